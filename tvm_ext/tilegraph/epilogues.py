"""Connected groups less the epilogues of GEMMs outside them.

Graph connecting merges an elementwise node with whatever saves most when it is tried. When a
GEMM or convolution stays a dlight kernel, its bias add (or activation, or residual add) may have
been connected *forward*, into the memory-intensive group after it. That group then reads the
GEMM's raw output and, where the biased value is read again later (a residual), writes it out as
a second output. TVM's fusion, and the dlight generator's compute groups
(:func:`~tvm_ext.select.groups.compute_groups`), keep those nodes as the GEMM's epilogue instead.

:func:`without_foreign_epilogues` gives each connected group less those nodes, so that the selector
can price both covers: NAFNet's ``conv -> add -> layer norm`` as ``conv`` + ``add + layer norm``
(the connected group) or as ``conv + add`` (dlight) + ``layer norm`` (this part).

Example
-------
>>> owners = epilogue_owners(ctx.graph)
>>> without_foreign_epilogues(ctx, (1, 2, 3, 4), owners)      # node 1 is node 0's bias add
[(2, 3, 4)]
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

from ..graph import OpGraph, components
from ..select.context import SelectionContext
from ..select.groups import compute_groups, is_compute_intensive


def epilogue_owners(graph: OpGraph) -> dict[int, tuple[int, frozenset[int]]]:
    """Every node of a compute group -> (the group's compute node, the group's nodes)."""
    owners: dict[int, tuple[int, frozenset[int]]] = {}
    for group in compute_groups(graph):
        head = next((n for n in group if is_compute_intensive(graph, n)), None)
        if head is None:
            continue
        members = frozenset(group)
        for n in group:
            owners[n] = (head, members)
    return owners


def without_foreign_epilogues(ctx: SelectionContext, nodes: Iterable[int],
                              owners: Mapping[int, tuple[int, frozenset[int]]]) -> list[tuple[int, ...]]:
    """The parts of ``nodes`` left once every node of a compute group whose compute node is not
    among ``nodes`` is taken out.

    Returns the convex, weakly connected parts of two or more nodes (a single node is a dlight
    singleton already), in topological order; ``[]`` when nothing is taken out.
    """
    inside = set(nodes)
    taken: set[int] = set()
    for n in inside:
        if n in owners and owners[n][0] not in inside:
            taken |= owners[n][1] & inside
    if not taken:
        return []
    rest = ctx.ordered(inside - taken)
    links = [(n, c) for n in rest for c in ctx.graph.consumers(n) if c in inside and c not in taken]
    parts = (tuple(p) for p in components(rest, links) if len(p) > 1)
    return [p for p in parts if ctx.graph.is_convex(p)]


__all__ = ["epilogue_owners", "without_foreign_epilogues"]
