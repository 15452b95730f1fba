"""Consecutive ``permute_dims`` merged into one (or none).

``relax.transform.ConvertLayout`` only propagates layouts forward: when a model's own transpose
(ConvNeXt's ``permute_dims(x, [0, 3, 1, 2])`` back to channels-first after a channels-last
layer norm) feeds a converted NHWC convolution, it adds ``permute_dims(.., [0, 2, 3, 1])``
after it. :func:`fold_permutes` composes such chains: ``permute_dims(permute_dims(x, p), q)``
reads axis ``p[q[j]]`` of ``x`` at position ``j``; an identity composition is ``x`` itself.
Permutations nothing reads any more are removed. A permutation of a constant (a convolution's
weights, OIHW to OHWI) becomes the permuted constant, transposed on the host: TVM's
``FoldConstant`` builds and runs a kernel per call for that (NAFNet: 632 weights, 22 s).
"""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm import relax

from ..ir_update import rewrite_relax_functions

_LOG = logging.getLogger(__name__)

_PERMUTE = "relax.permute_dims"


def _is_permute(expr) -> bool:
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == _PERMUTE


def _axes(call: relax.Call) -> list[int] | None:
    ndim = int(call.args[0].ty.ndim)
    if ndim < 0:
        return None
    axes = call.attrs.axes
    return list(range(ndim))[::-1] if axes is None else [int(a) % ndim for a in axes]


@relax.expr_functor.mutator
class _Folder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.folded = 0
        self.constants = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - visitor API
        call = super().visit_call_(call)
        if not _is_permute(call):
            return call
        if isinstance(call.args[0], tvm.ir.Constant) and (axes := _axes(call)) is not None:
            self.constants += 1
            return relax.const(np.ascontiguousarray(np.transpose(call.args[0].value.numpy(), axes)))
        if not isinstance(call.args[0], relax.Var):
            return call
        inner = self.lookup_binding(call.args[0])
        if not _is_permute(inner):
            return call
        outer_axes, inner_axes = _axes(call), _axes(inner)
        if outer_axes is None or inner_axes is None:
            return call
        composed = [inner_axes[j] for j in outer_axes]
        self.folded += 1
        source = inner.args[0]
        return source if composed == list(range(len(composed))) else relax.op.permute_dims(source, composed)


def fold_permutes(mod: tvm.IRModule) -> tvm.IRModule:
    """Compose chains of ``permute_dims`` in the Relax functions of ``mod`` and apply those of
    constants (module docstring)."""
    folder = _Folder(mod)
    out = rewrite_relax_functions(mod, folder)
    if not folder.folded and not folder.constants:
        return mod
    if folder.constants:        # the permuted constants into their uses, as FoldConstant leaves them
        out = relax.transform.CanonicalizeBindings()(out)
    for gvar, func in out.functions_items():
        if isinstance(func, relax.Function):
            out[gvar] = relax.analysis.remove_all_unused(func)
    _LOG.debug("folded %d chains of permute_dims, %d of constants", folder.folded, folder.constants)
    return out


__all__ = ["fold_permutes"]
