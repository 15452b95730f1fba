#!/usr/bin/env python3
"""Compile or tune the CUTLASS instances of models (ONNX files or skeletons).

Compile every distinct (shape-generic) instance once per arch (no GPU needed)::

    python scripts/cutlass_profile.py model.onnx other.onnx --arch sm_80 --arch sm_90a --compile-only

The whole seed suite: ``--compile-only --suite`` (the same as ``scripts/compile_cutlass_suite.py``).

Template search on a GPU machine, results appended to the JSON-lines database::

    python scripts/cutlass_profile.py model.onnx --arch sm_90a --device h100 \
        --tune --db configs/cutlass/database.jsonl
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", help="ONNX files (skeletons are filled)")
    parser.add_argument("--suite", action="store_true", help="add every skeleton of tvm_ext/models/skeletons")
    parser.add_argument("--arch", action="append", default=[], help="sm_80, sm_90a, ... (repeatable)")
    parser.add_argument("--device", default=None, help="device name for candidates (a100, h100, ...)")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--compile-only", action="store_true", help="compile each distinct instance once")
    mode.add_argument("--tune", action="store_true", help="profile candidates on this machine's GPU")
    parser.add_argument("--db", default=None, help="JSON-lines database (default configs/cutlass/database.jsonl)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel nvcc processes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("tvm_ext.cutlass.codegen").setLevel(logging.WARNING)

    from tvm_ext.cutlass import Database, workload_from_function
    from tvm_ext.cutlass.codegen import device_for
    from tvm_ext.cutlass.passes import default_database_path
    from tvm_ext.cutlass.profiler import tune
    from tvm_ext.cutlass.suite import compile_suite, load_fp16_model, offloaded_functions
    from tvm_ext.models.skeleton import SKELETON_DIR

    paths = [Path(p) for p in args.models] + (sorted(SKELETON_DIR.glob("*.onnx")) if args.suite else [])
    if not paths:
        parser.error("give model files or --suite")
    archs = args.arch or ["sm_80"]
    if args.compile_only:
        plan, compiler = compile_suite(paths, archs, jobs=args.jobs, database=args.db)
        glue_errors = compiler.glue_errors
        for arch, counts in plan.summary().items():
            logging.info("%s: %d offloads, %d distinct instances (%d CUTLASS 3.x)", arch, counts["offloads"],
                         counts["instances"], counts["instances_3x"])
        failed = [r for r in compiler.results if r.error]
        for res in failed:
            logging.error("%s %s failed:\n%s", res.arch, res.key, res.error[-2000:])
        logging.info("compiled in %.0f s (%.0f s CPU)", compiler.wall_seconds, compiler.cpu_seconds)
        return 1 if failed or glue_errors else 0
    db_path = args.db or str(default_database_path())
    database = Database(db_path)
    seen = set()
    for path in paths:
        mod = load_fp16_model(path)
        for arch in archs:
            device = device_for(arch, args.device)
            for func in offloaded_functions(mod, arch, db_path):
                wl = workload_from_function(func).workload
                if (arch, wl.key(), wl.dtype, wl.final_dtype, wl.epilogue) in seen:
                    continue
                seen.add((arch, wl.key(), wl.dtype, wl.final_dtype, wl.epilogue))
                rec = tune(wl, arch, device, database, jobs=args.jobs)
                logging.info("%s %s: %s %.2f us", arch, wl.key(), rec.config.name(), rec.latency_us)
    return 0


if __name__ == "__main__":
    sys.exit(main())
