"""The stitch generator's plan: what travels with a stitched kernel, as JSON.

:class:`StitchKernelPlan` is one of

* ``group="stitch"`` / ``"single"``: a :class:`~tvm_ext.stitch.planner.StitchPlan` (dominants,
  schemes per op, stages, thread mapping, grid, launch bound) for a memory-intensive group or
  one multi-block op (softmax, layer norm);
* ``group="prologue"``: the :class:`~tvm_ext.stitch.prologue_schedule.PrologueTiles` of a GEMM
  that computes its softmax-like row operand itself.

A plan read back from its attribute holds only decisions; :func:`realize` re-applies the two
transformations the planner made on its scratch copy of the function (local ops inlined, a split
reduction factored), which the schedule builder starts from. Nothing is decided again.

Example
-------
>>> plan = StitchKernelPlan("stitch", 1, stitch=plan_prim_func(func, device))
>>> StitchKernelPlan.from_json(plan.to_json()) == plan
True
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

from tvm import tirx

from ..errors import TVM_ERRORS
from .dominance import Dominance
from .launch import LaunchConfig
from .mapping import ThreadMapping
from .ops import StitchGraph
from .planner import Stage, StitchPlan, StitchPlanError, apply_split, inline_locals
from .prologue_schedule import PrologueTiles

#: Group kinds a stitch plan may have.
GROUP_KINDS = ("stitch", "single", "prologue")


def _plan_to_json(plan: StitchPlan) -> dict[str, Any]:
    d = plan.dominance
    return {
        "dominance": {"local": list(d.local), "candidates": list(d.candidates), "dominants": list(d.dominants),
                      "sub_dominants": dict(d.sub_dominants), "groups": {k: list(v) for k, v in d.groups.items()}},
        "materialized": list(plan.materialized), "schemes": dict(plan.schemes), "rows": dict(plan.rows),
        "mappings": {k: dataclasses.asdict(m) for k, m in plan.mappings.items()},
        "stages": [dataclasses.asdict(s) for s in plan.stages],
        "threads_x": plan.threads_x, "rows_per_block": plan.rows_per_block, "grid": plan.grid,
        "launch": dataclasses.asdict(plan.launch), "needs_grid_sync": plan.needs_grid_sync,
        "shared_bytes": plan.shared_bytes, "demoted": list(plan.demoted), "split": dict(plan.split),
    }


def _plan_from_json(data: dict[str, Any]) -> StitchPlan:
    d = data["dominance"]
    dominance = Dominance(tuple(d["local"]), tuple(d["candidates"]), tuple(d["dominants"]), dict(d["sub_dominants"]),
                          {k: tuple(v) for k, v in d["groups"].items()})
    stages = [Stage(s["root"], tuple(s["members"]), s["rows"], s["inner"], s["natural_blocks"], s["tasks"])
              for s in data["stages"]]
    return StitchPlan(dominance=dominance, materialized=tuple(data["materialized"]), schemes=dict(data["schemes"]),
                      rows=dict(data["rows"]), mappings={k: ThreadMapping(**m) for k, m in data["mappings"].items()},
                      stages=stages, threads_x=int(data["threads_x"]), rows_per_block=int(data["rows_per_block"]),
                      grid=int(data["grid"]), launch=LaunchConfig(**data["launch"]),
                      needs_grid_sync=bool(data["needs_grid_sync"]), shared_bytes=int(data["shared_bytes"]),
                      demoted=tuple(data["demoted"]), split={k: int(v) for k, v in data["split"].items()})


@dataclass(frozen=True)
class StitchKernelPlan:
    """The plan of one stitched kernel (see the module docstring).

    Attributes
    ----------
    group : str
        ``"stitch"``, ``"single"`` or ``"prologue"``.
    parts : int
        Remote-stitched parts (independent sub-groups) of a ``"stitch"`` group.
    stitch : StitchPlan or None
        The planner's decisions (``"stitch"`` / ``"single"``).
    tiles : PrologueTiles or None
        The row tile of a ``"prologue"`` kernel.
    """

    generator: ClassVar[str] = "stitch"

    group: str
    parts: int = 1
    stitch: StitchPlan | None = dataclasses.field(default=None, compare=False)
    tiles: PrologueTiles | None = None

    def __post_init__(self) -> None:
        if self.group not in GROUP_KINDS:
            raise ValueError(f"stitch plan group must be one of {GROUP_KINDS}, got {self.group!r}")
        if (self.group == "prologue") != (self.tiles is not None) or (self.tiles is None) == (self.stitch is None):
            raise ValueError("a prologue plan has tiles, any other stitch plan a StitchPlan")

    @property
    def code_path(self) -> str:
        """How its arithmetic runs: a GEMM prologue's contraction is one output per thread."""
        return "simt_contraction" if self.tiles is not None else "simt"

    def to_json(self) -> dict[str, Any]:
        """JSON form (the planner's scratch function is not part of it)."""
        out: dict[str, Any] = {"group": self.group, "parts": self.parts}
        if self.stitch is not None:
            out["stitch"] = _plan_to_json(self.stitch)
        if self.tiles is not None:
            out["tiles"] = dataclasses.asdict(self.tiles)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "StitchKernelPlan":
        """Inverse of :meth:`to_json`."""
        return cls(group=str(data["group"]), parts=int(data.get("parts", 1)),
                   stitch=_plan_from_json(data["stitch"]) if "stitch" in data else None,
                   tiles=PrologueTiles(**data["tiles"]) if "tiles" in data else None)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StitchKernelPlan) and self.to_json() == other.to_json()

    def __hash__(self) -> int:
        return hash((self.group, self.parts, self.tiles))

    @property
    def grid_syncs(self) -> int:
        """Grid barriers of the kernel (:meth:`~tvm_ext.stitch.planner.StitchPlan.barriers`)."""
        return 0 if self.stitch is None else self.stitch.barriers()

    def summary(self) -> str:
        """One line for reports."""
        if self.tiles is not None:
            t = self.tiles
            return (f"stitch prologue: softmax rows computed in the GEMM, {t.rows_per_block} rows/block, "
                    f"grid {t.grid} x {t.threads_x * t.threads_y} threads, {t.shared_bytes} B shared")
        p = self.stitch
        sync = ", grid barrier" if p.needs_grid_sync else ""
        parts = f", {self.parts} remote parts" if self.parts > 1 else ""
        return (f"stitch {self.group}: {len(p.stages)} stage(s), grid {p.grid} x {p.threads_per_block} threads, "
                f"{p.shared_bytes} B shared{sync}{parts}")


def realize(func: tirx.PrimFunc, plan: StitchPlan) -> StitchPlan:
    """``plan`` with its scratch state rebuilt on ``func``: the local ops inlined and the split
    reductions factored as the planner did, and the op graph of the result.

    Raises
    ------
    StitchPlanError
        ``func`` does not have the ops the plan names (it is not the function it was made for).
    """
    if plan.inlined_func is not None and plan.graph is not None:
        return plan
    sch, failed = inline_locals(func, plan.dominance.local)
    if failed:
        raise StitchPlanError(f"the plan's local ops {failed} cannot be inlined into this function")
    if plan.split:
        before = StitchGraph.from_prim_func(sch.mod["main"])
        for name, factor in plan.split.items():
            try:
                apply_split(sch, before.op(name), factor)
            except TVM_ERRORS as err:
                raise StitchPlanError(f"the plan's split of '{name}' does not apply: {err}") from None
    inlined = sch.mod["main"]
    return dataclasses.replace(plan, inlined_func=inlined, graph=StitchGraph.from_prim_func(inlined))


__all__ = ["GROUP_KINDS", "StitchKernelPlan", "realize"]
