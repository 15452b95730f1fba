"""Shared pytest configuration: the `gpu` marker and common fixtures."""
from __future__ import annotations

import pytest


def pytest_collection_modifyitems(config, items):
    from tvm_ext.toolchain import gpu_available

    if gpu_available():
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


@pytest.fixture
def planned_preset():
    """The name of a registered preset that is announced but not implemented (removed afterwards)."""
    from tvm_ext.driver.presets import Preset, register_preset, unregister_preset

    register_preset(Preset("planned_example", "a preset announced for a test", techniques=("none",),
                           implemented=False))
    yield "planned_example"
    unregister_preset("planned_example")
