"""The Relax side of stitching: the ``StitchMemoryIntensive`` pass and the graph stage of the preset.

``StitchMemoryIntensive`` runs on a legalized module (after ``AnnotateTIROpPattern``): for every
Relax function with a dataflow block it builds the :class:`~tvm_ext.graph.OpGraph`, computes
the stitch scope (:func:`~tvm_ext.stitch.scope.stitch_scope`) and emits one ``Primitive``
function per group of two or more nodes (:func:`~tvm_ext.stitch.emit.emit_groups`).
``FuseTIR`` then makes each of them one PrimFunc. The kind of every emitted group is recorded
in the module attribute ``"tvm_ext.stitch_groups"`` (function name -> ``"stitch"`` /
``"epilogue"`` / ``"single"``), which survives ``FuseTIR`` (function attributes do not), so
the schedule stage knows which PrimFuncs are stitched kernels.

Example
-------
>>> mod = tvm.transform.Sequential(stitch_graph_passes(target))(mod)
>>> dict(mod.attrs["tvm_ext.stitch_groups"])["fused_reshape_transpose_..."]
'stitch'
"""
from __future__ import annotations

import logging

import tvm
from tvm import relax

from ..graph import OpGraph
from .emit import StitchEmitError, call_bindings, emit_groups
from .scope import StitchScope, is_stitchable, stitch_scope
from .split_slices import SplitToSlices

logger = logging.getLogger(__name__)

GROUPS_ATTR = "tvm_ext.stitch_groups"
#: Module attribute set when the module could not be stitched (FuseOps was used instead).
SKIPPED_ATTR = "tvm_ext.stitch_skipped"
#: Attribute of each emitted Primitive function: the group kind (before ``FuseTIR`` drops it).
KIND_ATTR = "tvm_ext.stitch_kind"


def _has_dataflow(func) -> bool:
    return isinstance(func, relax.Function) and isinstance(func.body, relax.SeqExpr) and any(
        isinstance(b, relax.DataflowBlock) for b in func.body.blocks)


def _is_primitive(func) -> bool:
    return func.attrs is not None and "Primitive" in func.attrs and bool(func.attrs["Primitive"])


def stitch_module(mod: tvm.IRModule, *, absorb_epilogues: bool = True, remote: bool = True,
                  max_group_nodes: int | None = None) -> tuple[tvm.IRModule, dict[str, StitchScope]]:
    """Apply the stitch scope to every Relax function of ``mod``; returns the module and the scopes.

    Single memory-intensive nodes with several blocks (softmax, layer norm) are recorded as
    ``"single"`` groups under their PrimFunc name so that they get the stitched schedule too.
    If some function cannot be viewed as an OpGraph (shape-valued or dynamic variables), the
    module is fused with TVM's ``FuseOps`` instead, exactly as the baseline does, and the reason
    is recorded in the module attribute ``"tvm_ext.stitch_skipped"``.
    """
    groups_attr: dict[str, str] = {}
    if mod.attrs is not None and GROUPS_ATTR in mod.attrs:
        groups_attr.update({str(k): str(v) for k, v in mod.attrs[GROUPS_ATTR].items()})
    names = [gv.name_hint for gv, f in mod.functions_items() if _has_dataflow(f) and not _is_primitive(f)]
    graphs: dict[str, OpGraph] = {}
    for name in names:
        try:
            graphs[name] = OpGraph.from_module(mod, name)
        except ValueError as err:
            logger.warning("stitching skipped, falling back to FuseOps: function '%s': %s", name, err)
            return relax.transform.FuseOps()(mod).with_attr(SKIPPED_ATTR, f"{name}: {err}"), {}
    scopes: dict[str, StitchScope] = {}
    for name, graph in graphs.items():
        scope = stitch_scope(graph, absorb_epilogues=absorb_epilogues, remote=remote,
                             max_group_nodes=max_group_nodes)
        groups = [g.nodes for g in scope.groups]
        if len(call_bindings(mod[name])) != len(graph.nodes):
            logger.warning("stitching of '%s' skipped: its calls do not match the OpGraph nodes", name)
            continue
        try:
            mod, given = emit_groups(mod, groups, func_name=name,
                                     attrs=[{KIND_ATTR: g.kind} for g in scope.groups])
        except StitchEmitError as err:
            logger.warning("stitching of '%s' skipped: %s", name, err)
            continue
        scopes[name] = scope
        for group, fname in zip(scope.groups, given):
            if fname:
                groups_attr[fname] = group.kind
            elif group.kind == "single" and is_stitchable(graph, group.nodes[0]):
                groups_attr.setdefault(graph.nodes[group.nodes[0]].func_name, "single")
    mod = mod.with_attr(GROUPS_ATTR, groups_attr)
    return mod, scopes


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.StitchMemoryIntensive")
class StitchMemoryIntensive:
    """Relax pass: one ``Primitive`` function per stitch group (AStitch §4.1); see the module docstring.

    Parameters
    ----------
    absorb_epilogues : bool
        Keep compute nodes' elementwise epilogues with them, as ``FuseOps`` does.
    remote : bool
        Merge independent memory-intensive groups (remote stitching).
    max_group_nodes : int, optional
        Bound on the nodes of one stitch group.
    """

    def __init__(self, absorb_epilogues: bool = True, remote: bool = True, max_group_nodes: int | None = None):
        self.absorb_epilogues = absorb_epilogues
        self.remote = remote
        self.max_group_nodes = max_group_nodes

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        out, _ = stitch_module(mod, absorb_epilogues=self.absorb_epilogues, remote=self.remote,
                               max_group_nodes=self.max_group_nodes)
        return out


def stitch_graph_passes(target: tvm.target.Target | None = None) -> list:
    """The whole graph stage of the ``stitch`` preset (what replaces the baseline's graph passes).

    :class:`~tvm_ext.stitch.split_slices.SplitToSlices`, then the baseline's passes (TVM 0.27's
    CUDA library dispatch and legalization, without the dlight step) with
    :class:`StitchMemoryIntensive` in place of ``FuseOps``; ``FuseTIR`` follows. The result is
    target independent and builds for ``llvm``.
    """
    from tvm.relax.backend.cuda import pipeline as cuda

    tgt = target if target is not None else tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    passes: list = [SplitToSlices()]
    for p in cuda.library_dispatch_passes(tgt) + cuda.legalize_passes(tgt):
        name = p.info.name
        if name == "ApplyDefaultSchedule":
            continue
        if name == "FuseOps":
            passes.append(StitchMemoryIntensive())
            continue
        passes.append(p)
    return passes


__all__ = ["GROUPS_ATTR", "KIND_ATTR", "SKIPPED_ATTR", "StitchMemoryIntensive", "stitch_graph_passes", "stitch_module"]
