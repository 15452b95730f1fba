"""Korch's selector: the cheapest exact cover of the graph by candidate kernels, as a binary LP.

One binary variable per candidate; minimize the sum of the chosen candidates' costs subject to
every call node lying in exactly one chosen candidate (every node covered, nothing computed
twice). A chosen candidate's external inputs are then always produced by the chosen candidate
that holds their producer. Singletons (the dlight generator proposes every node alone) make a
cover always exist.

The kernels must also run in *some order*: two convex candidates can still depend on each
other (A feeds B and B feeds A through nodes that do not reach each other inside either), and
then no launch order exists. Such covers are removed lazily, as cutting planes: when the
optimum has a cycle of kernels, the constraint "not all of these together" is added and the
problem solved again (at most :data:`MAX_CUTS` rounds; each cut removes only covers with that
cycle, so the optimum stays optimal among acyclic covers).

The problem splits exactly into independent parts: candidates that share no node, directly or
through a chain of candidates (or a cut), never constrain each other, so each connected part is
solved alone (a transformer's layers are separate parts unless a candidate spans two). Each part
is solved by HiGHS (``scipy.optimize.milp``) with a time limit; on timeout the best cover found
so far is kept and the selection's notes say so.

Recomputation (a cheap node duplicated into several kernels, as Korch allows) is not offered:
every node is computed once.

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


class SelectionError(TvmExtError):
    """No (acyclic) cover of the graph exists with the candidates given."""


def components(sets: Sequence[Iterable[int]], links: Sequence[Iterable[int]] = ()) -> list[list[int]]:
    """Indices of ``sets`` grouped into the connected parts of the "shares an element" relation
    (``links``: further groups of set indices that must share a part)."""
    parent = list(range(len(sets)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: dict[int, int] = {}
    for i, members in enumerate(sets):
        for n in members:
            if n in owner:
                parent[find(i)] = find(owner[n])
            else:
                owner[n] = i
    for group in links:
        group = list(group)
        for j in group[1:]:
            parent[find(j)] = find(group[0])
    parts: dict[int, list[int]] = {}
    for i in range(len(sets)):
        parts.setdefault(find(i), []).append(i)
    return list(parts.values())


def kernel_cycle(chosen: Sequence[Iterable[int]], producers: Mapping[int, Iterable[int]]) -> list[int] | None:
    """Indices into ``chosen`` of kernels on a dependency cycle, or None when they can be ordered.

    Kernel ``a`` depends on ``b`` when a node of ``a`` reads a node of ``b``; a node in no chosen
    set is a kernel of its own (it can close a cycle but is not part of the answer)."""
    unit: dict[int, int] = {n: k for k, members in enumerate(chosen) for n in members}
    units = len(chosen)

    def unit_of(n: int) -> int:
        nonlocal units
        if n not in unit:
            unit[n], units = units, units + 1
        return unit[n]

    deps: dict[int, set[int]] = {}
    for n in list(producers):
        for p in producers[n]:
            a, b = unit_of(n), unit_of(p)
            if a != b:
                deps.setdefault(a, set()).add(b)
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


def _solve_part(sets: Sequence[Iterable[int]], prices: Sequence[float], cuts: Sequence[Sequence[int]],
                time_limit_s: float) -> tuple[list[int], str]:
    """One part: the cheapest exact cover that contains no whole cut."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    elements = sorted({n for s in sets for n in s})
    row = {n: k for k, n in enumerate(elements)}
    rows, cols = [], []
    for j, members in enumerate(sets):
        for n in set(members):
            rows.append(row[n])
            cols.append(j)
    a = coo_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(elements), len(sets))).tocsr()
    constraints = [LinearConstraint(a, lb=1, ub=1)]
    if cuts:
        crow = [k for k, cut in enumerate(cuts) for _ in cut]
        ccol = [j for cut in cuts for j in cut]
        c = coo_matrix((np.ones(len(ccol)), (crow, ccol)), shape=(len(cuts), len(sets))).tocsr()
        constraints.append(LinearConstraint(c, ub=np.array([len(cut) - 1 for cut in cuts], dtype=float)))
    res = milp(c=np.asarray(prices, dtype=float), integrality=np.ones(len(sets)), bounds=Bounds(0, 1),
               constraints=constraints, options={"time_limit": time_limit_s})
    if res.x is None or res.status not in (_SOLVED, _LIMIT):
        raise SelectionError(f"no exact acyclic cover of {len(elements)} nodes by {len(sets)} candidates "
                             f"({res.message})")
    return [j for j, v in enumerate(res.x) if v > 0.5], "optimal" if res.status == _SOLVED else "time limit"


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
    """

    chosen: list[int]
    statuses: list[str]
    cuts: int = 0


def solve_cover(sets: Sequence[Iterable[int]], prices: Sequence[float], time_limit_s: float = 10.0,
                producers: Mapping[int, Iterable[int]] | None = None) -> Cover:
    """The cheapest exact cover of the union of ``sets`` whose kernels can be ordered.

    Parameters
    ----------
    sets, prices : sequences
        Node sets of the candidates and their costs.
    time_limit_s : float
        HiGHS time limit per part and round.
    producers : mapping, optional
        Node -> the nodes it reads (the graph's edges); without it, cycles are not checked.

    Returns
    -------
    Cover

    Raises
    ------
    SelectionError
        The sets admit no exact cover, or every cover the cuts left has a cycle.
    """
    sets = [frozenset(s) for s in sets]
    cuts: list[list[int]] = []
    solved: dict[tuple, tuple[list[int], str]] = {}
    for _ in range(MAX_CUTS + 1):
        chosen: list[int] = []
        statuses: list[str] = []
        for part in components(sets, cuts):
            local = {g: i for i, g in enumerate(part)}
            part_cuts = [[local[j] for j in cut] for cut in cuts if cut[0] in local]
            key = (tuple(part), tuple(map(tuple, part_cuts)))
            if key not in solved:
                solved[key] = _solve_part([sets[j] for j in part], [prices[j] for j in part], part_cuts,
                                          time_limit_s)
            picked, status = solved[key]
            chosen.extend(part[j] for j in picked)
            statuses.append(status)
        chosen.sort()
        cycle = kernel_cycle([sets[j] for j in chosen], producers) if producers is not None else None
        if cycle is None:
            return Cover(chosen, statuses, len(cuts))
        cuts.append(sorted(chosen[k] for k in cycle))
        logger.debug("cover has a kernel cycle through candidates %s; cut and re-solved", cuts[-1])
    raise SelectionError(f"no acyclic cover found after {MAX_CUTS} cycle cuts")


class BlpSelector:
    """Exact cover at least cost (see the module docstring).

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
        """The cheapest exact cover of the call nodes; nodes no candidate holds stay uncovered."""
        if cost is None:
            raise SelectionError("the BLP selector needs a cost model")
        start = time.perf_counter()
        prices = [cost.cost(c, ctx.device).seconds for c in candidates]
        covered = {n for c in candidates for n in c.nodes}
        uncovered = [n for n in ctx.call_nodes() if n not in covered]
        producers = {n: ctx.graph.producers(n) for n in range(len(ctx.graph.nodes))}
        cover = solve_cover([c.nodes for c in candidates], prices, self.time_limit_s, producers)
        picked_all, statuses = cover.chosen, cover.statuses
        picked_all.sort(key=lambda i: ctx.ordered(candidates[i].nodes)[0])
        chosen = [candidates[i] for i in picked_all]
        limited = statuses.count("time limit")
        note = (f"{len(statuses)} parts solved to optimality" if not limited
                else f"{limited} of {len(statuses)} parts hit the {self.time_limit_s:g} s time limit (best cover kept)")
        if cover.cuts:
            note += f"; {cover.cuts} kernel cycle(s) cut away"
        logger.info("BLP selection of %d candidates in %.2f s: %s", len(candidates), time.perf_counter() - start, note)
        return Selection(chosen, uncovered, sum(prices[i] for i in picked_all), [note])


__all__ = ["BlpSelector", "Cover", "MAX_CUTS", "SelectionError", "components", "kernel_cycle", "solve_cover"]
