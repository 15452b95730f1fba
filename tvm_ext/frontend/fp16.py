"""``ConvertToFloat16``: turn an fp32 Relax model into a pure fp16 model.

Unlike ``relax.transform.ToMixedPrecision`` (which keeps fp32 inputs and casts around
GEMMs/convolutions), this pass rewrites the whole model to fp16: float32 parameters,
weights (constants), activations and outputs all become float16. Integer and boolean
tensors (token ids, masks, shapes) are left untouched.

What changes, precisely:

* float32 tensor parameters of every Relax function become float16 parameters;
* float32 constants become float16; finite values outside the fp16 range are clamped to
  +-65504 (so a ``-3.4e38`` attention-mask fill stays finite instead of turning into
  ``-inf`` and producing NaN in fully masked rows);
* ops whose attributes name a float32 result (``astype``, ``full``/``zeros``/``ones``,
  ``arange``, ``matmul``/``conv*`` ``out_dtype`` ...) are re-created with float16;
* *fp32 islands*: reductions that accumulate in their input dtype and can overflow or lose
  precision in fp16 (``sum``, ``mean``, ``variance``, ``std``, ``prod``, ``cumsum``,
  ``cumprod``, adaptive average pools; ``mean`` is what GlobalAveragePool imports to) run
  on fp32 copies of their inputs and cast the result back to fp16. Normalisations
  (``layer_norm``, ``group_norm``, ``rms_norm``) are not islands: TVM's kernels for them
  already accumulate in fp32;
* calls the pass cannot retype (``call_tir`` of PrimFuncs the importer emitted through
  ``emit_te``, e.g. Pad/Tile/Einsum, and other opaque calls) also become fp32 islands,
  with a log message naming them.

GEMMs and convolutions stay fp16 in and fp16 out (``out_dtype`` float16); the
accumulator precision is a scheduling/library decision taken later.
"""
from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np
import tvm
from tvm import relax

from ..ir_update import with_functions

logger = logging.getLogger(__name__)

FP32 = "float32"
FP16 = "float16"
_FP16_MAX = float(np.finfo(np.float16).max)

#: Ops that keep computing in fp32 inside an fp16 model (see the module docstring).
DEFAULT_FP32_OPS: frozenset[str] = frozenset({
    "relax.sum", "relax.mean", "relax.variance", "relax.std", "relax.prod",
    "relax.cumsum", "relax.cumprod",
    "relax.nn.adaptive_avg_pool1d", "relax.nn.adaptive_avg_pool2d", "relax.nn.adaptive_avg_pool3d",
})

#: Call ops whose callee the pass cannot retype; their tensor arguments live in ``args[1]``.
_OPAQUE_TUPLE_ARG_OPS = frozenset({"relax.call_tir", "relax.call_dps_packed", "relax.call_tir_inplace"})
#: Call ops whose callee (``args[0]``) the pass cannot retype; tensor arguments follow it.
_OPAQUE_DIRECT_ARG_OPS = frozenset({
    "relax.call_pure_packed", "relax.call_inplace_packed", "relax.call_builtin_with_ctx",
})
_DTYPE_ATTR_FIELDS = ("dtype", "out_dtype")


def _is_tensor_of(ty: tvm.ir.Type | None, dtype: str) -> bool:
    return isinstance(ty, relax.TensorType) and str(ty.dtype) == dtype


def _to_fp16_array(values: np.ndarray) -> np.ndarray:
    """Cast to fp16, clamping finite out-of-range values (inf/nan stay as they are).

    One cast, then only the elements that overflowed to inf from a finite value are clamped
    (BERT-base's 110 M weights: 0.4 s instead of 1.8 s for clip-then-cast)."""
    with np.errstate(over="ignore"):
        out = values.astype(np.float16)
    overflowed = np.isinf(out)
    if overflowed.any():
        overflowed &= np.isfinite(values)
        count = int(np.count_nonzero(overflowed))
        if count:
            out[overflowed] = np.clip(values[overflowed], -_FP16_MAX, _FP16_MAX).astype(np.float16)
            logger.info("ConvertToFloat16: clamped %d constant value(s) to the fp16 range", count)
    return out


def _retyped_attrs(attrs: tvm.ir.Attrs | None) -> tvm.ir.Attrs | None:
    """Copy of ``attrs`` with every float32 ``dtype``/``out_dtype`` field set to float16."""
    if attrs is None:
        return None
    info = getattr(type(attrs), "__tvm_ffi_type_info__", None)
    if info is None:
        return attrs
    fields = {f.name: getattr(attrs, f.name) for f in info.fields}
    if not any(k in fields and str(fields[k]) == FP32 for k in _DTYPE_ATTR_FIELDS):
        return attrs
    for key in _DTYPE_ATTR_FIELDS:
        if key in fields and str(fields[key]) == FP32:
            fields[key] = FP16
    return tvm.ir.make_node(info.type_key, **fields)


@relax.expr_functor.mutator
class _Float16Rewriter(relax.PyExprMutator):
    """Rewrites one function; see :class:`ConvertToFloat16`."""

    def __init__(self, mod: tvm.IRModule, fp32_ops: frozenset[str]):
        super().__init__(mod)
        self.relax_funcs = {gv.name_hint for gv, f in mod.functions_items()
                            if isinstance(f, relax.Function)}
        self.fp32_ops = fp32_ops
        self.opaque_calls: list[str] = []

    # -- entry ------------------------------------------------------------------------
    def rewrite(self, func: relax.Function) -> relax.Function:
        params = []
        for p in func.params:
            if _is_tensor_of(p.ty, FP32):
                new_p = relax.Var(p.name, relax.TensorType(p.ty.shape, FP16))
                self.set_var_remap(p, new_p)
                params.append(new_p)
            else:
                params.append(p)
        body = self.visit_expr(func.body)
        return relax.Function(params, body, is_pure=func.is_pure, attrs=func.attrs, span=func.span)

    # -- leaves -----------------------------------------------------------------------
    def visit_generic_const_(self, op):  # noqa: D401 - visitor hook
        if _is_tensor_of(op.ty, FP32):
            # a view of the host tensor, and no dtype for const (it would copy the fp16 array
            # again): Llama's 4 GB of weights were copied three times here
            return relax.const(_to_fp16_array(np.from_dlpack(op.value)))
        return op

    # -- calls ------------------------------------------------------------------------
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        new = self.visit_expr_post_order(call)
        if isinstance(new.op, tvm.ir.GlobalVar) and new.op.name_hint in self.relax_funcs:
            return new  # a Relax function of this module: the pass converts it as well
        op_name = new.op.name if isinstance(new.op, tvm.ir.Op) else None
        if (op_name in _OPAQUE_TUPLE_ARG_OPS or op_name in _OPAQUE_DIRECT_ARG_OPS
                or not isinstance(new.op, tvm.ir.Op)):
            return self._opaque_island(call, new, op_name)
        if op_name in self.fp32_ops and _is_tensor_of(call.ty, FP32):
            args = [self._upcast(old, arg) for old, arg in zip(call.args, new.args)]
            out = self.builder_.emit(relax.Call(new.op, args, new.attrs, new.ty_args))
            return relax.op.astype(out, FP16)
        attrs = _retyped_attrs(new.attrs)
        ty_args = [self._retype(t) for t in new.ty_args]
        if attrs is not new.attrs or any(not a.same_as(b) for a, b in zip(ty_args, new.ty_args)):
            new = relax.Call(new.op, new.args, attrs, ty_args)
        new = self.builder_.normalize(new)
        if _is_tensor_of(new.ty, FP32):
            # The result dtype comes from somewhere the pass does not rewrite (e.g. a
            # float32 PrimValue, as in one_hot): keep the op, cast its result.
            return relax.op.astype(self.builder_.emit(new), FP16)
        return new

    def _upcast(self, old: relax.Expr, new: relax.Expr) -> relax.Expr:
        """``new`` cast back to fp32 if it is a tensor this pass turned fp16."""
        if _is_tensor_of(getattr(old, "ty", None), FP32) and _is_tensor_of(new.ty, FP16):
            return self.builder_.emit(relax.op.astype(new, FP32))
        return new

    def _retype(self, ty: tvm.ir.Type) -> tvm.ir.Type:
        if _is_tensor_of(ty, FP32):
            return relax.TensorType(ty.shape, FP16) if ty.shape is not None \
                else relax.TensorType(None, FP16, ndim=ty.ndim)
        return ty

    def _opaque_island(self, old: relax.Call, new: relax.Call, op_name: str | None) -> relax.Expr:
        """Run a call the pass cannot retype on fp32 inputs and cast its fp32 outputs to fp16."""
        opaque_op = op_name in _OPAQUE_TUPLE_ARG_OPS or op_name in _OPAQUE_DIRECT_ARG_OPS
        callee = new.args[0] if opaque_op else new.op
        label = getattr(callee, "name_hint", None) or getattr(callee, "global_symbol", None) \
            or str(callee)
        args = list(new.args)
        if op_name in _OPAQUE_TUPLE_ARG_OPS and isinstance(args[1], relax.Tuple):
            old_fields = old.args[1].fields if isinstance(old.args[1], relax.Tuple) else []
            args[1] = relax.Tuple([self._upcast(o, n) for o, n in zip(old_fields, args[1].fields)])
        else:
            args = [self._upcast(o, n) for o, n in zip(old.args, new.args)]
        result = relax.Call(new.op, args, new.attrs, new.ty_args)
        if not self._has_fp32(old.ty):
            return result if any(not a.same_as(b) for a, b in zip(args, new.args)) else new
        self.opaque_calls.append(str(label))
        out = self.builder_.emit(result)
        return self._downcast(out, old.ty)

    def _has_fp32(self, ty: tvm.ir.Type) -> bool:
        if isinstance(ty, tvm.ir.TupleType):
            return any(self._has_fp32(t) for t in ty.fields)
        return _is_tensor_of(ty, FP32)

    def _downcast(self, value: relax.Expr, ty: tvm.ir.Type) -> relax.Expr:
        if isinstance(ty, tvm.ir.TupleType):
            items = [self._downcast(self.builder_.emit(relax.TupleGetItem(value, i)), t)
                     for i, t in enumerate(ty.fields)]
            return relax.Tuple(items)
        return relax.op.astype(value, FP16) if _is_tensor_of(ty, FP32) else value


@tvm.transform.module_pass(opt_level=0, name="ConvertToFloat16")
class ConvertToFloat16:
    """Module pass: every Relax function of the module becomes pure fp16.

    Parameters
    ----------
    fp32_ops : iterable of str, optional
        Names of Relax ops kept in fp32 (inputs upcast, result cast back);
        default :data:`DEFAULT_FP32_OPS`.
    """

    def __init__(self, fp32_ops: Iterable[str] | None = None):
        self.fp32_ops = frozenset(DEFAULT_FP32_OPS if fp32_ops is None else fp32_ops)

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            rewriter = _Float16Rewriter(mod, self.fp32_ops)
            updates[gv] = rewriter.rewrite(func)
            if rewriter.opaque_calls:
                logger.warning(
                    "ConvertToFloat16: %s kept in fp32 in %s (opaque calls cannot be retyped)",
                    ", ".join(sorted(set(rewriter.opaque_calls))), gv.name_hint)
        if not updates:
            return mod
        return relax.transform.Normalize()(with_functions(mod, updates))
