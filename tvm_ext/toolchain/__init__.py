"""The CUDA toolchain in one place: finding the toolkit, nvcc flags, compiling and exporting.

* :mod:`.cuda` - the one toolkit finder (``CUDA_PATH``, ``CUDA_HOME``, nvcc's own ``TOP``),
  ``nvcc_path``, ``nvcc_version``, ``nvcc_available``, ``gpu_available``;
* :mod:`.gencode` - the one ``-gencode`` builder: SASS per arch plus PTX of the newest;
* :mod:`.kernel_check` - compile generated CUDA source with nvcc as a build-time check;
* :mod:`.device_code` - compile device code into exported libraries on a host without a driver;
* :mod:`.export` - ``export_library`` with the CUDA runtime linked in when CUTLASS objects are inside.
"""
from __future__ import annotations

from .cuda import (cuda_root, driver_present, find_cuda_root, gpu_available, nvcc_available, nvcc_path, nvcc_version,
                   toolkit_env, use_toolkit)
from .export import export_library, has_cutlass_objects, link_options
from .gencode import gencode_flags
from .kernel_check import NvccResult, compile_cuda_source
from .resource_usage import KernelUsage, compiled_usage, function_kernels, resource_usage

__all__ = [
    "KernelUsage", "compiled_usage", "function_kernels", "resource_usage",
    "cuda_root", "driver_present", "find_cuda_root", "gpu_available", "nvcc_available", "nvcc_path", "nvcc_version", "toolkit_env",
    "use_toolkit", "export_library", "has_cutlass_objects", "link_options", "gencode_flags", "NvccResult", "compile_cuda_source",
]
