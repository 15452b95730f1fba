#!/usr/bin/env python3
"""Check every stitched kernel of some models: nvcc compiles it, and it computes what the
unscheduled function computes when its threads run one after another on the CPU (no GPU needed).

For each model the ``stitch`` preset's graph and schedule stages run for each target; the
PrimFuncs the schedule stage stitched (report ``"stitched..."``) are code-generated together
and the CUDA is compiled with nvcc for the target's arch; each is also run thread-serialized on
the CPU against its unscheduled form (:mod:`tvm_ext.testing.thread_serial`, skip with
``--no-cpu``). Fallbacks are listed too::

    python3 scripts/stitch_kernel_check.py                                # every skeleton, sm_80 + sm_90
    python3 scripts/stitch_kernel_check.py vit_b16_b1_fp32 --targets tvm_ext/h100

Exit status: 0 if every model's stitched kernels compile, match on the CPU and none fell back,
1 otherwise.
"""
from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tvm  # noqa: E402

from tvm_ext.errors import TvmExtError  # noqa: E402
from tvm_ext.frontend import from_onnx  # noqa: E402
from tvm_ext.toolchain import compile_cuda_source  # noqa: E402
from tvm_ext.models.skeleton import load_model, resolve_models  # noqa: E402
from tvm_ext.driver import preset_passes  # noqa: E402
from tvm_ext.select import planned_by  # noqa: E402
from tvm_ext.testing.thread_serial import call_inputs, compare_scheduled  # noqa: E402
from preset_numerics import report_row  # noqa: E402  (one JSON line per row, as preset_numerics writes)
from tvm_ext.tir import PIPELINE_NAME  # noqa: E402

log = logging.getLogger("stitch_kernel_check")


def check_model(path: Path, target_name: str, cpu: bool = True, fp16: bool = False) -> dict:
    """Stitch ``path`` (imported in fp16 with ``fp16``) for ``target_name``, nvcc-compile its
    stitched kernels and (``cpu``) run each thread-serialized against its unscheduled form."""
    target = tvm.target.Target(target_name)
    mod = from_onnx(load_model(path), fp16=fp16)
    with target:
        stages = preset_passes("stitch", target)
        fused = tvm.transform.Sequential(stages.graph)(mod)
        scheduled = tvm.transform.Sequential(stages.schedule)(fused)
    report = planned_by(scheduled, "stitch")
    ours = {name: scheduled[name].with_attr("global_symbol", name)
            for name, verdict in report.items() if verdict.startswith("stitched")}
    row = {"model": path.stem, "target": target_name, "fp16": fp16, "stitched": len(ours),
           "kinds": sorted({report[n] for n in ours}),
           "fallbacks": {n: v for n, v in report.items() if not v.startswith("stitched")}}
    if ours:
        with target:
            lib = tvm.tirx.build(tvm.IRModule(ours), target=target, pipeline=PIPELINE_NAME)
        result = compile_cuda_source(lib.imports[0].inspect_source(), target)
        row.update(arch=result.arch, nvcc_seconds=round(result.seconds, 1), fatbin_bytes=result.binary_bytes)
    if cpu:
        checks = {name: compare_scheduled(fused[name], scheduled[name], inputs=call_inputs(fused, name))
                  for name in ours}
        row["cpu_mismatch"] = sorted(name for name, c in checks.items() if not c.ok)
        row["cpu_max_abs_err"] = max((c.max_abs_err for c in checks.values()), default=0.0)
    row["ok"] = not row["fallbacks"] and not row.get("cpu_mismatch")
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="skeleton names or ONNX paths (default: every skeleton)")
    parser.add_argument("--targets", nargs="+", default=["tvm_ext/a100", "tvm_ext/h100"])
    parser.add_argument("--json", type=Path, default=None, help="append one JSON line per model and target")
    parser.add_argument("--no-cpu", action="store_true", help="skip the thread-serialized CPU comparison")
    parser.add_argument("--fp16", action="store_true", help="import the models in fp16")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        paths = resolve_models(args.models)
    except TvmExtError as err:
        parser.error(str(err))
    failed = 0
    for path in paths:
        for target_name in args.targets:
            start = time.perf_counter()
            try:
                row = check_model(path, target_name, cpu=not args.no_cpu, fp16=args.fp16)
            except TvmExtError as err:
                row = {"model": path.stem, "target": target_name, "ok": False, "error": f"{type(err).__name__}: {err}"}
            row["seconds"] = round(time.perf_counter() - start, 1)
            failed += not row["ok"]
            report_row(row, args.json)
    log.info("%d of %d model/target pairs pass (nvcc, no fallback, CPU numerics)", len(paths) * len(args.targets) - failed,
             len(paths) * len(args.targets))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
