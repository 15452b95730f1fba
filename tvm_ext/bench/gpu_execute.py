"""Run a prepared GPU run on the GPU machine: ``python -m tvm_ext.bench.gpu_execute DIR --out OUT``.

Runs the steps of ``DIR/plan.json`` (:mod:`.gpu_steps`) in order, **each in its own process**
with its own time limit, so an illegal address or a hang loses one (model, preset), not the run.
Everything is written under ``OUT`` as it is measured:

* ``steps.jsonl`` - one line per step: status (``ok``, ``failed``, ``crashed``, ``timeout``,
  ``skipped``), exit code or signal, wall seconds against the planned ones, the log's tail;
* ``results.jsonl`` - the measurement rows :mod:`.run` writes; for a measurement process that
  crashed or timed out, one row per system it held, with the error, so no row goes missing;
* ``logs/<step>.log`` - each process's output (sanitizer reports among them); ``ncu/*.csv`` the
  profiles; ``device.txt`` - the GPU, driver, Python, torch and the tools found.

No step starts that would end past ``--deadline`` by its plan (it is recorded as skipped).
``--dry-run`` runs the same plan without a GPU: measurement steps become
:mod:`.dry_run` (weights, inputs, references against themselves, libraries), tool steps say
which tool they would run and whether it is installed. Needs Python and numpy only (no TVM).
"""
from __future__ import annotations

import argparse
import datetime as _dt
import glob
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from ..errors import TvmExtError
from .gpu_steps import TOOLS, Plan, Step
from .weights import CACHE_ENV

log = logging.getLogger(__name__)

#: Where NVIDIA installs its tools when they are not on PATH.
_TOOL_GLOBS = {"compute-sanitizer": ("/usr/local/cuda*/bin/compute-sanitizer",
                                     "/opt/nvidia/*/compute-sanitizer/compute-sanitizer"),
               "ncu": ("/usr/local/cuda*/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu")}
_TAIL = 2000
#: Fault injection for testing the executor itself: STEP_ID=abort|hang.
FAULTS = {"abort": "import os; os.abort()", "hang": "import time; time.sleep(3600)"}


def find_tool(name: str) -> str | None:
    """The path of NVIDIA tool ``name`` (PATH first, then the usual install directories), or None."""
    found = shutil.which(name)
    if found:
        return found
    for pattern in _TOOL_GLOBS.get(name, ()):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def _probe(argv: list[str]) -> str | None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def describe_machine(python: str, tools: dict[str, str | None]) -> dict:
    """GPU, driver, Python, torch and tools of this machine (what ``device.txt`` records)."""
    smi = shutil.which("nvidia-smi")
    gpu = _probe([smi, "--query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem,memory.total",
                  "--format=csv,noheader"]) if smi else None
    torch = _probe([python, "-c", "import torch; print(torch.__version__, torch.cuda.is_available())"])
    return {"gpu": gpu, "python": _probe([python, "--version"]), "torch": torch,
            "tools": {k: (v, _probe([v, "--version"]) if v else None) for k, v in tools.items()}}


def step_environment(run_dir: Path, python: str) -> tuple[dict[str, str], str]:
    """The environment of every step, and which TVM runtime it uses: the run's harness first on
    ``PYTHONPATH``, TVM's runtime only.

    A runtime packed into ``run_dir/runtime`` (``tvm_runtime.tar.gz`` and the tvm-ffi wheel) is
    unpacked once into ``run_dir/runtime/site`` and put on the path when ``python`` is the version
    it was packed for (its compiled ``tvm_ffi`` loads in no other); otherwise, or without one, the
    machine's own TVM is used (with ``TVM_USE_RUNTIME_LIB=1``).
    """
    paths = [str(run_dir / "python")]
    packed = run_dir / "runtime" / "tvm_runtime.tar.gz"
    runtime = "the machine's own TVM (no runtime packed)"
    if packed.is_file():
        wanted = json.loads((run_dir / "runtime" / "runtime.json").read_text()).get("python")
        have = _probe([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"])
        if wanted and have != wanted:
            runtime = f"the machine's own TVM: the packed runtime is for Python {wanted}, {python} is {have}"
            log.warning("%s", runtime)
        else:
            site = run_dir / "runtime" / "site"
            if not (site / ".ready").is_file():
                site.mkdir(parents=True, exist_ok=True)
                with tarfile.open(packed) as tar:
                    tar.extractall(site, filter="data")
                for wheel in sorted((run_dir / "runtime").glob("*.whl")):
                    subprocess.run([python, "-m", "zipfile", "-e", str(wheel), str(site)], check=True)
                (site / ".ready").touch()
            paths.append(str(site))
            runtime = f"the packed runtime ({site})"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(paths + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    env.update(TVM_USE_RUNTIME_LIB="1", TVM_DEVICE_BACKEND_AUTOLOAD="0", PYTHONUNBUFFERED="1")
    # the processes of one model share its regenerated weights (checked by digest at every read)
    env.setdefault(CACHE_ENV, str(Path(tempfile.gettempdir()) / f"tvm_ext_weights_{os.getuid()}"))
    return env, runtime


def _safe(step_id: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", step_id)


def _dry_argv(step: Step) -> list[str] | None:
    """What the dry run runs for ``step`` (None: nothing runs without a GPU)."""
    if step.kind in ("measure", "overhead", "sanitize"):
        return ["{python}", "-m", "tvm_ext.bench.dry_run", f"{{run_dir}}/{step.bundle}", "--models", step.model or "",
                "--systems", ",".join(step.systems), "--out", "{out}/results.jsonl"]
    return None


class Executor:
    """Runs the steps of a plan and records them (see the module docstring)."""

    def __init__(self, run_dir: Path, out: Path, *, python: str, dry_run: bool, deadline_s: float,
                 faults: dict[str, str] | None = None):
        self.plan = Plan.read(run_dir)
        self.run_dir, self.out, self.python, self.dry_run = run_dir.resolve(), out, python, dry_run
        self.deadline_s = deadline_s
        self.faults = faults or {}
        self.tools = {name: find_tool(name) for name in set(TOOLS.values())}
        for sub in ("logs", "ncu"):
            (out / sub).mkdir(parents=True, exist_ok=True)
        self.env, runtime = step_environment(self.run_dir, python)
        self.machine = describe_machine(python, self.tools)
        self.machine["tvm_runtime"] = runtime
        self.main = self.plan.main_bundle(self.machine["gpu"])
        self.machine["bundle"] = self.main
        (out / "device.txt").write_text(json.dumps(self.machine, indent=1) + "\n")

    def run(self) -> list[dict]:
        """Run every step; returns the step records (also in ``OUT/steps.jsonl``)."""
        start = time.monotonic()
        records = []
        for step in self.plan.steps:
            elapsed = time.monotonic() - start
            if elapsed + step.estimate_s > self.deadline_s:
                rec = self._record(step, "skipped", reason=f"deadline: {elapsed:.0f} s spent, planned "
                                   f"{step.estimate_s:.0f} s more, deadline {self.deadline_s:.0f} s")
            else:
                rec = self._run_step(step)
            records.append(rec)
            with (self.out / "steps.jsonl").open("a") as f:
                f.write(json.dumps(rec) + "\n")
            print(f"[{time.monotonic() - start:6.1f} s] {step.id}: {rec['status']}"
                  + (f" ({rec['reason']})" if rec.get("reason") else ""), flush=True)
        return records

    def _record(self, step: Step, status: str, **extra) -> dict:
        return {"step": step.id, "kind": step.kind, "model": step.model, "systems": step.systems,
                "status": status, "estimate_s": step.estimate_s, "dry_run": self.dry_run, **extra}

    def _command(self, step: Step) -> tuple[list[str] | None, str | None]:
        """The command of ``step`` here, or (None, why it does not run)."""
        tool = None
        if step.tool:
            tool = self.tools.get(step.tool)
            if tool is None and not (self.dry_run and step.kind == "sanitize"):
                return None, f"{step.tool} is not installed on this machine"
        if step.kind == "torch" and not (self.machine["torch"] or "").endswith("True"):
            return None, "torch with CUDA is not installed on this machine" if not self.dry_run else "dry run"
        if self.dry_run:
            argv = _dry_argv(step)
            if argv is None:
                return None, f"dry run: would run {' '.join(step.argv[:4])} ... ({step.tool or step.kind})"
        else:
            argv = step.argv
        if step.id in self.faults:
            argv = ["{python}", "-c", FAULTS[self.faults[step.id]]]
        filled = Step(**{**step.__dict__, "argv": argv})
        return filled.command(python=self.python, run_dir=self.run_dir, out=self.out.resolve(), main=self.main,
                              tool=tool), None

    def _run_step(self, step: Step) -> dict:
        argv, why = self._command(step)
        if argv is None:
            return self._record(step, "skipped", reason=why)
        log_path = self.out / "logs" / f"{_safe(step.id)}.log"
        began = time.monotonic()
        with log_path.open("w") as log:
            log.write("$ " + " ".join(argv) + "\n")
            log.flush()
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                    env=self.env)
            try:
                rc = proc.wait(timeout=step.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the tool's children (python under ncu) too
                proc.wait()
                rc = None
        wall = time.monotonic() - began
        tail = log_path.read_text(errors="replace")[-_TAIL:]
        if rc is None:
            status, reason = "timeout", f"killed after {step.timeout_s:.0f} s"
        elif rc < 0:
            status, reason = "crashed", f"signal {-rc} ({signal.Signals(-rc).name})"
        elif rc == 0:
            status, reason = "ok", None
        else:
            status, reason = "failed", f"exit {rc}"
        if status in ("timeout", "crashed") and step.kind in ("measure", "overhead", "torch"):
            self._lost_rows(step, f"the process {status}: {reason}")
        return self._record(step, status, rc=rc, reason=reason, wall_s=round(wall, 2),
                            log=str(log_path.relative_to(self.out)), tail=tail)

    def _lost_rows(self, step: Step, error: str) -> None:
        """Results rows for the systems of a process that died before writing them."""
        path = self.out / "results.jsonl"
        have = set()
        if path.is_file():
            for line in path.read_text().splitlines():
                r = json.loads(line)
                have.add((r.get("model"), r.get("system")))
        date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
        with path.open("a") as f:
            for system in step.systems:
                if (step.model, system) not in have:
                    f.write(json.dumps({"model": step.model, "system": system, "device": self.machine["gpu"],
                                        "commit": self.plan.commit, "date": date, "median_ms": None,
                                        "kernels": None, "max_rel_err": None, "numerics_ok": None,
                                        "error": error, "process": step.id}) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: 0 when every step that ran was ok, 1 otherwise, 2 on bad input."""
    p = argparse.ArgumentParser(prog="python -m tvm_ext.bench.gpu_execute", description=__doc__.splitlines()[0])
    p.add_argument("directory", help="the prepared run (with plan.json)")
    p.add_argument("--out", required=True, help="where results go (on the device tool: $OUT)")
    p.add_argument("--dry-run", action="store_true", help="no GPU: run what can run, say what would run")
    p.add_argument("--deadline", type=float, default=None, help="seconds (default: the plan's)")
    p.add_argument("--python", default=sys.executable, help="interpreter of the steps (default this one)")
    p.add_argument("--inject-fault", action="append", default=[], metavar="STEP=abort|hang",
                   help="replace a step's process by one that aborts or hangs (tests the executor)")
    args = p.parse_args(argv)
    faults = {}
    for item in args.inject_fault:
        step_id, _, fault = item.rpartition("=")
        if fault not in FAULTS or not step_id:
            p.error(f"--inject-fault {item!r}: expected STEP=abort|hang")
        faults[step_id] = fault
    try:
        plan = Plan.read(args.directory)
        executor = Executor(Path(args.directory), Path(args.out), python=args.python, dry_run=args.dry_run,
                            deadline_s=args.deadline if args.deadline is not None else plan.deadline_s, faults=faults)
    except TvmExtError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    records = executor.run()
    ran = [r for r in records if r["status"] != "skipped"]
    print(f"{len(ran)} of {len(records)} steps ran, {sum(r['status'] == 'ok' for r in ran)} ok; results in {args.out}")
    return 0 if all(r["status"] == "ok" for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
