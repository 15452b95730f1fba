"""The plan of a merged subprogram kernel: its stages, their schedules and its launch.

Made once when the candidate is proposed (:func:`tvm_ext.subprogram.kernel.design`), carried by the
fused function, and built exactly by :func:`tvm_ext.subprogram.kernel.build`.

Example
-------
>>> plan.summary()
'subprogram: 5 stages (3 compute), grid 264 x 128 threads, 4 grid barriers'
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..select.candidate import StageWork
from .stages import StageSpec
from .uniform import ThreadShape


@dataclass(frozen=True)
class SubprogramPlan:
    """A merged kernel's plan.

    Attributes
    ----------
    stages : tuple of StageSpec
        The fused function's statements, cut into stages, in order.
    rules : tuple of str
        The dlight rule of each compute stage, in order (a memory stage takes the thread shape).
    threads : ThreadShape
        Every stage's threads.
    grid : int
        Blocks of the merged launch (all resident).
    blocks_per_sm : int
        The launch bound that keeps ``grid`` blocks resident.
    grid_syncs : int
        Grid barriers between its stage kernels.
    work : tuple of StageWork
        Each stage's work, traffic and launch as the cost model priced them when the kernel was
        proposed (its members' flops and bytes); the report prices the built kernel with them,
        stage by stage, as the selection did. Empty until the generator attaches them.
    """

    generator: ClassVar[str] = "subprogram"

    stages: tuple[StageSpec, ...]
    rules: tuple[str, ...]
    threads: ThreadShape
    grid: int
    blocks_per_sm: int
    grid_syncs: int = 0
    work: tuple[StageWork, ...] = ()

    def to_json(self) -> dict[str, Any]:  # noqa: D102 - Plan protocol
        return {"stages": [s.to_json() for s in self.stages], "rules": list(self.rules),
                "threads": self.threads.to_json(), "grid": self.grid, "blocks_per_sm": self.blocks_per_sm,
                "grid_syncs": self.grid_syncs, "work": [w.to_json() for w in self.work]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "SubprogramPlan":
        """Inverse of :meth:`to_json`."""
        return cls(tuple(StageSpec.from_json(s) for s in data["stages"]), tuple(str(r) for r in data["rules"]),
                   ThreadShape.from_json(data["threads"]), int(data["grid"]), int(data["blocks_per_sm"]),
                   int(data.get("grid_syncs", 0)), tuple(StageWork.from_json(w) for w in data.get("work", ())))

    def summary(self) -> str:  # noqa: D102 - Plan protocol
        compute = sum(1 for s in self.stages if s.kind == "compute")
        return (f"subprogram: {len(self.stages)} stages ({compute} compute), grid {self.grid} x "
                f"{self.threads.threads} threads, {self.grid_syncs} grid barriers")


__all__ = ["SubprogramPlan"]
