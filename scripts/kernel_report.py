"""Join the Nsight Compute profiles of a GPU run (`scripts/gpu_run.sh`) with their bundle's manifest.

    python3 scripts/kernel_report.py BUNDLE MEASURED_DIR --device h200 \
        [--out bench/results/NAME] [--database bench/measurements/h200.jsonl]

Reads MEASURED_DIR/ncu.tar.gz (or MEASURED_DIR/ncu/), one ``MODEL__SYSTEM.csv`` per profiled build,
and writes OUT.jsonl (one line per function: measured and modelled seconds per call, DRAM bytes
against modelled traffic), OUT.md (the table and a summary per generator) and, with
``--database``, one measurement record per function the cost model can look up or learn from.
"""
from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from pathlib import Path

from tvm_ext.bench.kernel_report import database_records, kernel_rows, markdown, parse_ncu_csv, summary
from tvm_ext.bench.manifest import read_manifest
from tvm_ext.errors import BenchError
from tvm_ext.select.database import Database


def profiles(measured: Path) -> dict[str, str]:
    """``MODEL__SYSTEM`` -> CSV text."""
    found: dict[str, str] = {}
    archive = measured / "ncu.tar.gz"
    if archive.is_file():
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.endswith(".csv"):
                    found[Path(member.name).stem] = io.TextIOWrapper(tar.extractfile(member)).read()
    for path in sorted((measured / "ncu").glob("*.csv")):
        found[path.stem] = path.read_text()
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("bundle")
    p.add_argument("measured", help="OUT of scripts/gpu_run.sh (its ncu/ folder)")
    p.add_argument("--device", required=True, help="device description the GPU was (h100, h200)")
    p.add_argument("--out", default=None, help="output stem (default MEASURED/kernels)")
    p.add_argument("--database", default=None, help="append measurement records to this database")
    args = p.parse_args(argv)
    manifest = read_manifest(args.bundle)
    rows, problems = [], []
    for stem, text in sorted(profiles(Path(args.measured)).items()):
        model, _, system = stem.partition("__")
        try:
            kernels = parse_ncu_csv(text)
            got = kernel_rows(manifest, model, system, kernels)
        except BenchError as err:
            problems.append(f"{stem}: {err}")
            continue
        build = next(b for b in manifest.model(model).builds if b.system == system)
        if len(kernels) != build.kernels:
            problems.append(f"{stem}: profiled {len(kernels)} launches, the build reports {build.kernels}")
        rows += got
    out = Path(args.out) if args.out else Path(args.measured) / "kernels"
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".jsonl"), "w") as f:
        for row in rows:
            f.write(json.dumps({**row.to_json(), "device": args.device, "commit": manifest.commit,
                                "target": manifest.target}) + "\n")
    stats = summary(rows)
    text = markdown(rows) + "\n```json\n" + json.dumps(stats, indent=1) + "\n```\n"
    if problems:
        text += "\nProblems:\n" + "".join(f"- {p}\n" for p in problems)
    out.with_suffix(".md").write_text(text)
    if args.database:
        db = Database(args.database)
        for record in database_records(manifest, rows, args.device):
            db.add(record)
    print(json.dumps(stats["all"]), *problems, sep="\n")
    return 1 if problems and not rows else 0


if __name__ == "__main__":
    sys.exit(main())
