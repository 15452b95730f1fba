"""Run structural rewrites with a model's weights out of the way.

TVM's pattern rewriter (``rewrite_call``, behind ``RemoveRedundantReshape`` and our
:class:`~tvm_ext.frontend.gelu.FuseGelu`) and ``EliminateCommonSubexpr`` hash whole functions
when they change one, and a structural hash of a Relax function reads every byte of its
constants: on BERT-base's imported ``main`` (110 M weights) each such rewrite took about a
second, 4 s of its 10 s import, for passes that never look at a weight's values.

:class:`WithConstantsAsParams` runs passes like these on functions whose large constants are
parameters for the while, and binds the same tensors back afterwards: the result is the
module the passes would have produced (structurally equal, checked in
``tests/test_lifted_constants.py``), 50x faster on BERT-base.

Example
-------
>>> passes = tvm.transform.Sequential([FuseGelu(), relax.transform.RemoveRedundantReshape()])
>>> mod = WithConstantsAsParams(passes)(mod)
"""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from ..errors import TvmExtError
from ..ir_update import with_functions

#: Constants of at least this many bytes become parameters; smaller ones (scalars a pattern
#: checks, such as GELU's 0.5) keep their values in place.
MIN_LIFTED_BYTES = 4096


def _nbytes(ty: tvm.ir.Type) -> int:
    """Bytes of a tensor type with a static shape (0 for any other type)."""
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return 0
    return math.prod(int(d) for d in ty.shape.values) * tvm.runtime.DataType(str(ty.dtype)).bits // 8


def _identity(value: tvm.runtime.Tensor) -> tuple[int, ...] | int:
    """What makes two constants one tensor: its data pointer and layout (``id`` of the Python
    wrapper where DLPack cannot share the tensor; TVM hands out a new wrapper per access)."""
    try:
        view = np.from_dlpack(value)
    except (BufferError, TypeError, ValueError, RuntimeError):
        return id(value)
    return (view.__array_interface__["data"][0], view.dtype.num, *view.shape)


@relax.expr_functor.mutator
class _Lift(relax.PyExprMutator):
    """Each large constant as a new parameter; one tensor used in several places (GPT-2's
    causal mask, once per layer) is one parameter, as it was one constant."""

    def __init__(self, mod: tvm.IRModule, min_bytes: int):
        super().__init__(mod)
        self.min_bytes = min_bytes
        self.params: dict[tuple[int, ...] | int, relax.Var] = {}
        self.values: dict[relax.Var, tvm.runtime.Tensor] = {}

    def visit_generic_const_(self, op):
        if _nbytes(op.ty) < self.min_bytes:
            return op
        value = op.value
        key = _identity(value)
        if key not in self.params:
            var = relax.Var(f"lifted_constant_{len(self.values)}", op.ty)
            self.params[key] = var
            self.values[var] = value
        return self.params[key]


def _entry_functions(mod: tvm.IRModule) -> list[tuple[tvm.ir.GlobalVar, relax.Function]]:
    """Relax functions with a global symbol (called from outside: their signature is free to
    grow for the while; a private function's call sites would not match)."""
    return [(gv, f) for gv, f in mod.functions_items()
            if isinstance(f, relax.Function) and f.attrs is not None and "global_symbol" in f.attrs]


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.WithConstantsAsParams")
class WithConstantsAsParams:
    """Module pass: ``passes`` run with each entry function's constants of at least
    ``min_bytes`` as extra parameters, bound back to the same tensors afterwards.

    Parameters
    ----------
    passes : tvm.transform.Pass
        Passes that do not read the values of large constants (pattern rewrites, CSE, DCE).
    min_bytes : int
        Smallest constant lifted.

    Raises
    ------
    TvmExtError
        When ``passes`` changed an entry function's parameters (the lifted ones cannot be
        bound back).
    """

    def __init__(self, passes: tvm.transform.Pass, min_bytes: int = MIN_LIFTED_BYTES):
        self.passes = passes
        self.min_bytes = min_bytes

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        lifted: dict[str, dict[relax.Var, tvm.runtime.Tensor]] = {}
        updates = {}
        for gv, func in _entry_functions(mod):
            lift = _Lift(mod, self.min_bytes)
            body = lift.visit_expr(func.body)
            if lift.values:
                lifted[gv.name_hint] = lift.values
                updates[gv] = relax.Function(list(func.params) + list(lift.values), body, func.ret_ty,
                                             func.is_pure, func.attrs, func.span)
        if not lifted:
            return self.passes(mod)
        mod = self.passes(with_functions(mod, updates))
        bound = {}
        for name, values in lifted.items():
            func = mod[name]
            missing = [v.name for v in values if not any(p.same_as(v) for p in func.params)]
            if missing:
                raise TvmExtError(f"{self.passes.info.name} changed the parameters of '{name}': "
                                  f"lifted constants {missing[:3]} are gone; run it without WithConstantsAsParams")
            bound[mod.get_global_var(name)] = func.bind_params(values)
        return with_functions(mod, bound)


__all__ = ["MIN_LIFTED_BYTES", "WithConstantsAsParams"]
