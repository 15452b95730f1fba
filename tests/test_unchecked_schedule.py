"""``UncheckedSchedule`` (``tvm_ext.tir.unchecked_schedule``): the same schedules as TVM's
``Schedule``, without the Python-side argument type check."""
from __future__ import annotations

import pytest
import tvm
from tvm import s_tir
from tvm.script import tirx as T

from tvm_ext.tir.unchecked_schedule import UNWRAPPED, UncheckedSchedule


@T.prim_func(s_tir=True)
def scale_then_add(a: T.Buffer((64, 64), "float32"), c: T.Buffer((64, 64), "float32")):
    b = T.sblock_alloc_buffer((64, 64), "float32")
    for i, j in T.grid(64, 64):
        with T.sblock("scale"):
            vi, vj = T.axis.remap("SS", [i, j])
            b[vi, vj] = a[vi, vj] * T.float32(2)
    for i, j in T.grid(64, 64):
        with T.sblock("add"):
            vi, vj = T.axis.remap("SS", [i, j])
            c[vi, vj] = b[vi, vj] + T.float32(1)


def _tile(sch):
    i, j = sch.get_loops(sch.get_sblock("add"))
    io, ii = sch.split(i, [None, 16])
    jo, ji = sch.split(j, [None, 16])
    sch.reorder(io, jo, ii, ji)
    sch.compute_at(sch.get_sblock("scale"), jo)
    sch.set_scope(sch.get_sblock("scale"), 0, "shared")
    return sch.mod["main"]


def test_it_builds_the_schedule_tvm_builds():
    assert UNWRAPPED >= 40
    tvm.ir.assert_structural_equal(_tile(UncheckedSchedule(scale_then_add)), _tile(s_tir.Schedule(scale_then_add)))


def test_its_primitives_skip_the_python_type_check():
    checked, unchecked = s_tir.Schedule(scale_then_add), UncheckedSchedule(scale_then_add)
    with pytest.raises(TypeError, match='In "Schedule.get_sblock"'):
        checked.get_sblock(3)
    with pytest.raises(TypeError, match="Mismatched type on argument") as raised:   # the FFI's own check
        unchecked.get_sblock(3)
    assert 'In "Schedule.get_sblock"' not in str(raised.value)


def test_a_copy_is_unchecked_and_leaves_the_original_alone():
    sch = UncheckedSchedule(scale_then_add)
    sch.compute_inline(sch.get_sblock("scale"))
    before = sch.mod["main"]
    copy = sch.copy()
    assert type(copy) is UncheckedSchedule
    copy.split(copy.get_loops(copy.get_sblock("add"))[0], [None, 16])
    tvm.ir.assert_structural_equal(sch.mod["main"], before)       # the original is not split
    assert len(copy.get_loops(copy.get_sblock("add"))) == 3
