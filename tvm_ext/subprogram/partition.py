"""Resource-bounded partition of a TE graph into subprograms (SOUFFLE §5.4, Algorithm 1 lines 2-9).

A subprogram becomes one kernel whose stages are joined by grid barriers, so every block of its
grid must be resident at once. SOUFFLE cuts only at compute-intensive TEs (they dominate the
registers and shared memory): walking the graph breadth first, a CI TE joins the current
subprogram while ``max_grid * max_occupancy < C`` still holds over the subprogram's CI TEs.
Here the check is the occupancy calculator's (:func:`tvm_ext.hardware.occupancy`): the merged
kernel runs every stage with the largest block (threads, registers per thread, shared memory per
block) of its CI TEs, so ``sm_count * blocks_per_sm(largest block)`` blocks are resident, and the
largest CI grid must not exceed that. A CI TE too large to be resident even alone is a kernel of
its own (launched normally, several waves), and so is a node without a PrimFunc (a library or
external call: SOUFFLE leaves what TEs cannot express unfused, §9). Memory-intensive TEs join the
current subprogram: the merged kernel gives them whatever grid fits.

Launch shapes of the CI TEs come from their schedules (SOUFFLE: Ansor's; here any generator's,
e.g. :func:`dlight_shapes`); registers per thread, when unknown before compiling, are
:data:`~tvm_ext.select.analytic.ASSUMED_REGISTERS` (*assumed*, as the cost model does).

Example
-------
>>> parts = partition(teg, device_from_target(target), dlight_shapes(teg, target))
>>> [len(p.nodes) for p in parts][:3]
[9, 1, 31]
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Mapping, Sequence

import tvm

from ..hardware import DeviceSpec, occupancy
from ..select.analytic import ASSUMED_REGISTERS
from ..select.candidate import LaunchShape
from .te_graph import TEGraph

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Subprogram:
    """Nodes (topological order) that become one kernel.

    ``compute`` are its CI nodes; ``grid`` the largest CI grid (0 without CI nodes); ``resident``
    the blocks resident at once with its largest block; ``cooperative`` whether its stages may be
    joined by grid barriers (every block resident); ``external`` a node without a PrimFunc alone.
    """

    nodes: tuple[int, ...]
    compute: tuple[int, ...]
    grid: int
    resident: int
    cooperative: bool
    external: bool = False


def resident_blocks(device: DeviceSpec, shapes: Sequence[LaunchShape]) -> int:
    """Blocks resident on ``device`` at once when every stage runs with the largest block of ``shapes``."""
    threads = max((s.threads for s in shapes), default=1)
    registers = max((s.registers or ASSUMED_REGISTERS for s in shapes), default=ASSUMED_REGISTERS)
    shared = max((s.shared_bytes for s in shapes), default=0)
    return occupancy(device, max(1, threads), registers, shared).blocks_per_sm * device.sm_count


class _Open:
    def __init__(self):
        self.nodes: list[int] = []
        self.compute: list[int] = []

    def close(self, device: DeviceSpec, shapes: Mapping[int, LaunchShape], out: list) -> None:
        if not self.nodes:
            return
        own = [shapes[c] for c in self.compute]
        grid = max((s.grid for s in own), default=0)
        resident = resident_blocks(device, own)
        out.append(Subprogram(tuple(self.nodes), tuple(self.compute), grid, resident, grid <= resident))
        self.nodes, self.compute = [], []


def partition(teg: TEGraph, device: DeviceSpec, shapes: Mapping[int, LaunchShape]) -> list[Subprogram]:
    """Greedy breadth-first partition of ``teg`` into subprograms (see the module docstring).

    Parameters
    ----------
    teg : TEGraph
        The graph; its topological order is Kahn's (breadth first).
    device : DeviceSpec
        The device whose SMs must hold every block of a subprogram.
    shapes : mapping of int to LaunchShape
        Launch shape of each compute-intensive node. A CI node without one is a kernel of its
        own (logged).

    Returns
    -------
    list of Subprogram
        In execution order; every node is in exactly one, and each is an interval of the
        topological order (hence convex).
    """
    out: list[Subprogram] = []
    current = _Open()
    for i in teg.order:
        node = teg.graph.nodes[i]
        if node.func is None:
            current.close(device, shapes, out)
            out.append(Subprogram((i,), (), 0, 0, False, external=True))
            continue
        if not teg.compute_intensive(i):
            current.nodes.append(i)
            continue
        if i not in shapes:
            logger.info("partition: no launch shape for compute node %s: a kernel of its own", node.name)
            current.close(device, shapes, out)
            out.append(Subprogram((i,), (i,), 0, 0, False))
            continue
        alone = shapes[i]
        if alone.grid > resident_blocks(device, [alone]):
            current.close(device, shapes, out)   # several waves: no grid barrier can follow it
            out.append(Subprogram((i,), (i,), alone.grid, resident_blocks(device, [alone]), False))
            continue
        together = [shapes[c] for c in current.compute] + [alone]
        if max(s.grid for s in together) > resident_blocks(device, together):
            current.close(device, shapes, out)
        current.nodes.append(i)
        current.compute.append(i)
    current.close(device, shapes, out)
    return out


def dlight_schedules(teg: TEGraph, target: tvm.target.Target, nodes) -> dict[int, "tvm.tirx.PrimFunc"]:
    """``nodes`` (with a PrimFunc) as dlight schedules them for ``target``, scheduled once per
    distinct PrimFunc."""
    import tvm_ffi

    from ..dlight.rules import apply_rules

    memo: dict[int, tvm.tirx.PrimFunc] = {}
    out = {}
    with target:
        for i in nodes:
            func = teg.graph.nodes[i].func
            if func is None:
                continue
            key = tvm_ffi.structural_hash(func)
            if key not in memo:
                memo[key] = apply_rules(func, target).func
            out[i] = memo[key]
    return out


def dlight_shapes(teg: TEGraph, target: tvm.target.Target,
                  schedules: Mapping[int, "tvm.tirx.PrimFunc"] | None = None) -> dict[int, LaunchShape]:
    """Launch shapes of the compute-intensive nodes as dlight schedules them for ``target``
    (``schedules``: dlight schedules already made, :func:`dlight_schedules`)."""
    from ..select.launch import launch_shape

    compute = [i for i in teg.order if teg.compute_intensive(i)]
    if schedules is None:
        schedules = dlight_schedules(teg, target, compute)
    return {i: launch_shape(schedules[i]) for i in compute if i in schedules}


__all__ = ["Subprogram", "dlight_schedules", "dlight_shapes", "partition", "resident_blocks"]
