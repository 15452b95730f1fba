"""The dlight generator: TVM's own kernels as candidates, so a cover always exists.

It proposes

* every node alone (a *singleton*), and
* every compute node with its epilogue chain and layout neighbours
  (:func:`tvm_ext.select.groups.compute_groups`: the kernels TVM's ``FuseOps`` + dlight make
  for a GEMM or convolution),

each planned by scheduling its fused PrimFunc with TVM's dlight rules in their default order
(:func:`~tvm_ext.dlight.rules.apply_rules`): the plan is the rule that applied, the launch shape
and code path are read from the scheduled function, and a schedule that executes more than its
function plans (:func:`~tvm_ext.select.describe.executed_ratios`: ``Fallback`` on a layer norm
fused into a GEMM recomputes the norm for every output) is priced from what it executes, as the
report prices the built kernel. The schedule stage applies that rule again to the kernel's PrimFunc.

Example
-------
>>> cands = DlightGenerator().candidates(ctx)
>>> sorted({c.plan.rule for c in cands})
['Fallback', 'GeneralReduction', 'Matmul', 'Reduction']
"""
from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, ClassVar

import tvm
from tvm import relax, tirx

from ..hardware import DeviceSpec
from ..select.candidate import Candidate, CodePath, boundary_bytes
from ..select.context import SelectionContext
from ..select.describe import PRICED_AS_BUILT, as_built_note, executed_ratios
from ..select.emit import EmitError, call_bindings
from ..select.generator import ScheduledKernel, get_generator, register_generator
from ..select.origin import trace_partition
from ..select.groups import compute_groups
from ..select.launch import launch_shape, uses_tensor_cores
from .rules import apply_rules, mark_dlight

logger = logging.getLogger(__name__)

#: Storage scopes of tensor-core fragments (dlight's tensorized matmul uses WMMA).


@dataclass(frozen=True)
class DlightPlan:
    """Schedule a kernel with dlight's rule ``rule`` (``"none"``: no rule applies).

    Attributes
    ----------
    rule : str
        Class name of the dlight rule (``"Matmul"``, ``"Reduction"``, ``"Fallback"``, ...).
    group : str
        ``"single"``, ``"compute"`` (a compute node with its epilogue), ``"fuseops"`` (a group
        TVM's ``FuseOps`` forms) or ``"orchestrate"`` (a convex set, :mod:`tvm_ext.orchestrate`).
    """

    generator: ClassVar[str] = "dlight"

    rule: str
    group: str = "single"

    def to_json(self) -> dict[str, Any]:
        """JSON form."""
        return {"rule": self.rule, "group": self.group}

    def summary(self) -> str:
        """One line for reports."""
        return f"dlight {self.rule}" + {"compute": " (compute + epilogue)", "fuseops": " (FuseOps group)",
                                         "orchestrate": " (convex set)"}.get(self.group, "")


class DlightGenerator:
    """Singletons and compute groups scheduled by dlight (see the module docstring)."""

    name = "dlight"
    kernel_kind = "tir"
    #: TVM's own schedules are not lowered twice.
    verify_lowering = False

    def prepare_passes(self, target: tvm.target.Target) -> list:  # noqa: D102 - protocol
        return []

    def plan_from_json(self, data: dict[str, Any]) -> DlightPlan:  # noqa: D102 - protocol
        return DlightPlan(rule=str(data["rule"]), group=str(data.get("group", "single")))

    def candidates(self, ctx: SelectionContext) -> list[Candidate]:
        """Compute groups first, then every call node alone."""
        out = []
        for group in compute_groups(ctx.graph):
            try:
                out.append(self.candidate(ctx, group, "compute", "compute node with its epilogue chain"))
            except EmitError as err:
                ctx.drop(self.name, group, str(err))
        for n in ctx.call_nodes():
            out.append(self.candidate(ctx, (n,), "single", "node alone"))
        return out

    def candidate(self, ctx: SelectionContext, nodes, group: str, provenance: str,
                  recomputes: tuple[int, ...] = ()) -> Candidate:
        """The dlight candidate over ``nodes`` (scheduled once per signature), recomputing
        ``recomputes``.

        Raises
        ------
        EmitError
            The nodes cannot be fused into one PrimFunc.
        """
        members = ctx.ordered(nodes)
        key = ("dlight", ctx.signature(members, recomputes))

        def plan() -> tuple[str, Any, CodePath, tuple[float, float]]:
            func = ctx.fused_function(members, recomputes)
            outcome = apply_rules(func, ctx.target)
            path = CodePath.WMMA if uses_tensor_cores(outcome.func) else CodePath.SIMT
            # what the schedule executes against what the function plans, as the report prices
            # the built kernel: a rule that inlines a layer norm into a GEMM recomputes it per output
            return outcome.rule, launch_shape(outcome.func), path, executed_ratios(func, outcome.func)

        rule, launch, path, (flops_ratio, loads_ratio) = ctx.shared_memo(key, plan)   # shared by the build's runs
        plan_ = DlightPlan(rule, group)
        provenance += as_built_note(flops_ratio, loads_ratio)
        # the re-reads are global loads, of tensors it touches once each: they hit L2 where those fit
        distinct = boundary_bytes(ctx.graph, members, recomputes)
        cand = Candidate.of(ctx.graph, members, plan_, launch=launch, code_path=path, provenance=provenance,
                            global_bytes=int(distinct * loads_ratio), unique_bytes=distinct,
                            key=ctx.kernel_key(members, plan_, recomputes), recomputes=recomputes)
        return dataclasses.replace(cand, flops=int(cand.flops * flops_ratio)) if flops_ratio > 1.0 else cand

    def extend(self, ctx: SelectionContext, cand: Candidate, recompute: tuple[int, ...]) -> Candidate | None:
        """``cand``'s kernel also recomputing the nodes ``recompute`` (see :mod:`tvm_ext.select.recompute`)."""
        names = ", ".join(ctx.graph.nodes[n].func_name for n in recompute)
        origin = cand.provenance.split(PRICED_AS_BUILT)[0]     # the grown kernel is priced anew
        try:
            return self.candidate(ctx, cand.nodes + recompute, cand.plan.group,
                                  f"{origin}; recomputes {names}", tuple(sorted({*cand.recomputes, *recompute})))
        except EmitError as err:
            ctx.drop(self.name, cand.nodes + recompute, str(err))
            return None

    def schedule(self, func: tirx.PrimFunc, plan: DlightPlan, device: DeviceSpec) -> ScheduledKernel:
        """Apply the plan's rule (the next rule in dlight's order if it raises, reported)."""
        target = tvm.target.Target.current(allow_none=False)
        outcome = apply_rules(func, target, only=plan.rule)
        scheduled = mark_dlight(func, outcome)
        return ScheduledKernel(scheduled, rule=outcome.rule)


#: ``op_pattern`` of a PrimFunc that ``FuseOps`` fuses with nothing (TVM's ``kOpaque``).
OPAQUE_PATTERN = 8


class FuseOpsGroups:
    """TVM's own fusion as candidates: the groups ``FuseOps`` forms, each scheduled by dlight.

    With them a cost-based selector can always fall back to exactly the kernels the baseline
    builds, so its modelled cost never exceeds the baseline's. Where a library generator proposed
    candidates before it (``ctx.proposed``), also the groups ``FuseOps`` forms of the rest, those
    nodes left out, as a preset that offloads first and fuses the rest builds them: a padded
    convolution's slice joins the layout ops after it there, where on the whole graph ``FuseOps``
    puts it with the convolution the library takes (YOLOv5's heads). Groups are traced back to the
    graph's nodes by matching their calls (:func:`tvm_ext.select.origin.match_calls`); their
    plans are :class:`DlightPlan` (``group="fuseops"``), built by the dlight generator.
    """

    name = "fuseops"
    kernel_kind = "tir"
    verify_lowering = False

    def prepare_passes(self, target: tvm.target.Target) -> list:  # noqa: D102 - protocol
        return []

    def plan_from_json(self, data: dict[str, Any]) -> DlightPlan:  # noqa: D102 - protocol
        return DlightGenerator().plan_from_json(data)

    def candidates(self, ctx: SelectionContext) -> list[Candidate]:
        """One candidate per group of two or more nodes ``FuseOps`` makes of the function, and of
        its rest beside the library generators' candidates (class docstring)."""
        groups = self._groups(ctx, tvm.IRModule(dict(ctx.mod.functions_items())))
        library = {n for c in ctx.proposed if get_generator(c.generator).kernel_kind == "library" for n in c.nodes}
        if library:
            seen = {frozenset(g) for g in groups}
            groups += [g for g in self._groups(ctx, _opaque(ctx, library)) if frozenset(g) not in seen]
        return [get_generator("dlight").candidate(ctx, nodes, "fuseops", "TVM FuseOps group") for nodes in groups]

    @staticmethod
    def _groups(ctx: SelectionContext, mod: tvm.IRModule) -> list[list[int]]:
        fused = relax.transform.FuseOps()(mod)
        is_group = lambda f: f.attrs is not None and "Primitive" in f.attrs  # noqa: E731
        out = []
        for _, _, found in trace_partition(fused, ctx.func_name, ctx.mod[ctx.func_name], is_group):
            nodes = [n for n in (ctx.node_of_var(v) for v in found) if n is not None]
            if len(nodes) >= 2 and ctx.graph.is_convex(nodes):
                out.append(nodes)
        return out


def _opaque(ctx: SelectionContext, nodes: set[int]) -> tvm.IRModule:
    """The selection's module with ``nodes`` calling copies of their PrimFuncs that ``FuseOps``
    fuses with nothing (the same variables, so its groups trace back to the graph's nodes)."""
    builder = relax.BlockBuilder(tvm.IRModule(dict(ctx.mod.functions_items())))
    func = ctx.mod[ctx.func_name]
    sites = call_bindings(func)
    replaced: dict = {}
    for n in nodes:
        bi, ki = sites[n]
        call = func.body.blocks[bi].bindings[ki].value
        callee = call.args[0]
        gv = builder.add_func(ctx.mod[callee].with_attr("op_pattern", OPAQUE_PATTERN), f"{callee.name_hint}_offloaded")
        replaced[(bi, ki)] = relax.Call(call.op, [gv, *call.args[1:]], call.attrs, call.ty_args)
    blocks = []
    for bi, block in enumerate(func.body.blocks):
        bindings = [relax.VarBinding(b.var, replaced[(bi, ki)]) if (bi, ki) in replaced else b
                    for ki, b in enumerate(block.bindings)]
        blocks.append(type(block)(bindings))
    functions = dict(builder.get().functions_items())
    # normalized, as FuseOps's builder expects every function it updates to be
    functions[ctx.mod.get_global_var(ctx.func_name)] = relax.BlockBuilder().normalize(relax.Function(
        func.params, relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure, func.attrs))
    return tvm.IRModule(functions)


register_generator(DlightGenerator())
register_generator(FuseOpsGroups())

__all__ = ["OPAQUE_PATTERN", "DlightGenerator", "DlightPlan", "FuseOpsGroups"]
