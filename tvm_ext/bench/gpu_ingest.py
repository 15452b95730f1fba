"""Bring a GPU run's results into the project: ``tvm-ext gpu-run ingest OUT --run DIR``.

From what the executor wrote under ``OUT`` (:mod:`.gpu_execute`):

* ``bench/results/<date>_<device>_<commit>.jsonl`` + ``.md`` - the measurement rows;
* ``..._steps.jsonl`` + ``.md`` - every step with its status and wall seconds (the next plan's
  estimates come from these), sanitizer findings quoted from the logs;
* ``..._kernels.jsonl`` + ``.md`` and ``bench/measurements/<device>.jsonl`` - the Nsight Compute
  profiles joined with the bundle (``scripts/kernel_report.py``), records appended by structural key;
* the README's GPU table regenerated (:mod:`.gpu_table`).
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import BenchError
from .bundle import REPO
from .gpu_steps import Plan
from .gpu_table import update_readme
from .results import markdown_table, results_name

#: compute-sanitizer's report lines: memcheck (Invalid ... read/write, Program hit), racecheck (Error: Race
#: reported, RACECHECK SUMMARY), synccheck (Barrier error), initcheck (Uninitialized), and the summary.
_SANITIZER_LINE = re.compile(r"^=========\s+(Error:|Invalid|Race|Barrier|Uninitialized|Program hit|ERROR SUMMARY|"
                             r"RACECHECK SUMMARY|.*hazard)")


def _device(out: Path) -> tuple[str, str]:
    """(device name as the driver says it, description tag such as ``h100``)."""
    info = json.loads((out / "device.txt").read_text()) if (out / "device.txt").is_file() else {}
    name = str(info.get("gpu") or "unknown").split(",")[0].strip()
    low = name.lower()
    tag = next((t for t in ("h200", "h100", "a100", "l40s", "a10g", "rtx4090") if t in low.replace(" ", "")), "unknown")
    return name, tag


def sanitizer_findings(log: str, limit: int = 8) -> list[str]:
    """The report lines of a compute-sanitizer log (hazards, invalid accesses, the error summary)."""
    return [line.strip() for line in log.splitlines() if _SANITIZER_LINE.match(line)][:limit]


def _steps_markdown(steps: Sequence[dict], out: Path) -> str:
    lines = ["| step | status | wall s | planned s | note |", "|---|---|---:|---:|---|"]
    for s in steps:
        note = s.get("reason") or ""
        if s["kind"] == "sanitize" and s.get("log") and (out / s["log"]).is_file():
            found = sanitizer_findings((out / s["log"]).read_text(errors="replace"))
            note = "; ".join([note] + found if note else found)
        wall = f"{s['wall_s']:.1f}" if s.get("wall_s") is not None else ""
        lines.append(f"| {s['step']} | {s['status']} | {wall} | {s['estimate_s']:.1f} | {note[:300]} |")
    return "\n".join(lines) + "\n"


def ingest(out: str | Path, run_dir: str | Path, *, results: Path = REPO / "bench" / "results",
           measurements: Path = REPO / "bench" / "measurements", readme: Path = REPO / "README.md",
           label: str | None = None) -> list[Path]:
    """Copy a run's results into the project (see the module docstring); returns the files written.

    Raises
    ------
    BenchError
        ``out`` holds no ``steps.jsonl`` (the executor did not run there).
    """
    out, run_dir = Path(out), Path(run_dir)
    if not (out / "steps.jsonl").is_file():
        raise BenchError(f"{out} holds no steps.jsonl: not the output of `gpu_execute`")
    plan = Plan.read(run_dir)
    steps = [json.loads(line) for line in (out / "steps.jsonl").read_text().splitlines() if line.strip()]
    if all(s.get("dry_run") for s in steps):
        raise BenchError(f"{out} is a dry run: only measurements taken on a GPU go into {results}")
    rows = ([json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
            if (out / "results.jsonl").is_file() else [])
    device, tag = _device(out)
    date = min((r["date"] for r in rows if r.get("date")), default=plan.created)
    stem = results_name(date, device, plan.commit) + (f"_{label}" if label else "")
    results.mkdir(parents=True, exist_ok=True)
    written = []
    if rows:
        (results / f"{stem}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (results / f"{stem}.md").write_text(markdown_table(rows))
        written += [results / f"{stem}.jsonl", results / f"{stem}.md"]
    (results / f"{stem}_steps.jsonl").write_text("".join(json.dumps({k: v for k, v in s.items() if k != "tail"})
                                                         + "\n" for s in steps))
    (results / f"{stem}_steps.md").write_text(_steps_markdown(steps, out))
    written += [results / f"{stem}_steps.jsonl", results / f"{stem}_steps.md"]
    if any((out / "ncu").glob("*.csv")):
        bundle = run_dir / json.loads((out / "device.txt").read_text()).get("bundle", next(iter(plan.targets)))
        cmd = [sys.executable, str(REPO / "scripts" / "kernel_report.py"), str(bundle), str(out), "--device", tag,
               "--out", str(results / f"{stem}_kernels"), "--database", str(measurements / f"{tag}.jsonl")]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode not in (0, 1):  # 1: some profiles did not match their build (reported in its output)
            raise BenchError(f"kernel_report failed: {proc.stderr.strip()[-800:]}")
        written += [results / f"{stem}_kernels.jsonl", results / f"{stem}_kernels.md"]
    update_readme(readme, results)
    written.append(readme)
    return written


__all__ = ["ingest", "sanitizer_findings"]
