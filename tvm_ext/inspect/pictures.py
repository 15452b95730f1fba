"""Pictures of a report, as SVG that renders offline in Jupyter (no JavaScript, no network).

* :func:`kernel_chart_svg` — one bar per kernel: its modelled time per inference (calls x modelled
  seconds per call, coloured by generator) over a grey bar of its roofline bound (its flops at
  the peak rate or its bytes at DRAM bandwidth, whichever is longer);
* :func:`graph_svg` — the operator graph, each kernel a coloured cluster of its operators (colour
  = generator, label = modelled time). With Graphviz's ``dot`` on PATH the layout is Graphviz's;
  otherwise a built-in layered layout (columns = longest path from the inputs) is used.

Example
-------
>>> from IPython.display import SVG
>>> SVG(graph_svg(report))
"""
from __future__ import annotations

import html
import shutil
import subprocess
from typing import TYPE_CHECKING

from ..graph import OpGraph
from .render import human_seconds

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .report import Report

#: Fill colour of each generator's kernels.
COLOURS = {"stitch": "#4e79a7", "cutlass": "#e15759", "dlight": "#59a14f", "fuseops": "#76b7b2",
           "library": "#f28e2b"}
_OTHER = "#bab0ac"


def colour(generator: str) -> str:
    """The fill colour of a generator's kernels."""
    return COLOURS.get(generator, _OTHER)


def _esc(text: str) -> str:
    return html.escape(str(text), quote=True)


def _kernel_roofline_s(report: "Report", func: str) -> float:
    """A kernel's own roofline bound: max(flops / peak, global bytes / DRAM bandwidth)."""
    from ..hardware import load_device

    group = next((g for g in report.groups if g.func == func), None)
    if group is None:
        return 0.0
    device = load_device(report.device)
    return max(group.flops / device.peak_flops_for(report.dtype),
               group.traffic_bytes / device.dram_bandwidth_bytes_per_s)


def kernel_chart_svg(report: "Report", width: int = 760, bar_height: int = 16, limit: int = 40) -> str:
    """Bars of the ``limit`` most expensive kernels (see the module docstring)."""
    rows = sorted(report.launches, key=lambda k: -(k.calls * (k.modelled_s or 0.0)))[:limit]
    if not rows:
        return f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='20'></svg>"
    label_w, pad = 300, 4
    total = [k.calls * (k.modelled_s or 0.0) for k in rows]
    bound = [k.calls * _kernel_roofline_s(report, k.func) for k in rows]
    scale = (width - label_w - 90) / max(max(total), max(bound), 1e-12)
    height = len(rows) * (bar_height + pad) + 40
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif' "
             f"font-size='11'>",
             f"<text x='0' y='12'>modelled time per inference by kernel (grey: its roofline bound); total "
             f"{_esc(human_seconds(report.modelled_time_s))}</text>"]
    for i, (k, t, b) in enumerate(zip(rows, total, bound)):
        y = 24 + i * (bar_height + pad)
        name = k.func if len(k.func) <= 44 else k.func[:41] + "..."
        parts.append(f"<text x='0' y='{y + bar_height - 4}'>{_esc(name)} x{k.calls}</text>")
        parts.append(f"<rect x='{label_w}' y='{y}' width='{b * scale:.1f}' height='{bar_height}' fill='#dddddd'/>")
        parts.append(f"<rect x='{label_w}' y='{y + 3}' width='{t * scale:.1f}' height='{bar_height - 6}' "
                     f"fill='{colour(k.generator)}'><title>{_esc(k.generator)}: {_esc(k.plan or k.rule)}</title></rect>")
        parts.append(f"<text x='{label_w + max(t, b) * scale + 4:.1f}' y='{y + bar_height - 4}'>"
                     f"{_esc(human_seconds(t))} ({_esc(k.cost_source or '-')})</text>")
    parts.append("</svg>")
    return "".join(parts)


def _kernel_of_nodes(report: "Report") -> tuple[OpGraph, dict[int, tuple[str, str, float | None]]]:
    """The fused graph and, per node, (kernel name, generator, modelled seconds per call)."""
    from .report import group_instances

    graph = OpGraph.from_module(report.build.fused_ops)
    by_func = {k.func: k for k in report.launches}
    owner: dict[int, tuple[str, str, float | None]] = {}
    for name, members in group_instances(graph):
        k = by_func.get(name)
        for n in members:
            owner[n] = (name, k.generator if k else "none", k.modelled_s if k else None)
    return graph, owner


def _layers(graph: OpGraph) -> dict[int, int]:
    """Longest path (in nodes) from a graph input to each node."""
    depth: dict[int, int] = {}
    for n in graph.topological_order():
        depth[n] = 1 + max((depth[p] for p in graph.producers(n)), default=-1)
    return depth


def _builtin_svg(graph: OpGraph, owner: dict, col_w: int = 150, row_h: int = 26) -> str:
    depth = _layers(graph)
    rows: dict[int, int] = {}
    position: dict[int, tuple[float, float]] = {}
    for n in graph.topological_order():
        d = depth[n]
        position[n] = (20 + d * col_w, 30 + rows.get(d, 0) * row_h)
        rows[d] = rows.get(d, 0) + 1
    width = 60 + (max(depth.values(), default=0) + 1) * col_w
    height = 60 + max(rows.values(), default=1) * row_h
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif' "
             f"font-size='9'>", "<g stroke='#999999' stroke-width='0.8'>"]
    for n in graph.topological_order():
        for p in graph.producers(n):
            (x0, y0), (x1, y1) = position[p], position[n]
            parts.append(f"<line x1='{x0 + 120:.0f}' y1='{y0 + 8:.0f}' x2='{x1:.0f}' y2='{y1 + 8:.0f}'/>")
    parts.append("</g>")
    for n in graph.topological_order():
        x, y = position[n]
        kernel, generator, seconds = owner.get(n, ("-", "none", None))
        label = graph.nodes[n].func_name
        title = f"{kernel} ({generator}" + (f", {human_seconds(seconds)} per call" if seconds else "") + ")"
        parts.append(f"<g><title>{_esc(title)}</title><rect x='{x:.0f}' y='{y:.0f}' width='120' height='16' rx='3' "
                     f"fill='{colour(generator)}' fill-opacity='0.85'/>"
                     f"<text x='{x + 4:.0f}' y='{y + 12:.0f}' fill='white'>{_esc(label[:22])}</text></g>")
    parts.append("</svg>")
    return "".join(parts)


def _dot_source(graph: OpGraph, owner: dict) -> str:
    clusters: dict[str, list[int]] = {}
    for n in graph.topological_order():
        clusters.setdefault(owner.get(n, ("-", "none", None))[0], []).append(n)
    lines = ["digraph kernels {", "rankdir=LR; node [shape=box, style=filled, fontname=sans, fontsize=9];"]
    for k, (kernel, members) in enumerate(clusters.items()):
        _, generator, seconds = owner.get(members[0], ("-", "none", None))
        label = f"{kernel}\\n{generator}" + (f" {human_seconds(seconds)}" if seconds else "")
        lines.append(f'subgraph cluster_{k} {{ label="{_esc(label)}"; style=filled; color="{colour(generator)}"; '
                     f'fillcolor="{colour(generator)}33";')
        lines.extend(f'n{n} [label="{_esc(graph.nodes[n].func_name)}", fillcolor="{colour(generator)}"];'
                     for n in members)
        lines.append("}")
    lines.extend(f"n{p} -> n{n};" for n in graph.topological_order() for p in graph.producers(n))
    lines.append("}")
    return "\n".join(lines)


def graph_svg(report: "Report", use_graphviz: bool | None = None) -> str:
    """The operator graph with kernels as coloured clusters (see the module docstring).

    ``use_graphviz``: None uses ``dot`` when it is on PATH; False forces the built-in layout.
    """
    graph, owner = _kernel_of_nodes(report)
    dot = shutil.which("dot") if use_graphviz is not False else None
    if dot is not None:
        done = subprocess.run([dot, "-Tsvg"], input=_dot_source(graph, owner), capture_output=True, text=True,
                              check=False)
        if done.returncode == 0 and "<svg" in done.stdout:
            return done.stdout[done.stdout.index("<svg"):]
    return _builtin_svg(graph, owner)


__all__ = ["COLOURS", "colour", "graph_svg", "kernel_chart_svg"]
