"""Hardware model: device descriptions, occupancy calculator and TVM target tags.

Planning code reads a :class:`DeviceSpec` loaded from ``tvm_ext/hardware/devices/<name>.yaml``; it never
queries a live GPU.
"""
from __future__ import annotations

from .device_spec import (
    CONFIG_DIR_ENV,
    DeviceSpec,
    FrozenMap,
    MemoryLevel,
    PACKAGED_DEVICES_DIR,
    config_dir,
    devices_dir,
    list_devices,
    load_device,
    load_device_file,
)
from .occupancy import LIMITER_ORDER, Occupancy, max_registers_for_blocks, occupancy
from .target import (
    DEFAULT_TARGET,
    PLANNING_FIELDS,
    TAG_PREFIX,
    TARGET_KEYS,
    device_from_target,
    is_gpu_target,
    is_tvm_ext_target,
    make_target,
    planning_target,
    register_target_tags,
    resolve_target,
    target_config,
)

__all__ = [
    "CONFIG_DIR_ENV",
    "DEFAULT_TARGET",
    "DeviceSpec",
    "FrozenMap",
    "LIMITER_ORDER",
    "MemoryLevel",
    "Occupancy",
    "PACKAGED_DEVICES_DIR",
    "PLANNING_FIELDS",
    "TAG_PREFIX",
    "TARGET_KEYS",
    "config_dir",
    "device_from_target",
    "devices_dir",
    "is_gpu_target",
    "is_tvm_ext_target",
    "list_devices",
    "load_device",
    "load_device_file",
    "make_target",
    "max_registers_for_blocks",
    "occupancy",
    "planning_target",
    "register_target_tags",
    "resolve_target",
    "target_config",
]
