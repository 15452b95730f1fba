"""The README's table of GPU measurements, made from ``bench/results/`` and never typed by hand.

One table per device: a row per model, a column per system, each cell the newest measured
median (ms) of that (model, system) on that device, marked ``wrong`` when its numerics failed,
``failed`` when it raised, ``crashed`` when its process died; the files each cell came from
are listed under it. ``python -m tvm_ext.bench.gpu_table [--check]`` rewrites (or checks) the
block between the README's ``<!-- gpu-table -->`` markers; a test runs ``--check``.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..errors import BenchError

BEGIN, END = "<!-- gpu-table: begin (python -m tvm_ext.bench.gpu_table) -->", "<!-- gpu-table: end -->"
#: Column order: TVM presets as the project lists them, then anything else (torch) by name.
PRESET_ORDER = ("baseline", "stitch", "cutlass", "subprogram", "full", "tilegraph", "orchestrate")
_SKIP_SUFFIXES = ("_kernels.jsonl", "_steps.jsonl")


def _cell(r: dict) -> str:
    if r.get("median_ms") is None:
        error = str(r.get("error") or "no timing")
        if "process crashed" in error or "the process crashed" in error:
            return "crashed"
        if "illegal" in error.lower():
            return "illegal access"
        return "timeout" if "timeout" in error else "failed"
    text = f"{r['median_ms']:.3f}"
    return f"{text} wrong" if r.get("numerics_ok") is False else text


def newest_records(results: Path) -> dict[str, dict[tuple[str, str], tuple[dict, str]]]:
    """device -> (model, system) -> (newest record, its file name); files are ordered by name (date first)."""
    table: dict[str, dict[tuple[str, str], tuple[dict, str]]] = {}
    for path in sorted(results.glob("*.jsonl")):
        if path.name.endswith(_SKIP_SUFFIXES):
            continue
        for line in path.read_text().splitlines():
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("dry_run") or not r.get("device") or "model" not in r or "system" not in r:
                continue
            device = str(r["device"]).split(",")[0].strip()
            table.setdefault(device, {})[(r["model"], r["system"])] = (r, path.stem)
    return table


def render(results: Path) -> str:
    """The markdown tables of every device measured in ``results``."""
    parts = []
    for device, cells in sorted(newest_records(results).items()):
        systems = sorted({s for _, s in cells}, key=lambda s: (PRESET_ORDER.index(s) if s in PRESET_ORDER
                                                                else len(PRESET_ORDER), s))
        models = sorted({m for m, _ in cells})
        lines = [f"**{device}**, median ms per inference (newest measurement of each cell):", "",
                 "| model | " + " | ".join(f"`{s}`" for s in systems) + " |",
                 "|---|" + "---:|" * len(systems)]
        for m in models:
            row = [_cell(cells[(m, s)][0]) if (m, s) in cells else "" for s in systems]
            lines.append(f"| {m} | " + " | ".join(row) + " |")
        files = sorted({f for _, f in cells.values()})
        lines += ["", "From " + ", ".join(f"`{f}`" for f in files) + "."]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) if parts else "No GPU measurement yet."


def update_readme(readme: Path, results: Path, check: bool = False) -> bool:
    """Rewrite the block between the markers of ``readme``; with ``check``, only say whether it matches.

    Raises
    ------
    BenchError
        The README lacks the markers.
    """
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise BenchError(f"{readme} has no {BEGIN} ... {END} block")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{render(results)}\n{END}{tail}"
    if check:
        return new == text
    readme.write_text(new)
    return True


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: rewrite the README's GPU table, or with ``--check`` exit 1 when it is stale."""
    repo = Path(__file__).resolve().parents[2]
    p = argparse.ArgumentParser(prog="python -m tvm_ext.bench.gpu_table", description=__doc__.splitlines()[0])
    p.add_argument("--readme", default=str(repo / "README.md"))
    p.add_argument("--results", default=str(repo / "bench" / "results"))
    p.add_argument("--check", action="store_true", help="exit 1 if the README's table differs from the files")
    args = p.parse_args(argv)
    ok = update_readme(Path(args.readme), Path(args.results), check=args.check)
    if args.check and not ok:
        print(f"{args.readme}: the GPU table differs from {args.results}; run python -m tvm_ext.bench.gpu_table",
              file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
