"""One model under several presets, side by side: ``tvm-ext compare``.

:func:`compare` builds the model once per preset (:func:`tvm_ext.inspect.inspect`) and collects
launches per inference, distinct kernels, modelled global traffic, modelled time (the cost
model's, see :mod:`tvm_ext.inspect.report`) and compile time. The text view is one table; the
HTML view adds a bar chart of the modelled times.

Example
-------
>>> table = compare("bert_layer.onnx", ["baseline", "stitch", "full"], fp16=True)
>>> print(table.to_table())
"""
from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..hardware import DEFAULT_TARGET
from .pictures import colour
from .render import human_bytes, human_seconds, text_table
from .report import Report, inspect


@dataclass
class Comparison:
    """Reports of one model under several presets (in the order asked)."""

    model: str
    reports: list[Report] = field(default_factory=list)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per preset (JSON-serialisable)."""
        best = min((r.modelled_time_s for r in self.reports), default=0.0)
        return [{"preset": r.preset, "launches": r.kernels, "distinct_kernels": r.distinct_kernels,
                 "traffic_bytes": r.traffic_bytes, "modelled_time_s": r.modelled_time_s,
                 "vs_best": r.modelled_time_s / best if best else None, "compile_seconds": r.compile_seconds,
                 "generators": _generators(r)} for r in self.reports]

    def to_json(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return {"model": self.model, "device": self.reports[0].device if self.reports else "", "rows": self.rows()}

    def to_table(self) -> str:
        """Plain-text table."""
        head = ["preset", "launches", "distinct", "traffic", "modelled time", "x best", "compile", "launches by generator"]
        rows = [[r["preset"], str(r["launches"]), str(r["distinct_kernels"]), human_bytes(r["traffic_bytes"]),
                 human_seconds(r["modelled_time_s"]), f"{r['vs_best']:.2f}" if r["vs_best"] else "-",
                 human_seconds(r["compile_seconds"]),
                 ", ".join(f"{g} {n}" for g, n in r["generators"].items())] for r in self.rows()]
        title = f"{self.model} on {self.reports[0].device if self.reports else '-'} (modelled, not measured)"
        return title + "\n" + text_table(head, rows, 80)

    def _repr_html_(self) -> str:
        rows = self.rows()
        longest = max((r["modelled_time_s"] for r in rows), default=0.0) or 1.0
        bar_w, height = 420, 22 * len(rows) + 10
        bars = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{bar_w + 240}' height='{height}' "
                "font-family='sans-serif' font-size='11'>"]
        for i, r in enumerate(rows):
            y = 4 + i * 22
            w = r["modelled_time_s"] / longest * bar_w
            main = max(r["generators"], key=r["generators"].get) if r["generators"] else ""
            bars.append(f"<text x='0' y='{y + 13}'>{html.escape(r['preset'])}</text>"
                        f"<rect x='90' y='{y}' width='{w:.1f}' height='16' fill='{colour(main)}'/>"
                        f"<text x='{94 + w:.1f}' y='{y + 13}'>{html.escape(human_seconds(r['modelled_time_s']))}, "
                        f"{r['launches']} launches</text>")
        bars.append("</svg>")
        table = html.escape(self.to_table())
        return f"<div class='tvm-ext-compare'>{''.join(bars)}<pre>{table}</pre></div>"


def _generators(report: Report) -> dict[str, int]:
    counts: dict[str, int] = {}
    for k in report.launches:
        counts[k.generator] = counts.get(k.generator, 0) + k.launches
    return dict(sorted(counts.items(), key=lambda item: -item[1]))


def compare(model: Any, presets: Sequence[str], target: str = DEFAULT_TARGET, *,
            shapes: Mapping[str, Sequence[int]] | None = None, fp16: bool = False,
            bind: Mapping[str, Any] | None = None, progress=None) -> Comparison:
    """Build ``model`` with every preset and collect the reports (see the module docstring).

    ``progress`` is called with each preset's name before it is built.
    """
    out = None
    for preset in presets:
        if progress is not None:
            progress(preset)
        report = inspect(model, target, preset, shapes=shapes, fp16=fp16, bind=bind)
        out = out or Comparison(report.model)
        out.reports.append(report)
    return out or Comparison(str(model))


__all__ = ["Comparison", "compare"]
