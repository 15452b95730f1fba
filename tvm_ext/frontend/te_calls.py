"""The importer's opaque ``call_tir`` calls lifted back to Relax operators.

TVM's ONNX importer emits a few operators through ``emit_te`` (Pad, Clip's ``maximum`` and
``minimum``), so they reach the graph as ``R.call_tir`` of a one-block PrimFunc. Relax passes
cannot see through such a call: ``ConvertLayout`` puts transposes around it, ``ConvertToFloat16``
keeps it in fp32, pattern matchers skip it. :class:`LiftTECalls` recognises the PrimFunc of each
such call (:func:`single_store` reads its one computation) and asks a list of *lifters* for the
Relax expression computing the same values; a call no lifter knows stays as it is. The unused
PrimFuncs are left for ``DeadCodeElimination``.

A lifter is ``fn(compute: SingleStore, args: list[relax.Expr]) -> relax.Expr | None``
(see :mod:`~tvm_ext.frontend.pad` and :mod:`~tvm_ext.frontend.clip`).
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import relax, tirx

from ..ir_update import rewrite_relax_functions

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SingleStore:
    """The one computation of a one-block PrimFunc: ``out[axes] = value``.

    Attributes
    ----------
    inputs : tuple of tirx.Buffer
        The buffer parameters of the PrimFunc's inputs (the ``call_tir`` arguments, in order).
    output : tirx.Buffer
        The buffer written.
    axes : tuple of tirx.Var
        The block iteration variables indexing the output, one per output axis, each ranging
        over the whole axis.
    value : tirx.PrimExpr
        The stored value.
    """

    inputs: tuple
    output: object
    axes: tuple
    value: object

    def input_index(self, load: tvm.ir.TensorLoad) -> int | None:
        """Which input ``load`` reads (None for another buffer)."""
        return next((i for i, buf in enumerate(self.inputs) if load.source.same_as(buf)), None)

    def is_elementwise_load(self, expr, ndim: int | None = None) -> bool:
        """Whether ``expr`` reads an input at exactly the output position (``A[v0, ..., vn]``)."""
        return (isinstance(expr, tvm.ir.TensorLoad) and self.input_index(expr) is not None
                and len(expr.indices) == len(self.axes)
                and all(i.same_as(a) for i, a in zip(expr.indices, self.axes)))


def int_shape(buffer) -> tuple[int, ...] | None:
    """Static shape of a TIR buffer (None when an extent is not a constant)."""
    dims = [d.value if isinstance(d, tirx.IntImm) else None for d in buffer.shape]
    return None if any(d is None for d in dims) else tuple(int(d) for d in dims)


def single_store(func: tirx.PrimFunc) -> SingleStore | None:
    """The computation of ``func`` when it is one block writing its last parameter element by
    element over the whole output (what ``te.create_prim_func`` makes of one ``te.compute``)."""
    if not isinstance(func, tirx.PrimFunc) or len(func.params) < 2:
        return None
    buffers = list(func.params)  # in TVM 0.27 a PrimFunc's parameters are its buffers
    blocks, stores = [], []
    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlock, blocks.append))
    tvm_ffi.structural_walk(func.body, (tirx.BufferStore, stores.append))
    compute = [b for b in blocks if b.name_hint != "root"]
    output = buffers[-1]
    out_shape = int_shape(output)
    if len(compute) != 1 or len(stores) != 1 or out_shape is None or not stores[0].buffer.same_as(output):
        return None
    store, block = stores[0], compute[0]
    axes = [iv.var for iv in block.iter_vars]
    if len(axes) != len(out_shape) or len(store.indices) != len(axes):
        return None
    for index, iv, extent in zip(store.indices, block.iter_vars, out_shape):
        dom = iv.dom
        if not (index.same_as(iv.var) and isinstance(dom.min, tirx.IntImm) and int(dom.min.value) == 0
                and isinstance(dom.extent, tirx.IntImm) and int(dom.extent.value) == extent):
            return None
    return SingleStore(tuple(buffers[:-1]), output, tuple(axes), store.value)


Lifter = Callable[[SingleStore, list], "relax.Expr | None"]


@relax.expr_functor.mutator
class _Lifter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, lifters: Sequence[Lifter]):
        super().__init__(mod)
        self.mod = mod
        self.lifters = list(lifters)
        self.lifted: Counter = Counter()

    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: N802 - visitor API
        call = super().visit_call_(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.call_tir"):
            return call
        callee, args = call.args[0], call.args[1]
        if not isinstance(callee, tvm.ir.GlobalVar) or not isinstance(args, relax.Tuple) or len(call.args) != 2:
            return call
        compute = single_store(self.mod[callee])
        if compute is None or len(compute.inputs) != len(args.fields):
            return call
        for lifter in self.lifters:
            lifted = lifter(compute, list(args.fields))
            if lifted is not None:
                self.lifted[getattr(lifter, "__name__", "lifter")] += 1
                return lifted
        return call


def lift_te_calls(mod: tvm.IRModule, lifters: Sequence[Lifter]) -> tvm.IRModule:
    """Replace each ``call_tir`` a lifter recognises by the Relax expression it returns."""
    lifter = _Lifter(mod, lifters)
    out = rewrite_relax_functions(mod, lifter)
    if not lifter.lifted:
        return mod
    logger.info("lifted the importer's call_tir calls to Relax operators: %s",
                ", ".join(f"{n} x{c}" for n, c in sorted(lifter.lifted.items())))
    return out


def LiftTECalls(lifters: Sequence[Lifter]) -> tvm.transform.Pass:  # noqa: N802 - TVM pass factory
    """Pass form of :func:`lift_te_calls` (named ``tvm_ext.LiftTECalls`` for ``disabled_pass``)."""

    @tvm.transform.module_pass(opt_level=0, name="tvm_ext.LiftTECalls")
    def _lift(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        return lift_te_calls(mod, lifters)

    return _lift


__all__ = ["LiftTECalls", "Lifter", "SingleStore", "int_shape", "lift_te_calls", "single_store"]
