"""The importer's call_tir Pad and Clip lifted to Relax operators; zero pads folded into convs."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import tvm
from onnx import TensorProto, helper
from tvm import relax, topi
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ext.frontend import from_onnx
from tvm_ext.frontend.clip import lift_min_max
from tvm_ext.frontend.pad import FoldPadIntoConv, lift_pad
from tvm_ext.frontend.te_calls import LiftTECalls

LIFT = tvm.transform.Sequential([LiftTECalls([lift_pad, lift_min_max]), relax.transform.CanonicalizeBindings(),
                               relax.transform.DeadCodeElimination(["main"])])


def _importer_style_module() -> tvm.IRModule:
    """What the ONNX importer emits for Pad (asymmetric, and of width zero) and Clip(0, 6)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 5, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            p = bb.emit_te(topi.nn.pad, x, [0, 0, 0, 0], [0, 0, 1, 1], 0.0)
            same = bb.emit_te(topi.nn.pad, p, [0, 0, 0, 0], [0, 0, 0, 0], 0.0)
            lo = bb.emit_te(topi.maximum, same, relax.const(0.0, "float32"))
            hi = bb.emit_te(topi.minimum, lo, 6.0)
            out = bb.emit_output(hi)
        bb.emit_func_output(out)
    return bb.get()


@I.ir_module
class Lifted:
    @R.function
    def main(x: R.Tensor((1, 4, 5, 5), "float32")) -> R.Tensor((1, 4, 6, 6), "float32"):
        with R.dataflow():
            p = R.nn.pad(x, pad_width=[0, 0, 0, 0, 0, 1, 0, 1], pad_mode="constant", pad_value=0.0)
            lo = R.maximum(p, R.const(0.0, "float32"))
            hi = R.minimum(lo, R.const(6.0, "float32"))
            R.output(hi)
        return hi


def test_importer_pad_and_clip_become_relax_ops():
    after = LIFT(_importer_style_module())
    tvm.ir.assert_structural_equal(after, Lifted)


def test_lifted_ops_compute_the_same_values(llvm_target):
    before = _importer_style_module()
    x = np.random.default_rng(0).uniform(-3, 9, (1, 4, 5, 5)).astype("float32")
    outs = [relax.VirtualMachine(tvm.compile(m, llvm_target), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
            for m in (before, LIFT(before))]
    np.testing.assert_array_equal(outs[0], outs[1])


def test_mirror_pad_and_nonconstant_pads_stay_opaque():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 4, 5, 5), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            m = bb.emit_te(topi.nn.mirror_pad, x, [0, 0, 1, 1], [0, 0, 1, 1], "REFLECT")
            e = bb.emit_te(topi.nn.replicate_pad, m, [0, 0, 1, 1], [0, 0, 1, 1])
            out = bb.emit_output(e)
        bb.emit_func_output(out)
    mod = bb.get()
    tvm.ir.assert_structural_equal(LiftTECalls([lift_pad, lift_min_max])(mod), mod)


@I.ir_module
class PadThenConv:
    @R.function
    def main(x: R.Tensor((1, 8, 6, 6), "float32"), w: R.Tensor((8, 8, 3, 3), "float32")
             ) -> R.Tuple(R.Tensor((1, 8, 6, 6), "float32"), R.Tensor((1, 8, 3, 3), "float32")):
        with R.dataflow():
            p = R.nn.pad(x, pad_width=[0, 0, 0, 0, 1, 1, 1, 1], pad_mode="constant", pad_value=0.0)
            same = R.nn.conv2d(p, w)
            q = R.nn.pad(x, pad_width=[0, 0, 0, 0, 0, 1, 0, 1], pad_mode="constant", pad_value=0.0)
            down = R.nn.conv2d(q, w, strides=[2, 2])
            out = (same, down)
            R.output(out)
        return out


@I.ir_module
class PadFolded:
    @R.function
    def main(x: R.Tensor((1, 8, 6, 6), "float32"), w: R.Tensor((8, 8, 3, 3), "float32")
             ) -> R.Tuple(R.Tensor((1, 8, 6, 6), "float32"), R.Tensor((1, 8, 3, 3), "float32")):
        with R.dataflow():
            same = R.nn.conv2d(x, w, padding=[1, 1, 1, 1])
            # asymmetric (TF "same" for stride 2): kept, so the convolution stays implicit-GEMM friendly
            q = R.nn.pad(x, pad_width=[0, 0, 0, 0, 0, 1, 0, 1], pad_mode="constant", pad_value=0.0)
            down = R.nn.conv2d(q, w, strides=[2, 2])
            out = (same, down)
            R.output(out)
        return out


def test_symmetric_zero_pad_folds_into_the_conv():
    after = relax.transform.DeadCodeElimination(["main"])(FoldPadIntoConv(PadThenConv))
    tvm.ir.assert_structural_equal(after, PadFolded)


def _onnx_conv_pad_clip_model(rng) -> onnx.ModelProto:
    w1 = rng.standard_normal((16, 8, 3, 3)).astype("float32")
    w2 = rng.standard_normal((16, 1, 3, 3)).astype("float32")
    w3 = rng.standard_normal((8, 16, 1, 1)).astype("float32")
    inits = [onnx.numpy_helper.from_array(a, n) for a, n in ((w1, "w1"), (w2, "w2"), (w3, "w3"))]
    inits += [onnx.numpy_helper.from_array(np.array(v, np.float32), n) for v, n in ((0.0, "lo"), (6.0, "hi"))]
    inits.append(onnx.numpy_helper.from_array(np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64), "same"))
    inits.append(onnx.numpy_helper.from_array(np.array([0, 0, 0, 0, 0, 0, 1, 1], np.int64), "tf_same"))
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["c1", "lo", "hi"], ["r1"]),                  # ReLU6
        helper.make_node("Pad", ["r1", "same"], ["p1"]),
        helper.make_node("Conv", ["p1", "w2"], ["c2"], group=16),               # depthwise
        helper.make_node("Clip", ["c2", "lo", "hi"], ["r2"]),
        helper.make_node("Pad", ["r2", "tf_same"], ["p2"]),
        helper.make_node("Conv", ["p2", "w3"], ["y"], strides=[2, 2]),
    ]
    graph = helper.make_graph(nodes, "conv_pad_clip", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 10, 10])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_imported_pad_and_clip_match_onnxruntime(llvm_target):
    rng = np.random.default_rng(0)
    model = _onnx_conv_pad_clip_model(rng)
    mod = from_onnx(model)
    text = mod["main"].script()
    assert "R.call_tir" not in text and text.count("R.nn.pad") == 1   # the symmetric pad joined the conv
    x = rng.standard_normal((1, 8, 10, 10)).astype("float32")
    got = relax.VirtualMachine(tvm.compile(mod, llvm_target), tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    ref = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_fp16_import_keeps_pad_and_clip_in_fp16():
    mod = from_onnx(_onnx_conv_pad_clip_model(np.random.default_rng(0)), fp16=True)
    text = mod["main"].script()
    assert "R.call_tir" not in text and '"float32"' not in text
