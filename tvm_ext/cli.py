"""Command line: ``tvm-ext`` (also ``python -m tvm_ext``).

::

    tvm-ext demo [--target tvm_ext/h100] [--preset baseline]
    tvm-ext compile model.onnx --target tvm_ext/h100 --preset baseline -o model.so [--shapes x=1x128] [--fp16]
        [--weights-outside] [--embed-source]
    tvm-ext run model.so [--inputs x.npz] [--runs 100]        # TVM runtime only; exit 3 without a GPU
    tvm-ext inspect model.onnx --target tvm_ext/h100 --preset cutlass [--json] [--allow-tf32]
    tvm-ext compare model.onnx [--presets baseline,stitch,cutlass,full] [--fp16] [--html FILE]
    tvm-ext check model.onnx --preset baseline [--rtol 1e-4 --atol 1e-5]
    tvm-ext measure model.onnx --database measurements.jsonl [--rpc HOST:PORT:KEY]
    tvm-ext presets
    tvm-ext devices
    tvm-ext bench [MODEL ...] [--suite seed|small] [--presets baseline] [--fp16] [--build-only --out DIR]

Errors caused by the input (missing file, bad shapes, unknown preset or target, ...) end the
program with exit code 2 and one line on stderr, no traceback. ``check`` and ``demo`` exit
with 1 when the numbers do not match.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

from .driver.presets import DEFAULT_PRESET
from .errors import ModelLoadError, ShapeOverrideError, TvmExtError
from .hardware.target import DEFAULT_TARGET
from .testing.tolerance import tolerance_for

EXIT_MISMATCH = 1
EXIT_USAGE = 2


class UsageError(TvmExtError):
    """A command-line argument is malformed (CLI only; library code raises from ``tvm_ext.errors``)."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: {message}")


def parse_shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """``"input_ids=1x128"`` -> ``("input_ids", (1, 128))``.

    Raises
    ------
    argparse.ArgumentTypeError
        Missing ``=``, empty name, or a dimension that is not a positive integer.
    """
    name, sep, dims = text.rpartition("=")
    if not sep or not name or not dims:
        raise argparse.ArgumentTypeError(f"bad --shapes value {text!r}: expected NAME=DIMxDIM..., e.g. x=1x128")
    try:
        shape = tuple(int(d) for d in dims.lower().replace(",", "x").split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"bad --shapes value {text!r}: dimensions must be integers") from None
    if any(d < 1 for d in shape):
        raise argparse.ArgumentTypeError(f"bad --shapes value {text!r}: dimensions must be positive")
    return name, shape


def _by_name(pairs: Sequence[tuple[str, Any]] | None, option: str, error: type[Exception]) -> dict[str, Any] | None:
    """Repeated ``NAME=...`` options as a dict; the same name twice with different values is an error."""
    if not pairs:
        return None
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out and out[name] != value:
            raise error(f"{option} gives two different values for input '{name}'")
        out[name] = value
    return out


def _model_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``shapes``, ``fp16`` and ``bind`` of :func:`_add_model_options`, as keyword arguments of the import."""
    return {"shapes": _by_name(args.shapes, "--shapes", ShapeOverrideError), "fp16": args.fp16,
            "bind": _by_name(args.bind, "--bind", UsageError)}


def _bind_arg(text: str) -> tuple[str, list]:
    """``"shape=1,-1,64"`` -> ``("shape", [1, -1, 64])`` (argparse ``type=``)."""
    from .errors import InputBindingError
    from .frontend.bind import parse_bind_arg

    try:
        return parse_bind_arg(text)
    except InputBindingError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


def _model_path(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise ModelLoadError(f"model file not found: {text}")
    return path


class _Progress:
    """Step-wise tqdm bar on stderr (silent with ``--quiet`` or when stderr is not a terminal)."""

    def __init__(self, steps: Sequence[str], enabled: bool):
        from tqdm import tqdm

        # disable=None: tqdm stays silent when stderr is not a terminal (logs, pipes)
        self._bar = tqdm(total=len(steps), desc=steps[0] if steps else "", file=sys.stderr,
                         disable=None if enabled else True, leave=False,
                         bar_format="{desc} [{n_fmt}/{total_fmt}] {elapsed}")
        self._started = False

    def describe(self, text: str) -> None:
        """Show ``text`` as what the current step is doing."""
        self._bar.set_description_str(text)

    def step(self, name: str) -> None:
        if self._started:
            self._bar.update(1)
        self._started = True
        self._bar.set_description_str(name)

    def close(self) -> None:
        if self._started:
            self._bar.update(1)
        self._bar.close()


def _with_progress(steps: Sequence[str], quiet: bool, body: Callable[[Callable[[str], None]], Any]) -> Any:
    """Run ``body(step)`` under the bar; the build's own events (stage, generator, budget share:
    :mod:`tvm_ext.select.progress`) show as the step's description."""
    from .select.progress import describe, listening

    bar = _Progress(steps, not quiet)
    try:
        with listening(lambda event: bar.describe(describe(event))):
            return body(bar.step)
    finally:
        bar.close()


# --------------------------------------------------------------------------------------
# commands
# --------------------------------------------------------------------------------------
def _cmd_compile(args: argparse.Namespace) -> int:
    from .deploy.build import STEPS, build_library

    model = _model_path(args.model)
    out = Path(args.output)
    if not out.parent.is_dir():
        raise UsageError(f"output directory does not exist: {out.parent}")
    built = _with_progress(STEPS, args.quiet, lambda step: build_library(
        model, out, args.target, args.preset, **_model_kwargs(args),
        weights_outside=args.weights_outside, embed_source=args.embed_source, check_kernels=args.check_kernels,
        progress=step))
    print("\n".join(built.summary()))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from . import RUNTIME_ONLY
    from .run import in_runtime_process, run, to_argv

    return run(args) if RUNTIME_ONLY else in_runtime_process(to_argv(args))


def _cmd_inspect(args: argparse.Namespace) -> int:
    from .inspect import inspect

    model = _model_path(args.model)

    def body(step: Callable[[str], None]):
        step("compile + report")
        return inspect(model, args.target, args.preset, **_model_kwargs(args), keep_source=args.cuda is not None)

    report = _with_progress(["compile + report"], args.quiet, body)
    if args.cuda is not None:
        Path(args.cuda).write_text(report.cuda_source or "")
    print(json.dumps(report.to_json(), indent=2) if args.json else report.to_table())
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from .inspect import compare

    model = _model_path(args.model)
    presets = [p.strip() for p in args.presets.split(",") if p.strip()]
    if not presets:
        raise UsageError("--presets names no preset")
    result = _with_progress(presets, args.quiet, lambda step: compare(
        model, presets, args.target, **_model_kwargs(args),
        progress=step))
    if args.html:
        Path(args.html).write_text(result._repr_html_())
    print(json.dumps(result.to_json(), indent=2) if args.json else result.to_table())
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    from .testing.oracle import check_model

    model = _model_path(args.model)

    def body(step: Callable[[str], None]):
        step("CPU build + onnxruntime")
        return check_model(str(model), args.preset, **_model_kwargs(args), seed=args.seed, rtol=args.rtol, atol=args.atol)

    result = _with_progress(["CPU build + onnxruntime"], args.quiet, body)
    print(result.message())
    calls_ok = True
    if args.target:
        calls_ok = _check_library_calls(model, args)
    return 0 if result.ok and calls_ok else EXIT_MISMATCH


def _check_library_calls(model: Path, args: argparse.Namespace) -> bool:
    """``check --target``: every CUTLASS call the preset makes for the target, checked on the host."""
    from .checks.library_calls import library_calls
    from .driver.pipeline import load_module
    from .hardware import resolve_target

    target = resolve_target(args.target)
    mod = load_module(str(model), **_model_kwargs(args))
    verdicts = _with_progress(["library calls"], args.quiet,
                              lambda step: (step("library calls"), library_calls(mod, target, args.preset))[1])
    for _, result in verdicts:
        print(f"CUTLASS {result.line()}")
    bad = sum(not r.ok for _, r in verdicts)
    print(f"{len(verdicts)} CUTLASS call(s) for {args.target} checked on the host: "
          + ("all right" if not bad else f"{bad} with findings"))
    return not bad


def _positive_seconds(text: str) -> float:
    """``--emulation-seconds``: a positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


def _cmd_verify(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .checks.model import verify

    model = _model_path(args.model)
    with tqdm(total=1, desc="build", file=sys.stderr, disable=True if args.quiet else None, leave=False,
              bar_format="{desc} [{n_fmt}/{total_fmt}] {elapsed}") as bar:
        def progress(stage: str, done: int, total: int) -> None:
            bar.total, bar.n = total, done
            bar.set_description_str(stage)

        report = verify(model, args.target, args.preset, **_model_kwargs(args), progress=progress,
                        emulation_seconds=args.emulation_seconds)
    print(json.dumps(report.to_json(), indent=2) if args.json else report.to_table())
    return 0 if report.ok else EXIT_MISMATCH


def _cmd_measure(args: argparse.Namespace) -> int:
    from .driver.measure import measure_model, parse_rpc
    from .inspect.render import text_table
    from .select.database import Database
    from .select.runner import MetaScheduleRunner

    model = _model_path(args.model)
    runner = MetaScheduleRunner.rpc(*parse_rpc(args.rpc)) if args.rpc else None
    result = _with_progress(["build + measure"], args.quiet, lambda step: (step("build + measure"), measure_model(
        model, args.target, args.preset, runner=runner, database=Database(args.database), **_model_kwargs(args)))[1])
    print(text_table(["kernel", "generator", "modelled (analytic)", f"measured on {result.device}"], result.rows()))
    print(f"{result.added} of {len(result.outcomes)} planned kernels measured; records added to {args.database}")
    return 0 if result.added or not result.outcomes else EXIT_MISMATCH


def _cmd_presets(_args: argparse.Namespace) -> int:
    from .driver import list_presets

    presets = list_presets()
    width = max(len(p.name) for p in presets)
    for p in presets:
        state = "implemented" if p.implemented else "planned"
        techniques = ", ".join(p.techniques) or "-"
        print(f"{p.name.ljust(width)}  {state:<11}  {p.description}  [techniques: {techniques}]")
    return 0


def _cmd_devices(_args: argparse.Namespace) -> int:
    from .hardware import list_devices, load_device
    from .hardware.calibrated import calibration_summary, measured_kernels
    from .inspect.render import text_table

    rows = []
    for name in list_devices():
        d = load_device(name)
        fp16 = d.peak_flops.get("float16")
        rows.append([d.name, d.full_name, d.arch, str(d.sm_count), f"{d.dram_bandwidth_bytes_per_s / 1e12:.2f}",
                     f"{d.peak_flops_for('float32') / 1e12:.1f}", "-" if fp16 is None else f"{fp16 / 1e12:.1f}",
                     f"{d.l2_cache_bytes / 2**20:.0f}", f"{d.max_shared_memory_per_block_optin // 1024}",
                     f"tvm_ext/{d.name}", measured_kernels(d), calibration_summary(d)])
    head = ["name", "device", "arch", "SMs", "DRAM TB/s", "FP32 TFLOP/s", "FP16 TFLOP/s", "L2 MiB",
            "smem/block KiB", "target tag", "measured kernels", "cost model constants"]
    print(text_table(head, rows))
    return 0


def _cmd_bench(args: argparse.Namespace) -> int:
    from .bench.cli_bench import run_command

    return run_command(args)


def _cmd_gpu_run(args: argparse.Namespace) -> int:
    from .bench.cli_gpu_run import run_command

    return run_command(args)


def _cmd_demo(args: argparse.Namespace) -> int:
    from .inspect.demo import DEMO_STEPS, run_demo

    presets = ["baseline"] if args.preset == "baseline" else ["baseline", args.preset]
    steps = [f"{p}: {s}" for p in presets for s in DEMO_STEPS]
    result = _with_progress(steps, args.quiet, lambda step: run_demo(
        args.target, args.preset, model=args.model, progress=step))
    print(json.dumps(result.to_json(), indent=2) if args.json else result.render())
    return 0 if result.ok else EXIT_MISMATCH


# --------------------------------------------------------------------------------------
# parser
# --------------------------------------------------------------------------------------
def _add_model_options(p: argparse.ArgumentParser, target: bool = True) -> None:
    p.add_argument("model", help="ONNX model file")
    if target:
        p.add_argument("--target", default=DEFAULT_TARGET, help=f"GPU target or tag (default {DEFAULT_TARGET})")
    p.add_argument("--preset", default=DEFAULT_PRESET, help=f"preset (default {DEFAULT_PRESET}; see `tvm-ext presets`)")
    p.add_argument("--shapes", action="append", type=parse_shape_arg, metavar="NAME=DIMS",
                   help="static shape of an input, e.g. input_ids=1x128 (repeatable)")
    p.add_argument("--bind", action="append", type=_bind_arg, metavar="NAME=V1,V2,...",
                   help="make graph input NAME a constant with these values, e.g. shape=1,-1,64 (for inputs "
                        "the importer needs constant: Reshape shapes, Slice starts, axes, TopK's k; repeatable)")
    p.add_argument("--fp16", action="store_true", help="convert the model to float16")
    if target:
        p.add_argument("--allow-tf32", action="store_true",
                       help="offload float32 GEMMs and convolutions to CUTLASS on TF32 tensor cores "
                            "(operands rounded to a 10-bit mantissa; off by default, as in PyTorch)")


def build_parser() -> argparse.ArgumentParser:
    """The ``tvm-ext`` argument parser."""
    parser = _Parser(prog="tvm-ext", description="Fast DNN inference on NVIDIA GPUs with Apache TVM 0.27.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    p = sub.add_parser("compile", help="compile an ONNX model and export it as a shared library (compiled "
                                       "device code: the GPU machine needs the TVM runtime only)")
    _add_model_options(p)
    p.add_argument("-o", "--output", required=True, help="output file (.so)")
    p.add_argument("--embed-source", action="store_true",
                   help="ship CUDA source instead of compiled device code (the GPU machine then compiles it at "
                        "every load and needs a CUDA compiler)")
    p.add_argument("--weights-outside", action="store_true",
                   help="keep the weights out of the library, in OUTPUT_STEM.params.npz beside it (large models)")
    p.add_argument("--check-kernels", action="store_true",
                   help="emulate every generator kernel on the CPU before using it; one with findings is replaced "
                        "by dlight's (seconds per kernel)")
    p.set_defaults(func=_cmd_compile)

    p = sub.add_parser("run", help="run an exported library with the TVM runtime alone: outputs and timing")
    from .run import add_arguments as _add_run_arguments

    _add_run_arguments(p)
    p.set_defaults(func=_cmd_run)

    p = sub.add_parser("inspect", help="report kernels, fused groups, traffic and fallbacks")
    _add_model_options(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--cuda", metavar="FILE", help="also write the generated CUDA source to FILE")
    p.set_defaults(func=_cmd_inspect)

    p = sub.add_parser("compare", help="one table of several presets: launches, traffic, modelled time, compile time")
    _add_model_options(p)
    p.add_argument("--presets", default="baseline,stitch,cutlass,full",
                   help="comma-separated presets (default baseline,stitch,cutlass,full)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--html", metavar="FILE", help="also write the HTML view (table and bar chart) to FILE")
    p.set_defaults(func=_cmd_compare)

    p = sub.add_parser("check", help="check the preset's CPU build against onnxruntime")
    _add_model_options(p, target=False)
    (rtol32, atol32), (rtol16, atol16) = tolerance_for("float32"), tolerance_for("float16")
    p.add_argument("--rtol", type=float, default=None, help=f"relative tolerance (default {rtol32:g}, fp16 {rtol16:g})")
    p.add_argument("--atol", type=float, default=None, help=f"absolute tolerance (default {atol32:g}, fp16 {atol16:g})")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--target", default=None,
                   help="also check every CUTLASS call the preset makes for this GPU target on the host: the "
                        "kernel's can_implement, every operand's element range, emulated outputs (no GPU)")
    p.set_defaults(func=_cmd_check)

    p = sub.add_parser("verify", help="check every kernel the GPU would run, on the CPU: lowered device code "
                                      "emulated (races, barriers, shuffles, poisoned memory, outputs), CUTLASS "
                                      "calls against their contract")
    _add_model_options(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--emulation-seconds", type=_positive_seconds, default=None, metavar="S",
                   help="time limit of each kernel launch's emulation (default 120); a kernel past it is "
                        "listed unchecked")
    p.set_defaults(func=_cmd_verify)

    p = sub.add_parser("measure", help="time the planned kernels (local GPU or RPC tracker) into a database")
    _add_model_options(p)
    p.add_argument("--database", required=True, help="JSON-lines measurement database to add records to "
                                                     "(builds read it through $TVM_EXT_DATABASE)")
    p.add_argument("--rpc", metavar="HOST:PORT:KEY", help="measure on the devices a TVM RPC tracker serves")
    p.set_defaults(func=_cmd_measure)

    p = sub.add_parser("presets", help="list presets")
    p.set_defaults(func=_cmd_presets)
    p = sub.add_parser("devices", help="list device descriptions and their key numbers")
    p.set_defaults(func=_cmd_devices)

    p = sub.add_parser("bench", help="benchmark models x presets: build here, measure here or on a GPU machine")
    from .bench.cli_bench import add_arguments as _add_bench_arguments

    _add_bench_arguments(p, DEFAULT_TARGET)
    p.set_defaults(func=_cmd_bench)

    p = sub.add_parser("gpu-run", help="one prepared GPU run: build and plan here, execute on the GPU machine "
                                       "(one process per model and preset), ingest the results")
    from .bench.cli_gpu_run import add_arguments as _add_gpu_run_arguments

    _add_gpu_run_arguments(p)
    p.set_defaults(func=_cmd_gpu_run)

    p = sub.add_parser("demo", help="bundled BERT layer: baseline and a preset compiled for CUDA, checked on "
                                    "the CPU, compared")
    p.add_argument("--target", default=DEFAULT_TARGET, help=f"GPU target or tag (default {DEFAULT_TARGET})")
    p.add_argument("--preset", default=DEFAULT_PRESET,
                   help=f"preset shown beside baseline (default {DEFAULT_PRESET})")
    p.add_argument("--model", default=None, help="another ONNX model instead of the bundled BERT layer")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``tvm-ext`` with ``argv`` (default ``sys.argv[1:]``); returns the exit code."""
    try:
        args = build_parser().parse_args(argv)
        if args.command is None:
            raise UsageError("tvm-ext: a command is required "
                             "(compile, run, inspect, compare, check, verify, measure, presets, devices, bench, gpu-run, "
                             "demo)")
        logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                            format="%(levelname)s %(name)s: %(message)s")
        with _tf32_scope(args):
            return int(args.func(args))
    except TvmExtError as err:
        return _fail(str(err))
    except OSError as err:  # unreadable input, unwritable output
        return _fail(f"{err.strerror or err}: {err.filename}" if err.filename else str(err))
    except KeyboardInterrupt:
        return _fail("interrupted")


def _tf32_scope(args: argparse.Namespace) -> contextlib.AbstractContextManager:
    """:func:`tvm_ext.cutlass.allow_tf32` when ``--allow-tf32`` was given (the compiler is imported only then)."""
    if not getattr(args, "allow_tf32", False):
        return contextlib.nullcontext()
    from .cutlass import allow_tf32

    return allow_tf32()


def _fail(message: str) -> int:
    """Print ``message`` as one line on stderr; the exit code for input errors."""
    text = " ".join(message.split()) or "error"
    print(f"error: {text}", file=sys.stderr)
    return EXIT_USAGE


__all__ = ["main", "build_parser", "parse_shape_arg", "UsageError"]
