"""Lowered TIR statements as Python closures over one thread block, barriers as yields.

A statement compiles into ``run(block)``; one that contains a barrier (``__syncthreads``,
``__syncwarp``, a grid barrier) compiles into a generator function that yields
``(kind, statement id)`` at each barrier, so the scheduler (:mod:`tvm_ext.checks.emulator`)
decides when the block goes on. Divergent control flow narrows ``block.mask``; a barrier reached
with part of the block masked off is a finding (synccheck's divergent barrier).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tvm_ffi
from tvm import tirx

from .memory import Finding, Storage
from .tir_expr import ExprCompiler, Unemulated, is_sync
from .values import element_dtype, lanes_of
from .wmma import Fragment

Run = Callable[[Any], Any]


class BufferView:
    """A typed window on a storage: what a buffer variable is bound to."""

    __slots__ = ("dtype", "lanes", "name", "offset", "size", "storage")

    def __init__(self, storage: Storage, dtype: np.dtype, offset: int, size: int, name: str, lanes: int = 1) -> None:
        #: ``offset`` counts scalars of ``dtype``; ``size`` counts the buffer's elements, each
        #: ``lanes`` scalars wide (a ``float32x2`` register buffer has lanes 2).
        self.storage, self.dtype, self.offset, self.size, self.name, self.lanes = storage, dtype, offset, size, name, lanes

    def pointer(self) -> tuple[Storage, int]:
        """(storage, byte offset) of the first element."""
        return self.storage, self.offset * self.dtype.itemsize


def _size(buffer) -> int:
    return int(np.prod([int(d) for d in buffer.ty.shape])) if len(buffer.ty.shape) else 1


class StmtCompiler:
    """Compiles a device kernel's body; ``texts[i]`` is statement ``i`` as TVMScript (for reports)."""

    def __init__(self, memory, warp) -> None:
        self.slots: dict = {}
        self.texts: list[str] = []
        self.expr = ExprCompiler(self.slot, memory, warp)
        self.memory = memory
        self.allocs = 0
        self.fragment_shapes: dict[str, tuple[int, int, int]] = {}

    def slot(self, var) -> int:
        found = self.slots.get(var)
        if found is None:
            found = self.slots[var] = len(self.slots)
        return found

    def _stmt_id(self, stmt) -> int:
        lines = str(stmt).strip().splitlines() if not isinstance(stmt, (tirx.SeqStmt, tirx.For)) else [""]
        text = " ".join(lines[-1].split())
        self.texts.append(text[:160])
        return len(self.texts) - 1

    def __call__(self, stmt) -> tuple[Run, bool]:
        kind = type(stmt).__name__
        method = getattr(self, "_" + kind, None)
        if method is None:
            raise Unemulated(f"statement {kind} is not emulated")
        return method(stmt)

    # structure
    def _SeqStmt(self, s):
        parts = [self(c) for c in s.seq]
        if not any(g for _, g in parts):
            fns = [f for f, _ in parts]

            def run(b):
                for f in fns:
                    f(b)
            return run, False

        def gen(b):
            for f, g in parts:
                if g:
                    yield from f(b)
                else:
                    f(b)
        return gen, True

    def _AttrStmt(self, s):
        if s.attr_key == "fragment_shape":     # before the fragment's allocation below it
            self.fragment_shapes[s.node.name] = tuple(int(x) for x in str(s.value.value).split(","))
        body, g = self(s.body)
        if s.attr_key != "thread_extent":
            return body, g
        tag, i = str(s.node.thread_tag), self.slot(s.node.var)

        def bind(b):
            b.env[i] = b.index_of(tag)
        if not g:
            def run(b):
                bind(b)
                body(b)
            return run, False

        def gen(b):
            bind(b)
            yield from body(b)
        return gen, True

    def _DeclBuffer(self, s):
        i, data, buf = self.slot(s.buffer), self.expr(s.data), s.buffer
        dt, name, lanes = element_dtype(buf.ty.dtype), buf.name, lanes_of(buf.ty.dtype)
        elem = int(buf.ty.elem_offset) * lanes if buf.ty.elem_offset is not None else 0

        def run(b):   # bounded by the allocation: lowering leaves nominal shapes on views of merged shared memory
            storage, byte_offset = data(b)
            offset = byte_offset // dt.itemsize + elem
            capacity = (storage.exact_bytes // dt.itemsize - offset) // lanes
            b.env[i] = BufferView(storage, dt, offset, capacity, name, lanes)
        return run, False

    def _AllocBuffer(self, s):
        buf = s.buffer
        scope = str(buf.ty.storage_scope or "global")
        dt, size, name, i = element_dtype(buf.ty.dtype), _size(buf), buf.name, self.slot(buf)
        lanes = lanes_of(buf.ty.dtype)
        key = self.allocs
        self.allocs += 1
        if scope in ("shared", "shared.dyn"):
            def run(b):
                store = b.shared.get(key)
                if store is None:
                    store = b.shared[key] = Storage(name, size * lanes * dt.itemsize, "shared", initialised=False,
                                                    itemsize=dt.itemsize)
                b.env[i] = BufferView(store, dt, 0, size, name, lanes)
        elif scope == "local":
            def run(b):
                store = b.local.get(key)
                if store is None:
                    store = b.local[key] = Storage(name, size * lanes * dt.itemsize, "local", initialised=True,
                                                   lanes=b.threads, itemsize=dt.itemsize)
                b.env[i] = BufferView(store, dt, 0, size, name, lanes)
        elif scope.startswith("wmma.") and name in self.fragment_shapes:
            mnk = self.fragment_shapes[name]

            def run(b):
                frag = b.local.get(key)
                if frag is None:
                    frag = b.local[key] = Fragment(name, scope, dt, size * lanes, -(-b.threads // 32), mnk)
                b.env[i] = frag
        else:
            raise Unemulated(f"'{name}' in storage scope {scope} is not emulated"
                             + (" (a fragment without its fragment_shape)" if scope.startswith("wmma.") else ""))
        return run, False

    def _Bind(self, s):
        i, value = self.slot(s.var), self.expr(s.value)

        def run(b):
            b.env[i] = value(b)
        return run, False

    _LetStmt = _Bind

    def _BufferStore(self, s):
        stmt = self._stmt_id(s)
        self.expr.stmt = stmt
        if len(s.indices) != 1:
            raise Unemulated("a store with more than one index (buffer not flattened)")
        view, index, value, memory = self.slot(s.buffer), self.expr(s.indices[0]), self.expr(s.value), self.memory
        lanes = lanes_of(s.value.ty.dtype)

        def run(b):
            memory.store(b.env[view], index(b), value(b), b, stmt, lanes)
        return run, False

    def _Evaluate(self, s):
        sync = is_sync(s)
        stmt = self._stmt_id(s)
        self.expr.stmt = stmt
        if sync is not None and sync not in ("block", "warp", "grid"):
            raise Unemulated(f"a '{sync}' storage barrier is not emulated")
        if sync is not None:
            def gen(b):
                b.arrive(sync, stmt)
                yield sync, stmt
            return gen, True
        value = self.expr(s.value)
        return (lambda b: value(b)), False

    def _AssertStmt(self, s):
        stmt = self._stmt_id(s)
        cond = self.expr(s.condition)

        def run(b):
            c = cond(b)
            failed = ~np.broadcast_to(c, b.mask.shape) & b.mask if isinstance(c, np.ndarray) else (not c)
            if np.any(failed):
                b.report(Finding("assert", f"assertion fails in the kernel: {self.texts[stmt]}"))
        return run, False

    # control flow
    def _IfThenElse(self, s):
        cond = self.expr(s.condition)
        then, g1 = self(s.then_case)
        other, g2 = self(s.else_case) if s.else_case is not None else ((lambda b: None), False)

        def split(b):
            c = cond(b)
            if not isinstance(c, np.ndarray):
                return (b.mask, None) if c else (None, b.mask)
            c = np.broadcast_to(c, b.mask.shape)
            t, f = b.mask & c, b.mask & ~c
            return (t if t.any() else None), (f if f.any() else None)

        if not (g1 or g2):
            def run(b):
                saved = b.mask
                t, f = split(b)
                if t is not None:
                    b.mask = t
                    then(b)
                if f is not None:
                    b.mask = f
                    other(b)
                b.mask = saved
            return run, False

        def gen(b):
            saved = b.mask
            t, f = split(b)
            for m, fn, is_gen in ((t, then, g1), (f, other, g2)):
                if m is None:
                    continue
                b.mask = m
                if is_gen:
                    yield from fn(b)
                else:
                    fn(b)
            b.mask = saved
        return gen, True

    def _For(self, s):
        if s.thread_binding is not None:
            raise Unemulated("a thread-bound loop in lowered code")
        i, lo, ext = self.slot(s.loop_var), self.expr(s.min), self.expr(s.extent)
        body, g = self(s.body)

        def iterations(b):
            start, count = lo(b), ext(b)
            if not isinstance(start, np.ndarray) and not isinstance(count, np.ndarray):
                for k in range(int(start), int(start) + int(count)):
                    b.env[i] = k
                    yield None
                return
            start = np.broadcast_to(np.asarray(start, dtype=np.int64), b.mask.shape)
            count = np.broadcast_to(np.asarray(count, dtype=np.int64), b.mask.shape)
            saved = b.mask
            for k in range(int(count[saved].max(initial=0))):
                m = saved & (k < count)
                if not m.any():
                    break
                b.mask = m
                b.env[i] = start + k
                yield None
            b.mask = saved

        if not g:
            def run(b):
                for _ in iterations(b):
                    body(b)
            return run, False

        def gen(b):
            for _ in iterations(b):
                yield from body(b)
        return gen, True

    def _While(self, s):
        cond = self.expr(s.condition)
        body, g = self(s.body)
        if g:
            raise Unemulated("a barrier inside a while loop")

        def run(b):
            saved = b.mask
            while True:
                c = cond(b)
                m = b.mask & np.broadcast_to(c, b.mask.shape)
                if not m.any():
                    break
                b.mask = m
                body(b)
            b.mask = saved
        return run, False


def compile_kernel(func: tirx.PrimFunc, memory, warp) -> tuple[Run, bool, StmtCompiler]:
    """Closure of a device kernel's body, whether it has barriers, and its compiler (slots, texts)."""
    compiler = StmtCompiler(memory, warp)
    for p in func.params:
        compiler.slot(p)
    run, gen = compiler(func.body)
    return run, gen, compiler


def thread_extents(func: tirx.PrimFunc) -> dict[str, int]:
    """``{"blockIdx.x": 1536, "threadIdx.x": 128, ...}`` of a lowered device kernel."""
    found: dict[str, int] = {}

    def on_attr(a) -> None:
        if a.attr_key == "thread_extent":
            found[str(a.node.thread_tag)] = int(a.value)

    tvm_ffi.structural_walk(func.body, (tirx.AttrStmt, on_attr))
    return found


__all__ = ["BufferView", "StmtCompiler", "compile_kernel", "thread_extents"]
