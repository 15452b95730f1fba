#!/usr/bin/env python3
"""Check every stitched (or merged subprogram, or tile-graph) kernel of some models: nvcc compiles it, and it
computes what the unscheduled function computes when its threads run one after another on the
CPU (no GPU needed).

For each model the preset's graph and schedule stages run for each target (``--preset stitch``,
the default, ``subprogram`` or ``tilegraph``: the kernels its generator planned are checked); the planned
kernels are code-generated together and the CUDA is compiled with nvcc for the target's arch;
every device kernel with a grid barrier must be marked for cooperative launch; each is also run
thread-serialized on the CPU against its unscheduled form (a merged kernel stage by stage:
:func:`tvm_ext.testing.kernel_check.check_planned_kernels`, skip with ``--no-cpu``). Fallbacks
are listed too::

    python3 scripts/stitch_kernel_check.py                                # every skeleton, sm_80 + sm_90
    python3 scripts/stitch_kernel_check.py --variants bert_base_s128_b1_fp32  # + every shape variant
    python3 scripts/stitch_kernel_check.py vit_b16_b1_fp32 --targets tvm_ext/h100
    python3 scripts/stitch_kernel_check.py --preset subprogram --fp16 bert_base_s128_b1_fp32 lstm_s32_b1_fp32
    python3 scripts/stitch_kernel_check.py --preset subprogram --every-candidate --variants   # all merged kernels

Exit status: 0 if every model's planned kernels compile, match on the CPU, none fell back and
every grid barrier is launched cooperatively, 1 otherwise.
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
from tvm_ext.models import VARIANTS  # noqa: E402
from tvm_ext.models.skeleton import load_model, resolve_models  # noqa: E402
from tvm_ext.testing.kernel_check import check_planned_kernels, every_candidate  # noqa: E402
from preset_numerics import report_row  # noqa: E402  (one JSON line per row, as preset_numerics writes)

log = logging.getLogger("stitch_kernel_check")


def check_model(name: str, model, target_name: str, cpu: bool = True, fp16: bool = False,
                preset: str = "stitch", every: bool = False) -> dict:
    """Build ``model`` (imported in fp16 with ``fp16``) with ``preset`` for ``target_name`` and run
    the kernel check (:func:`tvm_ext.testing.kernel_check.check_planned_kernels`) on the kernels
    that preset's own generator planned (with ``every``, every candidate it proposed:
    :func:`~tvm_ext.testing.kernel_check.every_candidate`)."""
    target = tvm.target.Target(target_name)
    result = check_planned_kernels(from_onnx(model, fp16=fp16), target, generator=preset, cpu=cpu,
                                   preset=every_candidate(preset) if every else preset)
    return {"model": name, "preset": preset, "target": target_name, "fp16": fp16, **result.to_json()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="skeleton names, variant names or ONNX paths "
                                                  "(default: every skeleton)")
    parser.add_argument("--variants", action="store_true", help="also every shape variant (tvm_ext.models.VARIANTS)")
    parser.add_argument("--targets", nargs="+", default=["tvm_ext/a100", "tvm_ext/h100"])
    parser.add_argument("--json", type=Path, default=None, help="append one JSON line per model and target")
    parser.add_argument("--no-cpu", action="store_true", help="skip the thread-serialized CPU comparison")
    parser.add_argument("--fp16", action="store_true", help="import the models in fp16")
    parser.add_argument("--preset", choices=["stitch", "subprogram", "tilegraph"], default="stitch",
                        help="whose planned kernels to check (default: stitch)")
    parser.add_argument("--every-candidate", action="store_true",
                        help="build every candidate the preset's generator proposes, not only those the "
                             "cost model selects (priority selection)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    files = [n for n in args.models if n not in VARIANTS]
    try:
        paths = resolve_models(files) if files or not args.models else []     # no names: every skeleton
    except TvmExtError as err:
        parser.error(str(err))
    models = [(p.stem, lambda p=p: load_model(p)) for p in paths]
    models += [(n, VARIANTS[n]) for n in (sorted(VARIANTS) if args.variants else [])
               if n not in args.models] + [(n, VARIANTS[n]) for n in args.models if n in VARIANTS]
    failed = 0
    for name, build in models:
        for target_name in args.targets:
            start = time.perf_counter()
            try:
                row = check_model(name, build(), target_name, cpu=not args.no_cpu, fp16=args.fp16,
                                  preset=args.preset, every=args.every_candidate)
            except TvmExtError as err:
                row = {"model": name, "target": target_name, "ok": False, "error": f"{type(err).__name__}: {err}"}
            row["seconds"] = round(time.perf_counter() - start, 1)
            failed += not row["ok"]
            report_row(row, args.json)
    total = len(models) * len(args.targets)
    log.info("%d of %d model/target pairs pass (nvcc, no fallback, CPU numerics)", total - failed, total)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
