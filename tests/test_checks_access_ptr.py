"""``tvm_access_ptr`` in the emulator: its data argument is either a pointer (``buffer_data``) or a
buffer's data variable, which a buffer declared over merged shared memory binds to its view.

The tile graph's attention kernels (BERT-base, GPT-2 under ``tilegraph``) load their WMMA operand
from such a view; the emulator unpacked it as a pointer and listed those kernels "could not be
run: cannot unpack non-iterable BufferView object".
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from tvm import tirx

from tvm_ext.checks.memory import Storage
from tvm_ext.checks.tir_expr import ExprCompiler
from tvm_ext.checks.tir_stmt import BufferView


def _access_ptr(offset: int, bound):
    """``tvm_access_ptr(float16, data, offset, 256, read)`` evaluated with ``data`` bound to ``bound``."""
    data = tirx.Var("A_data", "handle")
    slots: dict = {}
    compiler = ExprCompiler(lambda v: slots.setdefault(v, len(slots)), memory=None, warp=None)
    ptr = compiler(tirx.call_intrin("handle", "tirx.tvm_access_ptr", tirx.type_annotation("float16"),
                                    data, tirx.IntImm("int32", offset), tirx.IntImm("int32", 256), 1))
    return ptr(SimpleNamespace(env={slots[data]: bound}))


def test_access_ptr_of_a_data_variable_bound_to_a_view_points_into_the_view():
    storage = Storage("merged_shared", 4096, "shared", initialised=False, itemsize=2)
    view = BufferView(storage, np.dtype("float16"), 64, 1024, "A_shared")      # 64 elements into the storage
    got = _access_ptr(16, view)
    assert got.storage is storage and np.asarray(got.element).item() == 64 + 16


def test_access_ptr_of_a_pointer_is_unchanged():
    storage = Storage("shared", 1024, "shared", initialised=False, itemsize=2)
    got = _access_ptr(8, (storage, 32))          # (storage, byte offset)
    assert got.storage is storage and np.asarray(got.element).item() == 16 + 8
