"""Pictures of a report, as SVG that renders offline in Jupyter (no JavaScript, no network).

* :func:`kernel_chart_svg` — one bar per kernel: its modelled time per inference (calls x modelled
  seconds per call, coloured by generator) over a grey bar of its roofline bound (its flops at
  the peak rate or its bytes at DRAM bandwidth, whichever is longer);
* :func:`graph_svg` — the operator graph, each kernel a coloured cluster of its operators (colour
  = generator, label = modelled time). With Graphviz's ``dot`` on PATH the layout is Graphviz's;
  otherwise a built-in layout draws each kernel as a box listing its operators, in columns by
  the longest kernel path from the inputs.

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
           "library": "#f28e2b", "orchestrate": "#b07aa1", "subprogram": "#ff9da7", "tilegraph": "#edc948"}
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


def _kernel_of_nodes(report: "Report") -> tuple[OpGraph, dict[int, tuple[str, str, float | None, int]]]:
    """The fused graph and, per node, (kernel name, generator, modelled seconds per call, call
    index: each call of a kernel is a cluster of its own)."""
    from .report import group_instances

    graph = OpGraph.from_module(report.build.fused_ops)
    by_func = {k.func: k for k in report.launches}
    owner: dict[int, tuple[str, str, float | None, int]] = {}
    for index, (name, members) in enumerate(group_instances(graph)):
        k = by_func.get(name)
        for n in members:
            owner[n] = (name, k.generator if k else "none", k.modelled_s if k else None, index)
    return graph, owner


def _owner(graph: OpGraph, owner: dict, n: int) -> tuple[str, str, float | None, int | str]:
    """A node's kernel; a node of no kernel is a cluster of its own."""
    return owner.get(n, (graph.nodes[n].name, "none", None, f"node{n}"))


def _clusters(graph: OpGraph, owner: dict) -> dict[int | str, list[int]]:
    """Kernel call -> its operator nodes, in the order their first node runs."""
    clusters: dict[int | str, list[int]] = {}
    for n in graph.topological_order():
        clusters.setdefault(_owner(graph, owner, n)[3], []).append(n)
    return clusters


def _builtin_svg(graph: OpGraph, owner: dict, box_w: int = 190, gap_x: int = 40, line_h: int = 12,
                 max_ops: int = 6) -> str:
    """Kernels as boxes listing their operators, in columns by longest kernel path from the inputs,
    with an edge wherever one kernel reads another's output."""
    clusters = _clusters(graph, owner)
    home = {n: key for key, members in clusters.items() for n in members}
    deps = {key: {home[p] for n in members for p in graph.producers(n) if home[p] != key}
            for key, members in clusters.items()}
    depth: dict = {}
    for key in clusters:                      # clusters are in topological order of their first node
        depth[key] = 1 + max((depth.get(d, 0) for d in deps[key]), default=-1)
    column_y: dict[int, int] = {}
    box: dict = {}  # kernel call -> x, y, height
    for key, members in clusters.items():
        shown = min(len(members), max_ops) + (len(members) > max_ops)
        h = 2 * line_h + 8 + shown * line_h
        x, y = 10 + depth[key] * (box_w + gap_x), 30 + column_y.get(depth[key], 0)
        box[key] = (x, y, h)
        column_y[depth[key]] = column_y.get(depth[key], 0) + h + 12
    width = 20 + (max(depth.values(), default=0) + 1) * (box_w + gap_x)
    height = 40 + max(column_y.values(), default=0)
    parts = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{height}' font-family='sans-serif' "
             f"font-size='9'>", "<text x='10' y='16' font-size='11'>kernels (colour = generator) with their "
             "operators; modelled time per call</text>", "<g stroke='#999999' stroke-width='0.8' fill='none'>"]
    for key in clusters:
        x1, y1, h1 = box[key]
        for d in sorted(deps[key], key=str):
            x0, y0, h0 = box[d]
            parts.append(f"<line x1='{x0 + box_w}' y1='{y0 + h0 // 2}' x2='{x1}' y2='{y1 + h1 // 2}'/>")
    parts.append("</g>")
    for key, members in clusters.items():
        x, y, h = box[key]
        name, generator, seconds, _ = _owner(graph, owner, members[0])
        fill = colour(generator)
        timing = human_seconds(seconds) if seconds is not None else "not priced"
        ops = [graph.nodes[n].func_name for n in members[:max_ops]]
        if len(members) > max_ops:
            ops.append(f"... {len(members) - max_ops} more")
        lines = "".join(f"<text x='{x + 6}' y='{y + 2 * line_h + 8 + (i + 1) * line_h - 3}'>{_esc(op[:34])}</text>"
                        for i, op in enumerate(ops))
        parts.append(f"<g class='kernel'><title>{_esc(name)}</title>"
                     f"<rect x='{x}' y='{y}' width='{box_w}' height='{h}' rx='4' fill='{fill}' fill-opacity='0.15' "
                     f"stroke='{fill}' stroke-width='1.5'/>"
                     f"<text x='{x + 6}' y='{y + line_h}' font-weight='bold'>{_esc(name[:34])}</text>"
                     f"<text x='{x + 6}' y='{y + 2 * line_h + 2}' fill='{fill}'>{_esc(generator)}, {_esc(timing)}</text>"
                     f"{lines}</g>")
    parts.append("</svg>")
    return "".join(parts)


def _dot_source(graph: OpGraph, owner: dict) -> str:
    clusters = _clusters(graph, owner)
    lines = ["digraph kernels {", "rankdir=LR; node [shape=box, style=filled, fontname=sans, fontsize=9];"]
    for k, members in enumerate(clusters.values()):
        kernel, generator, seconds, _ = _owner(graph, owner, members[0])
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
    svg = dot_svg(_dot_source(graph, owner)) if use_graphviz is not False else None
    return svg if svg is not None else _builtin_svg(graph, owner)


def dot_svg(source: str) -> str | None:
    """``source`` (DOT) laid out by Graphviz as SVG; None when ``dot`` is not on PATH or fails."""
    dot = shutil.which("dot")
    if dot is None:
        return None
    done = subprocess.run([dot, "-Tsvg"], input=source, capture_output=True, text=True, check=False)
    if done.returncode != 0 or "<svg" not in done.stdout:
        return None
    return done.stdout[done.stdout.index("<svg"):]


__all__ = ["COLOURS", "colour", "dot_svg", "graph_svg", "kernel_chart_svg"]
