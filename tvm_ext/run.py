"""``tvm-ext run LIB`` / ``python -m tvm_ext.run LIB``: run an exported library with the TVM runtime alone.

::

    python -m tvm_ext.run model.so [--inputs x.npz] [--params model.params.npz] [--warmup 10] [--runs 100]
        [--seed 0] [--save-outputs out.npz]

Prints the device, each output (shape, dtype, a few values) and the median time of ``main``.
TVM's compiler library is never loaded: started without ``TVM_USE_RUNTIME_LIB=1`` (so that
``import tvm_ext`` would load it), the command runs itself again in a process that sets it.
Without a GPU a CUDA library is refused with one line (exit code 3), not a traceback.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

#: Exit codes: bad input (as every tvm-ext command), no device of the library's kind here.
EXIT_USAGE = 2
EXIT_NO_DEVICE = 3


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of the run command."""
    p.add_argument("library", help="exported library (.so) from tvm-ext compile or tvm_ext.export_library")
    p.add_argument("--inputs", metavar="FILE.npz", help="inputs by name (default: random, from the library's signature)")
    p.add_argument("--params", metavar="FILE.npz", help="weights of a library compiled with --weights-outside "
                                                        "(default: the file it names, next to it)")
    p.add_argument("--warmup", type=int, default=10, help="untimed runs before timing (default 10)")
    p.add_argument("--runs", type=int, default=100, help="timed runs (default 100; 0: no timing)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--save-outputs", metavar="FILE.npz", help="also write the outputs to FILE.npz")


def to_argv(args: argparse.Namespace) -> list[str]:
    """The command line that :func:`add_arguments` parses into ``args``."""
    argv = [str(args.library), "--warmup", str(args.warmup), "--runs", str(args.runs), "--seed", str(args.seed)]
    for option in ("inputs", "params", "save_outputs"):
        value = getattr(args, option)
        if value is not None:
            argv += [f"--{option.replace('_', '-')}", str(value)]
    return argv


def in_runtime_process(argv: Sequence[str]) -> int:
    """Run ``python -m tvm_ext.run argv`` with ``TVM_USE_RUNTIME_LIB=1``; its exit code."""
    package_root = str(Path(__file__).resolve().parents[1])
    env = dict(os.environ, TVM_USE_RUNTIME_LIB="1", TVM_DEVICE_BACKEND_AUTOLOAD="0")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "tvm_ext.run", *argv], env=env, check=False).returncode


def _summary(array: np.ndarray) -> str:
    flat = array.reshape(-1)
    head = ", ".join(f"{v:.4g}" if array.dtype.kind == "f" else str(v) for v in flat[:4])
    finite = flat[np.isfinite(flat)] if array.dtype.kind == "f" else flat
    stats = f"mean {float(finite.mean()):.4g}" if finite.size else "no finite values"
    return f"{tuple(array.shape)} {array.dtype}  [{head}{', ...' if flat.size > 4 else ''}]  {stats}"


def report_lines(result, args: argparse.Namespace) -> list[str]:
    """What the command shows for ``result`` (a :class:`~tvm_ext.deploy.runner.RunResult`): the
    device, the inputs and where the weights came from, each output, the median time."""
    sig = result.signature
    source = "given" if args.inputs else "random"
    weights = ("bound into the library" if sig is None or not sig.num_params
               else f"{sig.num_params} loaded from {args.params or sig.params_file}")
    lines = [f"{args.library} on {result.device}",
             f"inputs ({source}): " + "; ".join(f"{n} {tuple(a.shape)} {a.dtype}" for n, a in result.inputs.items())
             + f"; weights {weights}"]
    lines += [f"output {i}: {_summary(out)}" for i, out in enumerate(result.outputs)]
    if result.median_ms is not None:
        lines.append(f"main: median {result.median_ms:.3f} ms over {len(result.samples_ms)} runs "
                     f"(min {min(result.samples_ms):.3f}, max {max(result.samples_ms):.3f}; {args.warmup} warm-up)")
    return lines


def run(args: argparse.Namespace) -> int:
    """Run the library in this (runtime-only) process and write :func:`report_lines` to stdout;
    the exit code."""
    from .deploy import NoDeviceError
    from .deploy.runner import run_library
    from .errors import TvmExtError

    try:
        result = run_library(args.library, inputs=args.inputs, params=args.params, warmup=args.warmup,
                             runs=args.runs, seed=args.seed)
    except NoDeviceError as err:
        sys.stderr.write(f"error: no GPU to run {args.library} here (it holds CUDA code): "
                         f"{' '.join(str(err).split())}\n")
        return EXIT_NO_DEVICE
    except TvmExtError as err:  # DeployError, BenchError of the shared timers
        sys.stderr.write(f"error: {' '.join(str(err).split())}\n")
        return EXIT_USAGE
    if args.save_outputs:
        np.savez(args.save_outputs, **{f"output_{i}": o for i, o in enumerate(result.outputs)})
    sys.stdout.write("\n".join(report_lines(result, args)) + "\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m tvm_ext.run``."""
    parser = argparse.ArgumentParser(prog="python -m tvm_ext.run", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    from . import RUNTIME_ONLY

    if not RUNTIME_ONLY:
        return in_runtime_process(to_argv(args))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
