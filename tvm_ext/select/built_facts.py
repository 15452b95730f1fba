"""What ptxas says of a built kernel, and the price of its spills.

A plan cannot know how many registers its kernel needs: ptxas decides, and where a kernel needs
more than its launch bound allows it *spills* values to local memory. The driver compiles the
scheduled kernels once per build (:func:`tvm_ext.toolchain.compiled_usage`) and attaches each
PrimFunc's facts as :data:`BUILT_FACTS_ATTR`; :func:`~tvm_ext.select.describe.describe_scheduled`
prices a kernel with its spills, and a re-selection round prices every candidate with the same
kernel key likewise (:class:`~tvm_ext.select.select_pass.SelectKernels`'s ``built``), so a
kernel that spills is chosen only where it still pays.

Price of a spill: ptxas reports the bytes its spill instructions store and load per thread.
That count is static (an instruction in a loop moves its bytes every iteration), so a launch
moves *at least* ``(stores + loads) x threads x blocks`` bytes to and from local memory: the
lower bound is what is priced. Local memory resides in device memory, with the latency and
bandwidth of global memory (CUDA C++ Programming Guide, "Device Memory Accesses", local memory),
so those bytes are priced as global traffic (the L2 term; DRAM too once the kernel's bytes
overflow L2).

Registers are recorded, not priced: the analytic model's bytes-in-flight constant was fitted
with :data:`~tvm_ext.select.analytic.ASSUMED_REGISTERS` per thread for TVM's kernels
(``bench/modelled/validation.md``); pricing occupancy from ptxas's counts needs that fit redone
on the measured builds' ptxas reports.

Example
-------
>>> facts = BuiltFacts(registers=64, spill_stores=238, spill_loads=220)
>>> spill_traffic(facts, LaunchShape(grid=96, threads=256))
11255808
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from tvm import tirx

from .candidate import LaunchShape

#: PrimFunc attribute: the kernel's :class:`BuiltFacts` as JSON.
BUILT_FACTS_ATTR = "tvm_ext.ptxas"

_Priced = TypeVar("_Priced")


@dataclass(frozen=True)
class BuiltFacts:
    """ptxas's report of one PrimFunc's kernels: the most registers any of its kernels uses and
    the spill bytes per thread summed over them (a PrimFunc may launch several kernels)."""

    registers: int
    spill_stores: int = 0
    spill_loads: int = 0

    @property
    def spills(self) -> bool:
        """Whether any of its kernels spills."""
        return bool(self.spill_stores or self.spill_loads)

    @classmethod
    def of_kernels(cls, usages: Iterable[Any]) -> BuiltFacts:
        """Facts of a PrimFunc from its kernels' ptxas reports (objects with ``registers``,
        ``spill_stores`` and ``spill_loads``: :class:`tvm_ext.toolchain.KernelUsage`)."""
        usages = list(usages)
        return cls(max((u.registers for u in usages), default=0), sum(u.spill_stores for u in usages),
                   sum(u.spill_loads for u in usages))

    def to_json(self) -> str:
        """The attribute's value."""
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> BuiltFacts:
        """Inverse of :meth:`to_json`."""
        return cls(**{k: int(v) for k, v in json.loads(text).items()})

    def describe(self) -> str:
        """One line for a report."""
        return (f"ptxas: {self.registers} registers, spills {self.spill_stores} B stored and "
                f"{self.spill_loads} B loaded per thread")


def built_facts(func: tirx.PrimFunc) -> BuiltFacts | None:
    """The facts attached to a scheduled PrimFunc (None where it was not compiled)."""
    if func.attrs is None or BUILT_FACTS_ATTR not in func.attrs:
        return None
    return BuiltFacts.from_json(str(func.attrs[BUILT_FACTS_ATTR]))


def spill_traffic(facts: BuiltFacts, launch: LaunchShape) -> int:
    """Bytes one call moves to and from local memory, at least (module docstring)."""
    return (facts.spill_stores + facts.spill_loads) * launch.threads * launch.grid * max(1, launch.kernels)


def with_spills(kernel: _Priced, facts: BuiltFacts) -> _Priced:
    """``kernel`` (a :class:`~tvm_ext.select.candidate.Candidate` or a
    :class:`~tvm_ext.select.describe.KernelDescription`) with its spill traffic added to its
    global bytes; a multi-stage kernel's stages share it in proportion to their flops (where the
    register pressure is). Unchanged where it does not spill."""
    extra = spill_traffic(facts, kernel.launch)
    if extra == 0:
        return kernel
    changes: dict[str, Any] = {"global_bytes": kernel.global_bytes + extra}
    stages = getattr(kernel, "stages", ())
    if stages:
        total = sum(s.flops for s in stages)
        shares = [s.flops / total if total else 1 / len(stages) for s in stages]
        changes["stages"] = tuple(dataclasses.replace(s, global_bytes=s.global_bytes + int(extra * share))
                                  for s, share in zip(stages, shares))
    if hasattr(kernel, "provenance"):
        changes["provenance"] = f"{kernel.provenance}; priced with its spills ({facts.describe()})"
    if hasattr(kernel, "spill_bytes"):
        changes["spill_bytes"] = extra
    return dataclasses.replace(kernel, **changes)


__all__ = ["BUILT_FACTS_ATTR", "BuiltFacts", "built_facts", "spill_traffic", "with_spills"]
