"""Prepare a GPU run on the build host: ``tvm-ext gpu-run prepare --out DIR``.

Writes a directory that travels to the GPU machine (the device tool carries at most 64 MiB)::

    DIR/plan.json            the steps, in order, with planned device seconds (:mod:`.gpu_steps`)
    DIR/<tag>/               one bundle per target tag (h100, h200): models x presets, fp16
    DIR/tiny/                small models under every preset, for compute-sanitizer
    DIR/overhead/            one model under `baseline`, with and without CUDA graphs
    DIR/python/              the runtime-side harness, the executor among it
    DIR/runtime/             runtime-only TVM (optional, ``scripts/pack_runtime.sh``)
    DIR/ncu_list.json        the builds profiled per kernel, and why (least surely priced)

Libraries that are byte-identical across the target bundles are kept once (the second
manifest points at the first's file). The plan is refused when it exceeds the deadline or the
directory the 64 MiB that travel.
"""
from __future__ import annotations

import datetime as _dt
import json
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BenchError
from .bundle import (
    REPO,
    build_bundle,
    copy_runtime_python,
    git_commit,
    pack_runtime,
)
from .gpu_plan import (
    SANITIZER_TOOLS,
    Estimator,
    History,
    cache_rate_per_s,
    measure_steps,
    ncu_choices,
    ncu_steps,
    sanitize_steps,
    torch_steps,
    weight_rate_per_s,
)
from .gpu_steps import Plan, Step
from .manifest import MANIFEST, Manifest, read_manifest
from .suite import resolve

#: The seed models the first H200 run measured, and BERT-base (the transformer every issue cites).
DEFAULT_MODELS = ("bert_base_s128_b1", "vit_b16_b1", "resnet50_b1", "efficientnet_b0_b1", "mmoe_b1",
                  "lstm_s32_b1", "nerf_mlp_b1")
#: The six presets of that run, so each number has one to compare with (``--presets`` adds
#: ``orchestrate``; seven presets plan past the 480 s: ``tvm-ext gpu-run prepare`` prints the plan).
DEFAULT_PRESETS = ("full", "baseline", "cutlass", "subprogram", "stitch", "tilegraph")
#: Small enough for compute-sanitizer: a conv block (CUTLASS convolutions, depthwise and pooling
#: kernels) and the bundled BERT encoder layer (GEMMs, softmax, LayerNorm, attention). ``mlp``
#: (``--tiny mlp,...``) adds nothing a BERT layer's feed-forward half does not have.
TINY_MODELS = ("conv_block", str(REPO / "tvm_ext" / "models" / "bert_layer.onnx"))
#: Which presets each sanitizer tool checks: memcheck the presets whose kernels or library calls
#: are ours (``baseline`` is TVM's own lowering); racecheck and synccheck the presets whose own
#: kernels use shared memory and barriers (dlight's and CUTLASS's are the libraries').
SANITIZE_PRESETS = {"memcheck": ("full", "cutlass", "subprogram", "stitch", "tilegraph", "orchestrate"),
                    "racecheck": ("full", "stitch", "subprogram", "tilegraph", "orchestrate"),
                    "synccheck": ("full", "subprogram")}
CARRY_LIMIT = 64 << 20
DEADLINE_S = 480.0


@dataclass
class PrepareOptions:
    """What ``prepare`` builds and plans (defaults: :data:`DEFAULT_MODELS` x :data:`DEFAULT_PRESETS`)."""

    models: Sequence[str] = DEFAULT_MODELS
    presets: Sequence[str] = DEFAULT_PRESETS
    targets: Sequence[str] = ("tvm_ext/h100",)
    tiny: Sequence[str] = TINY_MODELS
    overhead_model: str | None = "bert_base_s128_b1"
    torch_compile: Sequence[str] = ()
    ncu_count: int = 1
    runs: int = 50
    warmup: int = 5
    repeat: bool = True
    deadline_s: float = DEADLINE_S
    runtime: bool = True
    runtime_python: str = "3.12"
    #: Keep a part (target bundle, ``tiny``, ``overhead``) whose manifest in OUT already holds
    #: every asked model and preset, instead of building it again (a prepare cut short goes on).
    resume: bool = False


def _covers(directory: Path, models: Sequence[str], presets: Sequence[str], cuda_graph: bool = False) -> bool:
    """Whether the bundle in ``directory`` holds a build of every model under every preset."""
    if not (directory / MANIFEST).is_file():
        return False
    manifest = read_manifest(directory)
    have = {m.name: {b.preset for b in m.builds if b.cuda_graph == cuda_graph} for m in manifest.models}
    names = [s.name for s in resolve(list(models))]
    return all(n in have and set(presets) <= have[n] for n in names)


def _tag(target: str) -> str:
    return target.split("/")[-1]


def dedupe_libraries(first: Path, other: Path) -> int:
    """Point ``other``'s builds at ``first``'s byte-identical libraries; returns the bytes saved."""
    a, b = read_manifest(first), read_manifest(other)
    known = {}
    for m in a.models:
        for build in m.builds:
            if build.library:
                known[(m.name, build.system)] = first / build.library
    saved = 0
    for m in b.models:
        for build in m.builds:
            twin = known.get((m.name, build.system))
            mine = other / build.library if build.library else None
            if twin is not None and mine is not None and twin.is_file() and mine.read_bytes() == twin.read_bytes():
                saved += mine.stat().st_size
                mine.unlink()
                build.library = str(Path("..") / first.name / Path(build.library))
    b.write(other)
    return saved


def _size(directory: Path) -> int:
    return sum(f.stat().st_size for f in directory.rglob("*") if f.is_file() and "site" not in f.parts)


def prepare(out: str | Path, options: PrepareOptions,
            progress: Callable[[str], None] | None = None) -> tuple[Plan, dict[str, int]]:
    """Build the bundles and write the plan of a GPU run into ``out``; returns it and the sizes by part.

    Raises
    ------
    BenchError
        A model or preset is unknown, every build failed, the directory exceeds what travels, or
        the plan exceeds its deadline (both are printed first by the command).
    """
    out = Path(out).resolve()
    if out.exists() and any(out.iterdir()) and not (out / "plan.json").is_file() and not options.resume:
        raise BenchError(f"{out} exists, is not empty and holds no plan.json; choose another --out (or --resume)")
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").unlink(missing_ok=True)

    def part(name: str, models: Sequence[str], presets: Sequence[str], target: str, cuda_graph: bool = False) -> None:
        if options.resume and _covers(out / name, models, presets, cuda_graph):
            if progress:
                progress(f"kept {name} (--resume)")
            return
        build_bundle(resolve(list(models)), out / name, presets=presets, target=target, fp16=True,
                     cuda_graph=cuda_graph, runtime=False, progress=progress)

    for target in options.targets:
        part(_tag(target), options.models, options.presets, target)
    first = options.targets[0]
    if options.tiny:
        part("tiny", options.tiny, options.presets, first)
    if options.overhead_model:
        part("overhead", [options.overhead_model], ["baseline"], first, cuda_graph=True)
    for tag in [_tag(t) for t in options.targets[1:]]:
        dedupe_libraries(out / _tag(first), out / tag)
    if (out / "python").is_dir():
        shutil.rmtree(out / "python")
    copy_runtime_python(out)
    notes = []
    if options.runtime:
        runtime = pack_runtime(out, options.runtime_python)
        notes.append(f"runtime-only TVM packed for Python {options.runtime_python}: {runtime}")
    plan = make_plan(out, options, notes)
    sizes = {p.name: _size(p) if p.is_dir() else p.stat().st_size for p in out.iterdir()}
    total = sum(sizes.values())
    if total > CARRY_LIMIT:
        raise BenchError(f"{out} takes {total / (1 << 20):.1f} MiB, more than the {CARRY_LIMIT >> 20} MiB that "
                         "travel; narrow --models/--presets or leave out --targets")
    return plan, sizes


def make_plan(out: Path, options: PrepareOptions, notes: list[str] | None = None) -> Plan:
    """The plan of the bundles in ``out`` (written to ``out/plan.json`` unless over its deadline).

    Raises
    ------
    BenchError
        The plan's device seconds exceed ``options.deadline_s``.
    """
    history = History.load(REPO / "bench" / "results")
    est = Estimator(history, weight_rate_per_s(), cache_rate_per_s(), runs=options.runs, warmup=options.warmup,
                    repeat=options.repeat)
    steps: list[Step] = []
    manifests: dict[str, Manifest] = {p.name: read_manifest(p) for p in sorted(out.iterdir())
                                      if (p / MANIFEST).is_file()}
    first = _tag(options.targets[0])
    main = "{main}"  # the executor picks the bundle of the GPU it finds
    steps += measure_steps(main, manifests[first], est, options.presets)
    if "tiny" in manifests:
        tools = {t: [p for p in SANITIZE_PRESETS[t] if p in options.presets] for t in SANITIZER_TOOLS}
        steps += sanitize_steps("tiny", manifests["tiny"], est, tools)
    if "overhead" in manifests:
        steps += measure_steps("overhead", manifests["overhead"], est, ["baseline"], kind="overhead")
    steps += torch_steps(main, manifests[first], est, options.torch_compile)
    measured = []
    for path in sorted((REPO / "bench" / "measurements").glob("*.jsonl")):
        measured += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    choices = ncu_choices(manifests[first], measured, options.ncu_count)
    (out / "ncu_list.json").write_text(json.dumps(choices, indent=1) + "\n")
    steps += ncu_steps(main, choices, est)
    plan = Plan(steps=steps, deadline_s=options.deadline_s, commit=git_commit(), targets={
        _tag(t): t for t in options.targets}, notes=list(notes or []),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    if plan.planned_s > options.deadline_s:
        raise BenchError(f"the plan needs {plan.planned_s:.0f} device seconds, more than its deadline of "
                         f"{options.deadline_s:.0f} s:\n{render_plan(plan)}\nnarrow --models, --presets, "
                         "--torch-compile or --ncu")
    plan.write(out)
    return plan


def render_plan(plan: Plan) -> str:
    """The plan as a table: planned seconds per step kind, then every step; last line the total."""
    lines = ["step                                                    planned s  timeout s  from"]
    for s in plan.steps:
        lines.append(f"{s.id[:55]:55s} {s.estimate_s:9.1f}  {s.timeout_s:9.1f}  {s.estimate_from}")
    kinds: dict[str, list[float]] = {}
    for s in plan.steps:
        kinds.setdefault(s.kind, []).append(s.estimate_s)
    lines.append("by kind: " + ", ".join(f"{k} {len(v)} steps {sum(v):.0f} s" for k, v in kinds.items()))
    lines += [f"note: {n}" for n in plan.notes]
    lines.append(f"planned device seconds: {plan.planned_s:.0f}")
    return "\n".join(lines)


__all__ = [
    "DEFAULT_MODELS",
    "DEFAULT_PRESETS",
    "SANITIZE_PRESETS",
    "TINY_MODELS",
    "PrepareOptions",
    "dedupe_libraries",
    "make_plan",
    "prepare",
    "render_plan",
]
