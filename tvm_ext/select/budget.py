"""Planning budgets: how much work a generator may spend on one function before it stops.

A generator that searches (tile-graph connecting, Korch's convex sets, SOUFFLE's subprograms;
AStitch's groups too) plans groups of nodes one after another; on an unusual graph that can take far longer than the
model's size suggests. A preset sets a :class:`PlanningBudget`: work units and wall-clock seconds
per call node of the function, each with a floor for small graphs and a ceiling for large ones.
The selection pass gives each generator a :class:`BudgetMeter` per function (:meth:`SelectionContext.meter
<tvm_ext.select.context.SelectionContext.meter>`); the generator charges what it plans
(:meth:`BudgetMeter.spend`) and, once :attr:`BudgetMeter.exhausted`, stops searching and hands
the selector the candidates it has. Selection and the build go on; the selection report says
so (:meth:`BudgetMeter.note`: ``"tilegraph: budget exhausted after 40 of 52 groups ..."``).
The budget is the build's: a graph stage run again (``full`` runs it with and without the
horizontal transform, a re-selection round once more) continues the meter where the earlier
run left it, and what the build has planned stays free to ask for again.

A work unit is the generator's own measure of planning effort, stated where it charges, fitted
to what planning costs (stitch: a node of a group planned; orchestrate: a stitched node of a set, a
set dlight builds as 5; subprogram: a statement of a piece designed, a tensor-core stage as 18; the
tile graph: a tile configuration priced, a tile schedule built as 30, a group asked as 32), the
searching generators each within a budget of its own (:attr:`PlanningBudget.per_generator`,
``tvm_ext.driver.presets.DEFAULT_BUDGET``). Work units make the cut deterministic: the same
on any machine and under any load; the seconds bound the compile time a user waits for, and make a
build that hits them depend on the machine (a faster one plans more before it stops), so the
default's work limits are set to bind first on the machine they were measured on.

Example
-------
>>> meter = PlanningBudget(work_per_node=2, min_work=0).meter("tilegraph", nodes=10)
>>> meter.spend(20); meter.exhausted
True
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import TvmExtError


class BudgetError(TvmExtError):
    """A planning budget with a negative or non-finite amount."""


@dataclass(frozen=True)
class PlanningBudget:
    """Work a generator may spend planning one function, scaled by the function's call nodes.

    Parameters
    ----------
    work_per_node, min_work, max_work : float
        Work units allowed: ``work_per_node x nodes``, at least ``min_work`` (a floor for small
        graphs, which wins over the ceiling) and at most ``max_work``; ``inf`` for no limit.
    seconds_per_node, min_seconds, max_seconds : float
        Wall-clock seconds allowed, likewise; ``inf`` for no limit.
    """

    #: *assumed*: about 2.5x the most a seed model spends, so only unusual graphs reach it. Measured
    #: (``scripts/planning_time.py``, ``--fp16``, ``full``, summed over its graph-stage runs): the
    #: tile graph 0.7-18.7 units per call node on 15 seed models (BERT-large s384 to YOLOv5s) and 79
    #: on MMoE (85 nodes; it hit the earlier 60), orchestrate 1.1-9.6 (MMoE 38), subprogram 0.2-1.8.
    work_per_node: float = 200.0
    min_work: float = 5000.0
    #: *assumed*: a bound on compile time, not a quality knob. Per node (2.5 s, a floor of 10 s) it
    #: only matters for small graphs; the ceiling is what bounds a model: 30 s per searching
    #: generator and function over the whole build, so that the three searching generators of
    #: ``full`` plan in at most about 90 s of the 120 s issue 38 allows a whole ``inspect`` on a
    #: 2-core machine. What it costs is measured (``planning_time.py --end-to-end`` on the seed
    #: suite, README "Compile time and planning budgets"): the tile graph's last groups are rarely
    #: chosen (MobileNet-V2 stops after 31 of its 83 s and keeps 134.40 us modelled).
    seconds_per_node: float = 2.5
    min_seconds: float = 10.0
    max_seconds: float = 30.0
    #: Ceiling on work units over any graph size (``inf``: none; the seconds bound a build).
    max_work: float = math.inf
    #: ``(generator, budget)`` pairs: a generator whose work unit is its own (the tile graph counts
    #: tile configurations priced, not nodes) plans within its own budget; the rest within this one.
    per_generator: tuple[tuple[str, PlanningBudget], ...] = ()

    def __post_init__(self) -> None:
        for name in ("work_per_node", "min_work", "seconds_per_node", "min_seconds", "max_work", "max_seconds"):
            value = getattr(self, name)
            if not value >= 0 or math.isnan(value):
                raise BudgetError(f"planning budget: {name} must be >= 0, got {value!r}")
        for pair in self.per_generator:
            if len(pair) != 2 or not isinstance(pair[0], str) or not isinstance(pair[1], PlanningBudget):
                raise BudgetError(f"planning budget: per_generator takes (generator name, PlanningBudget) pairs, "
                                  f"got {pair!r}")

    def for_generator(self, generator: str) -> PlanningBudget:
        """The budget ``generator`` plans within (its own where :attr:`per_generator` has one)."""
        return dict(self.per_generator).get(generator, self)

    def with_generator(self, generator: str, budget: PlanningBudget) -> PlanningBudget:
        """This budget with ``generator`` planning within ``budget`` (the others keep theirs).

        >>> quick = PlanningBudget().with_generator("subprogram", PlanningBudget(max_work=500.0))
        >>> quick.for_generator("subprogram").max_work
        500.0
        """
        kept = tuple(pair for pair in self.per_generator if pair[0] != generator)
        return dataclasses.replace(self, per_generator=kept + ((generator, budget),))

    def work_limit(self, nodes: int) -> float:
        """Work units allowed for a function of ``nodes`` call nodes."""
        return max(self.min_work, min(self.max_work, self.work_per_node * nodes))

    def seconds_limit(self, nodes: int) -> float:
        """Seconds allowed for a function of ``nodes`` call nodes."""
        return max(self.min_seconds, min(self.max_seconds, self.seconds_per_node * nodes))

    def meter(self, generator: str, nodes: int, clock: Callable[[], float] = time.perf_counter, *,
              spent: tuple[float, float] = (0.0, 0.0)) -> "BudgetMeter":
        """A meter for ``generator`` on a function of ``nodes`` call nodes, its seconds counting
        from now; ``spent``: (work, seconds) earlier runs of the generator on the function spent."""
        own = self.for_generator(generator)
        return BudgetMeter(generator, own.work_limit(nodes), own.seconds_limit(nodes), clock, spent=spent)


#: No limit at all (tests that need every candidate; the default of a context without a preset).
UNLIMITED = PlanningBudget(work_per_node=math.inf, min_work=math.inf, seconds_per_node=math.inf,
                           min_seconds=math.inf)


class BudgetMeter:
    """What one generator has spent on one function (see the module docstring).

    Parameters
    ----------
    generator : str
        The generator's name, for the report.
    work_limit, seconds_limit : float
        The allowance (``inf``: none).
    clock : callable
        Seconds since some origin (``time.perf_counter``); the meter starts when it is made.
    spent : (float, float)
        Work and seconds already spent (by earlier runs of the generator on the same function:
        the budget is the build's, not each run's).
    """

    def __init__(self, generator: str, work_limit: float, seconds_limit: float,
                 clock: Callable[[], float] = time.perf_counter, *, spent: tuple[float, float] = (0.0, 0.0)):
        self.generator = generator
        self.work_limit = work_limit
        self.seconds_limit = seconds_limit
        self.work, self._earlier = float(spent[0]), float(spent[1])
        self._clock = clock
        self._start = clock()
        self._stopped = False

    @property
    def seconds(self) -> float:
        """Seconds spent: since the meter was made, and by earlier runs."""
        return self._earlier + self._clock() - self._start

    def spend(self, units: float) -> None:
        """Charge ``units`` of work."""
        self.work += units

    @property
    def share(self) -> float:
        """The larger of the work and the seconds spent over their limits (0 where unlimited)."""
        return max(self.work / self.work_limit if math.isfinite(self.work_limit) else 0.0,
                   self.seconds / self.seconds_limit if math.isfinite(self.seconds_limit) else 0.0)

    @property
    def exhausted(self) -> bool:
        """Whether the work or the seconds are spent; once true it stays true (the generator
        stops at a consistent point, not at every check the clock happens to pass)."""
        if not self._stopped:
            self._stopped = self.work >= self.work_limit or self.seconds >= self.seconds_limit
        return self._stopped

    def note(self, done: int, asked: int, what: str = "groups") -> str:
        """The report line: ``"<generator>: budget exhausted after <done> of <asked> <what> ..."``."""
        return (f"{self.generator}: budget exhausted after {done} of {asked} {what} planned "
                f"({self.work:.0f} of {_amount(self.work_limit)} work units, {self.seconds:.0f} of "
                f"{_amount(self.seconds_limit)} s); its candidates so far went to the selector")

    def note_spent(self) -> str:
        """The report line of a budget spent without this run stopping anything: an earlier
        graph-stage run of the build spent it (this run took only what the build had planned)."""
        return (f"{self.generator}: budget exhausted over this build's graph-stage runs ({self.work:.0f} of "
                f"{_amount(self.work_limit)} work units, {self.seconds:.0f} of {_amount(self.seconds_limit)} s); "
                "what it planned before went to the selector")


def _amount(limit: float) -> str:
    return "unlimited" if math.isinf(limit) else f"{limit:.0f}"


__all__ = ["BudgetError", "BudgetMeter", "PlanningBudget", "UNLIMITED"]
