"""Selectors: which candidates become the kernels of a graph.

:class:`Selection` is what every selector returns: the chosen candidates (disjoint node sets) and
the call nodes none of them covers, which the preset's *rest* policy handles (TVM's ``FuseOps``
in the ``cutlass`` preset). Implementations:

* :class:`PrioritySelector` — candidates in the order the generators proposed them, each taken
  if it overlaps none taken before (a generator's own partition, e.g. the stitch scope, is
  reproduced exactly);
* :class:`~tvm_ext.select.blp.BlpSelector` — Korch's binary linear program over costs.

Example
-------
>>> selection = PrioritySelector().select(ctx, candidates)
>>> [c.generator for c in selection.chosen][:3], selection.uncovered
(['stitch', 'stitch', 'dlight'], [])
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, Sequence

from .candidate import Candidate

if TYPE_CHECKING:  # pragma: no cover - typing only
    from .context import SelectionContext
    from .cost import CostModel


@dataclass
class Selection:
    """The outcome of a selector.

    Attributes
    ----------
    chosen : list of Candidate
        Kernels to emit; their node sets are disjoint except for the nodes a candidate
        recomputes (``Candidate.recomputes``: it computes them for itself).
    uncovered : list of int
        Call nodes no chosen candidate covers.
    objective_s : float or None
        Total modelled cost of the chosen candidates, when the selector priced them.
    notes : list of str
        What the selector wants reported (solver status, time limits hit).
    """

    chosen: list[Candidate]
    uncovered: list[int] = field(default_factory=list)
    objective_s: float | None = None
    notes: list[str] = field(default_factory=list)


class Selector(Protocol):
    """What every selector provides."""

    name: str

    def select(self, ctx: "SelectionContext", candidates: Sequence[Candidate],
               cost: "CostModel | None" = None) -> Selection:
        """Pick disjoint candidates covering as many call nodes as the selector can."""


class PrioritySelector:
    """First come, first served, in candidate order (see the module docstring)."""

    name = "priority"

    def select(self, ctx: "SelectionContext", candidates: Sequence[Candidate],
               cost: "CostModel | None" = None) -> Selection:  # noqa: D102 - protocol
        taken: set[int] = set()
        chosen: list[Candidate] = []
        for cand in candidates:
            if taken.isdisjoint(cand.nodes):
                chosen.append(cand)
                taken.update(cand.nodes)
        uncovered = [n for n in ctx.call_nodes() if n not in taken]
        total = sum(cost.cost(c, ctx.device).seconds for c in chosen) if cost is not None else None
        return Selection(chosen, uncovered, total)


__all__ = ["PrioritySelector", "Selection", "Selector"]
