"""Stitch groups as candidate kernels for the selector.

:func:`stitch_candidates` turns the stitch scope of an OpGraph into candidates (node set,
boundary tensors, global bytes moved fused and unfused); :func:`plan_candidate` fuses one
candidate alone (``Primitive`` function + ``FuseTIR``) and plans it, so a cost model can read
its stages, schemes, grid barriers and launch shape.

Example
-------
>>> cands = stitch_candidates(OpGraph.from_module(legalized))
>>> plan = plan_candidate(legalized, cands[0], load_device("h100"))
>>> plan.needs_grid_sync
False
"""
from __future__ import annotations

from dataclasses import dataclass

import tvm
from tvm import relax

from ..graph import OpGraph
from ..hardware import DeviceSpec
from .emit import emit_groups
from .planner import PlanOptions, StitchPlan, plan_prim_func
from .prologue_schedule import PrologueTiles, plan_prologue_tiles
from .scope import is_stitchable, stitch_scope


@dataclass(frozen=True)
class StitchCandidate:
    """One stitched kernel proposed by the stitch generator.

    Attributes
    ----------
    nodes : tuple of int
        OpGraph node indices (convex), topological order.
    kind : str
        ``"stitch"`` (several nodes), ``"single"`` (one memory-intensive node) or
        ``"prologue"`` (a GEMM with its epilogue that also computes its row operand from a
        row-reduction group; the group alone is a candidate too, so a selector can pick either).
    parts : int
        Independent parts joined by remote stitching.
    inputs, outputs : tuple of str
        Boundary tensors read and written.
    fused_bytes : int
        Global bytes the stitched kernel reads and writes (its boundary tensors).
    unfused_bytes : int
        Global bytes the same nodes move as separate kernels.
    """

    nodes: tuple[int, ...]
    kind: str
    parts: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    fused_bytes: int
    unfused_bytes: int

    @property
    def saved_bytes(self) -> int:
        """Global traffic stitching removes."""
        return self.unfused_bytes - self.fused_bytes


def stitch_candidates(graph: OpGraph, *, remote: bool = True, absorb_epilogues: bool = True,
                      gemm_prologues: bool = True) -> list[StitchCandidate]:
    """Candidates from the stitch scope of ``graph``: stitch groups, multi-block singles and
    (``gemm_prologues``) GEMMs that compute their row operand."""
    groups = list(stitch_scope(graph, remote=remote, absorb_epilogues=absorb_epilogues,
                               gemm_prologues=False).groups)
    if gemm_prologues:
        groups += [g for g in stitch_scope(graph, remote=remote, absorb_epilogues=absorb_epilogues).groups
                   if g.kind == "prologue"]
    out = []
    for group in groups:
        if group.kind == "epilogue" or (group.kind != "prologue"
                                        and not all(is_stitchable(graph, n) for n in group.nodes)):
            continue
        inputs, outputs = graph.boundary(group.nodes)
        fused = sum(graph.tensors[t].nbytes for t in inputs + outputs)
        unfused = sum(graph.nodes[n].bytes_read + graph.nodes[n].bytes_written for n in group.nodes)
        out.append(StitchCandidate(tuple(group.nodes), group.kind, group.parts, tuple(inputs), tuple(outputs),
                                   fused, unfused))
    return out


def plan_candidate(mod: tvm.IRModule, candidate: StitchCandidate, device: DeviceSpec,
                   options: PlanOptions | None = None, func_name: str = "main") -> StitchPlan | PrologueTiles:
    """Fuse ``candidate`` alone in ``mod`` (the legalized module its graph came from) and plan it:
    a :class:`StitchPlan`, or for a ``"prologue"`` candidate its :class:`PrologueTiles`."""
    name = "stitch_candidate"
    if len(candidate.nodes) > 1:
        fused_mod, given = emit_groups(mod, [candidate.nodes], func_name=func_name, names=[name])
        fused_mod = relax.transform.FuseTIR()(fused_mod)
        func = fused_mod[given[0]]
    else:
        graph = OpGraph.from_module(mod, func_name)
        func = graph.nodes[candidate.nodes[0]].func
    if candidate.kind == "prologue":
        return plan_prologue_tiles(func, device)
    return plan_prim_func(func, device, options)


__all__ = ["StitchCandidate", "plan_candidate", "stitch_candidates"]
