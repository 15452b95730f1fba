"""Check a GPU-scheduled PrimFunc's numerics on the CPU by running its threads one after another.

A kernel scheduled with ``s_tir.Schedule`` keeps block semantics until lowering: a reduction
whose loop is bound to ``threadIdx.x`` is still a reduction, a ``compute_at`` block still
computes exactly its region, predicates of partial tiles are explicit. Turning every
thread-bound loop into a serial loop therefore gives a CPU program that computes what the
kernel computes, which catches wrong regions, predicates, inlined index maps and tile sizes.
A kernel with grid barriers (global scheme) is split at each barrier into one serial block
loop per stage, which is what the barrier guarantees on the GPU.

Every buffer a run passes has guard bytes behind it; a kernel that writes past the end of a
parameter (a border tile's store without its predicate) fails the check by name instead of
corrupting the process's heap.

What it cannot see: data races and missing ``__syncthreads`` (TVM inserts those when it
lowers), warp-shuffle and cooperative-launch behaviour: the emulator of the lowered kernel
(:mod:`tvm_ext.checks.emulator`, ``tvm-ext verify``) checks those. :func:`run_on_cpu` (a TIR
function built for the CPU, with guard bytes behind every buffer) is the reference both use.

Example
-------
>>> check = compare_scheduled(fused_func, scheduled_func)
>>> check.ok, check.max_abs_err
(True, 0.0)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx

from ..errors import TvmExtError
from ..tir import PIPELINE_NAME
from ..testing.compare import compare_outputs
from ..testing.tolerance import tolerance_for
from ..tir import buffer_scope, has_grid_sync, is_block_binding


def _is_grid_sync(stmt) -> bool:
    return isinstance(stmt, tirx.Evaluate) and has_grid_sync(stmt)


def _rename_loop(loop: tirx.For, body) -> tirx.For:
    fresh = tvm.ir.Var(loop.loop_var.name, loop.loop_var.ty)
    old = loop.loop_var

    def on_var(var, mutator):
        return fresh if var.same_as(old) else var

    return tirx.For(fresh, loop.min, loop.extent, tirx.ForKind.SERIAL,
                    tvm_ffi.structural_mutate(body, (tvm.ir.Var, on_var)))


def _split_stages(loop: tirx.For):
    """A block loop whose body is a stage sequence with grid barriers -> one loop per stage."""
    body = loop.body
    if not isinstance(body, tirx.SeqStmt):
        raise TvmExtError("a grid barrier below a block loop that is not a stage sequence")
    stages, current = [], []
    for stmt in body.seq:
        if _is_grid_sync(stmt):
            stages.append(current)
            current = []
        elif has_grid_sync(stmt):
            raise TvmExtError("a grid barrier nested inside a stage cannot be run serially")
        else:
            current.append(stmt)
    stages.append(current)
    loops = [_rename_loop(loop, tirx.SeqStmt(s) if len(s) > 1 else s[0]) for s in stages if s]
    return tirx.SeqStmt(loops) if len(loops) > 1 else loops[0]


def _scopes_to_global(body):
    """Shared and local allocations become global ones (one thread of execution, and the CPU
    backend only places small register-scope buffers on the stack)."""
    swap: dict = {}

    def on_block(block) -> None:
        for buf in block.alloc_buffers:
            if buffer_scope(buf) != "global":
                swap[buf] = tirx.decl_buffer(buf.ty.shape, str(buf.ty.dtype), buf.name, scope="global")

    tvm_ffi.structural_walk(body, (tvm.s_tir.SBlock, on_block))
    if not swap:
        return body

    def on_var(var, mutator):
        return swap.get(var, var)

    return tvm_ffi.structural_mutate(body, (tvm.ir.Var, on_var))


def serialize_threads(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every thread-bound loop made serial and grid barriers turned into stage
    boundaries (see the module docstring); builds for ``llvm``.

    Raises
    ------
    TvmExtError
        A grid barrier sits somewhere other than between the stages of a block loop.
    """
    def on_for(loop, mutator):
        new = mutator.default_mutate(loop)
        if new.thread_binding is None:
            return new
        if is_block_binding(new) and has_grid_sync(new.body):
            return _split_stages(new)
        return tirx.For(new.loop_var, new.min, new.extent, tirx.ForKind.SERIAL, new.body)

    def on_evaluate(stmt, mutator):   # a __syncthreads orders nothing among serialized threads
        call = stmt.value
        if isinstance(call, tvm.ir.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "tirx.tvm_storage_sync":
            return tirx.Evaluate(tirx.IntImm("int32", 0))
        return stmt

    body = _scopes_to_global(tvm_ffi.structural_mutate(func.body, [(tirx.For, on_for), (tirx.Evaluate, on_evaluate)]))
    return func.with_body(body).without_attr("tirx.is_scheduled")


@dataclass(frozen=True)
class SerialComparison:
    """Scheduled kernel (threads serialized) against the unscheduled function, on one input set."""

    ok: bool
    max_abs_err: float
    outputs: int
    #: Parameters the scheduled kernel wrote past the end of (the check fails).
    out_of_bounds: tuple[str, ...] = ()


def random_args(func: tirx.PrimFunc, count: int, rng: np.random.Generator,
                zero_integers: bool = False) -> list[np.ndarray]:
    """Random values for the first ``count`` parameters of ``func`` (normal floats, 0/1 integers and
    booleans; with ``zero_integers`` integers and booleans all zero, a draw any index is defined on)."""
    args = []
    for p in list(func.params)[:count]:
        shape = [int(d) for d in p.ty.shape]
        dtype = np.dtype(str(p.ty.dtype))
        if dtype.kind == "f":
            args.append(rng.standard_normal(shape).astype(dtype))
        elif dtype.kind in "iub" and zero_integers:
            args.append(np.zeros(shape, dtype))
        elif dtype.kind in "iu":
            args.append(rng.integers(0, 2, size=shape).astype(dtype))
        elif dtype.kind == "b":
            args.append(rng.random(shape) < 0.5)
        else:
            raise TvmExtError(f"no random data for parameter '{p.name}' of dtype {dtype}")
    return args


#: Guard bytes behind every buffer of a run: at least this many, else as many as the buffer has.
MIN_GUARD_BYTES = 4096
_GUARD = 0xA5


class CpuRun(NamedTuple):
    """What :func:`run_on_cpu` returns: every argument after the run, and the overruns."""

    values: list[np.ndarray]
    out_of_bounds: tuple[str, ...]     # parameters written past their end


def run_on_cpu(func: tirx.PrimFunc, args: list[np.ndarray]) -> CpuRun:
    """Run ``func`` on the CPU; each argument is a view at the start of a larger allocation whose
    tail (the guard) must come back untouched. Lowered by the ``"tvm_ext"`` TIR pipeline, as the
    GPU build is (TVM's own would compute some inlined index maps wrongly: :mod:`tvm_ext.tir.flatten_guard`)."""
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                         target=tvm.target.Target({"kind": "llvm"}), pipeline=PIPELINE_NAME)
    backing, views = [], []
    for a in args:
        a = np.asarray(a).copy(order="C")    # np.ascontiguousarray would make a 0-d array 1-d
        raw = np.full(a.nbytes + max(MIN_GUARD_BYTES, a.nbytes), _GUARD, dtype=np.uint8)
        raw[:a.nbytes] = a.reshape(-1).view(np.uint8)
        backing.append(tvm.runtime.tensor(raw))
        views.append(backing[-1]._create_view(a.shape, str(a.dtype)))
    lib(*views)
    overrun = tuple(p.name for p, t, a in zip(func.params, backing, args) if (t.numpy()[a.nbytes:] != _GUARD).any())
    return CpuRun([v.numpy() for v in views], overrun)


def call_inputs(mod: tvm.IRModule, name: str) -> int:
    """How many of PrimFunc ``name``'s parameters are inputs, read from a ``call_tir`` of it.

    Raises
    ------
    TvmExtError
        Nothing in ``mod`` calls ``name``.
    """
    call_tir = tvm.ir.Op.get("relax.call_tir")
    counts: list[int] = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir) and expr.args[0].name_hint == name:
            counts.append(len(expr.args[1].fields))

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    if not counts:
        raise TvmExtError(f"no call_tir of '{name}' in the module")
    return counts[0]


def comparison_inputs(reference: tirx.PrimFunc, scheduled: tirx.PrimFunc, inputs: int | None, seed: int,
                      rtol: float | None, atol: float | None, zero_integers: bool = False):
    """Inputs (:func:`random_args`), zeroed outputs and extra parameters, and the tolerance of one comparison."""
    n_ref = len(reference.params)
    n_in = n_ref - 1 if inputs is None else inputs
    dtypes = [str(p.ty.dtype) for p in list(reference.params)[n_in:]]
    compared = next((d for d in dtypes if d in ("float16", "bfloat16")), "float32")
    default_rtol, default_atol = tolerance_for(compared)
    rng = np.random.default_rng(seed)
    args = random_args(reference, n_in, rng, zero_integers)
    outs = [zeros_like_param(p) for p in list(reference.params)[n_in:]]
    extra = [zeros_like_param(p) for p in list(scheduled.params)[n_ref:]]
    return n_in, args, outs, extra, (default_rtol if rtol is None else rtol), (default_atol if atol is None else atol)


def zeros_like_param(param) -> np.ndarray:
    """A zero array of a buffer parameter's shape and dtype."""
    return np.zeros([int(d) for d in param.ty.shape], dtype=str(param.ty.dtype))


def compare_scheduled(reference: tirx.PrimFunc, scheduled: tirx.PrimFunc, *, inputs: int | None = None,
                      seed: int = 0, rtol: float | None = None, atol: float | None = None) -> SerialComparison:
    """Run ``reference`` (the unscheduled function) and ``scheduled`` (threads serialized) on the
    CPU with the same random inputs and compare every output parameter.

    Parameters
    ----------
    reference, scheduled : PrimFunc
        Same leading parameters; ``scheduled`` may have extra trailing ones (promoted workspaces,
        zero-filled, not compared).
    inputs : int, optional
        How many leading parameters are inputs (:func:`call_inputs` reads it from the module);
        default all but the reference's last.
    rtol, atol : float, optional
        Default: :func:`~tvm_ext.testing.tolerance.tolerance_for` of the outputs' dtype (the
        half-precision one when any output is float16 or bfloat16).
    """
    n_in, args, outs, extra, rtol, atol = comparison_inputs(reference, scheduled, inputs, seed, rtol, atol)
    n_ref = len(reference.params)
    expected = run_on_cpu(reference, args + [o.copy() for o in outs]).values[n_in:]
    run = run_on_cpu(serialize_threads(scheduled), args + [o.copy() for o in outs] + extra)
    errors = compare_outputs(run.values[n_in:n_ref], list(expected), rtol=rtol, atol=atol)   # the one policy
    worst = max((e.max_abs_err for e in errors if e.size), default=0.0)
    return SerialComparison(all(e.ok for e in errors) and not run.out_of_bounds, worst, len(expected),
                            run.out_of_bounds)


def _written(func: tirx.PrimFunc) -> set:
    found: set = set()
    tvm_ffi.structural_walk(func.body, (tirx.BufferStore, lambda st: found.add(st.buffer)))
    return found


def compare_stages(reference: tirx.PrimFunc, scheduled: tirx.PrimFunc, stages: list[tirx.PrimFunc], *,
                   inputs: int | None = None, seed: int = 0, rtol: float | None = None,
                   atol: float | None = None) -> SerialComparison:
    """Check a multi-stage kernel stage by stage with its own intermediate values.

    ``scheduled`` runs once (threads serialized); then each unscheduled stage function of
    ``stages`` (whose parameters are ``reference``'s parameters and the intermediates that
    ``scheduled`` keeps in its trailing workspace parameters, the same buffers) is recomputed from
    the kernel's values of what it reads, and what it writes is compared with the kernel's values.
    A wrong stage, index map or virtual-block mapping shows at the stage that computes it, while
    rounding differences do not compound along the stages (a 32-step recurrence with N(0, 1)
    weights amplifies fp32 rounding beyond any tolerance, in the reference as much as in the kernel).
    ``outputs`` of the result counts the values compared.
    """
    n_in, args, outs, extra, rtol, atol = comparison_inputs(reference, scheduled, inputs, seed, rtol, atol)
    kernel = run_on_cpu(serialize_threads(scheduled), args + [o.copy() for o in outs] + extra)
    value_of = dict(zip(scheduled.params, kernel.values))
    got_all, expected_all = [], []
    for stage in stages:
        written = _written(stage)
        if any(p not in value_of for p in stage.params):
            raise TvmExtError("a stage reads a buffer the kernel does not keep as a parameter")
        run = [np.zeros_like(value_of[p]) if p in written else value_of[p].copy() for p in stage.params]
        results = run_on_cpu(stage, run).values
        for p, result in zip(stage.params, results):
            if p in written:
                got_all.append(value_of[p])
                expected_all.append(result)
    errors = compare_outputs(got_all, expected_all, rtol=rtol, atol=atol)
    worst = max((e.max_abs_err for e in errors if e.size), default=0.0)
    return SerialComparison(all(e.ok for e in errors) and not kernel.out_of_bounds, worst, len(expected_all),
                            kernel.out_of_bounds)


__all__ = ["CpuRun", "SerialComparison", "call_inputs", "compare_scheduled", "compare_stages", "comparison_inputs",
           "random_args", "run_on_cpu", "serialize_threads", "zeros_like_param"]
