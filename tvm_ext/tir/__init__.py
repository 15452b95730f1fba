"""TIR passes shared by the techniques: grid-barrier insertion, cooperative launch, launch bounds,
global workspaces.

Importing the package registers the TIR pipeline ``"tvm_ext"`` (our barrier and index-guard
passes, TVM's ``s_tir`` pipeline, the launch-parameter passes); pass ``tir_pipeline="tvm_ext"`` to ``tvm.compile``.
"""
from __future__ import annotations

from .flatten_guard import GuardFlattenIndices, guard_flatten_indices
from .shared_sync import SyncSharedBroadcasts, sync_shared_broadcasts
from .workspace import buffer_scope, global_workspaces, promote_workspace
from .grid_sync import GRID_SYNC_OP, InsertGridSync, has_grid_sync, insert_grid_sync, is_block_binding
from .launch_params import (
    COOPERATIVE_TAG,
    MIN_BLOCKS_ATTR,
    PIPELINE_NAME,
    AnnotateCooperativeLaunch,
    ApplyLaunchBounds,
    is_device_kernel,
    launch_params,
    register_tir_pipeline,
    with_cooperative_launch,
)

register_tir_pipeline()

__all__ = [
    "AnnotateCooperativeLaunch", "ApplyLaunchBounds", "COOPERATIVE_TAG", "GRID_SYNC_OP", "GuardFlattenIndices",
    "InsertGridSync", "guard_flatten_indices",
    "MIN_BLOCKS_ATTR", "PIPELINE_NAME", "has_grid_sync", "insert_grid_sync", "is_block_binding", "is_device_kernel",
    "launch_params", "register_tir_pipeline", "with_cooperative_launch", "buffer_scope", "global_workspaces", "promote_workspace",
    "SyncSharedBroadcasts", "sync_shared_broadcasts",
]
