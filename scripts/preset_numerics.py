#!/usr/bin/env python3
"""Compare two presets' graph stages on the CPU, model by model (no GPU).

Each model is imported once, built for ``llvm`` with each preset's graph stage, and run on the
same random inputs; outputs are compared elementwise within the fp32 tolerance of the oracle.
With ``onnxruntime`` as the reference, the preset is checked against onnxruntime instead
(:func:`tvm_ext.testing.oracle.check_model`).
Skeletons (``tvm_ext/models/skeletons``) are refilled deterministically, so the comparison needs
no corpus. Unscheduled ``llvm`` builds of large models take minutes each::

    python3 scripts/preset_numerics.py                              # all skeletons, stitch vs baseline
    python3 scripts/preset_numerics.py bert_large_s128_b1_fp32 --json out/stitch_numerics.json
    python3 scripts/preset_numerics.py --presets onnxruntime tilegraph

Exit status: 0 if every model matches, 1 on a mismatch or a failed build, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tvm_ext.errors import TvmExtError  # noqa: E402
from tvm_ext.frontend import from_onnx, random_inputs  # noqa: E402
from tvm_ext.models.skeleton import load_model, resolve_models  # noqa: E402
from tvm_ext.testing.compare import compare_outputs  # noqa: E402
from tvm_ext.testing.oracle import build_cpu, check_model, run_cpu  # noqa: E402
from tvm_ext.testing.tolerance import tolerance_for  # noqa: E402

log = logging.getLogger("preset_numerics")
#: The reference name that means onnxruntime rather than a preset.
ONNXRUNTIME = "onnxruntime"


def compare_model(path: Path, presets: tuple[str, str], seed: int = 0) -> dict:
    """Build ``path`` with both presets for llvm, run both on one input set, compare the outputs
    (with ``onnxruntime`` as the first preset: check the second against onnxruntime)."""
    proto = load_model(path)
    if presets[0] == ONNXRUNTIME:
        start = time.perf_counter()
        res = check_model(proto, presets[1], seed=seed)
        return {"model": path.stem, "ok": res.ok, "rtol": res.rtol, "atol": res.atol,
                "max_abs_err": res.max_abs_err, "max_tol_ratio": res.max_tol_ratio, "outputs": len(res.outputs),
                "seconds": {presets[1]: round(time.perf_counter() - start, 1)}}
    mod = from_onnx(proto)
    inputs = random_inputs(mod, seed=seed)
    outputs, seconds = [], {}
    for preset in presets:
        start = time.perf_counter()
        vm = build_cpu(mod, preset)
        outputs.append(run_cpu(vm, inputs, num_outputs=len(proto.graph.output)))
        seconds[preset] = round(time.perf_counter() - start, 1)
    rtol, atol = tolerance_for("float32")
    errors = compare_outputs(outputs[1], outputs[0], rtol=rtol, atol=atol,
                             names=[o.name for o in proto.graph.output])
    finite = [e for e in errors if e.size]
    return {"model": path.stem, "ok": all(e.ok for e in errors), "rtol": rtol, "atol": atol,
            "max_abs_err": max((e.max_abs_err for e in finite), default=0.0),
            "max_tol_ratio": max((e.tol_ratio for e in finite), default=0.0),
            "outputs": len(errors), "seconds": seconds}


def report_row(row: dict, json_path: Path | None) -> None:
    """Log ``row`` as JSON and append it to ``json_path`` (one JSON object per line)."""
    log.info("%s", json.dumps(row))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        with json_path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="skeleton names or ONNX paths (default: every skeleton)")
    parser.add_argument("--presets", nargs=2, default=["baseline", "stitch"], metavar=("REFERENCE", "PRESET"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="append one JSON line per model here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        paths = resolve_models(args.models)
    except TvmExtError as err:
        parser.error(str(err))
    failed = 0
    for path in paths:
        try:
            row = compare_model(path, tuple(args.presets), seed=args.seed)
        except TvmExtError as err:
            row = {"model": path.stem, "ok": False, "error": f"{type(err).__name__}: {err}"}
        failed += not row["ok"]
        report_row(row, args.json)
    log.info("%d of %d models match (%s vs %s)", len(paths) - failed, len(paths), *reversed(args.presets))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
