"""Check one scheduled PrimFunc by running what the GPU runs: its lowered device kernels, emulated.

Inputs are random (as the thread-serialized check draws them); outputs and workspaces start
poisoned; the kernels run in launch order under :func:`~tvm_ext.checks.emulator.emulate_launch`
(adversarial block order, races, uninitialised reads, shuffles, barriers); then every output
element the emulated blocks wrote is compared with the unscheduled function run on the CPU (in
float32 for a half-precision function: :mod:`~tvm_ext.checks.widen`). With every block run, an
output element never written is a finding too.

Example
-------
>>> verdict = emulate_function(fused["softmax"], scheduled["softmax"], target)
>>> verdict.ok, verdict.findings
(True, [])
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import tirx

from ..analysis.work import Work, function_work
from ..testing.compare import compare_outputs
from ..testing.tolerance import tolerance_for, within_own_rounding
from ..tir import PIPELINE_NAME, global_workspaces
from .emulator import WorkOverBudget, emulate_launch
from .lowered import distinct_parameters, lower_device
from .memory import Finding, Storage
from .thread_serial import comparison_inputs, run_on_cpu
from .values import element_dtype
from .widen import widened
from .work import (
    EMULATION_ALLOWANCE,
    EMULATION_BUDGET,
    PERFORMANCE_KINDS,
    RECOMPUTE_LIMIT,
)

#: Default time limit of one launch's emulation, in seconds: a kernel whose emulation would take
#: longer (huge unrolled expressions) is listed unchecked, not waited for.
EMULATION_SECONDS = 120.0


@dataclass
class EmulationVerdict:
    """What the emulation of one function found.

    Attributes
    ----------
    kernels : int
        Device kernels launched.
    blocks, blocks_run : int
        Thread blocks of all launches, and how many were emulated (large grids are sampled).
    findings : list of Finding
        Races, uninitialised reads, out-of-bounds accesses, barrier and shuffle misuse, wrong outputs.
    max_abs_err : float
        Largest difference from the unscheduled function over the compared elements.
    compared : int
        Output elements compared.
    """

    kernels: int = 0
    blocks: int = 0
    blocks_run: int = 0
    findings: list[Finding] = field(default_factory=list)
    max_abs_err: float = 0.0
    compared: int = 0
    #: Work of the unscheduled function, and what the kernels executed (counted by the emulator).
    planned: Work = field(default_factory=Work)
    executed: Work = field(default_factory=Work)
    #: The emulation stopped at its work budget (outputs not compared).
    stopped: bool = False
    #: How the inputs were drawn where not at random (:mod:`~tvm_ext.checks.input_domain`), else ''.
    domain: str = ""

    @property
    def ok(self) -> bool:
        """No finding about correctness (cost findings, :data:`~tvm_ext.checks.work.PERFORMANCE_KINDS`, are warnings)."""
        return not any(f.kind not in PERFORMANCE_KINDS for f in self.findings)

    @property
    def warnings(self) -> list[Finding]:
        """Findings about cost: recomputation, spills."""
        return [f for f in self.findings if f.kind in PERFORMANCE_KINDS]


def _storage(param, value: np.ndarray | None) -> Storage:
    """Global memory of a parameter (or a global intermediate buffer): ``value``, else poisoned."""
    shape = [int(d) for d in param.ty.shape]
    array = value if value is not None else np.empty(shape, dtype=element_dtype(param.ty.dtype))
    return Storage.global_tensor(param.name, array, initialised=value is not None)


def _work_text(executed: Work, planned: Work) -> str:
    return (f"{executed.transcendentals:.0f} transcendentals and {executed.global_loads:.0f} global loads executed, "
            f"{planned.transcendentals:.0f} and {planned.global_loads:.0f} in the function")


def _computes_in_half(func: tirx.PrimFunc) -> bool:
    return any(str(p.ty.dtype) in ("float16", "bfloat16") for p in func.params)


def _widen_array(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if (a.dtype.kind == "f" and a.dtype.itemsize == 2) or a.dtype.name == "bfloat16" else a


def _reference_outputs(reference: tirx.PrimFunc, args: list, outs: list, n_in: int) -> list[np.ndarray]:
    """The unscheduled function's outputs; a half-precision one computed in float32 (the tolerance
    policy compares half-precision results with a float32 reference)."""
    if not _computes_in_half(reference):
        return run_on_cpu(reference, args + [o.copy() for o in outs]).values[n_in:]
    return run_on_cpu(widened(reference), [_widen_array(a) for a in args + outs]).values[n_in:]


def emulate_function(reference: tirx.PrimFunc, scheduled: tirx.PrimFunc, target: tvm.target.Target, *,
                     name: str = "kernel", inputs: int | None = None, seed: int = 0, order: str = "reversed",
                     max_blocks: int | None = 16, seconds: float | None = EMULATION_SECONDS,
                     pipeline: str = PIPELINE_NAME, zero_integers: bool = False) -> EmulationVerdict:
    """Emulate ``scheduled``'s device kernels for ``target`` and compare with ``reference``.

    Parameters
    ----------
    reference, scheduled : PrimFunc
        The unscheduled and the scheduled function (``scheduled`` may have extra trailing
        workspace parameters).
    inputs : int, optional
        How many leading parameters are inputs; default all but the reference's last.
    order : str
        Block order: ``"reversed"`` (default), ``"shuffled"`` or ``"forward"``.
    max_blocks : int, optional
        Emulate at most this many blocks of a launch without grid barriers (all of a launch that
        passes a global intermediate on to a later launch).
    seconds : float, optional
        Time limit of each launch's emulation (:class:`~tvm_ext.checks.emulator.EmulationTimeout`
        past it); None for none.
    pipeline : str
        The TIR pipeline the build lowers ``scheduled`` with (a preset's ``tir_pipeline``).
    zero_integers : bool
        Integer and boolean inputs all zero instead of random 0/1
        (:func:`~tvm_ext.checks.input_domain.emulate_in_domain` decides when).

    Raises
    ------
    Unemulated
        A kernel uses something the emulator does not model.
    EmulationTimeout
        A launch's emulation ran past ``seconds``.
    """
    scheduled = distinct_parameters(scheduled)       # launches name their buffers by parameter
    n_in, args, outs, _, rtol, atol = comparison_inputs(reference, scheduled, inputs, seed, None, None,
                                                        zero_integers)
    if _computes_in_half(reference):    # fp16 inputs cast to a float32 output: computed in fp16
        rtol, atol = tolerance_for("float16")
    n_ref = len(reference.params)
    expected = _reference_outputs(reference, args, outs, n_in)
    storages = {p.name: _storage(p, args[i] if i < n_in else None) for i, p in enumerate(scheduled.params)}
    workspaces = global_workspaces(scheduled)          # host-allocated between launches, poisoned
    intermediates = {b.name for b in workspaces}
    storages.update({b.name: _storage(b, None) for b in workspaces})
    verdict = EmulationVerdict(planned=function_work(reference))
    launches = lower_device(scheduled, name, target, pipeline)
    for k, launch in enumerate(launches):
        # a launch passing an intermediate to a later one runs whole: sampled, it would leave the
        # later launch reading what no emulated block wrote
        feeds = any(a in intermediates and any(a in later.args for later in launches[k + 1:]) for a in launch.args)
        try:
            result = emulate_launch(launch.func, [storages[a] if isinstance(a, str) else a for a in launch.args],
                                    order=order, max_blocks=None if feeds else max_blocks, seed=seed,
                                    budget=verdict.planned * EMULATION_BUDGET + Work(EMULATION_ALLOWANCE,
                                                                                      EMULATION_ALLOWANCE)
                                    - verdict.executed, seconds=seconds)
        except WorkOverBudget as over:
            verdict.executed = verdict.executed + over.work
            verdict.findings.append(Finding("recompute", f"{launch.kernel} executes more than {EMULATION_BUDGET:g}x "
                                                         f"the transcendentals or global loads of its function "
                                                         f"({_work_text(verdict.executed, verdict.planned)}); "
                                                         "emulation stopped"))
            verdict.stopped = True
            return verdict
        verdict.kernels += 1
        verdict.blocks += result.blocks
        verdict.blocks_run += result.blocks_run
        verdict.findings.extend(result.findings)
        verdict.executed = verdict.executed + result.work
    if verdict.executed.ratio_over(verdict.planned) > RECOMPUTE_LIMIT:
        verdict.findings.append(Finding("recompute", f"executes {verdict.executed.ratio_over(verdict.planned):.1f}x "
                                                     f"the work of its function "
                                                     f"({_work_text(verdict.executed, verdict.planned)})"))
    sampled = verdict.blocks_run < verdict.blocks
    got, want, masks = [], [], []
    for p, ref in zip(list(scheduled.params)[n_in:n_ref], expected):
        st = storages[p.name]
        dt = element_dtype(p.ty.dtype)
        values = st.view(dt)[:ref.size]
        written = st.init[::dt.itemsize][:ref.size]
        if not sampled and not written.all():
            verdict.findings.append(Finding("mismatch", f"{int((~written).sum())} of {ref.size} elements of "
                                                        f"output '{p.name}' are never written"))
        got.append(values[written])
        want.append(ref.reshape(-1)[written])
        masks.append(written)
    errors = compare_outputs(got, want, rtol=rtol, atol=atol)
    verdict.compared = int(sum(g.size for g in got))
    verdict.max_abs_err = max((e.max_abs_err for e in errors if e.size), default=0.0)
    own = None
    for k, (p, e) in enumerate(zip(list(scheduled.params)[n_in:n_ref], errors)):
        if e.ok:
            continue
        if _computes_in_half(reference):    # as exact as the function in its own precision?
            own = own if own is not None else run_on_cpu(reference, args + [o.copy() for o in outs]).values[n_in:]
            if within_own_rounding(got[k], want[k], own[k].reshape(-1)[masks[k]], rtol, atol):
                continue
        verdict.findings.append(Finding("mismatch", f"output '{p.name}' differs from the unscheduled function "
                                                    f"(max abs error {e.max_abs_err:.3g})"))
    return verdict


def run_device_kernel(func: tirx.PrimFunc, args: list, *, poisoned: set[int] = frozenset(), order: str = "reversed",
                      max_blocks: int | None = None, seed: int = 0):
    """Emulate one lowered device kernel on numpy arrays (hand-written kernels, tests).

    ``args`` are the kernel's arguments in order: arrays for pointer parameters, ints for scalars;
    the arrays at the positions in ``poisoned`` (outputs, workspaces) start poisoned and
    uninitialised, whatever they hold. Returns the :class:`~tvm_ext.checks.emulator.LaunchResult`
    and every argument's final contents (arrays, in order; scalars as given).
    """
    storages = [Storage.global_tensor(p.name.removesuffix("_ptr"), a, initialised=i not in poisoned)
                if isinstance(a, np.ndarray) else a for i, (p, a) in enumerate(zip(func.params, args))]
    result = emulate_launch(func, storages, order=order, max_blocks=max_blocks, seed=seed)
    out = [st.view(a.dtype)[:a.size].reshape(a.shape).copy() if isinstance(a, np.ndarray) else a
           for a, st in zip(args, storages)]
    return result, out


__all__ = ["EmulationVerdict", "emulate_function", "run_device_kernel"]
