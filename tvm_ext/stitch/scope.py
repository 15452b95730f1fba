"""Stitch scope (AStitch §4.1): which OpGraph nodes become one kernel.

1. *Epilogues* (:func:`tvm_ext.select.groups.compute_groups`). A compute node (matmul, conv) keeps
   the chain of elementwise / broadcast consumers TVM's ``FuseOps`` would give it (bias add,
   activation, residual add), so compute kernels stay as in the baseline and those ops do not
   count as stitched work. It also takes the layout nodes (reshape, transpose, slice) that
   only feed it or only follow its epilogue: dlight's matmul schedule reads and writes
   through them.
2. *Clustering.* The remaining memory-intensive nodes (elementwise, broadcast, injective,
   reduce; gathers, which TVM marks opaque; contractions so small that they are memory-bound,
   such as squeeze-excitation matrix-vector products) are clustered along producer -> consumer
   edges, in topological order, into maximal groups that stay convex (no path leaves a group
   and re-enters it), so compute-intensive or opaque nodes bound the groups and the condensed
   graph stays acyclic.
3. *Remote stitching.* Two groups with no path between them in either direction are merged
   (the merge is convex by construction).
4. *Row-reduction prologues.* A softmax-like group whose only result is the row operand of
   one GEMM joins that GEMM's group (regional scheme through shared memory, see
   :mod:`tvm_ext.stitch.prologue`).

Example
-------
>>> scope = stitch_scope(OpGraph.from_module(legalized))
>>> [g.kind for g in scope.groups][:3]
['epilogue', 'stitch', 'epilogue']
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

import tvm
import tvm_ffi

from ..graph import OpClass, OpGraph, sblocks
from ..select.groups import compute_groups, is_compute, is_compute_intensive
from .prologue import prologue_target

#: Operator classes that stitching treats as memory-intensive (paper §2.1).
STITCH_CLASSES = frozenset({OpClass.ELEMENTWISE, OpClass.BROADCAST, OpClass.INJECTIVE, OpClass.REDUCE})


@dataclass(frozen=True)
class ScopeGroup:
    """A set of nodes that becomes one kernel.

    Attributes
    ----------
    nodes : tuple of int
        Node indices in topological order.
    kind : str
        ``"stitch"`` (memory-intensive nodes only), ``"epilogue"`` (a compute node and its
        elementwise consumers), ``"prologue"`` (an epilogue group that also computes its row
        operand from a row-reduction group, see :mod:`tvm_ext.stitch.prologue`) or
        ``"single"`` (one node left alone).
    parts : int
        Number of remote-stitched parts (independent sub-groups) in a stitch group.
    """

    nodes: tuple[int, ...]
    kind: str
    parts: int = 1


@dataclass
class StitchScope:
    """Result of :func:`stitch_scope`."""

    graph: OpGraph
    groups: list[ScopeGroup] = field(default_factory=list)

    def group_of(self) -> dict[int, int]:
        """Node index -> index of its group in :attr:`groups`."""
        return {n: gi for gi, g in enumerate(self.groups) for n in g.nodes}

    @property
    def stitched(self) -> list[ScopeGroup]:
        """Groups of kind ``"stitch"`` with more than one node."""
        return [g for g in self.groups if g.kind == "stitch" and len(g.nodes) > 1]


def _is_gather(graph: OpGraph, index: int) -> bool:
    """An opaque-pattern PrimFunc that is a gather (``take``): spatial blocks indexing by loaded data."""
    node = graph.nodes[index]
    if node.func is None or node.op_class != OpClass.OPAQUE:
        return False
    blocks = sblocks(node.func)
    if not blocks:
        return False
    data_dependent = False
    for block, _ in blocks:
        if any(iv.iter_type != 0 for iv in block.iter_vars):
            return False
        loads: list = []
        tvm_ffi.structural_walk(block.body, (tvm.ir.TensorLoad, loads.append))
        for load in loads:
            inner: list = []
            for idx in load.indices:
                tvm_ffi.structural_walk(idx, (tvm.ir.TensorLoad, inner.append))
            data_dependent = data_dependent or bool(inner)
    return data_dependent


def is_stitchable(graph: OpGraph, index: int) -> bool:
    """Whether node ``index`` is a memory-intensive op stitching may take.

    A PrimFunc whose arithmetic intensity is below the graph's threshold and that is of a
    memory-intensive class (elementwise, broadcast, injective, reduce) or a contraction that
    is memory-bound anyway (a matrix-vector product such as a squeeze-excitation 1x1
    convolution), or a gather (``take``, which TVM marks opaque).
    """
    node = graph.nodes[index]
    if node.func is None:
        return False
    if _is_gather(graph, index):
        return True
    return node.memory_intensive and (node.op_class in STITCH_CLASSES or is_compute(graph, index))


class _Clusters:
    """Union of node sets with a convexity check over the OpGraph."""

    def __init__(self, graph: OpGraph):
        self.graph = graph
        self.owner: dict[int, int] = {}
        self.members: dict[int, set[int]] = {}
        self.parts: dict[int, int] = {}
        self._next = 0

    def add(self, nodes: Iterable[int]) -> int:
        gid = self._next
        self._next += 1
        self.members[gid] = set(nodes)
        self.parts[gid] = 1
        for n in self.members[gid]:
            self.owner[n] = gid
        return gid

    def try_merge(self, a: int, b: int, parts: int | None = None) -> bool:
        """Merge group ``b`` into group ``a`` if the union is convex."""
        if a == b:
            return True
        union = self.members[a] | self.members[b]
        if not self.graph.is_convex(union):
            return False
        self.members[a] = union
        self.parts[a] = self.parts[a] + self.parts[b] if parts is None else parts
        for n in self.members.pop(b):
            self.owner[n] = a
        self.parts.pop(b)
        return True


def _reach(graph: OpGraph, sources: set[int]) -> set[int]:
    seen: set[int] = set()
    todo = deque(c for s in sources for c in graph.consumers(s))
    while todo:
        i = todo.popleft()
        if i in seen:
            continue
        seen.add(i)
        todo.extend(graph.consumers(i))
    return seen


def stitch_scope(graph: OpGraph, *, absorb_epilogues: bool = True, absorb_layout: bool = True,
                 remote: bool = True, max_group_nodes: int | None = None,
                 gemm_prologues: bool = True, compute_kernels: list[list[int]] | None = None) -> StitchScope:
    """Cluster the nodes of ``graph`` into kernels (see the module docstring).

    Parameters
    ----------
    graph : OpGraph
        An unfused, legalized graph (one node per ``call_tir``).
    absorb_epilogues : bool
        Give compute nodes their elementwise consumer chains (as ``FuseOps`` does).
    absorb_layout : bool
        Also give compute nodes the layout nodes (reshape, transpose) that only feed them
        (prologue) or only follow their epilogue: dlight's matmul schedule reads and writes
        through them, so no separate data-movement kernel remains.
    remote : bool
        Merge independent memory-intensive groups (remote stitching).
    max_group_nodes : int, optional
        Upper bound on nodes per stitch group (no bound by default).
    gemm_prologues : bool
        Stitch row-reduction groups (softmax) into the GEMM consuming their result.
    compute_kernels : list of node lists, optional
        The kernels compute nodes form, instead of their ``FuseOps``-like epilogue chains (e.g.
        the node sets library kernels cover): nodes outside them are free for stitch groups.

    Returns
    -------
    StitchScope
        Every node in exactly one group; groups listed in topological order of their first node.
    """
    order = graph.topological_order()
    if compute_kernels is not None:
        epilogues = [list(k) for k in compute_kernels]
    else:
        epilogues = compute_groups(graph, absorb_layout=absorb_layout) if absorb_epilogues else []
    taken = {n for group in epilogues for n in group}

    clusters = _Clusters(graph)
    limit = max_group_nodes or len(graph.nodes)
    for i in order:
        if i in taken or not is_stitchable(graph, i):
            continue
        gid = clusters.add([i])
        for p in graph.producers(i):
            pg = clusters.owner.get(p)
            if pg is None or pg == gid:
                continue
            if len(clusters.members[pg]) + len(clusters.members[gid]) > limit:
                continue
            if clusters.try_merge(pg, gid, parts=max(clusters.parts[pg], clusters.parts[gid])):
                gid = pg

    if remote:
        # a group that will be computed inside its GEMM is not merged with unrelated groups
        keep = {gid for gid, members in clusters.members.items()
                if gemm_prologues and _prologue_gemm(graph, members) is not None}
        _remote_stitch(graph, clusters, limit, keep)

    groups: list[ScopeGroup] = []
    for nodes in epilogues:
        groups.append(ScopeGroup(tuple(n for n in order if n in set(nodes)), "epilogue"))
    for gid, members in clusters.members.items():
        kind = "stitch" if len(members) > 1 else "single"
        groups.append(ScopeGroup(tuple(n for n in order if n in members), kind, clusters.parts[gid]))
    grouped = {n for g in groups for n in g.nodes}
    groups.extend(ScopeGroup((i,), "single") for i in order if i not in grouped)
    if gemm_prologues:
        groups = _absorb_row_prologues(graph, groups, order)
    position = {n: k for k, n in enumerate(order)}
    groups.sort(key=lambda g: position[g.nodes[0]])
    return StitchScope(graph, groups)


def _prologue_gemm(graph: OpGraph, members: set[int]) -> int | None:
    """The compute-intensive GEMM node the group ``members`` would run inside, or None."""
    target = prologue_target(graph, members)
    return target if target is not None and is_compute_intensive(graph, target) else None


def _absorb_row_prologues(graph: OpGraph, groups: list[ScopeGroup], order: list[int]) -> list[ScopeGroup]:
    """Merge each row-reduction group into the group of the GEMM that consumes its result, when
    that GEMM heads its group (its epilogue and layout nodes) and the union stays convex."""
    owner = {n: k for k, g in enumerate(groups) for n in g.nodes}
    merged: dict[int, int] = {}  # absorbed group -> host group
    for k, group in enumerate(groups):
        if group.kind not in ("stitch", "single") or k in merged.values():
            continue
        target = _prologue_gemm(graph, set(group.nodes))
        if target is None:
            continue
        host = owner[target]
        if groups[host].kind not in ("epilogue", "single") or host in merged or host in merged.values():
            continue
        if not graph.is_convex(set(group.nodes) | set(groups[host].nodes)):
            continue
        merged[k] = host
    if not merged:
        return groups
    out: list[ScopeGroup] = []
    for k, group in enumerate(groups):
        if k in merged:
            continue
        guests = [g for g, h in merged.items() if h == k]
        if guests:
            nodes = set(group.nodes).union(*(groups[g].nodes for g in guests))
            out.append(ScopeGroup(tuple(n for n in order if n in nodes), "prologue"))
        else:
            out.append(group)
    return out


def _remote_stitch(graph: OpGraph, clusters: _Clusters, limit: int, keep: set[int] = frozenset()) -> None:
    """Greedily merge groups that have no path between them (paper: remote stitching); groups
    in ``keep`` stay as they are."""
    position = {n: k for k, n in enumerate(graph.topological_order())}

    def first(gid: int) -> int:
        return min(position[n] for n in clusters.members[gid])

    gids = sorted((g for g in clusters.members if g not in keep), key=first)
    reach = {g: _reach(graph, clusters.members[g]) for g in gids}
    alive = list(gids)
    k = 0
    while k < len(alive):
        a = alive[k]
        j = k + 1
        while j < len(alive):
            b = alive[j]
            ma, mb = clusters.members[a], clusters.members[b]
            independent = not (reach[a] & mb) and not (reach[b] & ma)
            if independent and len(ma) + len(mb) <= limit and clusters.try_merge(a, b):
                reach[a] = reach[a] | reach.pop(b)
                alive.pop(j)
                continue
            j += 1
        k += 1
