"""The cost interface: one number per candidate kernel, in seconds, with where it came from.

Every selector and every generator that compares alternatives (CUTLASS configurations, stitching
against separate kernels) asks a :class:`CostModel`. Implementations: the analytic model
(:class:`~tvm_ext.select.analytic.AnalyticCostModel`), measurements from the
:class:`~tvm_ext.select.database.Database`, and a learned correction of the analytic model
(:class:`~tvm_ext.select.measured.MeasuredCostModel` layers them).

Example
-------
>>> estimate = model.cost(candidate, load_device("h100"))
>>> estimate.seconds, estimate.source
(1.2e-05, 'analytic')
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Mapping, Protocol

if TYPE_CHECKING:  # pragma: no cover - typing only
    from ..hardware import DeviceSpec
    from .candidate import Candidate

#: Where a cost came from.
COST_SOURCES = ("analytic", "learned", "measured")


@dataclass(frozen=True)
class CostEstimate:
    """The cost of one call of a candidate kernel.

    Attributes
    ----------
    seconds : float
        Modelled (or measured) time of one call, launch overhead included.
    source : str
        ``"analytic"``, ``"learned"`` or ``"measured"``.
    parts : Mapping
        The terms that make up ``seconds`` (for reports), e.g. ``launch_s``, ``compute_s``,
        ``memory_s``, ``sync_s``.
    """

    seconds: float
    source: str
    parts: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.source not in COST_SOURCES:
            raise ValueError(f"cost source must be one of {COST_SOURCES}, got {self.source!r}")
        if not self.seconds >= 0.0:
            raise ValueError(f"a cost must be a non-negative number of seconds, got {self.seconds!r}")


class CostModel(Protocol):
    """What every cost model provides."""

    def cost(self, candidate: "Candidate", device: "DeviceSpec") -> CostEstimate:
        """Seconds of one call of ``candidate`` on ``device``."""


__all__ = ["COST_SOURCES", "CostEstimate", "CostModel"]
