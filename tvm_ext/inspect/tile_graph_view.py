"""The tile graph of a sub-graph (Welder), drawn for notebooks: DOT, SVG and HTML.

Nodes are the sub-graph's operators, clustered by kernel (the ``shared``-level sub-graphs), each
labelled with its tile when a config was propagated; edges carry their tensor and connect level
(``register`` red and bold, ``shared`` blue and dashed, ``global`` grey). The HTML view adds the
footprint per memory level, the global traffic, and one row per kernel (members, output tiles,
tiles, bytes). ``TileGraph`` shows it in Jupyter by itself (``_repr_html_``).

Example
-------
>>> tg = TileGraph(graph, [0, 1]); tg.set_connect((0, 1), "shared"); tg.propagate({"T_softmax": (16, 128)})
>>> html = tile_graph_html(tg)          # or just evaluate ``tg`` in a notebook cell
"""
from __future__ import annotations

import html
from typing import TYPE_CHECKING

from .pictures import dot_svg

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..tilegraph import TileGraph

#: (DOT style, colour) of an edge by connect level.
LEVEL_STYLES = {"global": ("solid", "#888888"), "shared": ("dashed", "#1f77b4"), "register": ("bold", "#d62728")}


def _esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def _shape(extents) -> str:
    return "x".join(str(int(e)) for e in extents)


def tile_graph_dot(tg: "TileGraph") -> str:
    """DOT source of ``tg`` (see the module docstring)."""
    config = tg.config
    lines = ["digraph tile_graph {", "rankdir=TB; node [shape=box, fontname=sans, fontsize=9];"]
    for k, group in enumerate(tg.kernels()):
        lines.append(f'subgraph cluster_{k} {{ label="kernel {k}"; style=rounded; color="#999999";')
        for n in group:
            node = tg.graph.nodes[n]
            tile = f"\\ntile {_shape(config.node_tiles[n])}" if config is not None and n in config.node_tiles else ""
            lines.append(f'n{n} [label="{_esc(node.name)}\\n{_esc(node.func_name)}{tile}"];')
        lines.append("}")
    for e in tg.edges:
        level = tg.connect_level(e).label
        style, colour = LEVEL_STYLES[level]
        lines.append(f'n{e.producer} -> n{e.consumer} [label="{_esc(e.tensor)}\\n{level}", style={style}, '
                     f'color="{colour}", fontcolor="{colour}", fontsize=8];')
    lines.append("}")
    return "\n".join(lines)


def tile_graph_html(tg: "TileGraph", use_graphviz: bool | None = None) -> str:
    """HTML of ``tg``: its picture (SVG with Graphviz, else the DOT source) and, once a config is
    propagated, its footprint per level, global traffic and kernels.

    ``use_graphviz``: None uses ``dot`` when it is on PATH; False shows the DOT source.
    """
    dot = tile_graph_dot(tg)
    svg = dot_svg(dot) if use_graphviz is not False else None
    picture = svg if svg is not None else f"<pre>{_esc(dot)}</pre>"
    parts = [f"<div><b>tile graph</b> of {len(tg.members)} nodes, {len(tg.edges)} edges, "
             f"{len(tg.kernels())} kernel(s)</div>", picture]
    if tg.config is None:
        parts.append("<div>no tile config yet: <code>propagate(output_tile)</code> adds tiles, traffic and "
                     "footprint</div>")
        return "\n".join(parts)
    footprint = tg.mem_footprint()
    parts.append("<div>footprint per level: " + ", ".join(f"{k} {v:,} B" for k, v in footprint.items())
                 + f"; global traffic {tg.mem_traffic():,} B</div>")
    rows = ["<tr><th>kernel</th><th>members</th><th>output tiles</th><th>tiles</th><th>global bytes</th>"
            "<th>shared bytes / tile</th><th>register bytes / tile</th></tr>"]
    for k, kt in enumerate(tg.kernel_tiles()):
        names = ", ".join(tg.graph.nodes[n].name for n in kt.members)
        tiles = ", ".join(f"{t}: {_shape(s)}" for t, s in kt.output_tiles.items())
        rows.append(f"<tr><td>{k}</td><td>{_esc(names)}</td><td>{_esc(tiles)}</td><td>{kt.num_tiles:,}</td>"
                    f"<td>{kt.global_bytes:,}</td><td>{kt.shared.peak_bytes:,}</td><td>{kt.register_bytes:,}</td></tr>")
    parts.append("<table>" + "".join(rows) + "</table>")
    return "\n".join(parts)


__all__ = ["LEVEL_STYLES", "tile_graph_dot", "tile_graph_html"]
