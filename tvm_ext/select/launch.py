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
from .candidate import LaunchShape

_SHARED_SCOPES = ("shared", "shared.dyn")


def _const_extent(loop: tirx.For) -> int:
    ext = loop.extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else 1


def _is_launch_tag(tag: str) -> bool:
    return tag.startswith(("blockIdx", "threadIdx"))


def _region_shape(node) -> tuple[int, int, int]:
    """(grid, threads, shared bytes) of one launch region."""
    extents: dict[str, int] = {}
    shared = 0

    def on_for(loop: tirx.For) -> None:
        binding = loop.thread_binding
        if loop.kind == tirx.ForKind.THREAD_BINDING and binding is not None:
            tag = str(binding.thread_tag)
            extents[tag] = max(extents.get(tag, 1), _const_extent(loop))

    def on_attr(attr: tirx.AttrStmt) -> None:
        if attr.attr_key == "thread_extent" and isinstance(attr.value, tirx.IntImm):
            tag = str(attr.node.thread_tag)
            extents[tag] = max(extents.get(tag, 1), int(attr.value.value))

    def on_block(block) -> None:
        nonlocal shared
        for buf in block.alloc_buffers:
            scope = str(getattr(buf.ty, "storage_scope", "") or "global")
            if scope in _SHARED_SCOPES:
                shape = [int(d.value) if isinstance(d, tirx.IntImm) else 1 for d in buf.ty.shape]
                shared += math.prod(shape) * element_bytes(str(buf.ty.dtype))

    tvm_ffi.structural_walk(node, (tirx.For, on_for))
    tvm_ffi.structural_walk(node, (tirx.AttrStmt, on_attr))
    tvm_ffi.structural_walk(node, (tvm.s_tir.SBlock, on_block))
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


def launch_shape(func: tirx.PrimFunc, *, registers: int | None = None, grid_syncs: int = 0) -> LaunchShape:
    """The launch shape of one call of a scheduled ``func`` (its largest kernel's grid and block)."""
    regions = launch_regions(func)
    if not regions:
        return LaunchShape(grid=1, threads=1, kernels=0)
    shapes = [_region_shape(r) for r in dict.fromkeys(regions)]
    grid, threads, shared = max(shapes, key=lambda s: s[0] * s[1])
    return LaunchShape(grid=grid, threads=threads, shared_bytes=shared, registers=registers, kernels=len(regions),
                       grid_syncs=grid_syncs)


__all__ = ["launch_regions", "launch_shape"]
