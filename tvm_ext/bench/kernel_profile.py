"""One profiled inference per build, for a kernel profiler: ``python -m tvm_ext.bench.kernel_profile DIR``.

Runs on the GPU machine with the TVM runtime only, under Nsight Compute started with
``--profile-from-start off``::

    ncu --profile-from-start off --csv --page raw --clock-control none \\
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
        python -m tvm_ext.bench.kernel_profile DIR --model bert_base_s128_b1 --system stitch

For each selected build: load it, regenerate the weights (``main_transform_params`` runs
outside the profiled range), run ``warmup`` untimed inferences, then exactly one inference
between ``cudaProfilerStart`` and ``cudaProfilerStop``. Every kernel the profiler sees belongs
to that one inference, in launch order, so ``tvm_ext.bench.kernel_report`` can join them with
the build's ``kernel_list``. Profile one build per process: a kernel name can occur in several
builds of a model.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from ..deploy.runtime import device_for, import_tvm
from ..errors import BenchError, TvmExtError
from .manifest import read_manifest
from .model_data import load_model_data
from .timing import CudaRuntime
from .tvm_runner import TvmModel, upload_weights

log = logging.getLogger(__name__)


def profile_build(directory: str | Path, model: str, system: str, *, warmup: int = 2) -> int:
    """Run one profiled inference of ``model``/``system``; returns the launches the manifest expects.

    Raises
    ------
    BenchError
        Unknown model or system, a failed build, or no CUDA device.
    """
    bundle = Path(directory).resolve()
    manifest = read_manifest(bundle)
    if manifest.target_kind != "cuda":
        raise BenchError(f"{bundle} was built for {manifest.target_kind}; kernel profiles need a CUDA bundle")
    entry = manifest.model(model)
    build = next((b for b in entry.builds if b.system == system), None)
    if build is None:
        raise BenchError(f"{model} has no build '{system}'; it has {[b.system for b in entry.builds]}")
    if build.status != "ok":
        raise BenchError(f"{model}/{system} did not build: {build.error}")
    tvm = import_tvm()
    dev = device_for(tvm, "cuda")
    cuda = CudaRuntime()
    data = load_model_data(bundle, entry, 1)
    loaded = TvmModel(tvm, bundle, entry, build, dev, upload_weights(tvm, entry, dev), data)
    for _ in range(warmup):
        loaded.call(0)
    cuda.synchronize()
    cuda.profiler_start()
    loaded.call(0)
    cuda.synchronize()
    cuda.profiler_stop()
    cuda.last_error()
    return int(build.kernels or 0)


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``DIR --model M --system S [--warmup N]``."""
    p = argparse.ArgumentParser(prog="python -m tvm_ext.bench.kernel_profile", description=__doc__.splitlines()[0])
    p.add_argument("directory", help="bundle written by `tvm-ext bench --build-only --out DIR`")
    p.add_argument("--model", required=True, help="model name in the bundle")
    p.add_argument("--system", required=True, help="system (build) of that model")
    p.add_argument("--warmup", type=int, default=2, help="untimed inferences before the profiled one")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        expected = profile_build(args.directory, args.model, args.system, warmup=args.warmup)
    except (TvmExtError, RuntimeError, ValueError) as err:   # TVM raises RuntimeError/ValueError
        log.error("error: %s", err)
        return 1
    log.info("%s/%s: one inference profiled (%d launches expected)", args.model, args.system, expected)
    return 0


if __name__ == "__main__":
    sys.exit(main())
