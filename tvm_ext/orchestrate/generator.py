"""The orchestrate generator (Korch): every convex set of the graph as a candidate kernel.

Where the other generators propose the groups a fixed rule forms (a compute node with its
epilogue, a stitch cluster, TVM's ``FuseOps`` groups), this one proposes every convex set that
:func:`~tvm_ext.orchestrate.enumeration.enumerate_candidates` finds (up to its caps), so the
BLP selector can recombine pieces of different operators: softmax's reductions with the GEMM
before it, a layer norm's mean with the residual add. On a fissioned graph
(:mod:`tvm_ext.fission`, the ``orchestrate`` preset) the pieces are primitives.

Each set is built by an existing builder, chosen by what it holds (Korch §5.2: a kernel with a
linear primitive goes to the library / tensor-program path, the rest is memory-bound):

* no compute-intensive node and every node stitchable: the stitch planner;
* otherwise dlight's rules (a GEMM or convolution with its neighbours), for sets that write one
  tensor (Korch's single-output kernels; dlight's GEMM schedules write one result, and a split
  in a GEMM's epilogue gives TIR that TVM's lowering rejects).

The plan, :class:`OrchestratePlan`, names that builder and carries its plan; the schedule stage
hands the kernel to the builder. A set no builder can plan is dropped and counted. Sets that an
earlier generator already proposed are skipped (the same kernel, planned the same way).

Example
-------
>>> cands = OrchestrateGenerator().candidates(ctx)
>>> cands[0].plan.summary()
'orchestrate set via stitch: 2 stage(s), grid 128 x 256 threads, 512 B shared'
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import tvm
from tvm import tirx

from ..graph import OpGraph
from ..hardware import DeviceSpec
from ..select.candidate import Candidate
from ..select.context import SelectionContext
from ..select.emit import EmitError
from ..select.generator import ScheduledKernel, get_generator, register_generator
from ..select.groups import is_compute_intensive
from ..select.plan import Plan
from ..stitch.scope import is_stitchable
from .enumeration import EnumerationLimits, enumerate_candidates

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class OrchestratePlan:
    """A convex set built by ``builder`` with the builder's own ``plan``.

    Attributes
    ----------
    builder : str
        Generator that plans and schedules the kernel (``"stitch"`` or ``"dlight"``).
    plan : Plan
        The builder's plan.
    """

    generator: ClassVar[str] = "orchestrate"

    builder: str
    plan: Plan

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"builder": self.builder, "plan": self.plan.to_json()}

    def summary(self) -> str:
        """One line for reports."""
        return f"orchestrate set via {self.plan.summary()}"


#: Work units of a set dlight's rules build, in stitched nodes (:func:`planning_units`). *Measured*
#: (``scripts/planning_units.py``, records in ``bench/planning_units.jsonl``): least
#: squares on the seconds of 5117 distinct sets the ``orchestrate`` preset planned on 6 seed models
#: (YOLOv5s, Swin-T, LSTM, ConvNeXt-T, BERT-base s128, MobileNet-V2; fp16, this project's 2-core
#: machine, one build at a time): 6.3 ms a node of a stitched set, 32.7 ms a set dlight builds,
#: whatever its size (5.2 nodes). Validated on 4932 sets of 5 others (DETR-R50, NAFNet,
#: Segformer-B0, EfficientNet-B0, ResNet-50): 4.5-6.6 ms a unit per model (their own fit: 5.1);
#: the LSTM's six-node stitched sets (150 ms each) make it 10.7 there.
DLIGHT_SET_UNITS = 5


def is_stitched_set(graph: OpGraph, members: tuple[int, ...]) -> bool:
    """Whether the stitch planner builds the set (no compute-intensive node, all stitchable)."""
    return all(is_stitchable(graph, n) and not is_compute_intensive(graph, n) for n in members)


def set_units(nodes: int, stitched: bool) -> float:
    """The planning-budget charge of one distinct set (:mod:`tvm_ext.select.budget`): its nodes when
    it is stitched, :data:`DLIGHT_SET_UNITS` when dlight's rules build it (their cost hardly
    depends on the set's size)."""
    return float(nodes) if stitched else float(DLIGHT_SET_UNITS)


def planning_units(graph: OpGraph, members: tuple[int, ...]) -> float:
    """:func:`set_units` of ``members`` of ``graph``."""
    return set_units(len(members), is_stitched_set(graph, members))


class OrchestrateGenerator:
    """Korch's convex candidates (see the module docstring).

    Parameters
    ----------
    limits : EnumerationLimits, optional
        Caps of the enumeration.
    name : str
        Registry name (two instances with different caps are registered, see below).
    """

    kernel_kind = "tir"
    #: Stitched kernels are lowered alone first; one TVM rejects runs as dlight kernels.
    verify_lowering = True

    def __init__(self, limits: EnumerationLimits | None = None, name: str = "orchestrate"):
        self.limits = limits or EnumerationLimits()
        self.name = name

    def prepare_passes(self, target: tvm.target.Target) -> list:  # noqa: D102 - protocol
        return []

    def plan_from_json(self, data: dict[str, Any]) -> OrchestratePlan:  # noqa: D102 - protocol
        builder = str(data["builder"])
        return OrchestratePlan(builder, get_generator(builder).plan_from_json(dict(data["plan"])))

    def candidates(self, ctx: SelectionContext) -> list[Candidate]:
        """One candidate per enumerated convex set that no earlier generator proposed."""
        graph = ctx.graph
        found = enumerate_candidates(graph, self.limits, nodes=ctx.call_nodes(),
                                     is_compute=lambda n: is_compute_intensive(graph, n))
        known = {c.nodes for c in ctx.proposed}
        out, failed, unplanned = [], 0, 0
        planned: set[tuple] = set()
        unbudgeted: set[tuple] = set()     # distinct sets the planning budget left unplanned
        meter = ctx.meter(self.name)     # the preset's planning budget, in :func:`planning_units`
        for nodes in sorted(found.sets, key=len):      # smallest first: the kernel budget keeps them
            members = ctx.ordered(nodes)
            if members in known:
                continue
            signature = ctx.signature(members)
            if signature not in planned:
                if len(planned) >= self.limits.max_kernels:
                    unplanned += 1
                    continue
                if meter.exhausted and not ctx.has_shared(("orchestrate", signature)):
                    unbudgeted.add(signature)
                    continue
                # charged once per build (its plans are memoized)
                ctx.shared_memo(("orchestrate", signature), lambda m=members: meter.spend(planning_units(graph, m)))
                planned.add(signature)
            cand = self._build(ctx, members)
            if cand is None:
                failed += 1
            else:
                out.append(cand)
        note = (f"orchestrate: {found.windows} windows, {found.states} execution states, {len(found.sets)} convex "
                f"sets, {len(out)} candidates, {failed} no builder takes or could plan")
        if unplanned:
            note += f", {unplanned} left unplanned (budget of {self.limits.max_kernels} distinct kernels)"
        if unbudgeted:
            ctx.notes.append(meter.note(len(planned), len(planned) + len(unbudgeted), "distinct sets"))
            logger.warning(ctx.notes[-1])
        ctx.notes.append(note + "".join(f"; {c}" for c in found.capped))
        logger.info(ctx.notes[-1])
        return out

    def _build(self, ctx: SelectionContext, members: tuple[int, ...]) -> Candidate | None:
        graph = ctx.graph
        if is_stitched_set(graph, members):
            builder, inner = "stitch", get_generator("stitch").plan_set(ctx, members, "orchestrate: convex set")
        elif len(graph.boundary(members)[1]) != 1:
            return None     # dlight's GEMM rules write one result (Korch's single-output kernels)
        else:
            builder = "dlight"
            try:
                inner = get_generator("dlight").candidate(ctx, members, "orchestrate", "orchestrate: convex set")
            except EmitError as err:
                ctx.drop(self.name, members, str(err))
                return None
        if inner is None:
            return None
        plan = OrchestratePlan(builder, inner.plan)
        return dataclasses.replace(inner, plan=plan, key=ctx.kernel_key(members, plan))

    def schedule(self, func: tirx.PrimFunc, plan: OrchestratePlan, device: DeviceSpec) -> ScheduledKernel:
        """The builder schedules its own plan."""
        return get_generator(plan.builder).schedule(func, plan.plan, device)


#: The ``orchestrate`` preset's: sets of up to 8 nodes, enough for a fissioned softmax or layer
#: norm with its neighbours.
register_generator(OrchestrateGenerator(EnumerationLimits(max_nodes=8)))
#: ``full``'s: sets of up to 4 nodes. Its stitch groups already cover the large memory-intensive
#: clusters, and larger sets cost BERT-base about 10 s more planning (14 s at 6 nodes against
#: 4.7 s at 4, on a 2-core machine), which would put its compile over a minute.
register_generator(OrchestrateGenerator(EnumerationLimits(max_nodes=4), name="orchestrate_small"))

__all__ = ["OrchestrateGenerator", "OrchestratePlan"]
