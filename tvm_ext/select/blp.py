"""Korch's selector: the cheapest exact cover of the graph by candidate kernels, as a binary LP.

One binary variable per candidate; minimize the sum of the chosen candidates' costs subject to
every call node lying in exactly one chosen candidate (every node covered, nothing computed
twice). A chosen candidate's external inputs are then always produced by the chosen candidate
that holds their producer. Singletons (the dlight generator proposes every node alone) make a
cover always exist.

The problem splits exactly into independent parts: candidates that share no node, directly or
through a chain of candidates, never constrain each other, so each connected part of the
"shares a node" relation is solved alone (a transformer's layers are separate parts unless a
candidate spans two). Each part is solved by HiGHS (``scipy.optimize.milp``) with a time limit;
on timeout the best cover found so far is kept and the selection's notes say so.

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
from collections.abc import Sequence
from typing import TYPE_CHECKING

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


class SelectionError(TvmExtError):
    """No cover of the graph exists with the candidates given (some node is in no candidate)."""


def components(sets: Sequence[Sequence[int]]) -> list[list[int]]:
    """Indices of ``sets`` grouped into the connected parts of the "shares an element" relation."""
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
    parts: dict[int, list[int]] = {}
    for i in range(len(sets)):
        parts.setdefault(find(i), []).append(i)
    return list(parts.values())


def solve_cover(sets: Sequence[Sequence[int]], prices: Sequence[float], time_limit_s: float = 10.0
                ) -> tuple[list[int], str]:
    """The cheapest exact cover of the union of ``sets``: indices of the chosen sets and the solver
    status (``"optimal"`` or ``"time limit"``).

    Raises
    ------
    SelectionError
        The sets admit no exact cover.
    """
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
    res = milp(c=np.asarray(prices, dtype=float), integrality=np.ones(len(sets)), bounds=Bounds(0, 1),
               constraints=LinearConstraint(a, lb=1, ub=1), options={"time_limit": time_limit_s})
    if res.x is None or res.status not in (_SOLVED, _LIMIT):
        raise SelectionError(f"no exact cover of {len(elements)} nodes by {len(sets)} candidates ({res.message})")
    chosen = [j for j, v in enumerate(res.x) if v > 0.5]
    return chosen, "optimal" if res.status == _SOLVED else "time limit"


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
        picked_all: list[int] = []
        statuses: list[str] = []
        for part in components([c.nodes for c in candidates]):
            picked, status = solve_cover([candidates[i].nodes for i in part], [prices[i] for i in part],
                                         self.time_limit_s)
            picked_all.extend(part[j] for j in picked)
            statuses.append(status)
        picked_all.sort(key=lambda i: ctx.ordered(candidates[i].nodes)[0])
        chosen = [candidates[i] for i in picked_all]
        limited = statuses.count("time limit")
        note = (f"{len(statuses)} parts solved to optimality" if not limited
                else f"{limited} of {len(statuses)} parts hit the {self.time_limit_s:g} s time limit (best cover kept)")
        logger.info("BLP selection of %d candidates in %.2f s: %s", len(candidates), time.perf_counter() - start, note)
        return Selection(chosen, uncovered, sum(prices[i] for i in picked_all), [note])


__all__ = ["BlpSelector", "SelectionError", "components", "solve_cover"]
