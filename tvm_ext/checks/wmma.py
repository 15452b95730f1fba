"""Tensor-core fragments (CUDA's WMMA API, as TVM lowers it) in the emulator.

A fragment buffer (scope ``wmma.matrix_a``, ``wmma.matrix_b``, ``wmma.accumulator``) belongs to
a warp: each warp of the block holds its own copy, fragment ``i`` being elements
``[i * rows * cols, (i + 1) * rows * cols)`` as a row-major tile. ``tvm_load_matrix_sync`` /
``tvm_store_matrix_sync`` move a tile between a fragment and memory with a leading-dimension
stride in row- or column-major layout, ``tvm_fill_fragment`` sets one, ``tvm_mma_sync`` computes
``D = A @ B + C`` (products exact, accumulated in float32, rounded to the accumulator type). The
operations are warp-collective: a warp that executes one with some lanes masked off, or with
arguments that differ between its lanes, is a finding. Memory accesses are logged with the
warp's first thread as the actor, so races with other warps are found.
"""
from __future__ import annotations

import numpy as np

from .memory import Finding, Storage

WARP = 32
#: The WMMA intrinsics the emulator runs.
OPS = ("tvm_fill_fragment", "tvm_load_matrix_sync", "tvm_store_matrix_sync", "tvm_mma_sync")


class Fragment:
    """One fragment buffer of an ``m x n x k`` operation: ``data[warp, element]``."""

    def __init__(self, name: str, scope: str, dtype: np.dtype, size: int, warps: int, mnk: tuple[int, int, int]) -> None:
        self.name, self.scope, self.dtype, self.mnk = name, scope, dtype, mnk
        self.data = np.full((warps, size), np.nan if dtype.kind == "f" else 0, dtype=dtype)

    def pointer(self) -> Fragment:
        return self

    def shape(self) -> tuple[int, int]:
        """(rows, cols) of one fragment: ``m x k`` for A, ``k x n`` for B, ``m x n`` for C/D."""
        m, n, k = self.mnk
        return {"wmma.matrix_a": (m, k), "wmma.matrix_b": (k, n)}.get(self.scope, (m, n))


class AccessPtr:
    """``tvm_access_ptr``: a typed pointer into a storage (per thread: its element offset)."""

    def __init__(self, storage: Storage, dtype: np.dtype, element: np.ndarray) -> None:
        self.storage, self.dtype, self.element = storage, dtype, element


def access_ptr(dtype: np.dtype, data, offset) -> AccessPtr:
    storage, byte_offset = data
    return AccessPtr(storage, dtype, byte_offset // dtype.itemsize + np.asarray(offset, dtype=np.int64))


class TensorCoreOps:
    """The warp-collective fragment operations over a block vector."""

    def __call__(self, b, name: str, args: list, stmt: int) -> int:
        warps = -(-b.threads // WARP)
        for w in range(warps):
            lanes = slice(w * WARP, min((w + 1) * WARP, b.threads))
            active = b.mask[lanes]
            if not active.any():
                continue
            if not active.all():
                b.report(Finding("barrier", f"warp {w} runs {name} with {int(active.sum())} of {active.size} lanes: "
                                            f"{b.launch.text(stmt)}"), key=("wmma-diverge", stmt))
                continue
            values = [self._uniform(b, a, lanes, w, name, stmt) for a in args]
            getattr(self, "_" + name)(b, w, values, stmt)
        return 0

    @staticmethod
    def _uniform(b, value, lanes: slice, w: int, name: str, stmt: int):
        if isinstance(value, AccessPtr):
            element = np.broadcast_to(value.element, (b.threads,))[lanes]
            if (element != element[0]).any():
                b.report(Finding("shuffle", f"warp {w}'s lanes pass different pointers to {name}: "
                                            f"{b.launch.text(stmt)}"), key=("wmma-args", stmt))
            return AccessPtr(value.storage, value.dtype, int(element[0]))
        if isinstance(value, np.ndarray) and value.ndim == 1 and value.shape[0] == b.threads:
            part = value[lanes]
            if (part != part[0]).any():
                b.report(Finding("shuffle", f"warp {w}'s lanes pass different arguments to {name}: "
                                            f"{b.launch.text(stmt)}"), key=("wmma-args", stmt))
            return part[0].item()
        return value.item() if isinstance(value, np.generic) else value

    @staticmethod
    def _tile(frag: Fragment, w: int, index: int, rows: int, cols: int) -> np.ndarray:
        return frag.data[w, int(index) * rows * cols:(int(index) + 1) * rows * cols].reshape(rows, cols)

    def _tvm_fill_fragment(self, b, w, values, stmt) -> None:
        frag, _, _, _, index, value = values
        self._tile(frag, w, index)[...] = value

    @staticmethod
    def _tile(frag: Fragment, w: int, index: int) -> np.ndarray:
        rows, cols = frag.shape()
        return frag.data[w, int(index) * rows * cols:(int(index) + 1) * rows * cols].reshape(rows, cols)

    @staticmethod
    def _elements(ptr: AccessPtr, frag: Fragment, stride: int, layout: str) -> np.ndarray:
        rows, cols = frag.shape()
        r, c = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        return ptr.element + (r * stride + c if layout == "row_major" else c * stride + r)

    def _tvm_load_matrix_sync(self, b, w, values, stmt) -> None:
        frag, _, _, _, index, ptr, stride, layout = values
        elements = self._elements(ptr, frag, int(stride), str(layout))
        self._tile(frag, w, index)[...] = self._memory(b, w, ptr, elements, None, stmt)

    def _tvm_store_matrix_sync(self, b, w, values, stmt) -> None:
        frag, _, _, _, index, ptr, stride, layout = values
        elements = self._elements(ptr, frag, int(stride), str(layout))
        self._memory(b, w, ptr, elements, self._tile(frag, w, index), stmt)

    def _tvm_mma_sync(self, b, w, values, stmt) -> None:
        d, di, a, ai, bm, bi, c, ci = values
        product = (self._tile(a, w, ai).astype(np.float32) @ self._tile(bm, w, bi).astype(np.float32)
                   + self._tile(c, w, ci).astype(np.float32))
        self._tile(d, w, di)[...] = product.astype(d.dtype)

    @staticmethod
    def _memory(b, w: int, ptr: AccessPtr, elements: np.ndarray, tile: np.ndarray | None, stmt: int) -> np.ndarray:
        """Read (``tile`` None) or write a tile through ``ptr``; the warp's first thread is the actor."""
        st, dt = ptr.storage, ptr.dtype
        flat = elements.ravel()
        size = st.view(dt).size
        if flat.min() < 0 or flat.max() >= size:
            b.report(Finding("out_of_bounds", f"'{st.name}' accessed at element {int(flat.max())} outside its "
                                              f"{size}: {b.launch.text(stmt)}"), key=("oob", st.name, stmt))
            flat = np.clip(flat, 0, size - 1)
        actor = np.full(flat.size, w * WARP, dtype=np.int64)
        if tile is None:
            return b.read(st, dt, flat, actor, stmt).reshape(elements.shape)
        values = tile.astype(dt).ravel()
        b.write(st, dt, flat, values, actor, stmt)
        return values


__all__ = ["OPS", "AccessPtr", "Fragment", "TensorCoreOps", "access_ptr"]
