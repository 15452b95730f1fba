"""Planning time per generator: the graph stage of a preset on ONNX models and BERT stacks.

Runs each preset's graph stage (every generator proposes, the selector picks; no scheduling, no
re-selection rounds) and prints, per model and preset, the call nodes, the seconds each generator
took to propose and the work units it charged to its planning budget per call node (summed over
the stage's runs: a preset with the horizontal transform runs it on both graphs), the whole stage,
and any planning-budget note. ``--bert`` adds stacks of BERT
layers (``tvm_ext.models.bert.bert_layer``, chained) and ``--swin`` stacks of Swin blocks
(``tvm_ext.models.swin.swin_block``, shifted and unshifted alternating) to see how the time grows
with depth: with identical layers planned once, it should grow far slower than the layer count.

``--end-to-end`` times what a user waits for instead: ``tvm-ext inspect`` of each ONNX model, each
in a fresh process (import, graph stage, scheduling, lowering, the build with its CUTLASS
compiles, which the on-disk cache makes cold or warm), with the seconds of each stage and of each
generator, the modelled time and the budget notes; ``--markdown`` writes those rows as a table.

Usage::

    python3 scripts/planning_time.py MODEL.onnx [MODEL.onnx ...] [--presets full,tilegraph] [--fp16]
    python3 scripts/planning_time.py --seed-suite --fp16 --end-to-end --json e2e.json --markdown e2e.md
    python3 scripts/planning_time.py --seed-suite --fp16 --json planning.json
    python3 scripts/planning_time.py --bert 1,2,4,8 --presets tilegraph --fp16
    python3 scripts/planning_time.py --swin 1,2,4,8 --presets full --fp16
    python3 scripts/planning_time.py swin_t_b1_fp32 --fp16 --end-to-end --unlimited   # what the budget costs
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import time
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import onnx
import tvm
from onnx import compose

from tvm_ext.driver import get_preset, load_module, preset_passes
from tvm_ext.driver.presets import Preset
from tvm_ext.graph import OpGraph
from tvm_ext.hardware import resolve_target
from tvm_ext.inspect import inspect
from tvm_ext.models.bert import bert_layer
from tvm_ext.models.skeleton import load_model, resolve_models
from tvm_ext.models.swin import swin_block
from tvm_ext.select.attrs import SELECTION_ATTR
from tvm_ext.select.budget import UNLIMITED
from tvm_ext.select.progress import ProgressEvent, listening
from tvm_ext.tir.script_import import import_tensor_intrinsics


def bert_stack(layers: int, seq: int = 128, hidden: int = 256, heads: int = 4) -> onnx.ModelProto:
    """``layers`` BERT layers (no attention mask) chained output to input."""
    def layer(k: int) -> onnx.ModelProto:
        return compose.add_prefix(bert_layer(seq=seq, hidden=hidden, heads=heads, intermediate=4 * hidden,
                                             seed=k, attention_mask=False), f"l{k}_")

    model = layer(0)
    for k in range(1, layers):
        model = compose.merge_models(model, layer(k), io_map=[(f"l{k - 1}_output", f"l{k}_hidden_states")])
    return model


def swin_stack(blocks: int, size: int = 14, window: int = 7, channels: int = 96, heads: int = 3) -> onnx.ModelProto:
    """``blocks`` Swin blocks of one stage (``tvm_ext.models.swin.swin_block``) chained output to
    input, shifted and unshifted windows alternating as in Swin-T's third stage (14x14 tokens,
    window 7)."""
    def block(k: int) -> onnx.ModelProto:
        return compose.add_prefix(swin_block(size=size, window=window, shift=window // 2 if k % 2 else 0,
                                             channels=channels, heads=heads, seed=k), f"b{k}_")

    model = block(0)
    for k in range(1, blocks):
        model = compose.merge_models(model, block(k), io_map=[(f"b{k - 1}_output", f"b{k}_hidden_states")])
    return model


def call_nodes(mod: tvm.IRModule) -> int:
    """Call nodes of ``main`` after legalization (what the generators plan over)."""
    legal = tvm.relax.transform.LegalizeOps()(mod)
    return sum(1 for n in OpGraph.from_module(legal).nodes if n.func is not None)


def measure(mod: tvm.IRModule, preset: str | Preset, target: tvm.target.Target) -> dict:
    """Seconds per generator and of the whole graph stage, and the budget notes, for one preset."""
    seconds: dict[str, float] = defaultdict(float)
    work: dict[str, float] = defaultdict(float)

    def add(event: ProgressEvent) -> None:
        if event.generator is not None and event.share is not None:     # a generator done
            seconds[event.generator] += event.seconds
            work[event.generator] += event.work

    start = time.perf_counter()
    with listening(add), target:
        out = tvm.transform.Sequential(preset_passes(preset, target).graph)(mod)
    total = time.perf_counter() - start
    report = json.loads(str(out.attrs[SELECTION_ATTR])) if out.attrs and SELECTION_ATTR in out.attrs else {}
    return {"generators": dict(seconds), "work_units": dict(work), "graph_stage_s": total,
            "budget_notes": budget_notes(report)}


def budget_notes(selection: dict) -> list[str]:
    """The budget notes of a selection report (function name -> its entry with ``notes``)."""
    return [n for entry in selection.values() for n in entry.get("notes", []) if "budget exhausted" in n]


def measure_end_to_end(path: Path, preset: str | Preset, target: tvm.target.Target, fp16: bool) -> dict:
    """Wall seconds of :func:`tvm_ext.inspect.inspect` on ``path``, its stages' seconds, each
    generator's seconds (summed over the graph stage's runs), the modelled time and budget notes."""
    seconds: dict[str, float] = defaultdict(float)

    def add(event: ProgressEvent) -> None:
        if event.generator is not None and event.share is not None:
            seconds[event.generator] += event.seconds

    start = time.perf_counter()
    with listening(add):
        report = inspect(str(path), target, preset, fp16=fp16)
    wall = time.perf_counter() - start
    data = report.to_json()
    return {"wall_s": wall, "stages": data["stage_seconds"], "generators": dict(seconds),
            "modelled_us": data["modelled_time_s"] * 1e6, "budget_notes": budget_notes(data["selection"])}


def _end_to_end_alone(path: Path, preset: str | Preset, target: str, fp16: bool) -> dict:
    """:func:`measure_end_to_end` in the process it runs in (a fresh one: see :func:`main`), after
    the one-time import of TVM's tensor intrinsics (5 s, not timed)."""
    import_tensor_intrinsics()
    return measure_end_to_end(path, preset, resolve_target(target), fp16)


def markdown(rows: list[dict]) -> str:
    """The end-to-end rows as a table: model, wall seconds, import/graph/rest, the generators."""
    lines = ["| model | preset | wall s | import s | graph s | rest s | generators (s) | modelled us |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        st = r["stages"]
        rest = sum(v for k, v in st.items() if k not in ("import", "graph"))
        gens = ", ".join(f"{g} {v:.1f}" for g, v in sorted(r["generators"].items(), key=lambda kv: -kv[1]) if v >= 0.5)
        preset = r["preset"] + (" (unlimited)" if r.get("unlimited") else "")
        lines.append(f"| {r['model']} | {preset} | {r['wall_s']:.1f} | {st.get('import', 0):.1f} | "
                     f"{st.get('graph', 0):.1f} | {rest:.1f} | {gens} | {r['modelled_us']:.2f} |")
    return "\n".join(lines) + "\n"


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="*", help="ONNX files or seed-model names (resnet50_b1_fp32)")
    p.add_argument("--seed-suite", action="store_true", help="every committed seed model")
    p.add_argument("--presets", default="full", help="comma-separated presets (default: full)")
    p.add_argument("--target", default="tvm_ext/h100")
    p.add_argument("--fp16", action="store_true", help="convert the models to float16 at import")
    p.add_argument("--bert", default="", help="comma-separated BERT stack depths, e.g. 1,2,4,8")
    p.add_argument("--swin", default="", help="comma-separated Swin stack depths (blocks), e.g. 1,2,4,8")
    p.add_argument("--end-to-end", action="store_true",
                   help="time tvm-ext inspect of each ONNX model (every stage and the build), not the graph stage")
    p.add_argument("--unlimited", action="store_true",
                   help="plan without any planning budget (what the budgets cost: compare the modelled times)")
    p.add_argument("--json", type=Path, help="also write the results here")
    p.add_argument("--markdown", type=Path, help="with --end-to-end: also write a markdown table here")
    args = p.parse_args(argv)
    if args.end_to_end and (args.bert or args.swin):
        p.error("--end-to-end times ONNX models; the --bert and --swin stacks are graph-stage measurements")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    import_tensor_intrinsics()      # a one-time import (5 s), kept out of the first timing
    target = resolve_target(args.target)
    paths = resolve_models([]) if args.seed_suite else resolve_models(args.models) if args.models else []
    inputs: list[tuple[str, object]] = [(p.stem, load_model(p)) for p in paths]
    inputs += [(f"bert_x{int(d)}", bert_stack(int(d))) for d in args.bert.split(",") if d.strip()]
    inputs += [(f"swin_x{int(d)}", swin_stack(int(d))) for d in args.swin.split(",") if d.strip()]
    results = []
    names = [p.strip() for p in args.presets.split(",") if p.strip()]
    presets = [dataclasses.replace(get_preset(n), budget=UNLIMITED) if args.unlimited else n for n in names]
    if args.end_to_end:     # each build in a fresh process, as `tvm-ext inspect` runs: one process
        # building model after model slows down (YOLOv5s 58 s alone, 91 s after 6 other models)
        spawn = multiprocessing.get_context("spawn")
        for path in paths:
            for name, preset in zip(names, presets):
                with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
                    got = pool.submit(_end_to_end_alone, path, preset, args.target, args.fp16).result()
                results.append({"model": path.stem, "preset": name, "unlimited": args.unlimited, **got})
                print(markdown(results[-1:]).splitlines()[-1], flush=True)
                for note in got["budget_notes"]:
                    print(f"    {note}", flush=True)
        if args.markdown:
            args.markdown.write_text(markdown(results))
        inputs = []
    for label, model in inputs:
        mod = load_module(model, fp16=args.fp16)
        nodes = call_nodes(mod)
        for name, preset in zip(names, presets):
            got = measure(mod, preset, target)
            results.append({"model": label, "nodes": nodes, "preset": name, "unlimited": args.unlimited, **got})
            per = ", ".join(f"{g} {s:.1f} s/{got['work_units'].get(g, 0) / nodes:.1f} u"
                            for g, s in sorted(got["generators"].items(), key=lambda kv: -kv[1]))
            print(f"{label:28s} {nodes:5d} nodes  {name:10s} graph stage {got['graph_stage_s']:7.1f} s  "
                  f"({per})", flush=True)
            for note in got["budget_notes"]:
                print(f"    {note}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
