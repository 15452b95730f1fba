#!/usr/bin/env python3
"""Compile or tune the CUTLASS instances of models.

Compile every distinct instance once per arch (CI check, no GPU needed)::

    python scripts/cutlass_profile.py model.onnx other.onnx --arch sm_80 --arch sm_90a --compile-only

Template search on a GPU machine, results appended to the JSON-lines database::

    python scripts/cutlass_profile.py model.onnx --arch sm_90a --device h100 \
        --tune --db configs/cutlass/database.jsonl
"""
from __future__ import annotations

import argparse
import logging
import sys
import time

from tvm import relax


def _partitioned(path: str, fp16: bool):
    from tvm_ext.cutlass import convert_conv_to_nhwc, partition_for_cutlass
    from tvm_ext.pipeline import load_module

    mod = load_module(path, fp16=fp16)
    return partition_for_cutlass(convert_conv_to_nhwc(mod))


def _functions(mod):
    from tvm_ext.cutlass import CODEGEN_NAME

    return [f for _, f in mod.functions_items()
            if isinstance(f, relax.Function) and f.attrs and f.attrs.get("Codegen") == CODEGEN_NAME]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", help="ONNX files")
    parser.add_argument("--arch", action="append", default=[], help="sm_80, sm_90a, ... (repeatable)")
    parser.add_argument("--device", default=None, help="device name for candidates (a100, h100, ...)")
    parser.add_argument("--no-fp16", action="store_true", help="do not convert the models to fp16")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--compile-only", action="store_true", help="compile each distinct instance once")
    mode.add_argument("--tune", action="store_true", help="profile candidates on this machine's GPU")
    parser.add_argument("--db", default=None, help="JSON-lines database (default configs/cutlass/database.jsonl)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel nvcc processes")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    from tvm_ext.cutlass import Database, workload_from_function
    from tvm_ext.cutlass.codegen import device_for, module_kernels
    from tvm_ext.cutlass.nvcc import compile_many
    from tvm_ext.cutlass.passes import default_database_path
    from tvm_ext.cutlass.profiler import tune

    archs = args.arch or ["sm_80"]
    mods = [_partitioned(path, not args.no_fp16) for path in args.models]
    db_path = args.db or str(default_database_path())
    if args.compile_only:
        for arch in archs:
            sources: dict[str, str] = {}
            for mod in mods:
                sources.update(module_kernels(mod, {"arch": arch, "database": db_path if args.db else ""}))
            start = time.time()
            compile_many(list(sources.values()), arch, jobs=args.jobs)
            logging.info("%s: %d distinct instances compiled in %.0f s", arch, len(sources), time.time() - start)
        return 0
    database = Database(db_path)
    for arch in archs:
        device = device_for(arch, args.device)
        seen = set()
        for mod in mods:
            for func in _functions(mod):
                wl = workload_from_function(func).workload
                if (wl.key(), wl.dtype, wl.final_dtype, wl.epilogue) in seen:
                    continue
                seen.add((wl.key(), wl.dtype, wl.final_dtype, wl.epilogue))
                rec = tune(wl, arch, device, database, jobs=args.jobs)
                logging.info("%s %s: %s %.2f us", arch, wl.key(), rec.config.name(), rec.latency_us)
    return 0


if __name__ == "__main__":
    sys.exit(main())
