"""Cost-model constants fitted to GPU measurements: written into a device file, and summarised.

A fitted constant's source says ``fitted: ...`` (the measurements, the script, the fit) or, for
a device whose value comes from another device's fit, ``fitted on <device>: ...`` with the
documented difference that justifies it. :func:`write_cost_model` rewrites the ``cost_model``
block of a device file and its ``cost_model.*`` sources, keeping the rest of the file as it is;
:func:`calibration_summary` and :func:`measured_kernels` are what ``tvm-ext devices`` shows.

Example
-------
>>> write_cost_model(Path("h200.yaml"), {"efficiency.wmma": 0.065}, {"efficiency.wmma": "fitted: ..."})
>>> calibration_summary(load_device("h200"))
'1 fitted (efficiency.wmma)'
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from .device_spec import DeviceSpec, load_device_file

#: Order of the scalar constants in a written ``cost_model`` block.
_SCALARS = ("launch_overhead_s", "launch_overhead_graph_s", "grid_sync_s", "dram_latency_s",
            "bytes_in_flight_per_thread", "dram_efficiency", "simt_dram_efficiency", "sibling")


def yaml_number(value: float) -> str:
    """``value`` as a YAML 1.1 float PyYAML reads back as one (a mantissa with a dot, a signed exponent)."""
    if value == 0:
        return "0.0"
    text = f"{value:.4g}" if 1e-3 <= abs(value) < 1e4 else f"{value:.3e}"
    mantissa, _, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return f"{mantissa}e{exponent[0] if exponent[0] in '+-' else '+'}{exponent.lstrip('+-')}" if exponent else mantissa


def _old_lines(block: list[str]) -> dict[str, str]:
    """The lines of a ``cost_model`` block by constant (``efficiency.simt`` for nested ones)."""
    out: dict[str, str] = {}
    parent = ""
    for line in block[1:]:
        name = line.strip().split(":", 1)[0]
        if line.startswith("    "):
            out[f"{parent}.{name}"] = line
        elif line.startswith("  ") and name:
            parent = name
            out[name] = line
    return out


def _block(cost: Mapping[str, Any], changed: set[str], old: Mapping[str, str]) -> list[str]:
    """The ``cost_model`` block: the lines of unchanged constants as they were, the others written."""
    def line(key: str, indent: str, value: Any) -> str:
        if key not in changed and key in old:
            return old[key]
        name = key.rsplit(".", 1)[-1]
        if isinstance(value, str):
            return f"{indent}{name}: {value}"
        if name == "bytes_in_flight_per_thread":
            return f"{indent}{name}: {round(value)}"
        return f"{indent}{name}: {yaml_number(float(value))}"

    lines = ["cost_model:                             # constants of the analytic cost model (tvm_ext.select.analytic)"]
    lines += [line(key, "  ", cost[key]) for key in _SCALARS if key in cost]
    for group in ("simt_peak_flops", "efficiency"):
        lines.append(old.get(group, f"  {group}:"))
        lines += [line(f"{group}.{k}", "    ", v) for k, v in cost[group].items()]
    return lines


def write_cost_model(path: Path, values: Mapping[str, float | str], sources: Mapping[str, str]) -> None:
    """Set the ``cost_model`` constants ``values`` (``launch_overhead_s``, ``efficiency.wmma``, ...)
    of the device file ``path`` with their ``sources``; every other line stays as it is.

    The file is validated by loading it afterwards (a bad value raises
    :class:`~tvm_ext.errors.DeviceConfigError` and leaves the written file for inspection).
    """
    text = Path(path).read_text()
    raw = yaml.safe_load(text)
    cost = dict(raw["cost_model"])
    cost["efficiency"] = dict(cost["efficiency"])
    for name, value in values.items():
        if name.startswith("efficiency."):
            cost["efficiency"][name.split(".", 1)[1]] = value
        else:
            cost[name] = value
    cited = {k: v for k, v in raw["sources"].items() if k.startswith("cost_model.")}
    cited.update({f"cost_model.{k}": v for k, v in sources.items()})
    lines = text.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("cost_model:")))
    end = next(i for i in range(start + 1, len(lines)) if lines[i] and not lines[i].startswith((" ", "#")))
    out = lines[:start] + _block(cost, set(values), _old_lines(lines[start:end])) + lines[end:]
    out = [line for line in out if not line.startswith("  cost_model.")]
    begin = next(i for i, line in enumerate(out) if line.startswith("sources:"))
    stop = next((i for i in range(begin + 1, len(out)) if out[i] and not out[i].startswith((" ", "#"))), len(out))
    order = ([f"cost_model.{k}" for k in _SCALARS] + [f"cost_model.simt_peak_flops.{d}" for d in cost["simt_peak_flops"]]
             + [f"cost_model.efficiency.{p}" for p in cost["efficiency"]])
    cited_lines = [f"  {key}: {yaml.safe_dump(cited[key], width=10 ** 6, default_style=chr(34)).strip()}"
                   for key in order if key in cited]
    out = out[:stop] + cited_lines + out[stop:]
    Path(path).write_text("\n".join(out) + "\n")
    load_device_file(path)


def measured_kernels(device: DeviceSpec) -> str:
    """How many kernel records the package ships for ``device`` and for its sibling (``"-"`` for none)."""
    from ..select.database import shipped_database

    counts: dict[str, int] = {}
    for record in shipped_database():
        counts[record.device] = counts.get(record.device, 0) + 1
    own, sibling = counts.get(device.name, 0), device.cost.sibling
    parts = [str(own)] if own else []
    if sibling and counts.get(sibling):
        parts.append(f"{counts[sibling]} on {sibling}, scaled")
    return ", ".join(parts) or "-"


def fitted_constants(device: DeviceSpec) -> list[str]:
    """The ``cost_model`` constants of ``device`` whose source says they were fitted."""
    return [key.split(".", 1)[1] for key, source in device.sources.items()
            if key.startswith("cost_model.") and source.startswith("fitted")]


def calibration_summary(device: DeviceSpec) -> str:
    """One phrase: how many cost-model constants of ``device`` were fitted to measurements, and on
    which device (``"-"`` for none)."""
    fitted = fitted_constants(device)
    if not fitted:
        return "-"
    where = {device.sources[f"cost_model.{k}"].split(":", 1)[0].removeprefix("fitted").strip() for k in fitted}
    on = ", ".join(sorted(w for w in where if w)) or f"on {device.name}"
    return f"{len(fitted)} fitted {on}"


__all__ = ["calibration_summary", "fitted_constants", "measured_kernels", "write_cost_model", "yaml_number"]
