"""Schema and validation of the device description files ``tvm_ext/hardware/devices/*.yaml``.

A device file is a YAML mapping. :func:`validate_device_config` checks the raw mapping
(types, required fields, cited sources, cross-field consistency) and returns normalized
keyword arguments for :class:`tvm_ext.hardware.device_spec.DeviceSpec`. Every problem is
reported as a :class:`tvm_ext.errors.DeviceConfigError` naming the file and the field.

Rules a device file must follow:

* every field below is present, no unknown field appears;
* every numeric field, every ``peak_flops`` entry and every numeric field of every memory
  level has a non-empty entry in ``sources`` (keys ``field``, ``peak_flops.<dtype>``,
  ``memory_levels.<level>.<field>``), and ``sources`` names no field that does not exist;
* numbers are YAML numbers (PyYAML reads ``3.35e12`` as a string: write ``3.35e+12``);
* the memory levels are exactly ``register``, ``shared``, ``l2``, ``dram``, fastest first,
  and agree with the scalar fields they repeat (capacities, DRAM bandwidth);
* ``cost_model`` holds the constants of the analytic cost model (:data:`COST_FLOAT_FIELDS`,
  :data:`COST_INT_FIELDS`, ``simt_peak_flops.<dtype>`` and ``efficiency.<code path>``; optionally
  :data:`COST_OPTIONAL_FRACTION_FIELDS`, :data:`COST_OPTIONAL_STR_FIELDS`), each with a source; a
  constant nobody publishes is cited as ``"assumed: <reason>"``, one fitted to GPU measurements
  as ``"fitted: ..."`` with the measurements and the script that fitted it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import DeviceConfigError

#: Integer fields of a device file (counts and byte sizes).
INT_FIELDS: tuple[str, ...] = (
    "sm_count",
    "warp_size",
    "registers_per_sm",
    "max_registers_per_block",
    "max_registers_per_thread",
    "register_allocation_unit",
    "sub_partitions_per_sm",
    "shared_memory_per_sm",
    "max_shared_memory_per_block",
    "max_shared_memory_per_block_optin",
    "reserved_shared_memory_per_block",
    "shared_memory_allocation_unit",
    "max_threads_per_block",
    "max_threads_per_sm",
    "max_blocks_per_sm",
    "max_warps_per_sm",
    "l2_cache_bytes",
    "dram_bytes",
)
#: Real-valued fields (rates).
FLOAT_FIELDS: tuple[str, ...] = ("dram_bandwidth_bytes_per_s", "clock_hz")
#: String fields that still need a cited source.
SOURCED_STR_FIELDS: tuple[str, ...] = ("arch", "compute_capability")
#: Fields that need no source.
UNSOURCED_FIELDS: tuple[str, ...] = ("name", "full_name")
OPTIONAL_FIELDS: tuple[str, ...] = ("notes",)
MAPPING_FIELDS: tuple[str, ...] = ("peak_flops", "memory_levels", "cost_model", "sources")

#: Real-valued constants of the analytic cost model (``cost_model.<field>``).
COST_FLOAT_FIELDS: tuple[str, ...] = ("launch_overhead_s", "launch_overhead_graph_s", "grid_sync_s", "dram_latency_s",
                                      "dram_efficiency")
COST_INT_FIELDS: tuple[str, ...] = ("bytes_in_flight_per_thread",)
#: Optional constants: a fraction (0 when absent) and ``sibling``, a device whose measurements stand
#: for this one's ('' when absent).
COST_OPTIONAL_FRACTION_FIELDS: tuple[str, ...] = ("simt_dram_efficiency",)
COST_OPTIONAL_STR_FIELDS: tuple[str, ...] = ("sibling",)
#: Code paths every device prices; ``wgmma`` only exists on devices that have it; a device without
#: ``wmma`` (TVM's tensorized schedules) prices them as ``mma_sync``.
CODE_PATHS_REQUIRED: tuple[str, ...] = ("simt", "simt_contraction", "wmma_tile", "mma_sync")
CODE_PATHS_OPTIONAL: tuple[str, ...] = ("wgmma", "wmma")

#: Memory levels every device describes, fastest first, with their TVM storage scope.
LEVEL_SCOPES: dict[str, str] = {"register": "local", "shared": "shared", "l2": "global", "dram": "global"}
LEVEL_INT_FIELDS: tuple[str, ...] = ("capacity_bytes", "transaction_bytes", "line_bytes")
LEVEL_FLOAT_FIELDS: tuple[str, ...] = ("bandwidth_bytes_per_s",)
LEVEL_FIELDS: tuple[str, ...] = ("name", "scope") + LEVEL_INT_FIELDS + LEVEL_FLOAT_FIELDS

#: Data types every device must give a peak for.
REQUIRED_DTYPES: tuple[str, ...] = ("float32", "float16")

_ALL_FIELDS = (
    UNSOURCED_FIELDS + SOURCED_STR_FIELDS + INT_FIELDS + FLOAT_FIELDS + MAPPING_FIELDS + OPTIONAL_FIELDS
)
_ARCH_RE = re.compile(r"^sm_(\d+)(\d)$")
_CC_RE = re.compile(r"^(\d+)\.(\d)$")


def _fail(path: Path, field: str, message: str) -> DeviceConfigError:
    return DeviceConfigError(f"{path}: field '{field}': {message}")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _number_hint(value: Any) -> str:
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE]\d+", value.strip()):
        return " (YAML 1.1 reads an exponent without sign as a string: write e.g. 3.35e+12)"
    return ""


def _get_int(path: Path, field: str, value: Any) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise _fail(path, field, f"expected an integer, got {type(value).__name__} {value!r}{_number_hint(value)}")
    if value < 0:
        raise _fail(path, field, f"must not be negative, got {value}")
    return value


def _get_float(path: Path, field: str, value: Any) -> float:
    if not _is_number(value):
        raise _fail(path, field, f"expected a number, got {type(value).__name__} {value!r}{_number_hint(value)}")
    if value <= 0:
        raise _fail(path, field, f"must be positive, got {value}")
    return float(value)


def _get_str(path: Path, field: str, value: Any) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _fail(path, field, f"expected a non-empty string, got {value!r}")
    return value.strip()


def _parse_levels(path: Path, raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise _fail(path, "memory_levels", f"expected a list of mappings, got {type(raw).__name__}")
    levels = []
    for index, entry in enumerate(raw):
        where = f"memory_levels[{index}]"
        if not isinstance(entry, Mapping):
            raise _fail(path, where, f"expected a mapping, got {type(entry).__name__}")
        missing = [key for key in LEVEL_FIELDS if key not in entry]
        if missing:
            raise _fail(path, where, f"missing {', '.join(missing)}")
        unknown = sorted(set(entry) - set(LEVEL_FIELDS))
        if unknown:
            allowed = ", ".join(LEVEL_FIELDS)
            raise _fail(path, where, f"unknown key(s) {', '.join(map(str, unknown))}; allowed: {allowed}")
        name = _get_str(path, f"{where}.name", entry["name"])
        level: dict[str, Any] = {"name": name, "scope": _get_str(path, f"memory_levels.{name}.scope", entry["scope"])}
        for key in LEVEL_INT_FIELDS:
            level[key] = _get_int(path, f"memory_levels.{name}.{key}", entry[key])
            if level[key] == 0:
                raise _fail(path, f"memory_levels.{name}.{key}", "must be positive")
        for key in LEVEL_FLOAT_FIELDS:
            level[key] = _get_float(path, f"memory_levels.{name}.{key}", entry[key])
        levels.append(level)
    names = [level["name"] for level in levels]
    if names != list(LEVEL_SCOPES):
        raise _fail(path, "memory_levels", f"levels must be {list(LEVEL_SCOPES)} in this order, got {names}")
    for level in levels:
        expected = LEVEL_SCOPES[level["name"]]
        if level["scope"] != expected:
            raise _fail(path, f"memory_levels.{level['name']}.scope", f"expected '{expected}', got '{level['scope']}'")
    return levels


def _parse_peaks(path: Path, raw: Any) -> dict[str, float]:
    if not isinstance(raw, Mapping) or not raw:
        raise _fail(path, "peak_flops", "expected a non-empty mapping dtype -> FLOP/s")
    peaks = {}
    for dtype, value in raw.items():
        key = _get_str(path, "peak_flops", dtype).lower()
        peaks[key] = _get_float(path, f"peak_flops.{key}", value)
    missing = [dtype for dtype in REQUIRED_DTYPES if dtype not in peaks]
    if missing:
        raise _fail(path, "peak_flops", f"missing required dtype(s) {', '.join(missing)}")
    return peaks


def _fraction(path: Path, field: str, value: Any) -> float:
    out = _get_float(path, field, value)
    if out > 1.0:
        raise _fail(path, field, f"a fraction must be at most 1, got {out}")
    return out


def _parse_cost_model(path: Path, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise _fail(path, "cost_model", f"expected a mapping, got {type(raw).__name__}")
    known = set(COST_FLOAT_FIELDS + COST_INT_FIELDS + ("simt_peak_flops", "efficiency"))
    missing = [key for key in sorted(known) if key not in raw]
    if missing:
        raise _fail(path, "cost_model", f"missing {', '.join(missing)}")
    optional = set(COST_OPTIONAL_FRACTION_FIELDS + COST_OPTIONAL_STR_FIELDS)
    unknown = sorted(str(key) for key in set(raw) - known - optional)
    if unknown:
        raise _fail(path, "cost_model", f"unknown key(s) {', '.join(unknown)}")
    out: dict[str, Any] = {key: _get_float(path, f"cost_model.{key}", raw[key]) for key in COST_FLOAT_FIELDS}
    out["dram_efficiency"] = _fraction(path, "cost_model.dram_efficiency", raw["dram_efficiency"])
    out.update({key: _get_int(path, f"cost_model.{key}", raw[key]) for key in COST_INT_FIELDS})
    out.update({key: _fraction(path, f"cost_model.{key}", raw[key]) for key in COST_OPTIONAL_FRACTION_FIELDS
                if key in raw})
    out.update({key: _get_str(path, f"cost_model.{key}", raw[key]).lower() for key in COST_OPTIONAL_STR_FIELDS
                if key in raw})
    simt = raw["simt_peak_flops"]
    if not isinstance(simt, Mapping) or not all(d in simt for d in REQUIRED_DTYPES):
        raise _fail(path, "cost_model.simt_peak_flops", f"expected a mapping with {', '.join(REQUIRED_DTYPES)}")
    out["simt_peak_flops"] = {str(d).lower(): _get_float(path, f"cost_model.simt_peak_flops.{d}", v)
                              for d, v in simt.items()}
    eff = raw["efficiency"]
    if not isinstance(eff, Mapping) or not all(p in eff for p in CODE_PATHS_REQUIRED):
        raise _fail(path, "cost_model.efficiency", f"expected a mapping with {', '.join(CODE_PATHS_REQUIRED)}")
    extra = sorted(str(p) for p in set(eff) - set(CODE_PATHS_REQUIRED + CODE_PATHS_OPTIONAL))
    if extra:
        raise _fail(path, "cost_model.efficiency", f"unknown code path(s) {', '.join(extra)}")
    out["efficiency"] = {str(p): _fraction(path, f"cost_model.efficiency.{p}", v) for p, v in eff.items()}
    return out


def _parse_sources(path: Path, raw: Any, needed: list[str]) -> dict[str, str]:
    if not isinstance(raw, Mapping):
        raise _fail(path, "sources", f"expected a mapping field -> document, got {type(raw).__name__}")
    sources = {str(key): _get_str(path, f"sources.{key}", value) for key, value in raw.items()}
    missing = [key for key in needed if key not in sources]
    if missing:
        raise _fail(path, "sources", f"no source cited for {', '.join(missing)}")
    stale = sorted(set(sources) - set(needed))
    if stale:
        raise _fail(path, "sources", f"source(s) cited for unknown field(s) {', '.join(stale)}")
    return sources


def _check_consistency(path: Path, cfg: dict[str, Any]) -> None:
    major, minor = cfg["compute_capability"]
    if cfg["arch"] != f"sm_{major}{minor}":
        raise _fail(path, "arch", f"'{cfg['arch']}' does not match compute_capability {major}.{minor}")
    if cfg["max_warps_per_sm"] * cfg["warp_size"] != cfg["max_threads_per_sm"]:
        raise _fail(path, "max_warps_per_sm", "max_warps_per_sm * warp_size must equal max_threads_per_sm")
    if cfg["max_threads_per_block"] > cfg["max_threads_per_sm"]:
        raise _fail(path, "max_threads_per_block", "exceeds max_threads_per_sm")
    if cfg["max_shared_memory_per_block"] > cfg["max_shared_memory_per_block_optin"]:
        raise _fail(path, "max_shared_memory_per_block", "exceeds max_shared_memory_per_block_optin")
    if cfg["max_shared_memory_per_block_optin"] + cfg["reserved_shared_memory_per_block"] > cfg["shared_memory_per_sm"]:
        message = "optin + reserved_shared_memory_per_block exceeds shared_memory_per_sm"
        raise _fail(path, "max_shared_memory_per_block_optin", message)
    if cfg["max_registers_per_block"] > cfg["registers_per_sm"]:
        raise _fail(path, "max_registers_per_block", "exceeds registers_per_sm")
    for field in ("warp_size", "register_allocation_unit", "shared_memory_allocation_unit", "sub_partitions_per_sm"):
        if cfg[field] == 0:
            raise _fail(path, field, "must be positive")
    levels = {level["name"]: level for level in cfg["memory_levels"]}
    repeated = {
        "register": ("capacity_bytes", cfg["registers_per_sm"] * 4, "registers_per_sm * 4"),
        "shared": ("capacity_bytes", cfg["shared_memory_per_sm"], "shared_memory_per_sm"),
        "l2": ("capacity_bytes", cfg["l2_cache_bytes"], "l2_cache_bytes"),
        "dram": ("capacity_bytes", cfg["dram_bytes"], "dram_bytes"),
    }
    for name, (key, expected, what) in repeated.items():
        if levels[name][key] != expected:
            raise _fail(path, f"memory_levels.{name}.{key}", f"{levels[name][key]} disagrees with {what} = {expected}")
    if levels["dram"]["bandwidth_bytes_per_s"] != cfg["dram_bandwidth_bytes_per_s"]:
        raise _fail(path, "memory_levels.dram.bandwidth_bytes_per_s", "disagrees with dram_bandwidth_bytes_per_s")


def required_sources(cfg: Mapping[str, Any]) -> list[str]:
    """Return the ``sources`` keys a validated config must cite, in file order."""
    keys = list(SOURCED_STR_FIELDS) + list(INT_FIELDS) + list(FLOAT_FIELDS)
    keys += [f"peak_flops.{dtype}" for dtype in cfg["peak_flops"]]
    for level in cfg["memory_levels"]:
        keys += [f"memory_levels.{level['name']}.{key}" for key in LEVEL_INT_FIELDS + LEVEL_FLOAT_FIELDS]
    cost = cfg["cost_model"]
    keys += [f"cost_model.{key}" for key in COST_FLOAT_FIELDS + COST_INT_FIELDS]
    keys += [f"cost_model.{key}" for key in COST_OPTIONAL_FRACTION_FIELDS + COST_OPTIONAL_STR_FIELDS
             if key in cost]
    keys += [f"cost_model.simt_peak_flops.{dtype}" for dtype in cost["simt_peak_flops"]]
    keys += [f"cost_model.efficiency.{code_path}" for code_path in cost["efficiency"]]
    return keys


def validate_device_config(raw: Any, path: Path) -> dict[str, Any]:
    """Validate one parsed device file and return keyword arguments for ``DeviceSpec``.

    Parameters
    ----------
    raw : Any
        The object ``yaml.safe_load`` returned for the file.
    path : Path
        The file, named in every error message.

    Returns
    -------
    dict
        Normalized fields; ``memory_levels`` is a list of dicts, ``compute_capability`` a pair.

    Raises
    ------
    DeviceConfigError
        On the first problem found, naming the file and field.
    """
    if not isinstance(raw, Mapping):
        raise DeviceConfigError(f"{path}: expected a YAML mapping at top level, got {type(raw).__name__}")
    missing = [key for key in _ALL_FIELDS if key not in raw and key not in OPTIONAL_FIELDS]
    if missing:
        raise _fail(path, missing[0], f"missing (all missing: {', '.join(missing)})")
    unknown = sorted(str(key) for key in set(raw) - set(_ALL_FIELDS))
    if unknown:
        raise _fail(path, unknown[0], f"unknown field(s) {', '.join(unknown)}")
    cfg: dict[str, Any] = {key: _get_str(path, key, raw[key]) for key in UNSOURCED_FIELDS + ("arch",)}
    cfg["name"] = cfg["name"].lower()
    if path.suffix in (".yaml", ".yml") and cfg["name"] != path.stem.lower():
        raise _fail(path, "name", f"'{cfg['name']}' must equal the file stem '{path.stem.lower()}'")
    if not _ARCH_RE.match(cfg["arch"]):
        raise _fail(path, "arch", f"expected 'sm_<major><minor>' such as sm_80, got '{cfg['arch']}'")
    cc = raw["compute_capability"]
    match = _CC_RE.match(str(cc)) if isinstance(cc, (str, float)) else None
    if match is None:
        raise _fail(path, "compute_capability", f"expected a string like \"8.0\", got {cc!r}")
    cfg["compute_capability"] = (int(match.group(1)), int(match.group(2)))
    for key in INT_FIELDS:
        cfg[key] = _get_int(path, key, raw[key])
    for key in FLOAT_FIELDS:
        cfg[key] = _get_float(path, key, raw[key])
    for key in ("sm_count", "max_threads_per_block", "max_threads_per_sm", "max_blocks_per_sm", "registers_per_sm"):
        if cfg[key] == 0:
            raise _fail(path, key, "must be positive")
    cfg["peak_flops"] = _parse_peaks(path, raw["peak_flops"])
    cfg["memory_levels"] = _parse_levels(path, raw["memory_levels"])
    cfg["cost_model"] = _parse_cost_model(path, raw["cost_model"])
    cfg["sources"] = _parse_sources(path, raw["sources"], required_sources(cfg))
    notes = raw.get("notes", "")
    if not isinstance(notes, str):
        raise _fail(path, "notes", f"expected a string, got {type(notes).__name__}")
    cfg["notes"] = notes.strip()
    _check_consistency(path, cfg)
    return cfg
