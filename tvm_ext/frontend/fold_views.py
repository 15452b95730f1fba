"""Layout operators on constants folded in numpy, ahead of Relax's ``FoldConstant``.

``FoldConstant`` evaluates an all-constant call by legalizing it to a PrimFunc, compiling that
with LLVM and running it: 20-60 ms per distinct shape on this machine. Imported models reshape
and transpose many weights (NAFNet: 222 constant reshapes, 14 of its 20 s import; MobileNet-V2's
clips test their constant bounds with ``isnan``/``where``), each a separate compile.
:class:`FoldConstantViews` computes those calls in numpy instead, where the result is exact by
construction (a reshape or transpose moves elements, ``isnan`` and ``where`` select them), so the
module ``FoldConstant`` then sees is the one it would have produced itself; every other
all-constant call is left to it.

Example
-------
>>> mod = FoldConstantViews()(mod)      # then relax.transform.FoldConstant()
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable

import numpy as np
import tvm
from tvm import relax, tirx

from ..ir_update import rewrite_relax_functions

logger = logging.getLogger(__name__)

#: dtypes numpy holds exactly (bfloat16 and the float8 types are left to FoldConstant).
_NUMPY_DTYPES = frozenset({"bool", "float16", "float32", "float64", "int8", "int16", "int32", "int64",
                           "uint8", "uint16", "uint32", "uint64"})


def _axes(value) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(a) for a in value)


def _static_shape(expr) -> tuple[int, ...] | None:
    if not isinstance(expr, relax.ShapeExpr) or not all(isinstance(v, tirx.IntImm) for v in expr.values):
        return None
    return tuple(int(v.value) for v in expr.values)


def _reshape(arrays: list, call: relax.Call):
    shape = _static_shape(call.args[1])
    return None if shape is None else arrays[0].reshape(shape)


def _squeeze(arrays: list, call: relax.Call):
    axes = _axes(call.attrs.axis)
    return np.squeeze(arrays[0]) if axes is None else np.squeeze(arrays[0], axis=axes)


#: Op name -> fn(numpy operands, call) -> the result, or None where it cannot say (a shape that is
#: not static). Operands are the call's tensor arguments in order.
_FOLDERS: dict[str, Callable[[list, relax.Call], np.ndarray | None]] = {
    "relax.reshape": _reshape,
    "relax.permute_dims": lambda a, call: np.transpose(a[0], _axes(call.attrs.axes)),
    "relax.expand_dims": lambda a, call: np.expand_dims(a[0], _axes(call.attrs.axis)),
    "relax.squeeze": _squeeze,
    "relax.flatten": lambda a, call: a[0].reshape(-1),
    "relax.isnan": lambda a, call: np.isnan(a[0]),
    "relax.where": lambda a, call: np.where(*a),
}

#: How many tensor operands each op takes (its other arguments are shapes).
_TENSOR_ARGS = {"relax.reshape": 1, "relax.where": 3}


@relax.expr_functor.mutator
class _ViewFolder(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule):
        super().__init__(mod)
        self.folded: Counter = Counter()

    def _array(self, expr) -> np.ndarray | None:
        if isinstance(expr, relax.Var):
            expr = self.lookup_binding(expr)
        if not isinstance(expr, tvm.ir.Constant) or str(expr.ty.dtype) not in _NUMPY_DTYPES:
            return None
        return expr.value.numpy()

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        new = self.visit_expr_post_order(call)
        name = new.op.name if isinstance(new.op, tvm.ir.Op) else None
        if name not in _FOLDERS or not isinstance(new.ty, relax.TensorType) \
                or str(new.ty.dtype) not in _NUMPY_DTYPES:
            return new
        arrays = [self._array(arg) for arg in new.args[:_TENSOR_ARGS.get(name, 1)]]
        if any(a is None for a in arrays):
            return new
        result = _FOLDERS[name](arrays, new)
        if result is None:
            return new
        self.folded[name] += 1
        return relax.const(np.asarray(result, dtype=str(new.ty.dtype), order="C"))  # 0-d stays 0-d


def fold_constant_views(mod: tvm.IRModule) -> tvm.IRModule:
    """Replace every layout call of ``mod``'s Relax functions whose operands are constants by its
    value (see the module docstring)."""
    folder = _ViewFolder(mod)
    out = rewrite_relax_functions(mod, folder)
    if not folder.folded:
        return mod
    logger.info("folded constant layout calls in numpy: %s",
                ", ".join(f"{n} x{c}" for n, c in sorted(folder.folded.items())))
    return out


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.FoldConstantViews")
class FoldConstantViews:
    """Pass form of :func:`fold_constant_views` (``tvm_ext.FoldConstantViews`` for ``disabled_pass``)."""

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return fold_constant_views(mod)


__all__ = ["FoldConstantViews", "fold_constant_views"]
