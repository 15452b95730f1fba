"""The schedule stage's first step: build every kernel's plan with the generator that made it.

:class:`ApplyPlans` is a dlight-style rule driver: for every unscheduled PrimFunc that carries a
plan (:data:`~tvm_ext.select.attrs.PLAN_ATTR`), the generator named in the plan builds exactly
that plan (``generator.schedule(func, plan, device)``). A generator that refuses, or a kernel
that fails a check, leaves the function unscheduled and marked with
:data:`~tvm_ext.select.attrs.FALLBACK_ATTR`; dlight's rules then schedule it
(:class:`~tvm_ext.dlight.SafeDefaultSchedule`, the next step), the build re-selects without the
candidate and the report lists it. The checks: TVM's lowering rejects the kernel (generators with
``verify_lowering``); reductions over thread-bound loops TVM would not lower to allreduces
(:mod:`tvm_ext.checks.lints`); an output element stored from two threads
(:mod:`tvm_ext.checks.write_once`); with ``check_kernels``, findings of the emulated lowered
kernel (:mod:`tvm_ext.checks.kernel`).

Global workspaces a kernel needs become extra outputs of its PrimFunc, allocated by the Relax VM
at every call site (a kernel cannot allocate global memory).

Example
-------
>>> scheduled = ApplyPlans(load_device("h100"), target)(fused)
"""
from __future__ import annotations

import dataclasses
import logging

import tvm
from tvm import relax, tirx

from ..checks.emulator import EmulationTimeout
from ..checks.input_domain import emulate_in_domain
from ..checks.lints import unlowered_thread_reductions
from ..checks.lowering import lowering_problem
from ..checks.thread_serial import call_inputs
from ..checks.tir_expr import Unemulated
from ..checks.work import PERFORMANCE_KINDS
from ..checks.write_once import duplicate_writes
from ..dlight.rules import is_scheduled
from ..hardware import DeviceSpec
from ..ir_update import with_functions
from ..select.attrs import FALLBACK_ATTR, GENERATOR_ATTR, RULE_ATTR
from ..select.generator import ScheduleRefused, get_generator
from ..select.plan import PlanError, plan_of
from ..tir.shared_sync import sync_shared_broadcasts
from ..tir.write_back import predicate_write_backs

logger = logging.getLogger(__name__)

#: Generators whose refused plans are not re-selected: their fallback is the same dlight schedule.
_FALLBACK_GENERATORS = ("dlight", "fuseops")


def refused_kernels(graph: tvm.IRModule, scheduled: tvm.IRModule) -> dict[str, tuple[str, str]]:
    """Kernel key -> (generator, reason), for every planned kernel of ``graph`` that
    :class:`ApplyPlans` left to dlight in ``scheduled`` (dlight's own plans excluded: dlight is
    the fallback)."""
    from ..select.context import kernel_key

    refused = {}
    for gv, func in scheduled.functions_items():
        if not isinstance(func, tirx.PrimFunc) or func.attrs is None or FALLBACK_ATTR not in func.attrs:
            continue
        try:
            plan = plan_of(graph[gv.name_hint])
        except PlanError:
            continue
        if plan is not None and plan.generator not in _FALLBACK_GENERATORS:
            refused[kernel_key(graph[gv.name_hint], plan)] = (
                plan.generator, f"{gv.name_hint} failed to schedule in an earlier round: {func.attrs[FALLBACK_ATTR]}")
    return refused


def unscheduled_fallbacks(scheduled: tvm.IRModule) -> list[str]:
    """Kernels :class:`ApplyPlans` left to dlight that dlight could not schedule either (they
    would fail the build)."""
    return sorted(gv.name_hint for gv, func in scheduled.functions_items()
                  if isinstance(func, tirx.PrimFunc) and func.attrs is not None and FALLBACK_ATTR in func.attrs
                  and not is_scheduled(func))


def _ws_type(buf) -> relax.TensorType:
    return relax.TensorType([int(d) for d in buf.ty.shape], str(buf.ty.dtype))


def _split_call(bb: relax.BlockBuilder, binding, gvar, buffers: list, block) -> list:
    call = binding.value
    var = binding.var
    orig = call.ty if hasattr(call, "ty") else var.ty
    fields = list(orig.fields) if isinstance(orig, relax.TupleType) else [orig]
    out_ty = fields + [_ws_type(b) for b in buffers]
    new_call = bb.normalize(relax.call_tir(gvar, call.args[1], out_ty))
    var_cls = relax.DataflowVar if isinstance(block, relax.DataflowBlock) else relax.Var
    tmp = var_cls(f"{var.name}_ws", new_call.ty)
    out = [relax.VarBinding(tmp, new_call)]
    if isinstance(orig, relax.TupleType):
        items = []
        for i in range(len(fields)):
            item = var_cls(f"{var.name}_{i}", fields[i])
            out.append(relax.VarBinding(item, bb.normalize(relax.TupleGetItem(tmp, i))))
            items.append(item)
        out.append(relax.VarBinding(var, bb.normalize(relax.Tuple(items))))
    else:
        out.append(relax.VarBinding(var, bb.normalize(relax.TupleGetItem(tmp, 0))))
    return out


def add_workspace_outputs(mod: tvm.IRModule, workspaces: dict[str, list]) -> tvm.IRModule:
    """Re-add the PrimFuncs that gained workspace outputs (their GlobalVar types change) and give
    every ``call_tir`` of them the extra outputs, unpacking the original results."""
    call_tir = tvm.ir.Op.get("relax.call_tir")
    changed = {name: mod[name] for name in workspaces}
    kept = {gv: f for gv, f in mod.functions_items() if gv.name_hint not in changed}
    out = tvm.IRModule(kept, attrs=mod.attrs)
    bb = relax.BlockBuilder(out)
    new_gvs = {name: bb.add_func(func, name) for name, func in changed.items()}
    for gv, func in list(bb.get().functions_items()):
        if not isinstance(func, relax.Function) or not isinstance(func.body, relax.SeqExpr):
            continue
        touched = False
        blocks = []
        for block in func.body.blocks:
            bindings = []
            for binding in block.bindings:
                value = binding.value
                if (isinstance(value, relax.Call) and value.op.same_as(call_tir)
                        and value.args[0].name_hint in new_gvs):
                    touched = True
                    name = value.args[0].name_hint
                    bindings.extend(_split_call(bb, binding, new_gvs[name], workspaces[name], block))
                else:
                    bindings.append(binding)
            blocks.append(relax.DataflowBlock(bindings) if isinstance(block, relax.DataflowBlock)
                          else relax.BindingBlock(bindings))
        if touched:
            bb.update_func(gv, relax.Function(list(func.params), relax.SeqExpr(blocks, func.body.body),
                                              func.ret_ty, func.is_pure, func.attrs))
    return bb.get()


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.ApplyPlans")
class ApplyPlans:
    """Build every planned kernel with its generator (see the module docstring).

    Parameters
    ----------
    device : DeviceSpec
        The device the plans were made for.
    target : tvm.target.Target, optional
        Where kernels of generators with ``verify_lowering`` are lowered alone as a check
        (default ``Target.current()``; ``None`` there skips the check).
    check_kernels : bool
        Also emulate each kernel's lowered device code against its function
        (:func:`~tvm_ext.checks.input_domain.emulate_in_domain`); one with findings goes to dlight. A kernel the
        emulator cannot run is kept and logged.
    """

    def __init__(self, device: DeviceSpec, target: tvm.target.Target | None = None, check_kernels: bool = False):
        self.device = device
        self.target = target
        self.check_kernels = check_kernels

    def _problem(self, name: str, func: tirx.PrimFunc, kernel, generator, mod: tvm.IRModule,
                 target: tvm.target.Target | None) -> str | None:
        """Why the scheduled ``kernel`` of ``func`` must not be used, or None."""
        if target is not None and getattr(generator, "verify_lowering", False):
            problem = lowering_problem(kernel.func, name, target)
            if problem is not None:
                return f"lowering failed ({problem})"
        if target is None or target.kind.name != "cuda":
            return None
        unlowered = unlowered_thread_reductions(kernel.func, target)
        if unlowered:   # each would reach CUDA as a read-modify-write every thread runs at once
            return f"reductions over thread-bound loops would not be lowered to allreduces ({', '.join(unlowered)})"
        twice = duplicate_writes(kernel.func)
        if twice:       # whichever thread stores last wins
            return f"stores elements of {', '.join(twice)} from two threads"
        return self._emulation_problem(name, func, kernel.func, mod, target) if self.check_kernels else None

    @staticmethod
    def _emulation_problem(name: str, func: tirx.PrimFunc, scheduled: tirx.PrimFunc, mod: tvm.IRModule,
                           target: tvm.target.Target) -> str | None:
        try:
            verdict = emulate_in_domain(func, scheduled, target, name=name, inputs=call_inputs(mod, name))
        except (Unemulated, EmulationTimeout) as err:
            logger.info("kernel '%s' kept unchecked: %s", name, err)
            return None
        if verdict.ok:      # cost findings (recomputation) are the cost model's, not a reason to refuse
            return None
        wrong = next(f for f in verdict.findings if f.kind not in PERFORMANCE_KINDS)
        return f"the emulated kernel has findings ({wrong.message})"

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        target = self.target or tvm.target.Target.current(allow_none=True)
        updates = {}
        workspaces: dict[str, list] = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
                continue
            try:
                plan = plan_of(func)
            except PlanError as err:
                updates[gv] = func.with_attr(FALLBACK_ATTR, f"plan unreadable ({err}); scheduled by dlight")
                continue
            if plan is None:
                continue
            generator = get_generator(plan.generator)
            try:
                kernel = generator.schedule(func, plan, self.device)
            except ScheduleRefused as err:
                logger.warning("kernel '%s' left to dlight: %s", gv.name_hint, err)
                updates[gv] = func.with_attr(FALLBACK_ATTR, f"{err}; scheduled by dlight as separate kernels")
                continue
            # before any lowering: barriers ThreadSync misses, write-backs predicated like their producers
            kernel = dataclasses.replace(kernel, func=predicate_write_backs(sync_shared_broadcasts(kernel.func)))
            problem = self._problem(gv.name_hint, func, kernel, generator, mod, target)
            if problem is not None:
                logger.warning("kernel '%s' left to dlight: %s", gv.name_hint, problem)
                updates[gv] = func.with_attr(FALLBACK_ATTR, f"{plan.generator}: {problem}; scheduled by dlight")
                continue
            scheduled = kernel.func
            for key, value in func.attrs.items():
                if str(key).startswith("tvm_ext.") and key not in scheduled.attrs:
                    scheduled = scheduled.with_attr(str(key), value)
            updates[gv] = scheduled.with_attr(GENERATOR_ATTR, plan.generator).with_attr(RULE_ATTR, kernel.rule)
            if kernel.workspaces:
                workspaces[gv.name_hint] = kernel.workspaces
        mod = with_functions(mod, updates)
        return add_workspace_outputs(mod, workspaces) if workspaces else mod


__all__ = ["ApplyPlans", "add_workspace_outputs", "refused_kernels", "unscheduled_fallbacks"]
