"""The plan of a prepared GPU run (``DIR/plan.json``): the steps, each one process on the GPU machine.

``tvm-ext gpu-run prepare`` (:mod:`.gpu_prepare`) writes it on the build host; the executor
(:mod:`.gpu_execute`) reads it on the GPU machine with numpy and the TVM runtime only, so this
module imports nothing else. A step's ``argv`` holds placeholders the executor fills in:
``{python}`` (the interpreter), ``{run_dir}`` (the plan's directory), ``{out}`` (where results
go), ``{tool}`` (the step's external tool: ``compute-sanitizer`` or ``ncu``) and ``{main}`` (the
bundle built for the GPU found there: ``h200`` on an H200 when the run carries one, else the
first target's).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import BenchError

FORMAT = "tvm_ext.gpu_run/1"
PLAN = "plan.json"
#: Step kinds, in the order a plan runs them: what matters most comes first, so a run cut short
#: by its deadline still has numerics and timings of every (model, preset).
KINDS = ("measure", "sanitize", "overhead", "torch", "ncu")
#: External tool of each kind that needs one.
TOOLS = {"sanitize": "compute-sanitizer", "ncu": "ncu"}


@dataclass
class Step:
    """One process of the run.

    Attributes
    ----------
    id : str
        Unique, readable: ``measure:bert_base_s128_b1/full``.
    kind : str
        One of :data:`KINDS`.
    argv : list of str
        The command, with ``{python}``, ``{run_dir}``, ``{out}`` and ``{tool}`` placeholders.
    estimate_s : float
        Planned device seconds (process start included).
    estimate_from : str
        Where the estimate comes from (a recorded step, a recorded median, an assumption).
    timeout_s : float
        The process is killed after this long and recorded as ``timeout``.
    model, systems, bundle, tool, log : str, list, str, str, str
        What it runs (for the records), and the file under ``{out}`` its output goes to.
    """

    id: str
    kind: str
    argv: list[str]
    estimate_s: float
    estimate_from: str
    timeout_s: float
    model: str | None = None
    systems: list[str] = field(default_factory=list)
    bundle: str | None = None
    tool: str | None = None
    log: str | None = None

    def command(self, *, python: str, run_dir: Path, out: Path, main: str, tool: str | None = None) -> list[str]:
        """``argv`` with its placeholders filled in."""
        values = {"python": python, "run_dir": str(run_dir), "out": str(out), "tool": tool or "", "main": main}
        return [a.format(**values) for a in self.argv]


@dataclass
class Plan:
    """Everything the GPU machine runs, in order, and what it is expected to cost."""

    steps: list[Step]
    deadline_s: float
    commit: str
    created: str
    targets: dict[str, str]
    notes: list[str] = field(default_factory=list)
    format: str = FORMAT

    def main_bundle(self, gpu_name: str | None) -> str:
        """The bundle tag ``{main}`` stands for on a GPU the driver calls ``gpu_name``."""
        name = (gpu_name or "").lower()
        for tag in self.targets:
            if tag.lower() in name:
                return tag
        return next(iter(self.targets))

    @property
    def planned_s(self) -> float:
        """Planned device seconds of every step."""
        return sum(s.estimate_s for s in self.steps)

    def write(self, directory: Path) -> Path:
        """Write ``directory/plan.json``; returns its path."""
        path = Path(directory) / PLAN
        path.write_text(json.dumps(asdict(self), indent=1) + "\n")
        return path

    @classmethod
    def read(cls, directory: str | Path) -> Plan:
        """Read ``directory/plan.json``.

        Raises
        ------
        BenchError
            No plan there, or one of another format.
        """
        path = Path(directory) / PLAN
        if not path.is_file():
            raise BenchError(f"{directory} holds no {PLAN}: write one with `tvm-ext gpu-run prepare --out DIR`")
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT:
            raise BenchError(f"{path}: format {data.get('format')!r}, expected {FORMAT!r}")
        steps = [Step(**s) for s in data.pop("steps")]
        return cls(steps=steps, **data)


__all__ = ["FORMAT", "KINDS", "PLAN", "TOOLS", "Plan", "Step"]
