"""The ``tvm-ext bench`` subcommand (command-line layer; the work is in :mod:`.bundle` and :mod:`.run`).

::

    tvm-ext bench [MODEL ...] [--suite seed|small] [--presets baseline] [--target tvm_ext/h100]
        [--fp16] [--cuda-graph] [--build-only --out DIR] [--no-runtime] [--seed 0]
        [--runs 100 --warmup 10 --input-sets 8] [--torch auto|on|off] [--results bench/results]

``--build-only`` writes the bundle and prints the kernels of every model and system; without
it the bundle is also measured here (in a runtime-only TVM process, as on a GPU machine)
and the results land in ``--results``.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from ..errors import BenchError
from .bundle import BundleSummary, build_bundle
from .suite import resolve, suite
from .worker import BUILDING, BUILT

MIB = 1 << 20


def _bar_progress(bar: tqdm) -> Callable[[str], None]:
    """Progress lines of the build worker onto ``bar``: the model being built as its description
    (tqdm shows the elapsed time), each finished model's summary printed above it."""

    def show(line: str) -> None:
        if line.startswith(BUILDING):
            bar.set_description(f"bench build: {line[len(BUILDING):]}")
        else:
            bar.write(line, file=sys.stderr)
            bar.update(line.startswith(BUILT))

    return show


def add_arguments(p: argparse.ArgumentParser, default_target: str) -> None:
    """Register the options of ``tvm-ext bench`` on ``p``."""
    p.add_argument("models", nargs="*", help="skeleton names (resnet50_b1), bundled models (mlp) or .onnx files")
    p.add_argument("--suite", choices=("seed", "small"), help="seed: every corpus skeleton; small: mlp, conv_block")
    p.add_argument("--presets", default="baseline", help="comma-separated presets (default baseline)")
    p.add_argument("--target", default=default_target, help=f"target or tag (default {default_target}; llvm for CPU)")
    p.add_argument("--fp16", action="store_true", help="convert the models to float16")
    p.add_argument("--cuda-graph", action="store_true", help="also build and time every preset with CUDA graphs")
    p.add_argument("--build-only", action="store_true", help="write the bundle (--out) and stop")
    p.add_argument("--out", help="bundle directory (required with --build-only)")
    p.add_argument("--runtime", action=argparse.BooleanOptionalAction, default=None,
                   help="pack a runtime-only TVM into the bundle (default: for CUDA targets)")
    p.add_argument("--runtime-python", default="3.12", help="Python of the GPU machine for the packed runtime")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and inputs")
    p.add_argument("--runs", type=int, default=100, help="timed runs per timing (default 100)")
    p.add_argument("--warmup", type=int, default=10, help="untimed runs first (default 10)")
    p.add_argument("--input-sets", type=int, default=8, help="rotating input sets (default 8)")
    p.add_argument("--torch", choices=("auto", "on", "off"), default="auto", help="torch baselines (default auto)")
    p.add_argument("--results", default="bench/results", help="where results go without --build-only")


def build_table(summary: BundleSummary) -> str:
    """Per model and system: status, kernel launches, distinct kernels, build times, library size."""
    head = ["model", "system", "status", "kernels", "distinct", "compile s", "nvcc s", "library KiB", "note"]
    rows = []
    for m in summary.manifest.models:
        if not m.builds:
            rows.append([m.name, "-", m.status, "-", "-", "-", "-", "-", (m.error or "")[:100]])
        for b in m.builds:
            rows.append([m.name, b.system, b.status, str(b.kernels if b.kernels is not None else "-"),
                         str(b.distinct_kernels if b.distinct_kernels is not None else "-"), f"{b.compile_s:.1f}",
                         f"{b.stage_s.get('nvcc', 0.0):.1f}", f"{b.library_bytes / 1024:.0f}",
                         (b.error or m.error or "")[:100]])
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    parts = ", ".join(f"{k} {v / MIB:.2f}" for k, v in sorted(summary.sizes.items()))
    return "\n".join([line(head)] + [line(r) for r in rows] +
                     [f"bundle {summary.directory}: {summary.total_bytes / MIB:.2f} MiB ({parts} MiB)"])


def run_command(args: argparse.Namespace) -> int:
    """``tvm-ext bench``; returns the exit code (1 when a build or measurement failed).

    Raises
    ------
    BenchError, TvmExtError
        Bad arguments (no models, unknown model/preset/target, missing --out).
    """
    sources = resolve(args.models)
    if args.suite:
        sources += [s for s in suite(args.suite) if s.name not in {x.name for x in sources}]
    if not sources:
        raise BenchError("name models or a --suite (seed, small)")
    if args.build_only and not args.out:
        raise BenchError("--build-only needs --out DIR")
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="tvm_ext_bench_"))
    quiet = getattr(args, "quiet", False)
    with tqdm(total=len(sources), desc="bench build", unit="model", disable=quiet, file=sys.stderr) as bar:
        summary = build_bundle(sources, out, presets=presets, target=args.target, fp16=args.fp16,
                               cuda_graph=args.cuda_graph, seed=args.seed, runtime=args.runtime,
                               runtime_python=args.runtime_python, progress=None if quiet else _bar_progress(bar))
    print(build_table(summary))
    failed = any(m.status != "ok" or any(b.status != "ok" for b in m.builds) for m in summary.manifest.models)
    if args.build_only:
        print(f"measure it with: {out}/run.sh   (or: PYTHONPATH={out}/python python -m tvm_ext.bench.run {out})")
        return 1 if failed else 0
    code = _measure_here(out, args)
    return 1 if failed or code != 0 else 0


def _measure_here(bundle: Path, args: argparse.Namespace) -> int:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(bundle / "python"), env.get("PYTHONPATH")]))
    env["TVM_USE_RUNTIME_LIB"] = "1"
    env["TVM_DEVICE_BACKEND_AUTOLOAD"] = "0"
    cmd = [sys.executable, "-m", "tvm_ext.bench.run", str(bundle), "--runs", str(args.runs), "--warmup",
           str(args.warmup), "--input-sets", str(args.input_sets), "--torch", args.torch]
    if args.cuda_graph:
        cmd.append("--cuda-graph")
    code = subprocess.run(cmd, env=env, check=False).returncode
    results = Path(args.results)
    results.mkdir(parents=True, exist_ok=True)
    for f in sorted((bundle / "results").glob("*")) if (bundle / "results").is_dir() else []:
        shutil.copy2(f, results / f.name)
        print(f"results: {results / f.name}")
    return code


__all__ = ["add_arguments", "build_table", "run_command"]
