"""Planning seconds of orchestrate's sets and subprogram's pieces, and the fit of their budget units.

The searching generators charge their planning budgets (``tvm_ext.select.budget``) in units of their
own, so that where a build stops is the same under any load; a unit is worth its seconds only if
it tracks what planning costs. ``record`` runs the graph stage of the ``orchestrate`` and
``subprogram`` presets on ONNX models and writes one JSON line per distinct set orchestrate plans
(its nodes, whether the stitch planner builds it, seconds) and per piece subprogram designs (its
statements, tensor-core stages, seconds). ``fit`` fits the units on some models by least squares and
prints, per model, the seconds per unit on the others (the constants
``tvm_ext.orchestrate.generator.DLIGHT_SET_UNITS`` and
``tvm_ext.subprogram.generator.TENSOR_CORE_STAGE_UNITS`` cite it).

Usage::

    python3 scripts/planning_units.py record yolov5s_b1_fp32 swin_t_b1_fp32 --out units.jsonl
    python3 scripts/planning_units.py fit bench/planning_units.jsonl \\
        --fit-on yolov5s,swin_t,lstm_s32,convnext_t,bert_base_s128,mobilenet_v2
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import numpy as np
import tvm

import tvm_ext.subprogram.generator as subprogram_generator
from tvm_ext.driver import load_module, preset_passes
from tvm_ext.hardware import resolve_target
from tvm_ext.models.skeleton import load_model, resolve_models
from tvm_ext.orchestrate.generator import OrchestrateGenerator, is_stitched_set
from tvm_ext.subprogram.stages import statements
from tvm_ext.tir.script_import import import_tensor_intrinsics


def record(models: list[str], out: Path, target: str) -> None:
    """Run both presets' graph stages on ``models``, appending a line per set and piece to ``out``."""
    rows: list[dict] = []
    model = [""]
    seen: set = set()
    build, design = OrchestrateGenerator._build, subprogram_generator.design

    def timed_build(gen, ctx, members):
        key = (model[0], gen.name, ctx.signature(members))
        start = time.perf_counter()
        try:
            return build(gen, ctx, members)
        finally:
            if key not in seen:     # a set planned again is memoized (and charged once)
                seen.add(key)
                rows.append({"generator": "orchestrate", "model": model[0], "nodes": len(members),
                             "stitched": is_stitched_set(ctx.graph, members), "seconds": time.perf_counter() - start})

    def timed_design(func, device, tgt):
        start = time.perf_counter()
        made = design(func, device, tgt)        # a piece that fails is not recorded
        rows.append({"generator": "subprogram", "model": model[0], "statements": len(statements(func)),
                     "tensor_core_stages": sum(1 for s in made.stages if s.tensor_cores),
                     "seconds": time.perf_counter() - start})
        return made

    OrchestrateGenerator._build = timed_build
    subprogram_generator.design = timed_design
    import_tensor_intrinsics()
    tgt = resolve_target(target)
    for path in resolve_models(models):
        mod = load_module(load_model(path), fp16=True)
        model[0] = path.stem
        for preset in ("orchestrate", "subprogram"):
            with tgt:
                tvm.transform.Sequential(preset_passes(preset, tgt).graph)(mod)
            with out.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)
            print(f"{path.stem} {preset}: {len(rows)} records", flush=True)
            rows.clear()


def _features(row: dict) -> list[float]:
    if row["generator"] == "orchestrate":
        return [row["nodes"] if row["stitched"] else 0.0, 0.0 if row["stitched"] else 1.0]
    return [row["statements"], row["tensor_core_stages"]]


def fit(path: Path, fit_on: list[str]) -> None:
    """Least squares of seconds on each generator's features over the ``fit_on`` models; per
    model, seconds per fitted unit (the unit: a stitched node, a statement)."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    names = {"orchestrate": ("a stitched node", "a set dlight builds"),
             "subprogram": ("a statement", "a tensor-core stage")}
    for generator, (unit, other) in names.items():
        mine = [r for r in rows if r["generator"] == generator]
        train = [r for r in mine if any(r["model"].startswith(m) for m in fit_on)]
        rest = [r for r in mine if r not in train]
        coef = {}
        for label, part in (("fit", train), ("validation", rest)):
            if part:
                x = np.array([_features(r) for r in part], float)
                coef[label] = np.linalg.lstsq(x, np.array([r["seconds"] for r in part]), rcond=None)[0]
                c = coef[label]
                print(f"{generator} ({label}, {len(part)} records): {1e3 * c[0]:.1f} ms {unit}, "
                      f"{1e3 * c[1]:.1f} ms {other} = {c[1] / c[0]:.1f} units")
        if "fit" not in coef:
            continue
        ratio = coef["fit"][1] / coef["fit"][0]
        per_model: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        for r in mine:
            f = _features(r)
            per_model[r["model"]][0] += f[0] + ratio * f[1]
            per_model[r["model"]][1] += r["seconds"]
        for m, (units, seconds) in per_model.items():
            role = "fit" if any(m.startswith(k) for k in fit_on) else "validation"
            print(f"  {m:28s} {role:10s} {units:8.0f} units {seconds:7.1f} s  {1e3 * seconds / units:5.1f} ms a unit")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("record", help="time planning on models")
    r.add_argument("models", nargs="+", help="ONNX files or seed-model names")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--target", default="tvm_ext/h100")
    f = sub.add_parser("fit", help="fit the units on recorded seconds")
    f.add_argument("records", type=Path)
    f.add_argument("--fit-on", required=True, help="comma-separated model name prefixes to fit on")
    args = p.parse_args(argv)
    if args.command == "record":
        record(args.models, args.out, args.target)
    else:
        fit(args.records, [m.strip() for m in args.fit_on.split(",") if m.strip()])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
