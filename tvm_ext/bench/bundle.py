"""Write a benchmark bundle: ``tvm-ext bench --build-only --out DIR`` (layout in :mod:`.manifest`).

:func:`build_bundle` builds every model x preset (in a worker process for CUDA targets; the
export compiles the device code, see :mod:`tvm_ext.toolchain.export`), writes the manifest, copies the runtime-side harness and
the corpus model definitions, writes ``run.sh`` and, optionally, packs a runtime-only TVM
with ``scripts/pack_runtime.sh``.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BenchError, DeviceConfigError, TvmExtError
from ..hardware.target import DEFAULT_TARGET
from .manifest import MANIFEST, Manifest, ModelEntry
from .suite import ModelSource
from .worker import BuildJob, run_jobs

PACKAGE = Path(__file__).resolve().parents[1]          # tvm_ext/
REPO = PACKAGE.parent
#: Modules of :mod:`tvm_ext.bench` the measuring machine needs (numpy + TVM runtime only).
RUNTIME_MODULES = ("__init__", "inputs", "weights", "numerics", "timing", "manifest", "model_data", "results",
                   "tvm_runner", "torch_runner", "run", "kernel_profile", "dry_run", "gpu_steps", "gpu_execute")
#: Modules of :mod:`tvm_ext.deploy` they use (TVM without its compiler).
DEPLOY_MODULES = ("__init__", "runtime")
_PKG_INIT = '''"""tvm_ext, runtime side only: the benchmark harness of a bundle (see bench/run.py)."""
'''
_RUN_SH = r'''#!/bin/sh
# Measure this bundle with the TVM runtime only: ./run.sh [options of python -m tvm_ext.bench.run]
# PYTHON (default python3) must have numpy; torch (+ transformers) for the torch baselines.
set -e
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
if [ -f "$HERE/runtime/tvm_runtime.tar.gz" ]; then
  SITE="$HERE/runtime/site"
  if [ ! -f "$SITE/.ready" ]; then
    mkdir -p "$SITE"
    tar -xzf "$HERE/runtime/tvm_runtime.tar.gz" -C "$SITE"
    for w in "$HERE"/runtime/*.whl; do "$PY" -m zipfile -e "$w" "$SITE"; done
    touch "$SITE/.ready"
  fi
  PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$HERE/python${PYTHONPATH:+:$PYTHONPATH}"
export TVM_USE_RUNTIME_LIB=1 TVM_DEVICE_BACKEND_AUTOLOAD=0
exec "$PY" -m tvm_ext.bench.run "$HERE" "$@"
'''


@dataclass
class BundleSummary:
    """A written bundle: its manifest, location and size by part (bytes)."""

    manifest: Manifest
    directory: Path
    sizes: dict[str, int]

    @property
    def total_bytes(self) -> int:
        """Size of the whole bundle."""
        return sum(self.sizes.values())


def git_commit(path: Path = REPO) -> str:
    """Short commit of the repository holding ``path`` (``-dirty`` with local changes), or ``unknown``."""
    git = shutil.which("git")
    if git is None:
        return "unknown"
    head = subprocess.run([git, "-C", str(path), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True,
                          check=False)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run([git, "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def device_table() -> dict[str, dict]:
    """Peak rates and DRAM bandwidth of every described device (for rooflines)."""
    from ..hardware import list_devices, load_device  # noqa: PLC0415

    table = {}
    for name in list_devices():
        spec = load_device(name)
        peaks = {}
        for dtype in ("float32", "float16", "bfloat16"):
            try:
                peaks[dtype] = float(spec.peak_flops_for(dtype))
            except DeviceConfigError:
                continue
        table[name] = {"full_name": spec.full_name, "dram_bandwidth_bytes_per_s": float(spec.dram_bandwidth_bytes_per_s),
                       "peak_flops": peaks}
    return table


def _prepare_directory(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        if not (out / MANIFEST).is_file():
            raise BenchError(f"{out} exists, is not empty and is not a bundle; choose another --out")
        for part in ("lib", "ref", "python", "corpus", MANIFEST, "run.sh"):
            target = out / part
            if target.is_dir():
                shutil.rmtree(target)
            elif target.exists():
                target.unlink()
    out.mkdir(parents=True, exist_ok=True)


def copy_runtime_python(out: Path) -> None:
    """Copy the runtime-side harness to ``out/python/tvm_ext`` (with a minimal package ``__init__``)."""
    pkg = out / "python" / "tvm_ext"
    (pkg / "bench").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(_PKG_INIT)
    shutil.copy2(PACKAGE / "errors.py", pkg / "errors.py")
    for name in RUNTIME_MODULES:
        shutil.copy2(PACKAGE / "bench" / f"{name}.py", pkg / "bench" / f"{name}.py")
    (pkg / "deploy").mkdir(exist_ok=True)
    for name in DEPLOY_MODULES:
        shutil.copy2(PACKAGE / "deploy" / f"{name}.py", pkg / "deploy" / f"{name}.py")
    (pkg / "testing").mkdir(exist_ok=True)  # the tolerance policy only (numerics reads it)
    (pkg / "testing" / "__init__.py").write_text('"""tvm_ext.testing, runtime side only: the tolerance policy."""\n')
    shutil.copy2(PACKAGE / "testing" / "tolerance.py", pkg / "testing" / "tolerance.py")


def copy_corpus(out: Path) -> bool:
    """Copy the corpus model definitions (``scripts/corpus/*.py``) for the torch baselines."""
    src = REPO / "scripts" / "corpus"
    if not (src / "registry.py").is_file():
        return False
    (out / "corpus").mkdir(exist_ok=True)
    for f in src.glob("*.py"):
        shutil.copy2(f, out / "corpus" / f.name)
    return True


def pack_runtime(out: Path, python: str = "3.12") -> dict:
    """Run ``scripts/pack_runtime.sh out/runtime --python <python>``; returns its ``runtime.json``.

    The script packs the TVM of the running interpreter (``$PYTHON`` is ``sys.executable``), so a
    console script called by its full path, outside its activated venv, packs its own TVM.

    Raises
    ------
    BenchError
        The script fails (e.g. no tvm-ffi wheel for that Python and no network).
    """
    script = REPO / "scripts" / "pack_runtime.sh"
    if not script.is_file():
        raise BenchError(f"{script} is missing")
    from ..toolchain.cuda import find_cuda_root, toolkit_env  # noqa: PLC0415

    root = find_cuda_root()  # where the script takes libcudart from
    env = toolkit_env(os.environ, root) if root is not None else dict(os.environ)
    env["PYTHON"] = sys.executable  # the interpreter whose tvm is packed, not the first python3 on PATH
    proc = subprocess.run(["sh", str(script), str(out / "runtime"), "--python", python], capture_output=True,
                          text=True, check=False, env=env)
    if proc.returncode != 0:
        raise BenchError(f"packing the TVM runtime failed: {proc.stderr.strip()[-800:]} "
                         "(use --no-runtime to leave it out)")
    return json.loads((out / "runtime" / "runtime.json").read_text())


def _sizes(out: Path) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for f in out.rglob("*"):
        if f.is_file():
            rel = f.relative_to(out).parts
            if rel[0] == "results" or (rel[0] == "runtime" and len(rel) > 1 and rel[1] == "site"):
                continue  # measurements and the unpacked runtime are not part of what travels
            key = rel[0] if len(rel) > 1 else "top"
            sizes[key] = sizes.get(key, 0) + f.stat().st_size
    return sizes


def _worker_env() -> dict[str, str]:
    from ..toolchain.cuda import find_cuda_root, toolkit_env  # noqa: PLC0415

    env = {k: v for k, v in os.environ.items() if k != "TVM_USE_RUNTIME_LIB"}  # the worker needs the compiler
    root = find_cuda_root()
    if root is None:
        raise BenchError("CUDA builds need a CUDA toolkit (put nvcc on PATH or set CUDA_PATH)")
    env = toolkit_env(env, root)  # TVM's nvcc helper runs `nvcc` from PATH
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return env


def _run_worker(job: BuildJob, work: Path, progress: Callable[[str], None] | None) -> None:
    env = _worker_env()
    job_file = job.write(work / "job.json")
    log_file = work / "worker.log"
    with log_file.open("w") as log, subprocess.Popen(
            [sys.executable, "-m", "tvm_ext.bench.worker", str(job_file)], env=env, stdout=subprocess.PIPE,
            stderr=log, text=True) as proc:
        for line in proc.stdout or ():
            if progress is not None:
                progress(line.rstrip())
    if proc.returncode != 0:
        tail = log_file.read_text(errors="replace").strip()[-1500:]
        raise BenchError(f"the build worker failed (exit {proc.returncode}): {tail}")


def build_bundle(models: Sequence[ModelSource], out: str | Path, *, presets: Sequence[str] = ("baseline",),
                 target: str = DEFAULT_TARGET, fp16: bool = False, cuda_graph: bool = False, seed: int = 0,
                 runtime: bool | None = None, runtime_python: str = "3.12", isolate: bool | None = None,
                 progress: Callable[[str], None] | None = None) -> BundleSummary:
    """Build ``models`` x ``presets`` for ``target`` into the bundle directory ``out``.

    Parameters
    ----------
    runtime : bool, optional
        Pack a runtime-only TVM into ``out/runtime`` (default: for CUDA targets).
    isolate : bool, optional
        Build in a worker process (default: for CUDA targets, whose builds can crash TVM).

    Raises
    ------
    BenchError
        Bad arguments, or the build machinery (worker, nvcc, packing) fails. Failures of single
        models are recorded in the manifest instead.
    """
    import tvm  # noqa: PLC0415

    from ..hardware import resolve_target  # noqa: PLC0415
    from ..driver import get_preset  # noqa: PLC0415

    if not models:
        raise BenchError("no models to build")
    for p in presets:
        get_preset(p)
    tgt = resolve_target(target)
    kind = tgt.kind.name
    out = Path(out).resolve()
    _prepare_directory(out)
    with tempfile.TemporaryDirectory(prefix="tvm_ext_bench_") as tmp:
        work = Path(tmp)
        job = BuildJob.for_sources(list(models), bundle=str(out), target=target, presets=list(presets),
                                   entries_file=str(work / "entries.jsonl"), fp16=fp16, cuda_graph=cuda_graph,
                                   seed=seed)
        if isolate if isolate is not None else kind == "cuda":
            _run_worker(job, work, progress)
        else:
            run_jobs(job, progress)
        lines = Path(job.entries_file).read_text().splitlines() if Path(job.entries_file).is_file() else []
        entries = [ModelEntry.from_json(json.loads(line)) for line in lines if line.strip()]
    manifest = Manifest(target=str(target), target_kind=kind, dtype="float16" if fp16 else "float32",
                        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                        commit=git_commit(), tvm_version=str(tvm.__version__), arch=tgt.attrs.get("arch"),
                        device=_device_name(tgt), seed=seed, devices=device_table(), models=entries)
    copy_runtime_python(out)
    if any(e.corpus for e in entries):
        copy_corpus(out)
    run_sh = out / "run.sh"
    run_sh.write_text(_RUN_SH)
    run_sh.chmod(run_sh.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    if runtime if runtime is not None else kind == "cuda":
        manifest.runtime = pack_runtime(out, runtime_python)
    manifest.write(out)
    return BundleSummary(manifest, out, _sizes(out))


def _device_name(target) -> str | None:
    from ..hardware import device_from_target  # noqa: PLC0415

    if target.kind.name != "cuda":
        return None
    try:
        return device_from_target(target).name
    except TvmExtError:
        return None


__all__ = ["RUNTIME_MODULES", "DEPLOY_MODULES", "BundleSummary", "git_commit", "device_table", "copy_runtime_python", "copy_corpus",
           "pack_runtime", "build_bundle"]
