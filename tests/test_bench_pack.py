"""Packing the TVM runtime uses the interpreter ``tvm-ext`` runs in, not the first python3 on PATH."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tvm


def _console_script() -> Path | None:
    beside = Path(sys.executable).parent / "tvm-ext"
    if beside.is_file():
        return beside
    found = shutil.which("tvm-ext")
    return Path(found) if found else None


def test_bench_packs_the_runtime_when_called_by_full_path_outside_its_venv(tmp_path):
    script = _console_script()
    if script is None:
        pytest.skip("the tvm-ext console script is not installed")
    out = tmp_path / "bundle"
    # /usr/bin:/bin: python3 there, if any, is not this interpreter and may lack tvm. llvm needs no
    # nvcc; --runtime packs the runtime anyway.
    # PIP_NO_INDEX: a test never downloads; without a cached wheel in .whl/ it skips.
    env = {"PATH": "/usr/bin:/bin", "HOME": str(Path.home()), "PIP_NO_INDEX": "1"}
    proc = subprocess.run([str(script), "-q", "bench", "mlp", "--target", "llvm", "--build-only", "--runtime",
                           "--out", str(out)], env=env, capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode != 0 and "pip download failed" in proc.stderr:
        pytest.skip("no apache-tvm-ffi wheel cached in .whl/ (tests do not download it)")
    assert proc.returncode == 0, proc.stderr[-2000:]
    runtime = json.loads((out / "runtime" / "runtime.json").read_text())
    assert runtime["tvm_version"] == tvm.__version__
    assert (out / "runtime" / "tvm_runtime.tar.gz").is_file()
