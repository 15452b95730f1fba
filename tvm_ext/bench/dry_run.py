"""Everything of a measurement that runs without a GPU: ``python -m tvm_ext.bench.dry_run DIR``.

The dry run of a prepared GPU run (``tvm-ext gpu-run execute --dry-run``) runs this in place of
:mod:`tvm_ext.bench.run` for every measurement step. With the TVM runtime only, as on the GPU
machine, it regenerates the weights (checking their digest) and the inputs (checking the check
sets' digests), compares each reference with itself through the same numerics code, and loads
the library: a CUDA library needs TVM's CUDA runtime and a driver, so where there is none it
checks the file (present, the size the manifest recorded) and says so. One JSON line per model
and system, ``dry_run: true`` and no timings.

::

    python -m tvm_ext.bench.dry_run DIR [--models a,b] [--systems s,t] --out results.jsonl
"""
from __future__ import annotations

import argparse
import datetime as _dt
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ..deploy import DeployError, NoDeviceError
from ..errors import BenchError, TvmExtError
from .manifest import BuildEntry, ModelEntry, read_manifest
from .model_data import ModelData, load_model_data
from .numerics import summarize
from .results import append_jsonl
from .weights import checked_weights


def _weights(entry: ModelEntry) -> None:
    checked_weights(entry.weights, entry.weights_seed, entry.weights_digest, entry.name)


def _self_check(entry: ModelEntry, data: ModelData) -> dict:
    """The numerics of outputs equal to the reference at its sampled positions (zero elsewhere)."""
    checks = []
    for pos, refs in enumerate(data.references):
        outputs = []
        for spec, ref in zip(entry.outputs, refs):
            full = np.zeros(int(np.prod(spec.shape)), dtype=np.float64 if spec.dtype.startswith("float") else spec.dtype)
            full[spec.sample.indices()] = ref
            outputs.append(full.reshape(spec.shape))
        checks += data.check(pos, outputs)
    return summarize(checks, entry.dtype) if checks else {}


def _library(tvm, bundle: Path, build: BuildEntry, target_kind: str) -> dict:
    """Load the library where this machine can; otherwise check the file."""
    from ..deploy.runtime import enable_cuda

    if build.library is None:
        raise BenchError(f"{build.system}: the build has no library")
    path = bundle / build.library
    if not path.is_file():
        raise BenchError(f"{build.system}: library {path} is missing")
    if build.library_bytes and path.stat().st_size != build.library_bytes:
        raise BenchError(f"{build.system}: library {path} has {path.stat().st_size} bytes, the manifest "
                         f"recorded {build.library_bytes}")
    if target_kind == "cuda":
        try:
            enable_cuda(tvm)
        except (NoDeviceError, DeployError) as err:
            return {"library_loaded": False, "library_note": f"not loaded here: {' '.join(str(err).split())}"}
    tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu(0) if target_kind != "cuda"
                                  else tvm.cuda(0))
    return {"library_loaded": True}


def dry_run(directory: str | Path, *, models: Sequence[str] | None = None, systems: Sequence[str] | None = None,
            out: str | Path) -> list[dict]:
    """Dry-run the builds of ``models`` x ``systems`` of the bundle in ``directory``; returns the records.

    Raises
    ------
    BenchError
        Not a bundle, or an unknown model.
    """
    from ..deploy.runtime import import_tvm, runtime_only

    bundle = Path(directory).resolve()
    manifest = read_manifest(bundle)
    tvm = import_tvm()
    base = {"device": "none (dry run)", "driver": None, "commit": manifest.commit, "dry_run": True,
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "tvm_runtime_only": runtime_only(tvm), "target": manifest.target}
    records = []
    for entry in [manifest.model(n) for n in models] if models else manifest.models:
        for build in [b for b in entry.builds if not systems or b.system in systems]:
            rec = {"model": entry.name, "system": build.system, **base, "dtype": entry.dtype, "median_ms": None,
                   "min_ms": None, "max_ms": None,
                   "kernels": build.kernels, "max_rel_err": None, "preset": build.preset, "error": None}
            try:
                if build.status != "ok":
                    raise BenchError(f"build failed: {build.error}")
                _weights(entry)
                data = load_model_data(bundle, entry, input_sets=1)
                rec.update(_self_check(entry, data))
                rec.update(_library(tvm, bundle, build, manifest.target_kind))
            except (BenchError, RuntimeError, ValueError) as err:  # TVM's loader raises RuntimeError
                rec["error"] = f"{type(err).__name__}: {' '.join(str(err).split())[:500]}"
            records.append(rec)
    append_jsonl(out, records)
    return records


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; 1 when a record has an error or its self-comparison fails, 2 on bad input."""
    p = argparse.ArgumentParser(prog="python -m tvm_ext.bench.dry_run", description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("--models", default="")
    p.add_argument("--systems", default="")
    p.add_argument("--out", required=True, help="JSON-lines file the records are appended to")
    args = p.parse_args(argv)
    split = lambda text: [x.strip() for x in text.split(",") if x.strip()]
    try:
        records = dry_run(args.directory, models=split(args.models) or None, systems=split(args.systems) or None,
                          out=args.out)
    except TvmExtError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    for r in records:
        print(f"{r['model']}/{r['system']}: {r['error'] or 'ok'} ({r.get('library_note', 'library loaded')})")
    return 1 if any(r["error"] or r.get("numerics_ok") is False for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
