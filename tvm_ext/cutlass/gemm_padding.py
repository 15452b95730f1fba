"""GEMM extents padded to one 128-bit access so CUTLASS can take them (Bolt §3.2.3, for GEMMs).

CUTLASS needs every leading dimension aligned (at least
:func:`~tvm_ext.cutlass.checks.min_alignment`: two 16-bit elements), so a GEMM whose reduction
extent ``K`` or column count ``N`` is odd is not offloaded at all and runs on TVM's schedules at
a fraction of the library's speed: GPT-2's language-model head (``N = 50257``), NeRF's 63-wide
inputs, an attention core at 197 tokens the fused kernel does not take (``Q @ K^T`` has
``N = 197``, ``P @ V`` has ``K = 197``).

A constant weight is the exception for ``N``: stored ``[N, K]`` (a dense layer's weight, under
``permute_dims``; a ``[K, N]`` constant is transposed at compile time) its rows are ``K`` long, so
an odd ``N`` is only the length of the output's rows, which CUTLASS writes with one-element
stores: no padded columns and no copy of the product (GPT-2's head wrote 128 x 50264 and sliced
it). Any other unaligned extent is rounded up to one 128-bit access
(:func:`~tvm_ext.cutlass.padding.pad_multiple`), or to 64 or 32 bits where a whole access would
pad more than the share allows (extents CUTLASS already takes are left as they are):

* ``K``: zero columns on ``A`` and zero rows on ``B``; zero products add nothing to the sums;
* ``N``: zero columns on ``B``; the product's first ``N`` columns are taken back with an
  ``R.strided_slice``, after the bias where one is added (zeros for the padded columns,
  :func:`~tvm_ext.cutlass.padding.bias_before_slice`), so CUTLASS's epilogue still takes it.

A constant weight (``[K, N]``, or a dense layer's ``[N, K]`` under ``permute_dims``) is padded
here, at compile time; any other operand through an ``R.nn.pad``. ``R.nn.pad`` and
``R.strided_slice`` are injective, so fusion puts them into the operand's producer and the
product's readers (a transpose, a softmax). The two products of an attention core that the fused
attention kernel takes (:func:`~tvm_ext.cutlass.attention.attention_products`: any sequence
length) are left alone, so the core stays one match. Only where the extra extent is at most
:data:`MAX_EXTRA_SHARE` of the extent: for a narrow GEMM (a 2-way classifier) the padding would
be most of the work; and only where both extents then suit CUTLASS (a padded ``K`` beside an odd
``N`` too narrow to pad would be work for nothing). The padded graph computes the same values.

Example
-------
>>> mod = PadGemmExtents(mod)   # matmul(x, W[768, 50257]) -> matmul(x, permute_dims(W^T[50257, 768]))
"""
from __future__ import annotations

import logging
from typing import NamedTuple

import numpy as np
import tvm
from tvm import relax

from ..ir_update import rewrite_relax_functions
from .attention import attention_products
from .checks import OUTPUT_DTYPES, dtype_of, min_alignment, static_shape
from .padding import (
    MAX_EXTRA_SHARE,
    aligned_extra,
    bias_before_slice,
    remove_unused,
    zero_pad_last_axes,
)
from .precision import input_dtypes

_LOG = logging.getLogger(__name__)

class GemmPadding(NamedTuple):
    """What :func:`gemm_padding` decides for one GEMM."""

    k: int = 0
    n: int = 0
    #: Store a ``[K, N]`` constant weight as ``[N, K]`` under ``permute_dims`` (a dense layer): its
    #: rows are then ``K`` long, so an odd ``N`` is only the output's row length, which CUTLASS
    #: writes with one-element stores; no padded columns, no slice of the product.
    transpose: bool = False

    def __bool__(self) -> bool:
        return bool(self.k or self.n or self.transpose)


def gemm_padding(call: relax.Call, rhs: relax.Expr | None = None) -> GemmPadding:
    """How to make a ``relax.matmul`` call CUTLASS-able (nothing when it is, or cannot be).
    ``rhs``: the value the call's right operand is bound to, when that is a variable."""
    none = GemmPadding()
    if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.matmul"):
        return none
    lhs = call.args[0]
    rhs = call.args[1] if rhs is None else rhs
    a_shape, b_shape = static_shape(lhs), static_shape(rhs)
    if a_shape is None or b_shape is None or len(a_shape) < 2 or len(b_shape) < 2:
        return none
    dtype = dtype_of(lhs)
    if dtype not in input_dtypes() or dtype_of(rhs) != dtype or dtype_of(call) not in OUTPUT_DTYPES:
        return none
    if len(b_shape) > 2 and tuple(a_shape[:-2]) != tuple(b_shape[:-2]):
        return none   # broadcast batch axes: CUTLASS takes no such GEMM, padding would not help
    k, n = b_shape[-2:]
    if a_shape[-1] != k:
        return none
    align = min_alignment(dtype)
    weight = _constant_weight(rhs)
    if weight is not None and n % align:      # a constant weight is stored [N, K]: odd N costs nothing
        k_extra = aligned_extra(k, dtype)
        return GemmPadding(k_extra, 0, not weight[1]) if (k + k_extra) % align == 0 else none
    k_extra, n_extra = aligned_extra(k, dtype), aligned_extra(n, dtype)
    if (k + k_extra) % align or (n + n_extra) % align:
        return none   # the other extent stays unaligned: CUTLASS would still refuse, padding is waste
    return GemmPadding(k_extra, n_extra)


def _constant_weight(rhs: relax.Expr) -> tuple[np.ndarray, bool] | None:
    """The values of a constant 2-D weight and whether they are stored ``[N, K]`` (transposed)."""
    if isinstance(rhs, tvm.ir.Constant) and len(rhs.value.shape) == 2:
        return rhs.value.numpy(), False
    if (isinstance(rhs, relax.Call) and isinstance(rhs.op, tvm.ir.Op) and rhs.op.name == "relax.permute_dims"
            and isinstance(rhs.args[0], tvm.ir.Constant) and len(rhs.args[0].value.shape) == 2):
        axes = rhs.attrs.axes
        if axes is None or [int(a) for a in axes] == [1, 0]:
            return rhs.args[0].value.numpy(), True
    return None


@relax.expr_functor.mutator
class _GemmPadder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.padded = 0
        self.sliced: dict = {}
        # the fused attention kernel takes any sequence length: its cores' products stay as they are
        self.attention = []
        for _, func in mod.functions_items():
            if isinstance(func, relax.Function):
                values = {b.var: b.value for block in func.body.blocks for b in block.bindings}
                self.attention += [values[v] for v in attention_products(func) if v in values]

    def _rhs(self, rhs: relax.Expr, bound: relax.Expr, pad: GemmPadding) -> relax.Expr:
        k_extra, n_extra = pad.k, pad.n
        weight = _constant_weight(bound)
        if weight is None:
            return self.builder_.emit(zero_pad_last_axes(rhs, (k_extra, n_extra)))
        values, transposed = weight
        if pad.transpose:  # [K, N] stored as [N, K] under permute_dims: a dense layer's weight
            values, transposed = np.ascontiguousarray(values.T), True
        if transposed:   # [N, K] under permute_dims: zero rows (N) and columns (K), transposed as before
            padded = relax.const(np.pad(values, [(0, n_extra), (0, k_extra)]), dtype_of(rhs))
            return self.builder_.emit(relax.op.permute_dims(padded, [1, 0]))
        return relax.const(np.pad(values, [(0, k_extra), (0, n_extra)]), dtype_of(rhs))

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        in_attention = any(call.same_as(c) for c in self.attention)
        call = super().visit_call_(call)
        moved = bias_before_slice(self, call, self.sliced)
        if moved is not None:
            return moved
        if len(call.args) != 2 or in_attention:
            return call
        lhs, rhs = call.args
        bound = self.lookup_binding(rhs) if isinstance(rhs, relax.Var) else None
        bound = rhs if bound is None else bound
        pad = gemm_padding(call, bound)
        if not pad:
            return call
        new_lhs = self.builder_.emit(zero_pad_last_axes(lhs, (pad.k,))) if pad.k else lhs
        new_rhs = self._rhs(rhs, bound, pad)
        self.padded += 1
        product = relax.Call(call.op, [new_lhs, new_rhs], call.attrs)
        if not pad.n:
            return product
        out = self.builder_.emit(product)
        self.sliced[out] = static_shape(call)[-1]
        return relax.op.strided_slice(out, axes=[-1], begin=[0], end=[static_shape(call)[-1]])


def pad_gemm_extents(mod: tvm.IRModule) -> tvm.IRModule:
    """Pad ``K`` and ``N`` of every GEMM that needs and allows it (:func:`gemm_padding`)."""
    padder = _GemmPadder(mod)
    out = rewrite_relax_functions(mod, padder, skip_offloaded=True)
    if padder.padded:
        _LOG.info("padded K and/or N of %d GEMMs to CUTLASS's alignment", padder.padded)
    return remove_unused(out) if padder.sliced else out


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.cutlass.PadGemmExtents")
def PadGemmExtents(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Pass form of :func:`pad_gemm_extents`."""
    return pad_gemm_extents(mod)


__all__ = ["MAX_EXTRA_SHARE", "GemmPadding", "PadGemmExtents", "gemm_padding", "pad_gemm_extents"]
