"""Deployable libraries: compile here, run there with the TVM runtime alone.

* :mod:`.runtime` - TVM without its compiler (``TVM_USE_RUNTIME_LIB=1``), its CUDA runtime, the device;
* :mod:`.signature` - the inputs a library takes and where its weights are, carried inside it;
* :mod:`.weights` - weights kept outside the library: a params file loaded at run time;
* :mod:`.runner` - load a library, feed inputs, run and time ``main`` (``tvm-ext run``);
* :mod:`.build` - compile a model into such a library (``tvm-ext compile``; needs TVM's compiler).

The build side is :func:`tvm_ext.toolchain.export_library` (compiled device code) and
``tvm-ext compile``. Everything here but the build helpers of :mod:`.signature` and
:mod:`.weights` imports numpy and the TVM runtime only (the runtime side of bench bundles
copies it) except :mod:`.build`, and this ``__init__`` imports nothing but the error types.
"""
from __future__ import annotations

from ..errors import TvmExtError


class DeployError(TvmExtError):
    """A library, its params file or its inputs cannot be loaded or run here."""


class NoDeviceError(DeployError):
    """This machine has no device of the library's kind (no GPU, no NVIDIA driver, no TVM CUDA runtime)."""


__all__ = ["DeployError", "NoDeviceError"]
