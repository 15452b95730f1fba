"""Launch shape of a scheduled PrimFunc, read from its loop structure (no lowering, no GPU).

Each outermost ``blockIdx``/``threadIdx`` bound loop (or ``thread_extent`` attribute) starts one
kernel; a region nested in serial loops launches once per iteration. Within a region the grid is
the product of its ``blockIdx`` extents and the block the product of its ``threadIdx`` extents;
shared memory is the sum of the ``shared``/``shared.dyn`` buffers it allocates. The report reads
launches from the lowered module instead (what the host code really launches); a test checks
that both agree.

Example
-------
>>> launch_shape(scheduled)
LaunchShape(grid=1536, threads=256, shared_bytes=0, registers=None, kernels=1, grid_syncs=0)
"""
from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx

from ..analysis import element_bytes
from ..errors import TVM_ERRORS
from ..tir.grid_sync import GRID_SYNC_OP
from ..tir.workspace import buffer_scope
from .candidate import LaunchShape

_SHARED_SCOPES = ("shared", "shared.dyn")
#: Storage scopes of tensor-core fragments (dlight's WMMA tensorization, mma.sync tiles).
_TENSOR_CORE_SCOPES = ("wmma.", "m16n8k8.", "mma.")


def uses_tensor_cores(func: tirx.PrimFunc) -> bool:
    """Whether a scheduled ``func`` allocates tensor-core fragments (TVM's schedules: code path ``wmma``)."""
    found: list[bool] = []

    def on_block(block) -> None:
        for buf in block.alloc_buffers:
            if str(getattr(buf.ty, "storage_scope", "")).startswith(_TENSOR_CORE_SCOPES):
                found.append(True)

    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlock, on_block))
    return bool(found)


def _const_extent(loop: tirx.For) -> int:
    ext = loop.extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else 1


def _is_launch_tag(tag: str) -> bool:
    return tag.startswith(("blockIdx", "threadIdx"))


def _shared_buffers(node) -> dict:
    """Shared-memory buffers allocated in the blocks under ``node``: buffer -> bytes."""
    found: dict = {}

    def on_block(block) -> None:
        for buf in block.alloc_buffers:
            if buffer_scope(buf) in _SHARED_SCOPES:
                shape = [int(d.value) if isinstance(d, tirx.IntImm) else 1 for d in buf.ty.shape]
                found[buf] = math.prod(shape) * element_bytes(str(buf.ty.dtype))

    tvm_ffi.structural_walk(node, (tvm.s_tir.SBlock, on_block))
    return found


def _used_buffers(node) -> set:
    used: set = set()
    tvm_ffi.structural_walk(node, (tvm.ir.TensorLoad, lambda ld: used.add(ld.source)))
    tvm_ffi.structural_walk(node, (tirx.BufferStore, lambda st: used.add(st.buffer)))
    return used


def _region_shape(node, outer_shared: dict) -> tuple[int, int, int]:
    """(grid, threads, shared bytes) of one launch region; ``outer_shared`` are the shared buffers
    allocated above the region (a schedule's root block), counted when the region uses them."""
    extents: dict[str, int] = {}

    def on_for(loop: tirx.For) -> None:
        binding = loop.thread_binding
        if loop.kind == tirx.ForKind.THREAD_BINDING and binding is not None:
            tag = str(binding.thread_tag)
            extents[tag] = max(extents.get(tag, 1), _const_extent(loop))

    def on_attr(attr: tirx.AttrStmt) -> None:
        if attr.attr_key == "thread_extent" and isinstance(attr.value, tirx.IntImm):
            tag = str(attr.node.thread_tag)
            extents[tag] = max(extents.get(tag, 1), int(attr.value.value))

    tvm_ffi.structural_walk(node, (tirx.For, on_for))
    tvm_ffi.structural_walk(node, (tirx.AttrStmt, on_attr))
    shared = sum(_shared_buffers(node).values())
    if outer_shared:
        used = _used_buffers(node)
        shared += sum(size for buf, size in outer_shared.items() if buf in used)
    grid = math.prod(v for k, v in extents.items() if k.startswith("blockIdx"))
    threads = math.prod(v for k, v in extents.items() if k.startswith("threadIdx"))
    return grid, threads, shared


def launch_regions(func: tirx.PrimFunc) -> list:
    """The statements that each start a kernel, one entry per launch of one call."""
    regions: list = []
    factor = [1]

    def on_for(node: tirx.For, visitor) -> None:
        binding = node.thread_binding
        if node.kind == tirx.ForKind.THREAD_BINDING and binding is not None \
                and _is_launch_tag(str(binding.thread_tag)):
            regions.extend([node] * factor[-1])
            return  # everything below belongs to this kernel
        factor.append(factor[-1] * _const_extent(node))
        visitor.default_visit(node)
        factor.pop()

    def on_attr(node: tirx.AttrStmt, visitor) -> None:
        if node.attr_key == "thread_extent" and _is_launch_tag(str(node.node.thread_tag)):
            regions.extend([node] * factor[-1])
            return
        visitor.default_visit(node)

    tvm_ffi.structural_visit(func.body, [(tirx.For, on_for), (tirx.AttrStmt, on_attr)])
    return regions


def compacted(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every buffer allocated where it is used and shrunk to the region it is used in
    (the lowering's compaction): a schedule's shared tiles are declared at full size until then.
    ``func`` itself when the passes refuse it. Reduction inits are lowered first, as the lowering
    does (``ConvertBlocksToOpaque`` refuses a block with an init)."""
    import tvm.s_tir.transform as st

    seq = tvm.transform.Sequential([st.LowerInitBlock(), st.PlanAndUpdateBufferAllocationLocation(),
                                    st.ConvertBlocksToOpaque(), st.CompactBufferAllocation()])
    try:
        return seq(tvm.IRModule({"main": func}))["main"]
    except TVM_ERRORS:
        return func


def grid_barriers(func: tirx.PrimFunc) -> int:
    """Grid barriers (``tirx.cuda.grid_sync`` calls) one call of ``func`` executes, loops unrolled."""
    count = [0]
    factor = [1]

    def on_for(node: tirx.For, visitor) -> None:   # thread-bound loops run in parallel, not in turn
        parallel = node.kind == tirx.ForKind.THREAD_BINDING
        factor.append(factor[-1] * (1 if parallel else _const_extent(node)))
        visitor.default_visit(node)
        factor.pop()

    def on_call(node, visitor) -> None:
        if isinstance(node.op, tvm.ir.Op) and node.op.name == GRID_SYNC_OP:
            count[0] += factor[-1]
        visitor.default_visit(node)

    tvm_ffi.structural_visit(func.body, [(tirx.For, on_for), (tvm.ir.Call, on_call)])
    return count[0]


def launch_shape(func: tirx.PrimFunc, *, registers: int | None = None) -> LaunchShape:
    """The launch shape of one call of a scheduled ``func`` (its largest kernel's grid and block;
    shared memory as the compacted function allocates it; its grid barriers). Compaction (four TVM
    passes, 8 ms a call: 11 s of Swin-T's graph stage) only sizes shared buffers, so a function
    without any is read as it is."""
    if _shared_buffers(func.body):
        func = compacted(func)
    regions = launch_regions(func)
    if not regions:
        return LaunchShape(grid=1, threads=1, kernels=0)
    inner: dict = {}
    for r in dict.fromkeys(regions):
        inner.update(_shared_buffers(r))
    outer = {buf: size for buf, size in _shared_buffers(func.body).items() if buf not in inner}
    shapes = [_region_shape(r, outer) for r in dict.fromkeys(regions)]
    grid, threads, shared = max(shapes, key=lambda s: s[0] * s[1])
    return LaunchShape(grid=grid, threads=threads, shared_bytes=shared, registers=registers, kernels=len(regions),
                       grid_syncs=grid_barriers(func))


__all__ = ["compacted", "grid_barriers", "launch_regions", "launch_shape", "uses_tensor_cores"]
