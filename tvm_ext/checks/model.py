"""``tvm_ext.verify`` / ``tvm-ext verify``: check every kernel a build would run on the GPU, on the CPU.

The model is built as ``compile`` builds it (graph and schedule stages, with re-selection), then
each scheduled PrimFunc is lowered and its device kernels are emulated with CUDA's semantics
(:mod:`tvm_ext.checks.kernel`), against its unscheduled function; a PrimFunc that was already
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
from tvm import relax, tirx

from ..driver.library_calls import library_calls
from ..driver.pipeline import load_module
from ..driver.stages import build
from ..errors import TVM_ERRORS
from ..hardware import resolve_target
from ..select.attrs import GENERATOR_ATTR, func_attr
from ..testing.thread_serial import call_inputs, serialize_threads
from .kernel import emulate_function
from .tir_expr import Unemulated


@dataclass(frozen=True)
class KernelLine:
    """One kernel's verdict: ``verdict`` is ``ok``, ``findings`` or ``unchecked``."""

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

    @property
    def ok(self) -> bool:
        """No kernel with findings (unchecked kernels are listed, not failures)."""
        return all(line.verdict != "findings" for line in self.lines)

    def counts(self) -> dict[str, int]:
        """``{"kernels": n, "ok": .., "findings": .., "unchecked": ..}``."""
        out = {"kernels": len(self.lines), "ok": 0, "findings": 0, "unchecked": 0}
        for line in self.lines:
            out[line.verdict] += 1
        return out

    def to_table(self) -> str:
        c = self.counts()
        head = f"{'kernel':<48} {'generator':<10} {'checks':<34} verdict"
        tail = (f"{c['kernels']} kernels ({self.preset}, {self.target}): {c['ok']} ok, {c['findings']} with findings, "
                f"{c['unchecked']} unchecked")
        return "\n".join([head] + [line.line() for line in self.lines] + [tail])

    def to_json(self) -> dict[str, Any]:
        return {"preset": self.preset, "target": self.target, "counts": self.counts(),
                "kernels": [line.__dict__ for line in self.lines]}


def _called_prim_funcs(mod: tvm.IRModule) -> list[str]:
    call_tir = tvm.ir.Op.get("relax.call_tir")
    names: list[str] = []

    def visit(expr) -> None:
        if isinstance(expr, relax.Call) and expr.op.same_as(call_tir) and expr.args[0].name_hint not in names:
            names.append(expr.args[0].name_hint)

    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func.body, visit)
    return names


def _was_scheduled(func: tirx.PrimFunc) -> bool:
    return bool(func.attrs and func.attrs.get("tirx.is_scheduled")) and func_attr(func, GENERATOR_ATTR) is None


def check_kernel(name: str, reference: tirx.PrimFunc, scheduled: tirx.PrimFunc, target: tvm.target.Target,
                 inputs: int | None, generator: str) -> KernelLine:
    """Emulate one scheduled PrimFunc against ``reference`` and say what was found."""
    try:
        verdict = emulate_function(reference, scheduled, target, name=name, inputs=inputs)
    except Unemulated as err:
        return KernelLine(name, generator, "lowered emulation", "unchecked", (str(err),))
    except TVM_ERRORS as err:
        last = (str(err).strip().splitlines() or [type(err).__name__])[-1][:200]
        return KernelLine(name, generator, "lowered emulation", "unchecked", (f"could not be run: {last}",))
    checks = f"emulated {verdict.blocks_run}/{verdict.blocks} blocks"
    if verdict.ok:
        return KernelLine(name, generator, checks, "ok")
    return KernelLine(name, generator, checks, "findings", tuple(f"{f.kind}: {f.message}" for f in verdict.findings))


def verify(model: tvm.IRModule | str | Path, target: str | tvm.target.Target | None = None, preset: str = "full", *,
           shapes=None, fp16: bool = False, bind=None, progress: Callable[[str, int, int], None] | None = None) -> VerifyReport:
    """Build ``model`` as ``compile`` does and check every kernel the GPU would run (module docstring).

    Parameters
    ----------
    model : IRModule, str or Path
        An ONNX file or a Relax module (its PrimFuncs may already be scheduled).
    target : str or Target
        GPU target or tag (default :data:`~tvm_ext.hardware.DEFAULT_TARGET`).
    progress : callable, optional
        ``progress(stage, done, total)`` before the build and before each kernel is checked.
    """
    tgt = resolve_target(target)
    say = progress or (lambda stage, done, total: None)
    say(f"build ({preset})", 0, 1)
    mod = load_module(model, shapes=shapes, fp16=fp16, bind=bind)
    staged = build(mod, tgt, preset, link=False)
    report = VerifyReport(staged.preset.name, str(tgt.attrs.get("model", tgt.kind.name)))
    names = _called_prim_funcs(staged.scheduled)
    for done, name in enumerate(names):
        say(f"emulate {name}", done, len(names) + 1)
        func = staged.scheduled[name]
        generator = func_attr(func, GENERATOR_ATTR) or ("hand-written" if name in mod and _was_scheduled(mod[name])
                                                        else "dlight")
        if generator == "hand-written":
            reference = serialize_threads(func)
            inputs = call_inputs(staged.scheduled, name)
        else:
            reference, inputs = staged.graph[name], call_inputs(staged.graph, name)
        report.lines.append(check_kernel(name, reference, func, tgt, inputs, generator))
    say("CUTLASS contracts", len(names), len(names) + 1)
    for _, result in library_calls(mod, tgt, staged.preset):
        report.lines.append(KernelLine(result.symbol, "cutlass", "host contract",
                                       "ok" if result.ok else "findings", () if result.ok else (result.line(),)))
    return report


__all__ = ["KernelLine", "VerifyReport", "check_kernel", "verify"]
