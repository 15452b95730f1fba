"""`tvm-ext verify` over models and presets: kernels checked, unchecked (why) and findings per build.

Each (model, preset) runs as its own ``tvm-ext verify --json`` process (a build that crashes or
runs past ``--timeout`` is a row saying so, not the end of the run). Rows are appended to a JSON
lines file as they finish, so an interrupted run resumes where it stopped (``--json`` again);
``--markdown`` writes the table the closing notes and ``bench/`` quote: per preset, the kernels,
how many were checked, the unchecked ones grouped by reason, and every kernel with findings.

Usage::

    python3 scripts/verify_suite.py --seed-suite --presets full --fp16 --json verify.jsonl --markdown verify.md
    python3 scripts/verify_suite.py mobilenet_v2_b1_fp32 --presets tilegraph,stitch --fp16
    python3 scripts/verify_suite.py vit_b16_b1_fp32 --presets subprogram --fp16 --emulation-seconds 900
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from tvm_ext.models.skeleton import resolve_models


def verify_one(path: Path, preset: str, fp16: bool, target: str, timeout: float,
               emulation_seconds: float | None = None) -> dict:
    """One ``tvm-ext verify`` run as a row: counts, unchecked reasons, findings, seconds, status
    (``emulation_seconds``: each launch's emulation limit, the CLI's default when None)."""
    cmd = [sys.executable, "-m", "tvm_ext", "--quiet", "verify", str(path), "--preset", preset, "--target", target,
           "--json"] + (["--fp16"] if fp16 else [])
    if emulation_seconds is not None:
        cmd += ["--emulation-seconds", str(emulation_seconds)]
    start = time.perf_counter()
    row = {"model": path.stem, "preset": preset, "target": target, "fp16": fp16}
    if emulation_seconds is not None:
        row["emulation_seconds"] = emulation_seconds
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return dict(row, status=f"timed out after {timeout:.0f} s", seconds=round(time.perf_counter() - start, 1))
    row["seconds"] = round(time.perf_counter() - start, 1)
    try:
        report = json.loads(done.stdout)
    except json.JSONDecodeError:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return dict(row, status=f"failed (exit {done.returncode}): {last}")
    kernels = report["kernels"]
    row.update(status="ok" if done.returncode == 0 else "findings", counts=report["counts"], notes=report["notes"],
               unchecked=[{"kernel": k["kernel"], "generator": k["generator"], "why": k["details"][-1] if k["details"]
                           else k["checks"]} for k in kernels if k["verdict"] == "unchecked"],
               findings=[{"kernel": k["kernel"], "generator": k["generator"], "details": k["details"]}
                         for k in kernels if k["verdict"] == "findings"])
    return row


def _reason(text: str) -> str:
    """An unchecked kernel's reason without its kernel-specific names (for grouping)."""
    return text.split(":")[0][:80]


def markdown(rows: list[dict]) -> str:
    """Per (model, preset): kernels, checked, unchecked by reason, findings."""
    lines = ["| model | preset | kernels | ok | warnings | findings | unchecked | s | unchecked why / findings |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "counts" not in r:
            lines.append(f"| {r['model']} | {r['preset']} |  |  |  |  |  | {r.get('seconds', '')} | {r['status']} |")
            continue
        c = r["counts"]
        why = Counter(_reason(u["why"]) for u in r["unchecked"])
        notes = [f"{n}x {w}" for w, n in why.most_common()]
        notes += [f"**{f['kernel']}** ({f['generator']}): {'; '.join(f['details'])[:200]}" for f in r["findings"]]
        lines.append(f"| {r['model']} | {r['preset']} | {c['kernels']} | {c['ok']} | {c['warnings']} | "
                     f"{c['findings']} | {c['unchecked']} | {r['seconds']} | {'<br>'.join(notes)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("models", nargs="*", help="ONNX paths or skeleton names")
    p.add_argument("--seed-suite", action="store_true", help="every committed seed model")
    p.add_argument("--presets", default="full", help="comma-separated presets (default full)")
    p.add_argument("--fp16", action="store_true")
    p.add_argument("--target", default="tvm_ext/h100")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per (model, preset)")
    p.add_argument("--emulation-seconds", type=float, default=None,
                   help="each launch's emulation limit (tvm-ext verify's --emulation-seconds; its default if unset)")
    p.add_argument("--json", type=Path, help="JSON lines file: rows appended, rows already there skipped")
    p.add_argument("--markdown", type=Path, help="write the table here")
    args = p.parse_args(argv)
    paths = resolve_models([]) if args.seed_suite else resolve_models(args.models)
    done = []
    if args.json and args.json.exists():
        done = [json.loads(line) for line in args.json.read_text().splitlines() if line.strip()]
    have = {(r["model"], r["preset"]) for r in done}
    rows = list(done)
    for path in paths:
        for preset in args.presets.split(","):
            if (path.stem, preset) in have:
                continue
            row = verify_one(path, preset, args.fp16, args.target, args.timeout, args.emulation_seconds)
            rows.append(row)
            c = row.get("counts", {})
            print(f"{path.stem:<28} {preset:<10} {row['status']:<10} {c.get('kernels', '-')} kernels, "
                  f"{c.get('findings', '-')} with findings, {c.get('unchecked', '-')} unchecked, {row['seconds']} s",
                  flush=True)
            if args.json:
                with args.json.open("a") as fh:
                    fh.write(json.dumps(row) + "\n")
    if args.markdown:
        args.markdown.write_text(markdown(rows))
    return 0 if all(r.get("status") == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
