#!/usr/bin/env python3
"""Compile every distinct CUTLASS instance of the seed suite for sm_80 and sm_90a (no GPU needed).

Each model (``tvm_ext/models/skeletons/*.onnx`` by default) is imported in fp16 and partitioned
by the ``cutlass`` preset; kernels are shape-generic, so each distinct instance is compiled once
per arch (cached under ``$TVM_EXT_CUTLASS_CACHE``, default ``~/.cache/tvm_ext/cutlass``),
overlapping with the import of later models. Each model's TVM-FFI glue is compiled too.

    python scripts/compile_cutlass_suite.py                      # whole suite, both archs
    python scripts/compile_cutlass_suite.py --dry-run --json plan.json   # counts only, no nvcc
    python scripts/compile_cutlass_suite.py --models resnet50_b1_fp32 --arch sm_80 --jobs 1

Every call is also checked on the host (``tvm_ext.cutlass.contract``: ``can_implement``, operand
ranges, emulated outputs). Exit status 1 if any instance or glue fails to compile or a call has
a contract finding.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path


def _paths(names: list[str]) -> list[Path]:
    from tvm_ext.models.skeleton import SKELETON_DIR

    if not names:
        return sorted(SKELETON_DIR.glob("*.onnx"))
    return [Path(n) if n.endswith(".onnx") else SKELETON_DIR / f"{n}.onnx" for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=[], help="skeleton names or .onnx paths (default: all)")
    parser.add_argument("--arch", action="append", default=[], help="sm_80, sm_90a (repeatable; default both)")
    parser.add_argument("--jobs", type=int, default=2, help="parallel nvcc processes (default 2)")
    parser.add_argument("--heavy-jobs", type=int, default=1, help="of which CUTLASS 3.x at most (default 1)")
    parser.add_argument("--db", default=None, help="tuning database (default: the preset's)")
    parser.add_argument("--dry-run", action="store_true", help="emit and count the instances, compile nothing")
    parser.add_argument("--json", default=None, help="write the plan / timings here")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    logging.getLogger("tvm_ext.cutlass.codegen").setLevel(logging.WARNING)  # one line per offload otherwise

    from tvm_ext.cutlass.suite import compile_suite, plan_suite

    archs = args.arch or ["sm_80", "sm_90a"]
    paths = _paths(args.models)
    start = time.perf_counter()
    if args.dry_run:
        plan, compiler = plan_suite(paths, archs, args.db), None
    else:
        plan, compiler = compile_suite(paths, archs, jobs=args.jobs, heavy_jobs=args.heavy_jobs, database=args.db,
                                       progress=not args.no_progress)
    glue_errors = compiler.glue_errors if compiler is not None else {}
    total = time.perf_counter() - start
    report = {"archs": archs, "models": [p.stem for p in paths], "summary": plan.summary(),
              "planning_seconds": round(plan.seconds_planning, 1), "total_seconds": round(total, 1),
              "instances": [{"arch": i.arch, "entry": i.entry, "key": i.key, "users": i.users}
                            for i in plan.all_instances()]}
    failed = []
    if compiler is not None:
        results = {(r.arch, r.entry): r for r in compiler.results}
        for item in report["instances"]:
            res = results[(item["arch"], item["entry"])]
            item.update(seconds=round(res.seconds, 1), cached=res.cached)
            if res.error:
                item["error"] = res.error[-2000:]
                failed.append(res)
        report.update(compile_wall_seconds=round(compiler.wall_seconds, 1),
                      compile_cpu_seconds=round(compiler.cpu_seconds, 1), glue_errors=glue_errors)
    for arch, counts in report["summary"].items():
        logging.info("%s: %d offloads -> %d distinct instances (%d CUTLASS 3.x)", arch, counts["offloads"],
                     counts["instances"], counts["instances_3x"])
    if compiler is not None:
        logging.info("compiled in %.0f s wall, %.0f s CPU (nvcc + g++); total %.0f s; %d failures",
                     compiler.wall_seconds, compiler.cpu_seconds, total, len(failed) + len(glue_errors))
    refused = [f"{model} {arch} {r.line()}" for (model, arch), results in plan.verdicts.items()
               for r in results if not r.ok]
    if compiler is not None:
        checked = sum(len(v) for v in plan.verdicts.values())
        logging.info("contract check on the host: %d calls, %d with findings", checked, len(refused))
        report["contract_findings"] = refused
        for line in refused:
            logging.error(line)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 1 if failed or glue_errors or refused else 0


if __name__ == "__main__":
    sys.exit(main())
