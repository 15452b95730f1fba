"""The schedule stage of the ``stitch`` preset: stitched PrimFuncs get our schedules, the rest dlight.

:class:`ScheduleStitchedKernels` (a module pass) plans and schedules every PrimFunc the graph
stage recorded as a stitch group (module attribute ``"tvm_ext.stitch_groups"``); global
intermediates become extra outputs of the PrimFunc (allocated by the Relax VM, a kernel cannot
allocate global memory) and the ``call_tir`` sites are updated. A function the planner or the
builder cannot handle is left to dlight, i.e. compiled as several kernels, and the reason is
recorded in the module attribute ``"tvm_ext.stitch_report"`` (function name -> ``"stitched"``,
``"stitched+grid_sync"``, ``"stitched+gemm_prologue"`` or ``"fallback: <reason>"``) and logged.
Groups of kind ``"prologue"`` (a GEMM that computes its softmax-like row operand) are built by
:func:`~tvm_ext.stitch.prologue_schedule.build_prologue_schedule`.

``stitch_schedule_passes(target)`` = that pass, then TVM's dlight rules as the baseline runs them
(functions marked ``tirx.is_scheduled`` are skipped; a rule that raises on a function is
skipped for it instead of aborting the build, see :mod:`tvm_ext.default_schedule`). Compile with
``tir_pipeline="tvm_ext"`` so kernels with a grid barrier are launched cooperatively and get
their launch bounds (:mod:`tvm_ext.tir.launch_params`).
"""
from __future__ import annotations

import logging

import tvm
from tvm import relax, tirx

from ..errors import TVM_ERRORS, UnknownDeviceError
from ..hardware import DeviceSpec, device_from_target, list_devices, load_device
from ..ir_update import with_functions
from ..tir import PIPELINE_NAME
from ..default_schedule import SafeDefaultSchedule
from .planner import PlanOptions, StitchPlanError, plan_prim_func
from .relax_pass import GROUPS_ATTR
from .prologue_schedule import build_prologue_schedule
from .schedule import StitchScheduleError, build_schedule, promote_workspace

logger = logging.getLogger(__name__)

REPORT_ATTR = "tvm_ext.stitch_report"
_PLANNING_FIELDS = ("sm_count", "warp_size", "registers_per_sm", "max_registers_per_block", "max_registers_per_thread",
                    "register_allocation_unit", "sub_partitions_per_sm", "shared_memory_per_sm",
                    "max_shared_memory_per_block", "max_shared_memory_per_block_optin",
                    "reserved_shared_memory_per_block", "shared_memory_allocation_unit", "max_threads_per_block",
                    "max_threads_per_sm", "max_blocks_per_sm", "max_warps_per_sm")


def planning_device(target: tvm.target.Target | DeviceSpec) -> DeviceSpec:
    """The device to plan for: :func:`device_from_target`, or for an arch several devices share
    (sm_90: h100 and h200), one of them if every number the planner reads is the same.

    Raises
    ------
    UnknownDeviceError
        No device, or devices that differ in what the planner reads.
    """
    if isinstance(target, DeviceSpec):
        return target
    try:
        return device_from_target(target)
    except UnknownDeviceError:
        arch = str(target.attrs.get("arch", "")).rstrip("af")
        same = [load_device(n) for n in list_devices() if load_device(n).arch.rstrip("af") == arch]
        if same and all(all(getattr(s, f) == getattr(same[0], f) for f in _PLANNING_FIELDS) for s in same):
            return same[0]
        raise


def _stitched_names(mod: tvm.IRModule) -> dict[str, str]:
    if mod.attrs is None or GROUPS_ATTR not in mod.attrs:
        return {}
    return {str(k): str(v) for k, v in mod.attrs[GROUPS_ATTR].items()}


def _worth_own_schedule(func: tirx.PrimFunc, kind: str) -> bool:
    """Stitch groups and GEMM prologues always; a single node only when it has several blocks
    or a reduction (softmax, norms)."""
    if kind in ("stitch", "prologue"):
        return True
    if kind != "single":
        return False
    from ..graph import sblocks

    blocks = sblocks(func)
    return len(blocks) > 1 or any(iv.iter_type == tirx.IterVar.CommReduce for b, _ in blocks for iv in b.iter_vars)


def _lowers(func: tirx.PrimFunc, name: str, target: tvm.target.Target | None) -> str | None:
    """Lower and generate code for ``func`` alone; the first error line, or None if it builds."""
    if target is None:
        return None
    try:
        with target:
            tvm.tirx.build(tvm.IRModule({name: func.with_attr("global_symbol", name)}), target=target,
                           pipeline=PIPELINE_NAME)
    except TVM_ERRORS as err:  # the lowering rejects the function
        return str(err).strip().splitlines()[-1][:300] if str(err).strip() else type(err).__name__
    return None


def schedule_stitched(mod: tvm.IRModule, device: DeviceSpec, options: PlanOptions | None = None,
                      verify_target: tvm.target.Target | None = None) -> tuple[tvm.IRModule, dict[str, str]]:
    """Schedule the stitched PrimFuncs of ``mod``; returns the module and the per-function report.

    With ``verify_target``, each scheduled function is also lowered and code-generated alone for
    that target; one TVM's lowering rejects falls back to dlight like a planning failure.
    """
    report: dict[str, str] = {}
    workspaces: dict[str, list] = {}
    stitched = _stitched_names(mod)
    updates: dict = {}
    for gv, func in list(mod.functions_items()):
        name = gv.name_hint
        if not isinstance(func, tirx.PrimFunc) or name not in stitched:
            continue
        if func.attrs is not None and "tirx.is_scheduled" in func.attrs:
            continue
        if not _worth_own_schedule(func, stitched[name]):
            continue
        plan = None
        try:
            if stitched[name] == "prologue":
                scheduled = build_prologue_schedule(func, device)
            else:
                plan = plan_prim_func(func, device, options)
                scheduled = build_schedule(plan)
        except (StitchPlanError, StitchScheduleError) as err:
            report[name] = f"fallback: {err}"
            logger.warning("stitched kernel '%s' left to dlight (separate kernels): %s", name, err)
            continue
        scheduled, extra = promote_workspace(scheduled)
        problem = _lowers(scheduled, name, verify_target)
        if problem is not None:
            report[name] = f"fallback: lowering failed: {problem}"
            logger.warning("stitched kernel '%s' left to dlight (separate kernels): lowering failed: %s",
                           name, problem)
            continue
        if extra:
            workspaces[name] = extra
        updates[gv] = scheduled
        if plan is None:
            report[name] = "stitched+gemm_prologue"
        else:
            report[name] = "stitched+grid_sync" if plan.needs_grid_sync else "stitched"
    mod = with_functions(mod, updates)
    if workspaces:
        mod = _add_workspace_outputs(mod, workspaces)
    return mod.with_attr(REPORT_ATTR, report), report


def _ws_type(buf) -> relax.TensorType:
    return relax.TensorType([int(d) for d in buf.ty.shape], str(buf.ty.dtype))


def _add_workspace_outputs(mod: tvm.IRModule, workspaces: dict[str, list]) -> tvm.IRModule:
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


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.ScheduleStitchedKernels")
class ScheduleStitchedKernels:
    """Module pass form of :func:`schedule_stitched` for one target (``verify``: lower each
    stitched kernel alone for the target and fall back to dlight if TVM rejects it)."""

    def __init__(self, target: tvm.target.Target | DeviceSpec, options: PlanOptions | None = None,
                 verify: bool = True):
        self.device = planning_device(target)
        self.options = options
        self.verify_target = target if verify and isinstance(target, tvm.target.Target) else None

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        out, _ = schedule_stitched(mod, self.device, self.options, self.verify_target)
        return out


def stitch_schedule_passes(target: tvm.target.Target) -> list:
    """Schedule stage of the ``stitch`` preset: our schedules for stitched kernels, then TVM's
    default dlight rules (same rules, same order as the baseline) for everything else, applied
    by :class:`~tvm_ext.default_schedule.SafeDefaultSchedule` so that a rule that raises
    on one function does not abort the build."""
    return [ScheduleStitchedKernels(target), SafeDefaultSchedule()]


__all__ = ["REPORT_ATTR", "ScheduleStitchedKernels", "planning_device", "schedule_stitched",
           "stitch_schedule_passes"]
