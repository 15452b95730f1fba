"""Korch's candidate space: convex node sets from execution states (Korch §5.1, Alg. 1).

An *execution state* is a set of nodes closed under predecessors (what has run at some point
of some schedule). Every convex set is the difference ``D2 \\ D1`` of two states ``D1 ⊂ D2``
(Korch Thm. 3). The states are enumerated by depth-first search (:func:`execution_states`;
their count says how wide a window is), but the candidates are not taken pair by pair: on a
wide window (an unrolled LSTM's independent steps) the pairs of states within ``max_nodes`` of
each other run into the hundreds of millions. Instead the connected sets of up to
``max_nodes`` nodes are grown directly, each once (Wernicke's ESU), and the convex ones kept:
the same sets as the connected state differences, found in time proportional to their number.

The number of states grows exponentially with the graph's width, so the graph is first cut
into *windows*: contiguous slices of a topological order, cut where the fewest values are live
(a transformer's residual stream between layers, a CNN's activation between blocks). A
candidate never spans two windows. Within a window the search stops at ``max_states`` states
and ``max_candidates`` candidates; the report says when a cap was hit.

Kept: sets of 2 to ``max_nodes`` nodes that are weakly connected, have at most one
compute-intensive node (Korch: one linear primitive per kernel) and only nodes computed by a
PrimFunc.

Example
-------
>>> found = enumerate_candidates(graph, EnumerationLimits(max_nodes=6))
>>> found.windows, found.states, len(found.sets)
(14, 1630, 2210)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

from ..graph import OpGraph


@dataclass(frozen=True)
class EnumerationLimits:
    """Caps that keep enumeration polynomial.

    Attributes
    ----------
    max_nodes : int
        Nodes per candidate.
    window : int
        Nodes per window (the graph is cut into windows of at most this many nodes).
    max_states : int
        Execution states per window.
    max_candidates : int
        Candidates per window.
    max_kernels : int
        Distinct kernels (structural signatures) a generator plans per function, smallest sets
        first: planning costs ~0.1 s each, and an unrolled LSTM has ~5700 distinct sets of up to
        8 nodes where BERT-base has 388.
    """

    max_nodes: int = 6
    window: int = 40
    max_states: int = 5000
    max_candidates: int = 3000
    max_kernels: int = 1000


@dataclass
class Enumeration:
    """What :func:`enumerate_candidates` found.

    Attributes
    ----------
    sets : list of tuple of int
        Candidate node sets (topological order inside each).
    windows : int
        Windows the graph was cut into.
    states : int
        Execution states visited, over all windows.
    capped : list of str
        One line per window where a cap stopped the search.
    """

    sets: list[tuple[int, ...]] = field(default_factory=list)
    windows: int = 0
    states: int = 0
    capped: list[str] = field(default_factory=list)


def cut_windows(order: Sequence[int], producers: Callable[[int], Iterable[int]], size: int) -> list[list[int]]:
    """Slices of ``order`` of at most ``size`` nodes, each cut after the position (in the second
    half of the slice) where the fewest nodes have a consumer after it."""
    pos = {n: k for k, n in enumerate(order)}
    last_use = {n: pos[n] for n in order}
    for n in order:
        for p in producers(n):
            if p in pos:
                last_use[p] = max(last_use[p], pos[n])
    live = [0] * (len(order) + 1)       # live[k]: nodes at or before k read after k
    for n in order:
        if last_use[n] > pos[n]:
            live[pos[n]] += 1
            live[last_use[n]] -= 1
    running = 0
    for k in range(len(order)):
        running += live[k]
        live[k] = running
    windows, start = [], 0
    while start < len(order):
        end = min(start + size, len(order))
        if end < len(order):
            lo = start + max(1, size // 2) - 1
            end = min(range(lo, end), key=lambda k: (live[k], -k)) + 1
        windows.append(list(order[start:end]))
        start = end
    return windows


def execution_states(window: Sequence[int], producers: Callable[[int], Iterable[int]],
                     max_states: int) -> tuple[list[int], bool]:
    """Execution states of ``window`` (as bit masks over its positions) by depth-first search from
    the empty state; True when ``max_states`` stopped the search."""
    bit = {n: 1 << k for k, n in enumerate(window)}
    preds = [sum(bit[p] for p in set(producers(n)) if p in bit) for n in window]
    seen = {0}
    stack = [0]
    while stack:
        state = stack.pop()
        for k in range(len(window)):
            b = 1 << k
            if not state & b and preds[k] & ~state == 0:
                nxt = state | b
                if nxt not in seen:
                    if len(seen) >= max_states:
                        return sorted(seen), True
                    seen.add(nxt)
                    stack.append(nxt)
    return sorted(seen), False


def _connected_sets(window: Sequence[int], graph: OpGraph, max_nodes: int) -> Iterable[tuple[int, ...]]:
    """Every weakly connected set of 2 to ``max_nodes`` nodes of ``window``, each once (Wernicke's
    ESU: a set grows from its smallest member through neighbours larger than it)."""
    inside = set(window)
    rank = {n: k for k, n in enumerate(window)}
    near = {n: {m for m in (*graph.producers(n), *graph.consumers(n)) if m in inside and m != n} for n in window}

    def grow(members: list[int], frontier: set[int], root: int) -> Iterable[tuple[int, ...]]:
        if len(members) >= 2:
            yield tuple(sorted(members, key=rank.__getitem__))
        if len(members) == max_nodes:
            return
        frontier = set(frontier)
        reached = set(members).union(*(near[m] for m in members))
        while frontier:
            w = frontier.pop()
            extra = {u for u in near[w] if rank[u] > rank[root] and u not in reached}
            yield from grow(members + [w], frontier | extra, root)

    for v in window:
        yield from grow([v], {u for u in near[v] if rank[u] > rank[v]}, v)


def enumerate_candidates(graph: OpGraph, limits: EnumerationLimits = EnumerationLimits(), *,
                         nodes: Iterable[int] | None = None,
                         is_compute: Callable[[int], bool] | None = None) -> Enumeration:
    """Convex candidate sets of ``graph`` (see the module docstring).

    Parameters
    ----------
    graph : OpGraph
        The graph.
    limits : EnumerationLimits
        Caps.
    nodes : iterable of int, optional
        The nodes candidates may hold (default: every node computed by a PrimFunc).
    is_compute : callable, optional
        Whether a node is compute-intensive (at most one per candidate); default: none is.
    """
    allowed = set(nodes) if nodes is not None else {n.index for n in graph.nodes if n.func is not None}
    order = [n for n in graph.topological_order() if n in allowed]
    compute = is_compute or (lambda n: False)
    out = Enumeration()
    found: set[tuple[int, ...]] = set()
    for w, window in enumerate(cut_windows(order, graph.producers, limits.window)):
        out.windows += 1
        states, capped = execution_states(window, graph.producers, limits.max_states)
        out.states += len(states)
        if capped:
            out.capped.append(f"window {w} ({len(window)} nodes): state count stopped at {limits.max_states} "
                              "(the candidates do not depend on it)")
        count = 0
        for members in _connected_sets(window, graph, limits.max_nodes):
            if members in found or sum(map(compute, members)) > 1 or not graph.is_convex(members):
                continue
            found.add(members)
            count += 1
            if count >= limits.max_candidates:
                out.capped.append(f"window {w} ({len(window)} nodes): stopped at {limits.max_candidates} candidates")
                break
    out.sets = sorted(found, key=lambda s: (s[0], len(s), s))
    return out


__all__ = ["Enumeration", "EnumerationLimits", "cut_windows", "enumerate_candidates", "execution_states"]
