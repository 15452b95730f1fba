#!/usr/bin/env python3
"""Check which corpus models TVM's Relax ONNX importer can import.

Needs TVM (the system Python has it; torch is not needed). For every fp32 file of the
manifest (or the files given), lists the operators the importer has no converter for,
then runs ``tvm.relax.frontend.onnx.from_onnx`` and records success or the error::

    python3 scripts/corpus/check_tvm_import.py --corpus data/corpus
    python3 scripts/corpus/check_tvm_import.py tvm_ext/models/skeletons/*.onnx

Skeletons are filled first. Writes ``tvm_import_<dtype>.json`` next to the manifest (or
to ``--report``) and prints a Markdown table.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import tvm  # noqa: E402,F401
from tvm.relax.frontend.onnx import from_onnx  # noqa: E402
from tvm.relax.frontend.onnx.onnx_frontend import _get_convert_map  # noqa: E402

from tvm_ext.models.skeleton import load_model  # noqa: E402


def check(path: Path) -> dict:
    """Import one model; return its op histogram, unsupported ops and the outcome."""
    model = load_model(path)
    ops = Counter(n.op_type for n in model.graph.node)
    known = _get_convert_map()
    unsupported = sorted(op for op in ops if op not in known)
    result = {"file": path.name, "nodes": len(model.graph.node), "ops": dict(sorted(ops.items())),
              "unsupported": unsupported}
    t0 = time.perf_counter()
    try:
        from_onnx(model, keep_params_in_input=False)
        result["status"] = "ok"
    except (tvm.error.InternalError, ValueError, TypeError, KeyError, IndexError,
            NotImplementedError, AssertionError, AttributeError, RuntimeError) as err:
        result["status"] = "error"
        result["error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"
    result["import_s"] = round(time.perf_counter() - t0, 1)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("files", nargs="*", type=Path)
    p.add_argument("--corpus", type=Path, default=REPO / "data" / "corpus")
    p.add_argument("--dtype", default="fp32", choices=["fp32", "fp16"],
                   help="which manifest files to check (default fp32)")
    p.add_argument("--report", type=Path, default=None)
    args = p.parse_args(argv)
    files = args.files
    if not files:
        manifest = json.loads((args.corpus / "manifest.json").read_text())
        files = [args.corpus / e["path"] for e in manifest["models"] if e["dtype"] == args.dtype]
    results = []
    print("| file | nodes | TVM import | unsupported ops / error | import s |")
    print("|---|---|---|---|---|")
    for path in files:
        r = check(path)
        results.append(r)
        detail = ", ".join(r["unsupported"]) or r.get("error", "")
        print(f"| {r['file']} | {r['nodes']} | {r['status']} | {detail} | {r['import_s']} |",
              flush=True)
    report = args.report or (args.corpus / f"tvm_import_{args.dtype}.json")
    report.write_text(json.dumps(results, indent=1))
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
