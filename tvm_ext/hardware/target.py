"""TVM targets for the described devices and the way back from a target to a spec.

Every device gets a CUDA target tag ``tvm_ext/<name>`` (see :func:`target_config`):
``keys`` ``["cuda", "gpu", "tvm_ext"]`` (``"gpu"`` makes ``tvm.compile`` choose the GPU
pipeline), ``model`` the device name (TVM keeps ``model`` on the target but reports ``tag`` as
``""``, so the model is how a pass finds the device again), and the CUDA attributes TVM's
schedule rules read.

``max_shared_memory_per_block`` is the 48 KiB default, not the opt-in maximum: TVM's schedules
(dlight, meta_schedule) place shared buffers in the static ``shared`` scope, and ptxas rejects
more than 48 KiB of static shared memory ("uses too much shared data (0x10000 bytes, 0xc000
max)", checked with nvcc 13 for sm_80; the ``tirx.merge_static_smem`` option did not turn them
dynamic). Only ``shared.dyn`` buffers may exceed 48 KiB; the TVM CUDA runtime then raises the
kernel's dynamic shared memory limit by itself. Our own planner reads
:attr:`DeviceSpec.max_shared_memory_per_block_optin` for such kernels.

Target -> device rule (:func:`device_from_target`):

1. a ``DeviceSpec`` is returned unchanged; ``"tvm_ext/<name>"`` or a bare device name is looked up;
2. the target must be of kind ``cuda``;
3. if its ``model`` names a known device, that device;
4. otherwise a target with the ``tvm_ext`` key is an error (it claims to be ours but is not);
5. otherwise a plain CUDA target maps by ``arch`` (suffixes ``a``/``f`` ignored) when exactly one
   device has that arch: sm_70 -> v100, sm_75 -> t4, sm_80 -> a100, sm_86 -> rtx3090;
6. an arch several devices share (sm_90: h100 and h200) maps to the first of them by name when
   they agree on every number planning reads (:data:`PLANNING_FIELDS`: SMs, registers, shared
   memory, thread and block limits), with a warning that rates (bandwidth, peaks) are the first
   device's; otherwise it is an error, as is an arch no device has.

This is the only target -> device rule of the package; every technique calls
:func:`device_from_target`. :data:`DEFAULT_TARGET` is the one default target, and
:func:`planning_target` the GPU target a CPU build (the correctness oracle) plans its kernels for.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any, Union

import tvm
from tvm.target import Target

from ..errors import TVM_ERRORS, UnknownDeviceError
from .device_spec import DeviceSpec, list_devices, load_device

TAG_PREFIX = "tvm_ext/"
#: The default target of every entry point (``tvm_ext.compile``, the CLI, the CPU oracle's planning).
DEFAULT_TARGET = "tvm_ext/h100"
#: DeviceSpec fields that kernel planning reads (occupancy, launch shapes, shared memory budgets).
PLANNING_FIELDS = ("sm_count", "warp_size", "registers_per_sm", "max_registers_per_block",
                   "max_registers_per_thread", "register_allocation_unit", "sub_partitions_per_sm",
                   "shared_memory_per_sm", "max_shared_memory_per_block", "max_shared_memory_per_block_optin",
                   "reserved_shared_memory_per_block", "shared_memory_allocation_unit", "max_threads_per_block",
                   "max_threads_per_sm", "max_blocks_per_sm", "max_warps_per_sm")
TVM_EXT_KEY = "tvm_ext"
TARGET_KEYS: tuple[str, ...] = ("cuda", "gpu", TVM_EXT_KEY)
_ARCH_RE = re.compile(r"^sm_(\d+)(\d)([af]?)$")

TargetLike = Union[Target, str, Mapping[str, Any], DeviceSpec]
_LOG = logging.getLogger(__name__)


def _parse_arch(arch: str) -> tuple[int, int, str]:
    match = _ARCH_RE.match(arch)
    if match is None:
        raise ValueError(f"arch must look like 'sm_80' or 'sm_90a', got '{arch}'")
    return int(match.group(1)), int(match.group(2)), match.group(3)


def target_config(spec: DeviceSpec, arch: str | None = None) -> dict[str, Any]:
    """The TVM target dict for ``spec`` (what the tag ``tvm_ext/<name>`` stands for).

    Parameters
    ----------
    spec : DeviceSpec
        The device.
    arch : str, optional
        Override of ``spec.arch``, e.g. ``"sm_90a"`` for Hopper-only instructions, or an older
        arch to build portable code. It may not be newer than the device, and an ``a``/``f``
        arch must match the device exactly.
    """
    arch = spec.arch if arch is None else arch
    major, minor, suffix = _parse_arch(arch)
    if (major, minor) > spec.compute_capability:
        raise ValueError(f"arch {arch} is newer than {spec.name} (compute capability {spec.compute_capability})")
    if suffix and (major, minor) != spec.compute_capability:
        raise ValueError(f"arch-specific {arch} only runs on compute capability {major}.{minor}, not on {spec.name}")
    return {
        "kind": "cuda",
        "arch": arch,
        "keys": list(TARGET_KEYS),
        "model": spec.name,
        "max_shared_memory_per_block": spec.max_shared_memory_per_block,
        "max_threads_per_block": spec.max_threads_per_block,
        "max_num_threads": spec.max_threads_per_block,
        "thread_warp_size": spec.warp_size,
        "registers_per_block": spec.max_registers_per_block,
        "l2_cache_size_bytes": spec.l2_cache_bytes,
    }


def make_target(device: str | DeviceSpec, arch: str | None = None) -> Target:
    """Build the CUDA :class:`tvm.target.Target` for a device (no tag registration needed).

    Raises
    ------
    UnknownDeviceError
        ``device`` names no device file.
    ValueError
        ``arch`` is malformed or does not fit the device.
    """
    return Target(target_config(load_device(device), arch))


def register_target_tags() -> list[str]:
    """Register ``tvm_ext/<name>`` for every device file; returns the tag names.

    Idempotent: TVM refuses to redefine a tag unless asked to override, so tags are registered
    with ``override=True`` and a repeated call (or an edited device file) just refreshes them.
    """
    tags = []
    for name in list_devices():
        tag = TAG_PREFIX + name
        tvm.target.tag.register_tag(tag, target_config(load_device(name)), override=True)
        tags.append(tag)
    return tags


def _as_target(target: TargetLike) -> Target:
    if isinstance(target, Target):
        return target
    if isinstance(target, str):
        text = target.strip()
        if text.lower().startswith(TAG_PREFIX):
            return make_target(text[len(TAG_PREFIX):])
        if text.lower() in list_devices():
            return make_target(text)
    try:
        return Target(target)
    except TVM_ERRORS as err:  # TVM reports bad targets as ValueError
        raise UnknownDeviceError(f"cannot interpret {target!r} as a TVM target: {err}") from err


def _attr(target: Target, name: str) -> str | None:
    value = target.attrs.get(name)
    return None if value is None else str(value)


def resolve_target(target: TargetLike | None) -> Target:
    """A ``Target`` from a tag (``tvm_ext/*`` tags are built from the device files directly), JSON
    dict, device name or ``Target``; :data:`DEFAULT_TARGET` for None.

    Raises
    ------
    UnknownDeviceError
        TVM rejects the description (unknown tag, bad attribute).
    """
    if target is None:
        target = DEFAULT_TARGET
    if isinstance(target, DeviceSpec):
        return make_target(target)
    return _as_target(target)


def is_gpu_target(target: Target | None) -> bool:
    """True for targets that take the GPU path (their keys hold ``"gpu"``)."""
    return target is not None and "gpu" in [str(k) for k in target.keys]


def planning_target(target: Target | None) -> Target:
    """The GPU target kernels are planned for: ``target`` itself when it is a GPU target, else
    :data:`DEFAULT_TARGET` (a CPU build of the fused graph, the correctness oracle, plans the
    same kernels as the default GPU build)."""
    return target if is_gpu_target(target) else resolve_target(DEFAULT_TARGET)


def is_tvm_ext_target(target: Target | str | Mapping[str, Any]) -> bool:
    """Whether ``target`` is a CUDA target carrying the ``tvm_ext`` key (our tags and make_target)."""
    try:
        resolved = _as_target(target)
    except UnknownDeviceError:
        return False
    return resolved.kind.name == "cuda" and TVM_EXT_KEY in [str(key) for key in resolved.keys]


def device_from_target(target: TargetLike) -> DeviceSpec:
    """Return the :class:`DeviceSpec` a target describes (rule in the module docstring).

    Parameters
    ----------
    target : Target, str, dict or DeviceSpec
        A target, a tag such as ``"tvm_ext/h100"``, a device name, or a target dict.

    Raises
    ------
    UnknownDeviceError
        The target is not CUDA, or names no known device, or its arch maps to none or several.
    """
    if isinstance(target, DeviceSpec):
        return target
    resolved = _as_target(target)
    if resolved.kind.name != "cuda":
        raise UnknownDeviceError(f"target {resolved} is of kind '{resolved.kind.name}', not a CUDA target")
    known = list_devices()
    model = _attr(resolved, "model")
    if model and model.lower() in known:
        return load_device(model)
    if TVM_EXT_KEY in [str(key) for key in resolved.keys]:
        raise UnknownDeviceError(
            f"target has the '{TVM_EXT_KEY}' key but model {model!r} is not a known device; known: {', '.join(known)}"
        )
    arch = _attr(resolved, "arch")
    if arch is None:
        raise UnknownDeviceError(f"CUDA target {resolved} has no arch and no known model; known: {', '.join(known)}")
    try:
        major, minor, _ = _parse_arch(arch)
    except ValueError as err:
        raise UnknownDeviceError(f"CUDA target {resolved}: {err}") from err
    base = f"sm_{major}{minor}"
    matches = [name for name in known if load_device(name).arch == base]
    if len(matches) == 1:
        return load_device(matches[0])
    if matches:
        specs = [load_device(name) for name in matches]
        if all(getattr(s, f) == getattr(specs[0], f) for s in specs for f in PLANNING_FIELDS):
            _LOG.warning("arch %s is shared by devices %s; planning for %s (use a tag such as '%s%s' to model "
                         "another one's bandwidth and peak rates)", arch, ", ".join(matches), matches[0],
                         TAG_PREFIX, matches[-1])
            return specs[0]
        raise UnknownDeviceError(
            f"arch {arch} is ambiguous between devices {', '.join(matches)}; "
            f"use a tag such as '{TAG_PREFIX}{matches[0]}' or make_target('{matches[0]}')"
        )
    raise UnknownDeviceError(f"no device has arch {arch} (model {model!r}); known devices: {', '.join(known)}")
