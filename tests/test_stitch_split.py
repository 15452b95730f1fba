"""SplitToSlices: a split read part by part becomes one strided_slice per part (Before/Expected)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ext.stitch.split_slices import SplitToSlices
from tvm_ext.testing.oracle import run_cpu

T = relax.TensorType


def _func(body, params):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = body(bb, *params)
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def _params():
    return [relax.Var("x", T((2, 12), "float32"))]


def before(bb, x):
    parts = bb.emit(relax.op.split(x, [4, 8], axis=1))
    a = bb.emit(relax.TupleGetItem(parts, 0))
    c = bb.emit(relax.TupleGetItem(parts, 2))
    return bb.emit(relax.op.add(relax.op.exp(a), c))


def expected(bb, x):
    a = bb.emit(relax.op.strided_slice(x, axes=[1], begin=[0], end=[4]))
    c = bb.emit(relax.op.strided_slice(x, axes=[1], begin=[8], end=[12]))
    return bb.emit(relax.op.add(relax.op.exp(a), c))


def test_split_becomes_slices():
    after = SplitToSlices()(_func(before, _params()))
    tvm.ir.assert_structural_equal(after["main"], _func(expected, _params())["main"])


def test_sections_split_and_numerics():
    def body(bb, x):
        parts = bb.emit(relax.op.split(x, 3, axis=1))
        return bb.emit(relax.op.multiply(relax.TupleGetItem(parts, 1), relax.TupleGetItem(parts, 2)))

    def expected(bb, x):  # 3 equal sections of 12 columns: parts 1 and 2 are columns 4..8 and 8..12
        b = bb.emit(relax.op.strided_slice(x, axes=[1], begin=[4], end=[8]))
        c = bb.emit(relax.op.strided_slice(x, axes=[1], begin=[8], end=[12]))
        return bb.emit(relax.op.multiply(b, c))

    mod = _func(body, _params())
    after = SplitToSlices()(mod)
    tvm.ir.assert_structural_equal(after["main"], _func(expected, _params())["main"])
    x = np.random.default_rng(0).standard_normal((2, 12)).astype("float32")
    np.testing.assert_array_equal(run_cpu(after, {"x": x})[0], x[:, 4:8] * x[:, 8:12])


@pytest.mark.parametrize("escape", ["tuple", "dynamic"])
def test_split_left_alone_when_the_tuple_escapes_or_extents_are_unknown(escape):
    if escape == "tuple":
        params = _params()

        def body(bb, x):
            return bb.emit(relax.op.split(x, 2, axis=1))
    else:
        n = tvm.tirx.Var("n", "int64")
        params = [relax.Var("x", T((2, n), "float32"))]

        def body(bb, x):
            return bb.emit(relax.TupleGetItem(bb.emit(relax.op.split(x, [4], axis=1)), 0))
    mod = _func(body, params)
    tvm.ir.assert_structural_equal(SplitToSlices()(mod), mod)
