"""The ``tvm-ext gpu-run`` subcommand: one prepared GPU run (command-line layer).

::

    tvm-ext gpu-run prepare --out DIR [--models a,b] [--presets p,q] [--targets tvm_ext/h100,tvm_ext/h200]
    tvm-ext gpu-run execute DIR --out OUT [--dry-run]          # on the GPU machine: scripts/gpu_run.sh DIR
    tvm-ext gpu-run ingest OUT --run DIR                       # results into bench/, README table

The work is in :mod:`.gpu_prepare`, :mod:`.gpu_execute` and :mod:`.gpu_ingest`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from .gpu_prepare import (
    DEADLINE_S,
    DEFAULT_MODELS,
    DEFAULT_PRESETS,
    TINY_MODELS,
    PrepareOptions,
)

MIB = 1 << 20


def _list(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Register the ``gpu-run`` actions on ``p``."""
    sub = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    q = sub.add_parser("prepare", help="build the bundles here, write and print the plan")
    q.add_argument("--out", required=True, help="directory that travels to the GPU machine")
    q.add_argument("--models", default=",".join(DEFAULT_MODELS), help="comma-separated models (default: seven seed models)")
    q.add_argument("--presets", default=",".join(DEFAULT_PRESETS),
                   help="comma-separated presets (default: the six of the first H200 run)")
    q.add_argument("--targets", default="tvm_ext/h100",
                   help="target tags to build for (tvm_ext/h100,tvm_ext/h200 when the kind is not known)")
    q.add_argument("--tiny", default=",".join(Path(t).name for t in TINY_MODELS),
                   help="small models for compute-sanitizer ('' for none)")
    q.add_argument("--overhead-model", default="bert_base_s128_b1",
                   help="model timed with and without CUDA graphs ('' for none)")
    q.add_argument("--torch-compile", default="",
                   help="models also timed under torch.compile(mode='reduce-overhead'), a process each "
                        "(default none: 60 s assumed each, past the default plan's 480 s)")
    q.add_argument("--ncu", type=int, default=1,
                   help="builds profiled per kernel, most unsure modelled time per device second first (default 1)")
    q.add_argument("--runs", type=int, default=50, help="timed runs per measurement (default 50)")
    q.add_argument("--warmup", type=int, default=5, help="warm-up runs (default 5)")
    q.add_argument("--deadline", type=float, default=DEADLINE_S, help=f"device seconds (default {DEADLINE_S:.0f})")
    q.add_argument("--runtime", action=argparse.BooleanOptionalAction, default=True,
                   help="pack a runtime-only TVM (default on; off when the GPU machine has TVM)")
    q.add_argument("--runtime-python", default="3.12", help="Python of the GPU machine (default 3.12)")
    q.add_argument("--resume", action="store_true",
                   help="keep the parts of OUT already built for these models and presets (a prepare cut short)")
    q.set_defaults(gpu_action=_prepare)

    q = sub.add_parser("execute", help="run the plan (on the GPU machine; --dry-run here)")
    q.add_argument("directory")
    q.add_argument("--out", required=True)
    q.add_argument("--dry-run", action="store_true")
    q.add_argument("--deadline", type=float, default=None)
    q.set_defaults(gpu_action=_execute)

    q = sub.add_parser("ingest", help="copy a run's results into bench/ and regenerate the README's GPU table")
    q.add_argument("out", help="what the executor wrote ($OUT, fetched)")
    q.add_argument("--run", required=True, help="the prepared directory the run executed")
    q.add_argument("--label", default=None, help="suffix of the results files")
    q.set_defaults(gpu_action=_ingest)


def _resolve_tiny(names: list[str]) -> list[str]:
    by_name = {Path(t).name: t for t in TINY_MODELS}
    return [by_name.get(n, n) for n in names]


def _prepare(args: argparse.Namespace) -> int:
    from .gpu_prepare import prepare, render_plan

    options = PrepareOptions(models=_list(args.models), presets=_list(args.presets), targets=_list(args.targets),
                             tiny=_resolve_tiny(_list(args.tiny)), overhead_model=args.overhead_model or None,
                             torch_compile=_list(args.torch_compile), ncu_count=args.ncu, runs=args.runs,
                             warmup=args.warmup, deadline_s=args.deadline, runtime=args.runtime,
                             runtime_python=args.runtime_python, resume=args.resume)
    quiet = getattr(args, "quiet", False)
    with tqdm(desc="gpu-run prepare", unit="model", disable=quiet, file=sys.stderr) as bar:
        def progress(line: str) -> None:
            bar.set_description(f"gpu-run prepare: {line[:60]}")
            bar.update(0)

        plan, sizes = prepare(args.out, options, progress=None if quiet else progress)
    print(render_plan(plan))
    parts = ", ".join(f"{k} {v / MIB:.2f}" for k, v in sorted(sizes.items()))
    print(f"directory {args.out}: {sum(sizes.values()) / MIB:.2f} MiB ({parts} MiB)")
    print(f"on the GPU machine: bash scripts/gpu_run.sh {args.out} $OUT")
    return 0


def _execute(args: argparse.Namespace) -> int:
    from .gpu_execute import main

    argv = [args.directory, "--out", args.out] + (["--dry-run"] if args.dry_run else [])
    argv += ["--deadline", str(args.deadline)] if args.deadline is not None else []
    return main(argv)


def _ingest(args: argparse.Namespace) -> int:
    from .gpu_ingest import ingest

    for path in ingest(args.out, args.run, label=args.label):
        print(f"wrote {path}")
    return 0


def run_command(args: argparse.Namespace) -> int:
    """``tvm-ext gpu-run ACTION``; returns the exit code."""
    return int(args.gpu_action(args))


__all__ = ["add_arguments", "run_command"]
