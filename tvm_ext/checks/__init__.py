"""Checks of what the GPU will execute, run on the CPU (no GPU needed).

- :mod:`~tvm_ext.checks.lowered`: the device kernels TVM's lowering leaves for a scheduled function.
- :mod:`~tvm_ext.checks.emulator`: those kernels run with CUDA's semantics: barriers, warp
  shuffles, adversarial block order, poisoned memory, races (:mod:`~tvm_ext.checks.memory`).
- :mod:`~tvm_ext.checks.kernel`: one function emulated and compared with its unscheduled form.
- :mod:`~tvm_ext.checks.write_once`: output elements stored by two threads (static).
- :mod:`~tvm_ext.checks.lowering`: whether TVM lowers a scheduled kernel at all (and its static
  shared memory fits).
- :mod:`~tvm_ext.checks.thread_serial`: a scheduled function with its threads serialized, on the CPU.
- :mod:`~tvm_ext.checks.library_calls`: a preset's CUTLASS calls through their host contract
  (imported on use, like ``model``: it runs the driver's graph stage).
- :mod:`~tvm_ext.checks.model`: ``tvm_ext.verify`` / ``tvm-ext verify``, every kernel of a build
  (imported on use: it builds through the driver, which this package's core must not need).
"""
from __future__ import annotations

from .emulator import LaunchResult, emulate_launch
from .input_domain import emulate_in_domain
from .kernel import EmulationVerdict, emulate_function
from .lowered import DeviceLaunch, device_kernels, lower_device, lowered_module
from .memory import Finding, Race, Storage
from .tir_expr import Unemulated

__all__ = ["DeviceLaunch", "EmulationVerdict", "Finding", "LaunchResult", "Race", "Storage", "Unemulated",
           "device_kernels", "emulate_function", "emulate_in_domain", "emulate_launch", "lower_device", "lowered_module"]
