"""A non-editable install works on its own: package data (device descriptions) comes with it.

The venv is made ``--without-pip`` so that it uses this interpreter's pip, setuptools and
wheel (a seeded venv would shadow them with its own, older setuptools). Building offline
(``--no-build-isolation``) needs ``wheel`` or setuptools >= 70.1 here.
"""
from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest



def _can_build_wheels() -> bool:
    if importlib.util.find_spec("wheel") is not None:
        return True
    major, minor = (int(x) for x in importlib.metadata.version("setuptools").split(".")[:2])
    return (major, minor) >= (70, 1)  # bdist_wheel moved into setuptools


pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not _can_build_wheels(), reason="building a wheel offline needs `wheel` "
                                 "or setuptools>=70.1")]

REPO = Path(__file__).resolve().parent.parent
#: Top-level entries of the checkout a package build does not read (results, caches, build output).
_TOP_LEVEL_SKIP = {".git", "build", "dist", "bench", "tests", "out", "data", ".whl", ".rt", ".pytest_cache",
                   ".ruff_cache"}


def _not_sources(directory: str, names: list[str]) -> set[str]:
    skip = {n for n in names if n == "__pycache__" or n.endswith(".egg-info")}
    if Path(directory).resolve() == REPO:
        skip |= _TOP_LEVEL_SKIP & set(names)
    return skip


def _env_without_the_checkout() -> dict[str, str]:
    """The environment minus anything that would put the source tree on ``sys.path``."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TVM_EXT_CONFIG_DIR")}


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory) -> Path:
    """A fresh venv (seeing this interpreter's packages: tvm, onnx ...) with tvm_ext pip-installed into it."""
    root = tmp_path_factory.mktemp("install")
    src = root / "src"  # a copy, so the build writes nothing into the checkout
    shutil.copytree(REPO, src, ignore=_not_sources)
    venv = root / "venv"
    env = _env_without_the_checkout()
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)],
                   check=True, env=env, timeout=300)
    python = venv / "bin" / "python"
    proc = subprocess.run([str(python), "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           str(src)], capture_output=True, text=True, env=env, cwd=root, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    shutil.rmtree(src)  # the install must not need its source
    return python


def test_devices_load_from_site_packages(venv_python, tmp_path):
    code = ("import tvm_ext, tvm_ext.hardware as hw; spec = tvm_ext.load_device('h100'); "
            "print(spec.name); print(tvm_ext.__file__); print(spec.path); print(len(hw.list_devices()))")
    proc = subprocess.run([str(venv_python), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=_env_without_the_checkout(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, package_file, device_file, count = proc.stdout.strip().splitlines()[-4:]
    site = (venv_python.parent.parent / "lib").resolve()
    package_file, device_file = Path(package_file).resolve(), Path(device_file).resolve()
    assert name == "h100"
    assert package_file.is_relative_to(site) and "site-packages" in package_file.parts, package_file
    assert device_file.is_relative_to(site) and device_file.name == "h100.yaml", device_file
    assert not device_file.is_relative_to(REPO)
    assert int(count) >= 6


def test_cutlass_headers_come_with_the_package(venv_python, tmp_path):
    """The CUTLASS builds include the package's own headers (the attention adapter, the contract
    hook, the empty curand_kernel.h CUTLASS example 41 asks for): they must be installed too."""
    code = ("from tvm_ext.cutlass.nvcc import OWN_INCLUDE as d; "
            "print(all((d / f).is_file() for f in ('tvm_ext_cutlass/attention_op.h', "
            "'tvm_ext_cutlass/contract_attention.h', 'no_curand/curand_kernel.h'))); print(d)")
    proc = subprocess.run([str(venv_python), "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env=_env_without_the_checkout(), timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found, where = proc.stdout.strip().splitlines()[-2:]
    assert found == "True" and "site-packages" in where, where

