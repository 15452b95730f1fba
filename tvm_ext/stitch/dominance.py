"""Planning step 1 (AStitch §4.2-4.3): local ops, dominant candidates, dominant merging, groups.

On the ops of one PrimFunc (:class:`~tvm_ext.stitch.ops.StitchGraph`):

* an op is **local** (kept in registers: inlined into its consumers) unless it is a reduction,
  a heavy elementwise op whose result some consumer reads one-to-many (a broadcast, possibly
  behind reshapes; a reduction that reuses the value along its row), an output of the
  function, or an op with transcendentals (its own or inlined) that inlining would evaluate
  more than :data:`INLINE_EVALUATIONS_LIMIT` times per element (a value read by several inlined
  consumers, each of them read again: an LSTM's cell state, inlined step into step, recomputes
  the recurrence from step 0 at every step); those are the **dominant candidates**;
* the *upstream local closure* of a candidate is every local op (and function input) it
  reaches backwards through local ops only, since a local op's thread mapping is derived from
  its consumer (observation A);
* **dominant merging**: candidates whose closures share an op or an input (the paper's
  "connected through ops of only local scheme", e.g. ``parameter.2`` in Figure 9) form one
  group; its **dominant** is the first reduction (reductions are preferred), the others are
  **sub-dominants**; the group is the candidates plus their closures.

Example
-------
>>> d = find_dominants(StitchGraph.from_prim_func(layer_norm_func))
>>> d.dominants, d.sub_dominants
(('x_sum',), {'x_var_sum': 'x_sum', 'T_layer_norm': 'x_sum'})
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
import tvm_ffi

from ..analysis import DependencyKind
from .ops import StitchGraph, StitchOp


@dataclass(frozen=True)
class Dominance:
    """Result of :func:`find_dominants` (op names throughout)."""

    local: tuple[str, ...]
    candidates: tuple[str, ...]
    dominants: tuple[str, ...]
    sub_dominants: dict[str, str]
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def group_of(self, op: str) -> str:
        """The dominant of the group holding ``op``."""
        for dom, members in self.groups.items():
            if op in members:
                return dom
        raise KeyError(f"op '{op}' is in no group")


def _uses_any(indices, variables) -> bool:
    found: list = []
    for idx in indices:
        tvm_ffi.structural_walk(idx, (tvm.ir.Var, found.append))
    return any(any(v.same_as(x) for x in variables) for v in found)


def fans_out(consumer: StitchOp, buffer: str, kind: DependencyKind) -> bool:
    """Whether ``consumer`` reads each element of ``buffer`` for several of its own elements.

    A broadcast (or window) read does; so does a reduction that reads the buffer without one of
    its reduction iterators (the value is reused along the whole row) or without one of its
    spatial iterators of extent > 1 (a GEMV's ``h[k]`` in ``out[j] = sum_k W[j, k] h[k]`` is read
    for every ``j``). A reduction reading through all its iterators consumes each element once
    (many-to-one), which does not count.
    """
    if kind in (DependencyKind.BROADCAST, DependencyKind.WINDOW):
        return True
    if consumer.is_reduce and consumer.reduce_extent > 1:
        red = list(consumer.reduce_vars)
        spatial = [v for v, extent in zip(consumer.out_vars, consumer.spatial) if extent > 1]
        return any(not _uses_any(idx, red) or any(not _uses_any(idx, [v]) for v in spatial)
                   for idx in consumer.read_indices.get(buffer, ()))
    return False


def feeds_broadcast(graph: StitchGraph, op: StitchOp) -> bool:
    """Whether some consumer reads ``op``'s value one-to-many, directly or through reshapes.

    Relax legalizes ``broadcast(pow(x))`` with a reshape (``expand_dims``) in between, so
    one-to-one and injective (remapping) edges into non-reduction ops are followed.
    """
    seen: set[str] = set()
    todo = [op]
    while todo:
        cur = todo.pop()
        for consumer, kind in graph.consumers(cur):
            if fans_out(consumer, cur.buffer, kind):
                return True
            passthrough = kind in (DependencyKind.ONE_TO_ONE, DependencyKind.INJECTIVE_REMAP)
            if passthrough and not consumer.is_reduce and not consumer.heavy and consumer.name not in seen:
                seen.add(consumer.name)
                todo.append(consumer)
    return False


def is_candidate(graph: StitchGraph, op: StitchOp) -> bool:
    """Whether ``op`` must be a dominant candidate (not of local scheme)."""
    if op.is_reduce or op.writes_output:
        return True
    return op.heavy and feeds_broadcast(graph, op)


def _closure(graph: StitchGraph, op: StitchOp, local: set[str]) -> set[str]:
    """Local ops (by name) and inputs (``"input:<name>"``) reached backwards through local ops."""
    found: set[str] = set()
    todo = [op]
    while todo:
        cur = todo.pop()
        for read in cur.reads:
            producer = graph.writer(read.buffer)
            if producer is None:
                found.add(f"input:{read.buffer}")
            elif producer.name in local and producer.name not in found:
                found.add(producer.name)
                todo.append(producer)
    return found


#: Times inlining may evaluate an op per element of its own before it is materialized instead (the
#: check layer flags executed work above 3x the planned as recomputation: ``checks.work``).
INLINE_EVALUATIONS_LIMIT = 3


def _reads_per_element(op: StitchOp, consumer: StitchOp) -> float:
    """Loads of ``op``'s buffer that ``consumer`` makes per element of that buffer."""
    loads = max(1, len(consumer.read_indices.get(op.buffer, ())))
    made = consumer.rows * consumer.reduce_extent if consumer.is_reduce else consumer.num_elements
    return loads * made / max(1, op.num_elements)


def inline_evaluations(graph: StitchGraph, local: set[str],
                       limit: int | None = None) -> tuple[dict[str, float], set[str]]:
    """How often each op is evaluated per element of its own when the ``local`` ops are inlined.

    An op that is not inlined is evaluated once; an inlined op as often as its consumers load it
    per element of its own (a broadcast or a GEMV's vector operand: many times), times each
    consumer's own count (program order is a topological order, so one backward pass suffices).
    With ``limit``, an inlined op that would exceed it and calls a transcendental, itself or
    through the local ops it inlines, is materialized instead (greedy from the outputs back: its
    count, as its producers see it, becomes one); light arithmetic (a ReLU and its padding read by
    every output channel) stays recomputed, which is the local scheme's intent. Returns the counts
    and those ops.
    """
    heavy: dict[str, bool] = {}  # the op, or a local op it inlines, calls a transcendental
    for op in graph.ops:
        heavy[op.name] = op.heavy or any(heavy.get(p.name, False) for p, _ in graph.producers(op) if p.name in local)
    counts: dict[str, float] = {}
    promoted: set[str] = set()
    for op in reversed(graph.ops):
        if op.name not in local:
            counts[op.name] = 1.0
            continue
        consumers = {c.name: c for c, _ in graph.consumers(op)}.values()
        total = sum(_reads_per_element(op, c) * counts.get(c.name, 1.0) for c in consumers)
        if limit is not None and total > limit and heavy[op.name]:
            promoted.add(op.name)
            total = 1.0
        counts[op.name] = max(1.0, total)
    return counts, promoted


def find_dominants(graph: StitchGraph, *, force_candidates: frozenset[str] = frozenset(),
                   force_local: frozenset[str] = frozenset()) -> Dominance:
    """Planning step 1 on ``graph`` (see the module docstring).

    Parameters
    ----------
    graph : StitchGraph
    force_candidates : set of str
        Ops to treat as candidates regardless of the rule (e.g. ones that cannot be inlined).
    force_local : set of str
        Non-reduction, non-output ops to treat as local regardless of the rule.
    """
    local: set[str] = set()
    candidates: list[StitchOp] = []
    for op in graph.ops:
        forced_local = op.name in force_local and not (op.is_reduce or op.writes_output)
        if op.name in force_candidates or (is_candidate(graph, op) and not forced_local):
            candidates.append(op)
        else:
            local.add(op.name)
    _, recomputed = inline_evaluations(graph, local - set(force_local), INLINE_EVALUATIONS_LIMIT)
    if recomputed:
        local -= recomputed
        candidates = [op for op in graph.ops if op.name not in local]
    closures = {c.name: _closure(graph, c, local) for c in candidates}
    parent = {c.name: c.name for c in candidates}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: dict[str, str] = {}
    for c in candidates:
        for item in closures[c.name]:
            if item in owner:
                a, b = find(owner[item]), find(c.name)
                if a != b:
                    parent[b] = a
            else:
                owner[item] = c.name
    sets: dict[str, list[StitchOp]] = {}
    for c in candidates:
        sets.setdefault(find(c.name), []).append(c)
    dominants: list[str] = []
    subs: dict[str, str] = {}
    groups: dict[str, tuple[str, ...]] = {}
    for members in sorted(sets.values(), key=lambda ms: min(m.index for m in ms)):
        reduces = [m for m in members if m.is_reduce]
        dom = min(reduces or members, key=lambda m: m.index)
        dominants.append(dom.name)
        names = {m.name for m in members}
        for m in members:
            if m.name != dom.name:
                subs[m.name] = dom.name
            names |= {x for x in closures[m.name] if not x.startswith("input:")}
        groups[dom.name] = tuple(op.name for op in graph.ops if op.name in names)
    grouped = {n for ms in groups.values() for n in ms}
    stray = [op.name for op in graph.ops if op.name not in grouped]  # dead local ops
    if stray and dominants:
        first = dominants[0]
        groups[first] = tuple(op.name for op in graph.ops if op.name in set(groups[first]) | set(stray))
    return Dominance(local=tuple(op.name for op in graph.ops if op.name in local),
                     candidates=tuple(c.name for c in candidates), dominants=tuple(dominants),
                     sub_dominants=subs, groups=groups)


__all__ = ["INLINE_EVALUATIONS_LIMIT", "Dominance", "find_dominants", "inline_evaluations", "is_candidate"]
