"""Launch parameters of generated kernels: cooperative launch and register caps.

TVM 0.27's CUDA runtime launches a kernel cooperatively (``cuLaunchKernelEx`` with the
cooperative attribute) when its device PrimFunc lists ``"tirx.use_cooperative_launch"`` in
``"tirx.kernel_launch_params"``, but no compiler pass adds that tag. The CUDA code generator
prints ``__launch_bounds__(threads, min_blocks)`` from a device function's
``"tirx.launch_bounds_min_blocks_per_sm"`` attribute, which no pass sets either. Both
attributes only exist after host/device splitting, so they are set by passes that run at the
end of the TIR pipeline:

* :class:`AnnotateCooperativeLaunch` tags every device kernel that contains a grid barrier
  (``tirx.cuda.grid_sync``); the driver then refuses an oversized grid instead of letting it
  deadlock.
* :class:`ApplyLaunchBounds` copies ``"tvm_ext.min_blocks_per_sm"`` from a (host) PrimFunc to
  its device kernels (named ``<function name>_kernel...`` by ``SplitHostDevice``).

:func:`register_tir_pipeline` registers :class:`~tvm_ext.tir.shared_sync.SyncSharedBroadcasts`
(barriers ThreadSync misses), :class:`~tvm_ext.tir.flatten_guard.GuardFlattenIndices` (indices
``FlattenBuffer`` would simplify to another element), TVM's default ``s_tir`` pipeline and both
passes as the TIR pipeline ``"tvm_ext"``::

    ex = tvm.compile(mod, target, relax_pipeline=..., tir_pipeline="tvm_ext")
"""
from __future__ import annotations

import tvm
from tvm import tirx

from ..ir_update import with_functions
from .flatten_guard import GuardFlattenIndices
from .grid_sync import has_grid_sync
from .shared_sync import SyncSharedBroadcasts

COOPERATIVE_TAG = "tirx.use_cooperative_launch"
DYN_SHARED_TAG = "tirx.use_dyn_shared_memory"
LAUNCH_PARAMS_ATTR = "tirx.kernel_launch_params"
MIN_BLOCKS_ATTR = "tvm_ext.min_blocks_per_sm"
TVM_MIN_BLOCKS_ATTR = "tirx.launch_bounds_min_blocks_per_sm"
PIPELINE_NAME = "tvm_ext"


def is_device_kernel(func) -> bool:
    """Whether ``func`` is a device kernel produced by host/device splitting."""
    return isinstance(func, tirx.PrimFunc) and func.attrs is not None and LAUNCH_PARAMS_ATTR in func.attrs


def launch_params(func: tirx.PrimFunc) -> list[str]:
    """The launch parameter tags of a device kernel."""
    return [str(p) for p in func.attrs[LAUNCH_PARAMS_ATTR]]


def with_cooperative_launch(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with the cooperative tag added (kept before the dynamic-shared-memory tag, which must stay last)."""
    params = launch_params(func)
    if COOPERATIVE_TAG in params:
        return func
    rest = [p for p in params if p != DYN_SHARED_TAG]
    tail = [p for p in params if p == DYN_SHARED_TAG]
    return func.with_attr(LAUNCH_PARAMS_ATTR, rest + [COOPERATIVE_TAG] + tail)


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.AnnotateCooperativeLaunch")
class AnnotateCooperativeLaunch:
    """Tag every device kernel that contains ``tirx.cuda.grid_sync`` for cooperative launch."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        updates = {gv: with_cooperative_launch(f) for gv, f in mod.functions_items()
                   if is_device_kernel(f) and has_grid_sync(f)}
        return with_functions(mod, updates)


def _kernels_of(mod: tvm.IRModule, symbol: str) -> list:
    prefix = f"{symbol}_kernel"
    return [gv for gv, f in mod.functions_items() if is_device_kernel(f)
            and (gv.name_hint == prefix or gv.name_hint.startswith(prefix + "_"))]


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.ApplyLaunchBounds")
class ApplyLaunchBounds:
    """Give the device kernels of a PrimFunc with ``"tvm_ext.min_blocks_per_sm"`` a launch bound."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, tirx.PrimFunc) or func.attrs is None or MIN_BLOCKS_ATTR not in func.attrs:
                continue
            if is_device_kernel(func):
                continue
            blocks = int(func.attrs[MIN_BLOCKS_ATTR])
            for kernel in _kernels_of(mod, gv.name_hint):
                updates[kernel] = mod[kernel].with_attr(TVM_MIN_BLOCKS_ATTR, blocks)
        return with_functions(mod, updates)


def _pipeline_factory():
    base, finalize_host, finalize_device = tvm.s_tir.pipeline.default_s_tir_pipeline()
    passes = tvm.transform.Sequential([SyncSharedBroadcasts(), GuardFlattenIndices(), base, ApplyLaunchBounds(), AnnotateCooperativeLaunch()],
                                      name="tvm_ext.tir_pipeline")
    return passes, finalize_host, finalize_device


def register_tir_pipeline(name: str = PIPELINE_NAME) -> str:
    """Register the shared-memory barrier and index-guard passes, the ``s_tir`` pipeline and the launch-parameter passes
    under ``name`` (idempotent)."""
    from tvm.tirx import compilation_pipeline as pipelines

    if name not in pipelines.PIPELINE_MAP:
        pipelines.register_tir_pipeline(name, _pipeline_factory)
    return name


__all__ = ["AnnotateCooperativeLaunch", "ApplyLaunchBounds", "COOPERATIVE_TAG", "MIN_BLOCKS_ATTR",
           "PIPELINE_NAME", "is_device_kernel", "launch_params", "register_tir_pipeline",
           "with_cooperative_launch"]
