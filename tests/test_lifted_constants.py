"""Structural rewrites with the weights as parameters for the while (frontend/lifted_constants.py)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax

from tvm_ext.errors import TvmExtError
from tvm_ext.frontend.gelu import FuseGelu
from tvm_ext.frontend.lifted_constants import WithConstantsAsParams

CLEANUPS = tvm.transform.Sequential([
    FuseGelu(), relax.transform.RemoveRedundantReshape(), relax.transform.CanonicalizeBindings(),
    relax.transform.EliminateCommonSubexpr(), relax.transform.DeadCodeElimination(["main"]),
])


def _module() -> tvm.IRModule:
    """A GEMM whose weight (a large constant, read twice) feeds a written-out GELU through a
    reshape pair, a duplicated computation, and a scalar the GELU pattern must still see."""
    rng = np.random.default_rng(0)
    weight = relax.const(rng.standard_normal((64, 64)).astype("float32"))
    bias = relax.const(rng.standard_normal((64,)).astype("float32"))
    x = relax.Var("x", relax.TensorType([8, 64], "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.add(relax.op.matmul(x, weight), bias))
            twin = bb.emit(relax.op.add(relax.op.matmul(x, weight), bias))
            r = bb.emit(relax.op.reshape(relax.op.reshape(y, [2, 4, 64]), [8, 64]))
            e = bb.emit(relax.op.erf(relax.op.divide(r, relax.const(1.4142135, "float32"))))
            g = bb.emit(relax.op.multiply(relax.op.multiply(r, relax.op.add(e, relax.const(1.0, "float32"))),
                                          relax.const(0.5, "float32")))
            out = bb.emit_output(relax.op.add(g, twin))
        bb.emit_func_output(out)
    return bb.get()


def _constants(func: relax.Function) -> list[np.ndarray]:
    found = []

    def visit(expr):
        if isinstance(expr, tvm.ir.Constant) and hasattr(expr.value, "numpy"):
            found.append(expr.value.numpy())

    relax.analysis.post_order_visit(func, visit)
    return found


def test_same_module_as_the_passes_alone():
    mod = _module()
    expected = CLEANUPS(mod)
    got = WithConstantsAsParams(CLEANUPS, min_bytes=1024)(mod)
    tvm.ir.assert_structural_equal(got, expected)
    assert "R.nn.gelu(" in got.script()              # the scalar 0.5 / 1 / sqrt(2) stayed constants
    assert len(got["main"].params) == 1              # the lifted weight and bias are bound back
    assert any(c.shape == (64, 64) for c in _constants(got["main"]))


def test_one_tensor_is_one_parameter_while_lifted():
    seen = {}

    @tvm.transform.module_pass(opt_level=0, name="Record")
    def record(mod, ctx):
        seen["params"] = [p.name for p in mod["main"].params]
        return mod

    WithConstantsAsParams(record, min_bytes=1024)(_module())
    assert seen["params"] == ["x", "lifted_constant_0"]   # the weight (read twice); the bias is small


def test_a_pass_that_changes_parameters_is_refused():
    @tvm.transform.module_pass(opt_level=0, name="DropLifted")
    def drop(mod, ctx):
        func = mod["main"]
        body = relax.op.zeros([8, 64], "float32")
        mod = mod.clone()
        mod["main"] = relax.Function(func.params[:1], body, func.ret_ty, func.is_pure, func.attrs)
        return mod

    # raised inside a pass: TVM's pass infrastructure hands it on as a RuntimeError
    with pytest.raises((TvmExtError, RuntimeError), match="DropLifted changed the parameters of 'main'"):
        WithConstantsAsParams(drop, min_bytes=1024)(_module())


def test_module_without_large_constants_runs_the_passes_as_they_are():
    mod = _module()
    tvm.ir.assert_structural_equal(WithConstantsAsParams(CLEANUPS, min_bytes=1 << 30)(mod), CLEANUPS(mod))
    assert not tvm_ffi.structural_equal(CLEANUPS(mod), mod)
