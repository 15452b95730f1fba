"""Static description of an NVIDIA GPU for planning: :class:`DeviceSpec` and its loader.

Descriptions are ``<name>.yaml`` files shipped with the package in ``tvm_ext/hardware/devices``
(package data, so every kind of install has them). ``$TVM_EXT_CONFIG_DIR/devices``, when that
variable is set and the directory exists, replaces them (see :func:`devices_dir`).
Planning code reads a ``DeviceSpec``; it never queries a live GPU.
"""
from __future__ import annotations

import functools
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import DeviceConfigError, UnknownDeviceError
from .device_schema import validate_device_config

CONFIG_DIR_ENV = "TVM_EXT_CONFIG_DIR"
#: The device descriptions shipped with the package.
PACKAGED_DEVICES_DIR = Path(__file__).resolve().parent / "devices"

#: Common spellings accepted by :meth:`DeviceSpec.peak_flops_for`.
DTYPE_ALIASES: dict[str, str] = {
    "fp64": "float64",
    "fp32": "float32",
    "tf32": "tfloat32",
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "uint8": "int8",
    "fp8": "float8_e4m3fn",
}


class FrozenMap(Mapping):
    """An immutable, hashable, picklable ``dict`` view used for spec fields."""

    __slots__ = ("_data",)

    def __init__(self, data: Mapping[str, Any] | None = None):
        self._data = dict(data or {})

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._data.items())))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and dict(self.items()) == dict(other.items())

    def __repr__(self) -> str:
        return f"FrozenMap({self._data!r})"

    def __reduce__(self):
        return (FrozenMap, (self._data,))


@dataclass(frozen=True)
class MemoryLevel:
    """One level of the memory hierarchy as the cost model sees it.

    Parameters
    ----------
    name : str
        ``"register"``, ``"shared"`` (shared memory / L1), ``"l2"`` or ``"dram"``.
    capacity_bytes : int
        Capacity of one instance: per SM for scopes ``"local"`` and ``"shared"``,
        per device for scope ``"global"``.
    bandwidth_bytes_per_s : float
        Aggregate bandwidth of the whole device at this level.
    transaction_bytes : int
        Smallest unit moved (32-byte sectors for L2/DRAM, 128-byte wavefront for shared memory).
    scope : str
        TVM storage scope that lives in this level: ``"local"``, ``"shared"`` or ``"global"``.
    line_bytes : int
        Cache-line size (128 bytes for L2/DRAM); equal to ``transaction_bytes`` elsewhere.
    """

    name: str
    capacity_bytes: int
    bandwidth_bytes_per_s: float
    transaction_bytes: int
    scope: str
    line_bytes: int = 0

    @property
    def per_sm(self) -> bool:
        """Whether ``capacity_bytes`` is per SM (on-chip levels) rather than per device."""
        return self.scope in ("local", "shared")


@dataclass(frozen=True)
class CostConstants:
    """Constants of the analytic cost model (``cost_model`` in a device file; each cites a source,
    or says ``assumed`` and why).

    Attributes
    ----------
    launch_overhead_s, launch_overhead_graph_s : float
        Cost of one kernel launch from a stream, and from a CUDA graph replay.
    grid_sync_s : float
        One in-kernel grid barrier.
    dram_latency_s : float
        Latency of a global load that misses L2 (bounds the bandwidth of small grids).
    bytes_in_flight_per_thread : int
        Bytes one resident thread keeps in flight in a streaming kernel.
    dram_efficiency : float
        Fraction of the DRAM bandwidth a streaming kernel sustains.
    simt_peak_flops : Mapping
        CUDA-core peak FLOP/s per dtype (no tensor cores).
    efficiency : Mapping
        Code path (``simt``, ``mma_sync``, ``wgmma``) -> fraction of its peak a kernel sustains.
    simt_dram_efficiency : float
        Fraction of the DRAM bandwidth a SIMT kernel (``simt``, ``simt_contraction``) sustains, where
        it differs from ``dram_efficiency`` (0: the same).
    sibling : str
        A device whose measurements stand for this one's, scaled by the cost model's ratio of
        the two ('' for none).
    """

    launch_overhead_s: float
    launch_overhead_graph_s: float
    grid_sync_s: float
    dram_latency_s: float
    bytes_in_flight_per_thread: int
    dram_efficiency: float
    simt_peak_flops: Mapping[str, float]
    efficiency: Mapping[str, float]
    simt_dram_efficiency: float = 0.0
    sibling: str = ""


@dataclass(frozen=True)
class DeviceSpec:
    """Everything planning needs to know about one GPU model (see ``tvm_ext/hardware/devices/*.yaml``).

    Byte sizes are in bytes, rates per second. ``peak_flops`` maps a TVM dtype string to the
    dense peak (tensor cores where the device has them for that dtype, FP32 accumulate for
    16-bit inputs; ``float32`` is the non-tensor CUDA-core rate). ``sources`` maps every
    numeric field (``peak_flops.<dtype>``, ``memory_levels.<level>.<field>`` for nested ones)
    to the document it comes from.
    """

    name: str
    full_name: str
    arch: str
    compute_capability: tuple[int, int]
    sm_count: int
    warp_size: int
    registers_per_sm: int
    max_registers_per_block: int
    max_registers_per_thread: int
    register_allocation_unit: int
    sub_partitions_per_sm: int
    shared_memory_per_sm: int
    max_shared_memory_per_block: int
    max_shared_memory_per_block_optin: int
    reserved_shared_memory_per_block: int
    shared_memory_allocation_unit: int
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    max_warps_per_sm: int
    l2_cache_bytes: int
    dram_bytes: int
    dram_bandwidth_bytes_per_s: float
    clock_hz: float
    peak_flops: Mapping[str, float]
    memory_levels: tuple[MemoryLevel, ...]
    cost: CostConstants
    sources: Mapping[str, str]
    notes: str = ""
    path: str = field(default="", compare=False)

    def __hash__(self) -> int:
        return hash((self.name, self.arch, self.sm_count, self.peak_flops, self.memory_levels))

    def level(self, name: str) -> MemoryLevel:
        """Return the memory level called ``name`` (``register``, ``shared``, ``l2``, ``dram``)."""
        for level in self.memory_levels:
            if level.name == name:
                return level
        known = ", ".join(level.name for level in self.memory_levels)
        raise DeviceConfigError(f"device '{self.name}' has no memory level '{name}' (levels: {known})")

    def peak_flops_for(self, dtype: str) -> float:
        """Dense peak FLOP/s (or OP/s for integers) for ``dtype``.

        Raises
        ------
        DeviceConfigError
            If the device file gives no peak for that dtype (e.g. ``int8`` on V100).
        """
        key = DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
        try:
            return self.peak_flops[key]
        except KeyError:
            known = ", ".join(sorted(self.peak_flops))
            raise DeviceConfigError(
                f"device '{self.name}' has no peak_flops entry for dtype '{dtype}' (known: {known})"
            ) from None

    def ridge_point(self, dtype: str) -> float:
        """Roofline ridge point: FLOPs per DRAM byte at which ``dtype`` compute and DRAM balance."""
        return self.peak_flops_for(dtype) / self.dram_bandwidth_bytes_per_s


def config_dir() -> Path:
    """Directory of optional configuration: ``$TVM_EXT_CONFIG_DIR``, else ``configs`` beside the package.

    It may not exist (an installed wheel has none beside it). Its ``cutlass/database.jsonl`` is
    the default CUTLASS tuning database; with ``$TVM_EXT_CONFIG_DIR`` set, its ``devices/``
    replaces the packaged device descriptions (:func:`devices_dir`).
    """
    env = os.environ.get(CONFIG_DIR_ENV)
    if env:
        return Path(env).expanduser().resolve()
    # this file is <root>/tvm_ext/hardware/device_spec.py; tvm_ext.__file__ is <root>/tvm_ext/__init__.py
    return Path(__file__).resolve().parent.parent.parent / "configs"


def devices_dir() -> Path:
    """Directory holding the device description files.

    ``$TVM_EXT_CONFIG_DIR/devices`` when the variable is set and that directory exists, else
    the packaged :data:`PACKAGED_DEVICES_DIR`.
    """
    if os.environ.get(CONFIG_DIR_ENV):
        override = config_dir() / "devices"
        if override.is_dir():
            return override
    return PACKAGED_DEVICES_DIR


def _device_files() -> dict[str, Path]:
    directory = devices_dir()
    if not directory.is_dir():
        return {}
    files = sorted(directory.glob("*.yaml")) + sorted(directory.glob("*.yml"))
    return {path.stem.lower(): path for path in files}


def list_devices() -> list[str]:
    """Names of every device described in :func:`devices_dir`, sorted."""
    return sorted(_device_files())


@functools.lru_cache(maxsize=64)
def _load_cached(path: str, mtime_ns: int, size: int) -> DeviceSpec:
    del mtime_ns, size  # part of the cache key only: an edited file is re-read
    file = Path(path)
    try:
        raw = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise DeviceConfigError(f"{file}: not valid YAML: {err}") from err
    cfg = validate_device_config(raw, file)
    levels = tuple(MemoryLevel(**level) for level in cfg.pop("memory_levels"))
    cost = cfg.pop("cost_model")
    cost = CostConstants(**{**cost, "simt_peak_flops": FrozenMap(cost["simt_peak_flops"]),
                            "efficiency": FrozenMap(cost["efficiency"])})
    return DeviceSpec(
        **{key: value for key, value in cfg.items() if key not in ("peak_flops", "sources")},
        peak_flops=FrozenMap(cfg["peak_flops"]),
        cost=cost,
        sources=FrozenMap(cfg["sources"]),
        memory_levels=levels,
        path=str(file),
    )


def load_device_file(path: str | os.PathLike[str]) -> DeviceSpec:
    """Load and validate one device file (cached until the file changes)."""
    file = Path(path).expanduser().resolve()
    try:
        stat = file.stat()
    except OSError as err:
        raise UnknownDeviceError(f"device file {file} cannot be read: {err.strerror}") from err
    return _load_cached(str(file), stat.st_mtime_ns, stat.st_size)


def load_device(name_or_path: str | os.PathLike[str] | DeviceSpec) -> DeviceSpec:
    """Return the :class:`DeviceSpec` for a device name (case-insensitive) or a YAML path.

    Parameters
    ----------
    name_or_path : str, PathLike or DeviceSpec
        A stem of a file in :func:`devices_dir` such as ``"h100"``, or a path to a device
        file (anything ending in ``.yaml``/``.yml`` or containing a path separator). A
        ``DeviceSpec`` is returned unchanged.

    Raises
    ------
    UnknownDeviceError
        No such device; the message lists the known ones.
    DeviceConfigError
        The file exists but is malformed.
    """
    if isinstance(name_or_path, DeviceSpec):
        return name_or_path
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or text.endswith((".yaml", ".yml")) or os.sep in text:
        return load_device_file(text)
    files = _device_files()
    path = files.get(text.strip().lower())
    if path is None:
        known = ", ".join(sorted(files)) or "none"
        raise UnknownDeviceError(f"unknown device '{text}'; known devices in {devices_dir()}: {known}")
    return load_device_file(path)
