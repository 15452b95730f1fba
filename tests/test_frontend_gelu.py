"""GELU written out in elementary operators becomes one R.nn.gelu / R.nn.gelu_tanh (frontend/gelu.py)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ext.frontend import from_onnx
from tvm_ext.frontend.gelu import FuseGelu
from tvm_ext.testing.onnx_graphs import onnx_model, tensor_info
from tvm_ext.testing.oracle import onnxruntime_outputs

CLEAN = tvm.transform.Sequential([FuseGelu(), relax.transform.DeadCodeElimination(["main"])])


@I.ir_module
class ErfWrittenOut:
    """BERT's export: x / sqrt(2), erf, + 1, * x, * 0.5."""

    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            a = R.divide(x, R.const(1.4142135381698608, "float32"))
            b = R.erf(a)
            c = R.add(b, R.const(1.0, "float32"))
            d = R.multiply(x, c)
            e = R.multiply(d, R.const(0.5, "float32"))
            R.output(e)
        return e


@I.ir_module
class ErfOtherOrder:
    """The same with x * (1 / sqrt(2)), 1 + erf, and 0.5 * x grouped first."""

    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            a = R.multiply(R.const(0.70710677, "float32"), x)
            b = R.erf(a)
            c = R.add(R.const(1.0, "float32"), b)
            h = R.multiply(R.const(0.5, "float32"), x)
            e = R.multiply(c, h)
            R.output(e)
        return e


@I.ir_module
class Gelu:
    @R.function
    def main(x: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            e = R.nn.gelu(x)
            R.output(e)
        return e


@I.ir_module
class TanhWrittenOut:
    """GPT-2's export (x ** 3 as x * x * x here), between the reshapes of its Conv1D."""

    @R.function
    def main(y: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            x = R.reshape(y, R.shape([1, 4, 8]))
            sq = R.multiply(x, x)
            p = R.multiply(sq, x)
            q = R.multiply(p, R.const(0.044714998453855515, "float32"))
            s = R.add(x, q)
            t = R.multiply(s, R.const(0.79788458347320557, "float32"))
            u = R.tanh(t)
            h = R.multiply(x, R.const(0.5, "float32"))
            o = R.add(u, R.const(1.0, "float32"))
            r = R.multiply(h, o)
            z = R.reshape(r, R.shape([4, 8]))
            R.output(z)
        return z


@I.ir_module
class GeluTanhBeforeTheReshapes:
    @R.function
    def main(y: R.Tensor((4, 8), "float32")) -> R.Tensor((4, 8), "float32"):
        with R.dataflow():
            g = R.nn.gelu_tanh(y)
            r = R.reshape(g, R.shape([1, 4, 8]))
            z = R.reshape(r, R.shape([4, 8]))
            R.output(z)
        return z


@pytest.mark.parametrize("before", [ErfWrittenOut, ErfOtherOrder], ids=["bert-export", "other-order"])
def test_erf_form_becomes_one_gelu(before):
    tvm.ir.assert_structural_equal(CLEAN(before), Gelu)


def test_tanh_form_becomes_gelu_tanh_applied_before_the_reshape():
    tvm.ir.assert_structural_equal(CLEAN(TanhWrittenOut), GeluTanhBeforeTheReshapes)


def _erf_gelu(scale: float = 1.4142135381698608, erf_of_other: bool = False, dtype: str = "float32") -> tvm.IRModule:
    """``x * (erf(v / scale) + 1) * 0.5`` with ``v = x``, or another input (``erf_of_other``), its
    constants stored in ``dtype`` as an export in that dtype holds them."""
    bb = relax.BlockBuilder()
    ty = relax.TensorType((4, 8), dtype)
    x, y = relax.Var("x", ty), relax.Var("y", ty)
    with bb.function("main", [x, y] if erf_of_other else [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.divide(y if erf_of_other else x, relax.const(scale, dtype)))
            c = bb.emit(relax.op.add(bb.emit(relax.op.erf(a)), relax.const(1.0, dtype)))
            e = bb.emit(relax.op.multiply(bb.emit(relax.op.multiply(x, c)), relax.const(0.5, dtype)))
            out = bb.emit_output(e)
        bb.emit_func_output(out)
    return bb.get()


def test_the_builder_writes_what_the_export_holds():
    tvm.ir.assert_structural_equal(CLEAN(_erf_gelu()), Gelu)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_an_export_in_a_narrow_float_is_recognised(dtype):
    """sqrt(2) rounds to 1.4140625 in float16 (1.1e-4 off) and to 1.4140625 in bfloat16 too:
    within the constant's own rounding, not within float32's tolerance."""
    body = CLEAN(_erf_gelu(dtype=dtype))["main"].body.blocks[0].bindings
    assert [b.value.op.name for b in body] == ["relax.nn.gelu"]


@pytest.mark.parametrize("mod", [_erf_gelu(scale=1.5), _erf_gelu(erf_of_other=True)],
                         ids=["scale-1.5", "erf-of-another-tensor"])
def test_what_is_not_gelu_is_left_alone(mod):
    tvm.ir.assert_structural_equal(CLEAN(mod), mod)


def _ffn_model() -> tuple:
    """MatMul + bias, then GELU written out as torch exports it before opset 20."""
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32) * 0.3, "w")
    b = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b")
    consts = [numpy_helper.from_array(np.array(v, np.float32), n)
              for n, v in (("sqrt2", 1.4142135381698608), ("one", 1.0), ("half", 0.5))]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["mm"]), helper.make_node("Add", ["b", "mm"], ["h"]),
             helper.make_node("Div", ["h", "sqrt2"], ["s"]), helper.make_node("Erf", ["s"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["p"]), helper.make_node("Mul", ["h", "p"], ["q"]),
             helper.make_node("Mul", ["q", "half"], ["y"])]
    model = onnx_model(nodes, [tensor_info("x", [2, 8, 16])], [tensor_info("y", [2, 8, 32], TensorProto.FLOAT)],
                       [w, b, *consts])
    return model, {"x": rng.standard_normal((2, 8, 16)).astype(np.float32)}


def test_an_imported_ffn_holds_one_gelu_and_matches_onnxruntime(llvm_target):
    model, feeds = _ffn_model()
    mod = from_onnx(model)
    ops = [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
           if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    assert "relax.nn.gelu" in ops and "relax.erf" not in ops, ops
    out = relax.VirtualMachine(tvm.compile(mod, llvm_target), tvm.cpu())["main"](tvm.runtime.tensor(feeds["x"]))
    np.testing.assert_allclose(out.numpy(), onnxruntime_outputs(model, feeds)[0], rtol=1e-5, atol=1e-5)
