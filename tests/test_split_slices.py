"""SplitToSlices: a split read part by part becomes one strided_slice per part (Before/Expected)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ext.frontend.split_slices import SplitToSlices
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


def test_generators_that_ask_for_it_get_it_once():
    from tvm_ext.driver.presets import Preset
    from tvm_ext.driver.stages import preset_passes

    target = tvm.target.Target("tvm_ext/h100")
    both = Preset("stitch_and_tilegraph", "two generators asking for SplitToSlices",
                  generators=("stitch", "tilegraph", "dlight"), selector="blp", tir_pipeline="tvm_ext")
    for preset, count in (("baseline", 0), ("stitch", 1), ("tilegraph", 1), (both, 1)):
        names = [p.info.name for p in preset_passes(preset, target).fuse]
        assert names.count("tvm_ext.SplitToSlices") == count, (preset, names)


def test_tilegraph_connects_the_parts_of_a_split_to_their_readers():
    """GPT-2's QKV split: under ``tilegraph`` no three-kernel split is left between the parts and
    the kernels that read them."""
    from tvm_ext.inspect import inspect

    mod = _func(before, _params())
    report = inspect(mod, target="tvm_ext/h100", preset="tilegraph")
    funcs = [k.func for k in report.launches]
    assert not any(f == "split" or f.startswith("split") for f in funcs), funcs
    assert not any("split" in f and "strided_slice" not in f for f in funcs), funcs
