"""Korch's selector: the cheapest cover of the graph by candidate kernels, as a binary LP.

One binary variable per candidate; minimize the sum of the chosen candidates' costs subject to
every call node lying in exactly one chosen candidate (every node covered, nothing computed
twice). A chosen candidate's external inputs are then always produced by the chosen candidate
that holds their producer. Singletons (the dlight generator proposes every node alone) make a
cover always exist.

**Recomputation** (Korch §5): a candidate may *recompute* some of its nodes (cheap nodes with
several consumers, :mod:`tvm_ext.select.recompute`): it computes its own copy and writes none,
so such a node may lie in several chosen candidates. For a node some candidate recomputes,
"exactly one" becomes "at most one candidate computes it for others" (exactly one when its
value is needed outside every candidate), and what exactness gave for free is stated: a chosen
candidate that reads such a node, or whose member of that kind reads a node, from outside needs
a chosen candidate that *writes* that node (holds it without recomputing it and has a consumer
outside, or the value is needed outside every candidate).

The kernels must also run in *some order*: two convex candidates can still depend on each
other (A feeds B and B feeds A through nodes that do not reach each other inside either), and
then no launch order exists. Such covers are removed lazily, as cutting planes: when the
optimum has a cycle of kernels, the constraint "not all of these together" is added and the
problem solved again (at most :data:`MAX_CUTS` rounds; each cut removes only covers with that
cycle, so the optimum stays optimal among acyclic covers). A kernel depends on every chosen
writer of a node it reads, so any writer the emitter picks keeps the order.

The problem splits exactly into independent parts: candidates that share no node or
write-read constraint, directly or through a chain of candidates (or a cut), never constrain
each other, so each connected part is solved alone (a transformer's layers are separate parts
unless a candidate spans two). Each part is solved by HiGHS (``scipy.optimize.milp``) with a
time limit; on timeout the best cover found so far is kept and the selection's notes say so
(when HiGHS has found none, every node of the part becomes a kernel of its own).

Example
-------
>>> selection = BlpSelector().select(ctx, candidates, AnalyticCostModel())
>>> selection.objective_s, selection.notes
(0.000312, ['3 parts solved to optimality'])
"""
from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

import numpy as np

from ..errors import TvmExtError
from ..graph.components import components as connected
from .candidate import Candidate
from .selector import Selection

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .context import SelectionContext
    from .cost import CostModel

logger = logging.getLogger(__name__)

#: HiGHS status codes of ``scipy.optimize.milp`` that carry a usable solution.
_SOLVED, _LIMIT = 0, 1
#: Rounds of cycle cuts before giving up (each round removes one cycle of kernels).
MAX_CUTS = 200
#: Prices go to HiGHS in microseconds: its absolute MIP gap (``mip_abs_gap``, 1e-6 by default, not
#: settable through ``scipy.optimize.milp``) is in the objective's unit, and in seconds 1e-6 is the
#: price of a whole kernel: HiGHS stopped "optimal" up to 0.26% above the optimum on random interval
#: covers (121 of 400; ``tests/test_blp.py``) and chose differently with and without tilegraph's
#: candidates on ResNeXt-50.
PRICE_UNIT_S = 1e-6
#: HiGHS's relative MIP gap (1e-4 by default): *assumed* small enough that "optimal" means the
#: cheapest cover at the prices' own precision, for the time limit to bound the solve instead.
MIP_REL_GAP = 1e-9


class SelectionError(TvmExtError):
    """No (acyclic) cover of the graph exists with the candidates given."""


def components(sets: Sequence[Iterable[int]], links: Sequence[Iterable[int]] = ()) -> list[list[int]]:
    """Indices of ``sets`` grouped into the connected parts of the "shares an element" relation
    (``links``: further groups of set indices that must share a part)."""
    pairs: list[tuple[int, int]] = []
    owner: dict[int, int] = {}
    for i, members in enumerate(sets):
        for n in members:
            pairs.append((i, owner.setdefault(n, i)))
    for group in links:
        group = list(group)
        pairs += [(j, group[0]) for j in group[1:]]
    return connected(range(len(sets)), pairs)


def _consumers(producers: Mapping[int, Iterable[int]]) -> dict[int, set[int]]:
    readers: dict[int, set[int]] = {}
    for n, ps in producers.items():
        for q in ps:
            readers.setdefault(q, set()).add(n)
    return readers


def written_nodes(members: Iterable[int], consumers: Mapping[int, Iterable[int]], sinks: Iterable[int] = (),
                  recomputes: Iterable[int] = ()) -> frozenset[int]:
    """The nodes of a set whose values it writes to global memory: not recomputed (``recomputes``)
    and read by a node outside the set, or in ``sinks`` (needed outside every candidate)."""
    members = set(members)
    sinks, recomputes = set(sinks), set(recomputes)
    return frozenset(n for n in members - recomputes
                     if n in sinks or any(c not in members for c in consumers.get(n, ())))


def kernel_cycle(chosen: Sequence[Iterable[int]], producers: Mapping[int, Iterable[int]],
                 recomputes: Sequence[Iterable[int]] | None = None) -> list[int] | None:
    """Indices into ``chosen`` of kernels on a dependency cycle, or None when they can be ordered.

    Kernel ``a`` depends on kernel ``b`` when a node of ``a`` reads a node that ``b`` writes
    (:func:`written_nodes`; with recomputation several kernels may write one node, and ``a``
    depends on each); a node in no chosen set is a kernel of its own (it can close a cycle but
    is not part of the answer)."""
    chosen = [frozenset(s) for s in chosen]
    consumers = _consumers(producers)
    writers: dict[int, list[int]] = {}
    for k, members in enumerate(chosen):
        for n in written_nodes(members, consumers, recomputes=recomputes[k] if recomputes else ()):
            writers.setdefault(n, []).append(k)
    held = {n for members in chosen for n in members}
    units: list[frozenset[int]] = list(chosen) + [frozenset([n]) for n in producers if n not in held]
    for k in range(len(chosen), len(units)):
        (n,) = units[k]
        writers[n] = [k]
    deps: dict[int, set[int]] = {}
    for a, members in enumerate(units):
        for n in members:
            for p in producers.get(n, ()):
                if p not in members:
                    deps.setdefault(a, set()).update(b for b in writers.get(p, ()) if b != a)
    state: dict[int, int] = {}  # 1: on the stack, 2: done
    for root in list(deps):
        if state.get(root):
            continue
        stack, path = [(root, iter(deps.get(root, ())))], [root]
        state[root] = 1
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                stack.pop()
                path.pop()
                state[node] = 2
            elif state.get(nxt) == 1:
                cycle = path[path.index(nxt):]
                return [k for k in cycle if k < len(chosen)]
            elif not state.get(nxt):
                state[nxt] = 1
                stack.append((nxt, iter(deps.get(nxt, ()))))
                path.append(nxt)
    return None


@dataclass(frozen=True)
class _Part:
    """One independent part of the problem, in local candidate indices."""

    sets: list[frozenset[int]]
    prices: list[float]
    cuts: list[list[int]]
    #: Nodes that some candidate recomputes: covered by constraints of their own, not exactly.
    shared: frozenset[int]
    #: Per shared node: the sets that hold it without recomputing it, and whether one must be chosen.
    computed_by: list[tuple[tuple[int, ...], bool]]
    #: (reader, writers): the reader may be chosen only with one of the writers.
    needs: list[tuple[int, tuple[int, ...]]]


def _rows(coefs: list[dict[int, float]], columns: int):
    from scipy.sparse import coo_matrix

    r = [k for k, coef in enumerate(coefs) for _ in coef]
    c = [j for coef in coefs for j in coef]
    v = [x for coef in coefs for x in coef.values()]
    return coo_matrix((v, (r, c)), shape=(len(coefs), columns)).tocsr()


def _solve_part(part: _Part, time_limit_s: float) -> tuple[list[int], str]:
    """One part: the cheapest cover that contains no whole cut (see the module docstring)."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    sets, width = part.sets, len(part.sets)
    elements = sorted({n for s in sets for n in s} - part.shared)
    exact: dict[int, dict[int, float]] = {n: {} for n in elements}
    for j, members in enumerate(sets):
        for n in members:
            if n in exact:
                exact[n][j] = 1.0
    constraints = [LinearConstraint(_rows(list(exact.values()), width), lb=1, ub=1)]
    if part.cuts:
        constraints.append(LinearConstraint(_rows([{j: 1.0 for j in cut} for cut in part.cuts], width),
                                            ub=[len(cut) - 1.0 for cut in part.cuts]))
    if part.computed_by:
        constraints.append(LinearConstraint(_rows([{j: 1.0 for j in holders} for holders, _ in part.computed_by],
                                                  width),
                                            lb=[1.0 if needed else 0.0 for _, needed in part.computed_by], ub=1))
    needs = [{reader: 1.0, **{w: -1.0 for w in writers}} for reader, writers in part.needs]
    if needs:
        constraints.append(LinearConstraint(_rows(needs, width), ub=0))
    res = milp(c=np.asarray(part.prices, dtype=float) / PRICE_UNIT_S, integrality=np.ones(width),
               bounds=Bounds(0, 1), constraints=constraints,
               options={"time_limit": time_limit_s, "mip_rel_gap": MIP_REL_GAP})
    if res.x is None and res.status == _LIMIT:
        singles = _singleton_cover(sets, elements, part.shared)
        if singles is not None:  # no incumbent in time: every node alone is a valid cover
            logger.warning("the selector found no cover of %d nodes by %d candidates within %g s; "
                           "every node stays a kernel of its own", len(elements), width, time_limit_s)
            return singles, "time limit (singletons)"
    if res.x is None or res.status not in (_SOLVED, _LIMIT):
        raise SelectionError(f"no exact acyclic cover of {len(elements)} nodes by {width} candidates "
                             f"({res.message})")
    return [j for j, v in enumerate(res.x) if v > 0.5], "optimal" if res.status == _SOLVED else "time limit"


def _singleton_cover(sets: list[frozenset[int]], elements: list[int], shared: frozenset[int]) -> list[int] | None:
    """The one-node sets covering ``elements`` and ``shared`` (always feasible: one kernel per node writes
    every value, and one-node kernels cannot form a cycle), or None when some node has no such set."""
    single = {next(iter(s)): j for j, s in enumerate(sets) if len(s) == 1}
    nodes = [*elements, *sorted(shared)]
    return sorted(single[n] for n in nodes) if all(n in single for n in nodes) else None


@dataclass
class Cover:
    """What :func:`solve_cover` found.

    Attributes
    ----------
    chosen : list of int
        Indices of the chosen sets, sorted.
    statuses : list of str
        Solver status per independent part in the final round (``"optimal"`` / ``"time limit"``).
    cuts : int
        Kernel cycles cut away before the cover could be ordered.
    recomputed : int
        Nodes that chosen sets recompute.
    """

    chosen: list[int]
    statuses: list[str]
    cuts: int = 0
    recomputed: int = 0


@dataclass
class _Recomputation:
    """The constraints recomputation adds, in global set indices."""

    shared: frozenset[int]
    computed_by: dict[int, tuple[list[int], bool]]
    needs: list[tuple[int, list[int]]]

    def links(self) -> list[list[int]]:
        """Groups of sets the constraints tie together (they must be solved in one part)."""
        return [[j, *writers] for j, writers in self.needs] + [h for h, _ in self.computed_by.values() if h]


def _recomputation(sets: Sequence[frozenset[int]], recomputes: Sequence[frozenset[int]],
                   producers: Mapping[int, Iterable[int]], sinks: frozenset[int]) -> _Recomputation:
    consumers = _consumers(producers)
    shared = frozenset().union(*recomputes)
    writers: dict[int, list[int]] = {}
    for j, members in enumerate(sets):
        for n in written_nodes(members, consumers, sinks, recomputes[j]):
            writers.setdefault(n, []).append(j)
    computed_by = {n: ([j for j, s in enumerate(sets) if n in s and n not in recomputes[j]], n in sinks)
                   for n in sorted(shared)}
    held = {n for s in sets for n in s}
    needs: list[tuple[int, list[int]]] = []
    for j, members in enumerate(sets):
        wanted = {q for m in members for q in producers.get(m, ())
                  if q not in members and q in held and (q in shared or m in shared)}
        needs.extend((j, writers.get(q, [])) for q in sorted(wanted))
    return _Recomputation(shared, computed_by, needs)


def solve_cover(sets: Sequence[Iterable[int]], prices: Sequence[float], time_limit_s: float = 10.0,
                producers: Mapping[int, Iterable[int]] | None = None, *,
                recomputes: Sequence[Iterable[int]] | None = None, sinks: Iterable[int] = ()) -> Cover:
    """The cheapest cover of the union of ``sets`` whose kernels can be ordered.

    Parameters
    ----------
    sets, prices : sequences
        Node sets of the candidates and their costs.
    time_limit_s : float
        HiGHS time limit per part and round.
    producers : mapping, optional
        Node -> the nodes it reads (the graph's edges); without it, cycles are not checked.
    recomputes : sequence of iterables, optional
        Per set, the nodes it recomputes (computes for itself, writes for nobody); needs ``producers``.
    sinks : iterable of int
        Nodes whose values are needed outside every set (function outputs, readers in no set).

    Returns
    -------
    Cover

    Raises
    ------
    SelectionError
        The sets admit no cover, or every cover the cuts left has a cycle.
    """
    sets = [frozenset(s) for s in sets]
    rec = [frozenset(r) for r in recomputes] if recomputes is not None else [frozenset()] * len(sets)
    if len(rec) != len(sets) or any(not r <= s for r, s in zip(rec, sets)):
        raise SelectionError("recomputes must give, per set, a subset of its nodes")
    extra = None
    if any(rec):
        if producers is None:
            raise SelectionError("recomputation needs the graph's edges (producers)")
        extra = _recomputation(sets, rec, producers, frozenset(sinks))
    links = extra.links() if extra else []
    cuts: list[list[int]] = []
    solved: dict[tuple, tuple[list[int], str]] = {}
    for _ in range(MAX_CUTS + 1):
        chosen: list[int] = []
        statuses: list[str] = []
        for part in components(sets, [*links, *cuts]):
            local = {g: i for i, g in enumerate(part)}
            part_cuts = [[local[j] for j in cut] for cut in cuts if cut[0] in local]
            key = (tuple(part), tuple(map(tuple, part_cuts)))
            if key not in solved:
                solved[key] = _solve_part(_local_part(part, local, sets, prices, part_cuts, extra), time_limit_s)
            picked, status = solved[key]
            chosen.extend(part[j] for j in picked)
            statuses.append(status)
        chosen.sort()
        cycle = (kernel_cycle([sets[j] for j in chosen], producers, [rec[j] for j in chosen])
                 if producers is not None else None)
        if cycle is None:
            return Cover(chosen, statuses, len(cuts), len(set().union(*(rec[j] for j in chosen))))
        cuts.append(sorted(chosen[k] for k in cycle))
        logger.debug("cover has a kernel cycle through candidates %s; cut and re-solved", cuts[-1])
    raise SelectionError(f"no acyclic cover found after {MAX_CUTS} cycle cuts")


def _local_part(part: list[int], local: dict[int, int], sets, prices, cuts, extra: _Recomputation | None) -> _Part:
    if extra is None:
        return _Part([sets[j] for j in part], [prices[j] for j in part], cuts, frozenset(), [], [])
    members = {n for j in part for n in sets[j]}
    computed_by = [(tuple(local[j] for j in holders), needed) for n, (holders, needed) in extra.computed_by.items()
                   if n in members]
    needs = [(local[j], tuple(local[w] for w in writers)) for j, writers in extra.needs if j in local]
    return _Part([sets[j] for j in part], [prices[j] for j in part], cuts, extra.shared & members, computed_by,
                 needs)


def _sinks(ctx: "SelectionContext", covered: set[int]) -> frozenset[int]:
    """Nodes whose values are needed outside every candidate: function outputs, or read by a
    node no candidate holds."""
    graph = ctx.graph
    out = set()
    for n, node in enumerate(graph.nodes):
        for t in node.outputs:
            info = graph.tensors[t]
            if info.kind.value == "output" or any(c not in covered for c in info.consumers):
                out.add(n)
    return frozenset(out)


class BlpSelector:
    """The cheapest cover (see the module docstring).

    Parameters
    ----------
    time_limit_s : float
        HiGHS time limit of each independent part.
    """

    name = "blp"

    def __init__(self, time_limit_s: float = 10.0):
        self.time_limit_s = time_limit_s

    def select(self, ctx: "SelectionContext", candidates: Sequence[Candidate],
               cost: "CostModel | None" = None) -> Selection:
        """The cheapest cover of the call nodes (with the recomputations candidates offer);
        nodes no candidate holds stay uncovered."""
        if cost is None:
            raise SelectionError("the BLP selector needs a cost model")
        start = time.perf_counter()
        prices = [cost.cost(c, ctx.device).seconds for c in candidates]
        covered = {n for c in candidates for n in c.nodes}
        uncovered = [n for n in ctx.call_nodes() if n not in covered]
        producers = {n: ctx.graph.producers(n) for n in range(len(ctx.graph.nodes))}
        recomputes = [c.recomputes for c in candidates]
        cover = solve_cover([c.nodes for c in candidates], prices, self.time_limit_s, producers,
                            recomputes=recomputes, sinks=_sinks(ctx, covered) if any(recomputes) else ())
        picked_all, statuses = cover.chosen, cover.statuses
        picked_all.sort(key=lambda i: ctx.ordered(candidates[i].nodes)[0])
        chosen = [candidates[i] for i in picked_all]
        limited = sum(s.startswith("time limit") for s in statuses)
        note = (f"{len(statuses)} parts solved to optimality" if not limited
                else f"{limited} of {len(statuses)} parts hit the {self.time_limit_s:g} s time limit (best cover kept"
                     + (", or one kernel per node where none was found)" if "time limit (singletons)" in statuses
                        else ")"))
        if cover.cuts:
            note += f"; {cover.cuts} kernel cycle(s) cut away"
        if cover.recomputed:
            note += f"; {cover.recomputed} node(s) recomputed inside the kernels that read them"
        logger.info("BLP selection of %d candidates in %.2f s: %s", len(candidates), time.perf_counter() - start, note)
        return Selection(chosen, uncovered, sum(prices[i] for i in picked_all), [note])


__all__ = ["BlpSelector", "Cover", "MAX_CUTS", "SelectionError", "components", "kernel_cycle", "solve_cover",
           "written_nodes"]
