"""``tvm_ext.verify`` / ``tvm-ext verify``: check every kernel a build would run on the GPU, on the CPU.

The model is built as ``compile`` builds it (graph and schedule stages, with re-selection), then
each scheduled PrimFunc is linted (reductions over thread-bound loops lowered to allreduces:
:mod:`tvm_ext.checks.lints`; no output element stored by two threads: :mod:`tvm_ext.checks.write_once`), lowered, and its device kernels are emulated with CUDA's semantics
(:mod:`tvm_ext.checks.kernel`, lowered by the preset's TIR pipeline as the build lowers it)
against its unscheduled function; ptxas's report of the compiled
kernels adds spills and, for kernels with a grid barrier, the co-resident limit; a PrimFunc that was already
scheduled in the input module (hand-written TIR) is compared with its threads serialized
instead. Every CUTLASS call goes through the host-side contract check. One line per kernel:
name, generator, checks run, verdict; a kernel the emulator cannot run is listed unchecked with
the reason, never skipped.

Example
-------
>>> report = verify("model.onnx", "tvm_ext/h100", "full", fp16=True)
>>> print(report.to_table())
>>> report.ok
True
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm
from tvm import tirx

from .library_calls import library_calls
from ..driver.pipeline import load_module
from ..driver.ptxas_facts import ptxas_report
from ..driver.stages import build
from ..errors import TVM_ERRORS
from ..hardware import resolve_target
from ..inspect.kernels import primfunc_calls
from ..select.attrs import GENERATOR_ATTR, func_attr
from ..tir import PIPELINE_NAME, has_grid_sync
from ..toolchain import KernelUsage
from .emulator import EmulationTimeout
from .input_domain import emulate_in_domain
from .kernel import EMULATION_SECONDS
from .lints import unlowered_thread_reductions, usage_findings
from .lowered import lower_device
from .memory import Finding
from .thread_serial import call_inputs, serialize_threads
from .write_once import duplicate_writes
from .tir_expr import Unemulated
from .work import PERFORMANCE_KINDS


@dataclass(frozen=True)
class KernelLine:
    """One kernel's verdict: ``ok``, ``warnings`` (cost only: recomputation, spills), ``findings``
    (correctness) or ``unchecked`` (with the reason)."""

    kernel: str
    generator: str
    checks: str
    verdict: str
    details: tuple[str, ...] = ()

    def line(self) -> str:
        text = f"{self.kernel:<48} {self.generator:<10} {self.checks:<34} {self.verdict}"
        return "\n".join([text] + [f"    {d}" for d in self.details])


@dataclass
class VerifyReport:
    """Every kernel of one build, checked (see the module docstring)."""

    preset: str
    target: str
    lines: list[KernelLine] = field(default_factory=list)
    #: What the whole report could not check (e.g. no toolkit for ptxas).
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """No kernel with findings (unchecked kernels are listed, not failures)."""
        return all(line.verdict != "findings" for line in self.lines)

    def counts(self) -> dict[str, int]:
        """``{"kernels": n, "ok": .., "warnings": .., "findings": .., "unchecked": ..}``."""
        out = {"kernels": len(self.lines), "ok": 0, "warnings": 0, "findings": 0, "unchecked": 0}
        for line in self.lines:
            out[line.verdict] += 1
        return out

    def to_table(self) -> str:
        c = self.counts()
        head = f"{'kernel':<48} {'generator':<10} {'checks':<34} verdict"
        tail = (f"{c['kernels']} kernels ({self.preset}, {self.target}): {c['ok']} ok, {c['warnings']} with warnings "
                f"(cost), {c['findings']} with findings, {c['unchecked']} unchecked")
        return "\n".join([head] + [line.line() for line in self.lines] + [tail] + [f"note: {n}" for n in self.notes])

    def to_json(self) -> dict[str, Any]:
        return {"preset": self.preset, "target": self.target, "counts": self.counts(), "notes": self.notes,
                "kernels": [dict(line.__dict__, details=list(line.details)) for line in self.lines]}


def _was_scheduled(func: tirx.PrimFunc) -> bool:
    return bool(func.attrs and func.attrs.get("tirx.is_scheduled")) and func_attr(func, GENERATOR_ATTR) is None


def check_kernel(name: str, reference: tirx.PrimFunc, scheduled: tirx.PrimFunc, target: tvm.target.Target,
                 inputs: int | None, generator: str, usage: dict[str, KernelUsage] | None = None,
                 seconds: float | None = EMULATION_SECONDS, pipeline: str = PIPELINE_NAME) -> KernelLine:
    """Lint, emulate and (with ``usage``, ptxas's report of the built kernels) resource-check one
    scheduled PrimFunc against ``reference``, and say what was found (``seconds``: the
    emulation's time limit per launch)."""
    findings: list[Finding] = []
    checks = ["allreduce lint", "write-once lint"]
    unlowered = unlowered_thread_reductions(scheduled, target)
    if unlowered:
        findings.append(Finding("reduction", f"reductions over thread-bound loops left as plain read-modify-writes "
                                             f"(not lowered to allreduces): {', '.join(unlowered)}"))
    twice = duplicate_writes(scheduled)
    if twice:
        findings.append(Finding("race", f"elements of {', '.join(twice)} stored by two threads of one block "
                                        "(the last store wins)"))
    try:
        launches = lower_device(scheduled, name, target, pipeline)
        verdict = emulate_in_domain(reference, scheduled, target, name=name, inputs=inputs, seconds=seconds,
                                    pipeline=pipeline)
    except (Unemulated, EmulationTimeout) as err:
        return _line(name, generator, checks, findings, unchecked=str(err))
    except TVM_ERRORS as err:
        last = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
        return _line(name, generator, checks, findings, unchecked=f"could not be run: {last}")
    checks.append(f"emulated {verdict.blocks_run}/{verdict.blocks} blocks"
                  + (f" ({verdict.domain})" if verdict.domain else ""))
    findings.extend(verdict.findings)
    if verdict.stopped:
        return _line(name, generator, checks, findings, unchecked="emulation stopped at its work budget: "
                                                                  "outputs not compared")
    if usage is not None:
        checks.append("ptxas")
        for launch in launches:
            if launch.kernel in usage:
                findings.extend(usage_findings(launch.func, usage[launch.kernel], target,
                                               has_grid_sync(launch.func)))
    return _line(name, generator, checks, findings)


def _line(name: str, generator: str, checks: list[str], findings: list[Finding], unchecked: str = "") -> KernelLine:
    """``findings`` if any finding is about correctness; else ``unchecked`` if the emulation could
    not run to the end, ``warnings`` for cost findings only (recomputation, spills), ``ok``."""
    details = tuple(f"{f.kind}: {f.message}" for f in findings) + ((unchecked,) if unchecked else ())
    text = ", ".join(checks)
    if any(f.kind not in PERFORMANCE_KINDS for f in findings):
        return KernelLine(name, generator, text, "findings", details)
    if unchecked:
        return KernelLine(name, generator, text, "unchecked", details)
    return KernelLine(name, generator, text, "warnings" if findings else "ok", details)


def _usage(staged, names: list[str], target: tvm.target.Target) -> tuple[dict | None, str]:
    """ptxas's report of every kernel of ``names``: the build's own (the preset's ``ptxas``), else
    one nvcc run here; None and why where there is none."""
    facts = staged.ptxas if staged.ptxas is not None else ptxas_report(staged.scheduled, names, target,
                                                                       staged.preset.tir_pipeline)
    return facts.usage, facts.note


def verify(model: tvm.IRModule | str | Path, target: str | tvm.target.Target | None = None, preset: str = "full", *,
           shapes=None, fp16: bool = False, bind=None, progress: Callable[[str, int, int], None] | None = None,
           emulation_seconds: float | None = None) -> VerifyReport:
    """Build ``model`` as ``compile`` does and check every kernel the GPU would run (module docstring).

    Parameters
    ----------
    model : IRModule, str or Path
        An ONNX file or a Relax module (its PrimFuncs may already be scheduled).
    target : str or Target
        GPU target or tag (default :data:`~tvm_ext.hardware.DEFAULT_TARGET`).
    progress : callable, optional
        ``progress(stage, done, total)`` before the build and before each kernel is checked.
    emulation_seconds : float, optional
        Time limit of each launch's emulation (default :data:`~tvm_ext.checks.kernel.EMULATION_SECONDS`);
        a kernel past it is listed unchecked.
    """
    tgt = resolve_target(target)
    say = progress or (lambda stage, done, total: None)
    say(f"build ({preset})", 0, 1)
    mod = load_module(model, shapes=shapes, fp16=fp16, bind=bind)
    staged = build(mod, tgt, preset, link=False)
    report = VerifyReport(staged.preset.name, str(tgt.attrs.get("model", tgt.kind.name)))
    names = list(primfunc_calls(staged.scheduled))
    say("ptxas", 0, len(names) + 2)
    usage, why = _usage(staged, names, tgt) if names else ({}, "")
    if usage is None:
        report.notes.append(f"ptxas report unavailable, spills and co-residency unchecked: {why}")
    for done, name in enumerate(names):
        say(f"emulate {name}", done + 1, len(names) + 2)
        func = staged.scheduled[name]
        generator = func_attr(func, GENERATOR_ATTR) or ("hand-written" if name in mod and _was_scheduled(mod[name])
                                                        else "dlight")
        if generator == "hand-written":
            reference = serialize_threads(func)
            inputs = call_inputs(staged.scheduled, name)
        else:
            reference, inputs = staged.graph[name], call_inputs(staged.graph, name)
        report.lines.append(check_kernel(name, reference, func, tgt, inputs, generator, usage,
                                         seconds=emulation_seconds or EMULATION_SECONDS,
                                         pipeline=staged.preset.tir_pipeline))
    say("CUTLASS contracts", len(names) + 1, len(names) + 2)
    for _, result in library_calls(mod, tgt, staged.preset):
        report.lines.append(KernelLine(result.symbol, "cutlass", "host contract",
                                       "ok" if result.ok else "findings", () if result.ok else (result.line(),)))
    return report


__all__ = ["KernelLine", "VerifyReport", "check_kernel", "verify"]
