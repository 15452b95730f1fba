"""Shared pytest configuration: the `gpu` marker and common fixtures."""
from __future__ import annotations

import pytest


def _has_cuda_gpu() -> bool:
    import tvm

    try:
        return bool(tvm.cuda(0).exist)
    except (RuntimeError, ValueError):  # no CUDA runtime in this build / no driver
        return False


def pytest_collection_modifyitems(config, items):
    if _has_cuda_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (none found)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def cuda_target():
    """An sm_90 CUDA target (codegen works without a GPU)."""
    import tvm

    return tvm.target.Target({"kind": "cuda", "arch": "sm_90"})


@pytest.fixture(scope="session")
def llvm_target():
    import tvm

    return tvm.target.Target({"kind": "llvm"})
