"""Errors of the CUTLASS offload (subclasses of :class:`tvm_ext.errors.TvmExtError`).

nvcc failures and a missing CUDA toolkit raise :class:`tvm_ext.errors.KernelCompileError`.
"""
from __future__ import annotations

from ..errors import TvmExtError


class CutlassCodegenError(TvmExtError):
    """A function handed to the CUTLASS codegen is not one the partitioner produces."""


class CutlassSetupError(TvmExtError):
    """The ``nvidia-cutlass`` package (headers, ``cutlass_library``) or a host tool (ld, g++) is missing."""

