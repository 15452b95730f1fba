"""NHWC conversion region by region: layout rules, regions, the transpose bound, numerics, models."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relax, topi
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ext.cutlass import convert_conv_to_nhwc, partition_for_cutlass
from tvm_ext.cutlass.layout_rules import register_layout_rules
from tvm_ext.cutlass.nhwc import convert_regions
from tvm_ext.cutlass.padding import pad_conv_channels
from tvm_ext.cutlass.permutes import fold_permutes
from tvm_ext.frontend import from_onnx
from tvm_ext.models.skeleton import SKELETON_DIR

RNG = np.random.default_rng(0)


def _run(mod: tvm.IRModule, args, target) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()


def _offloaded_convs(mod: tvm.IRModule) -> int:
    part = partition_for_cutlass(pad_conv_channels(mod), ops=("conv2d",))
    return part["main"].script().count("_tvm_ext_cutlass(")


@I.ir_module
class TwoRegions:
    @R.function
    def main(x: R.Tensor((1, 8, 8, 8), "float16"), w1: R.Tensor((16, 8, 3, 3), "float16"),
             w2: R.Tensor((16, 1, 3, 3), "float16")) -> R.Tensor((1, 16, 8, 8), "float16"):
        with R.dataflow():
            y = R.nn.conv2d(x, w1, padding=[1, 1, 1, 1])
            z = R.nn.relu(y)
            r = R.reshape(z, (1, 16, 64))          # no layout rule: ends the region
            r2 = R.reshape(r, (1, 16, 8, 8))
            d = R.nn.conv2d(r2, w2, padding=[1, 1, 1, 1], groups=16)
            R.output(d)
        return d


@I.ir_module
class TwoRegionsConverted:
    @R.function
    def main(x: R.Tensor((1, 8, 8, 8), "float16"), w1: R.Tensor((16, 8, 3, 3), "float16"),
             w2: R.Tensor((16, 1, 3, 3), "float16")) -> R.Tensor((1, 16, 8, 8), "float16"):
        with R.dataflow():
            xt = R.permute_dims(x, axes=[0, 2, 3, 1])
            wt = R.permute_dims(w1, axes=[0, 2, 3, 1])
            y = R.nn.conv2d(xt, wt, padding=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI", out_layout="NHWC")
            z = R.nn.relu(y)
            zt = R.permute_dims(z, axes=[0, 3, 1, 2])
            r = R.reshape(zt, (1, 16, 64))
            r2 = R.reshape(r, (1, 16, 8, 8))
            # a region of depthwise convolutions only: nothing for CUTLASS, stays NCHW
            d = R.nn.conv2d(r2, w2, padding=[1, 1, 1, 1], groups=16)
            R.output(d)
        return d


def test_only_the_region_with_a_dense_conv_is_converted():
    after, regions = convert_regions(TwoRegions)
    tvm.ir.assert_structural_equal(after, TwoRegionsConverted)
    assert [(r.dense, r.converted, r.transposes) for r in regions] == [(1, 1, 2)]


def test_pad_layout_rule_permutes_the_widths():
    register_layout_rules()
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 10, 10), "float16"))
    w = relax.Var("w", relax.TensorType((8, 8, 3, 3), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w))
            y = bb.emit(relax.op.nn.pad(y, [0, 0, 0, 0, 0, 1, 2, 3]))
            out = bb.emit_output(relax.op.nn.conv2d(y, w, strides=2))
        bb.emit_func_output(out)
    after = convert_conv_to_nhwc(bb.get())
    text = after["main"].script()
    assert "pad_width=[0, 0, 0, 1, 2, 3, 0, 0]" in text            # N, H, W, C
    assert text.count('data_layout="NHWC"') == 2
    assert text.count("R.permute_dims(") == 4                     # entry, exit, two weights


def test_permute_chains_fold():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 2, 3, 4), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.permute_dims(x, [0, 3, 1, 2]))
            b = bb.emit(relax.op.permute_dims(a, [0, 2, 3, 1]))   # identity overall
            c = bb.emit(relax.op.permute_dims(b, [0, 3, 1, 2]))
            d = bb.emit(relax.op.permute_dims(c, [1, 0, 2, 3]))
            out = bb.emit_output(relax.Tuple([b, d]))
        bb.emit_func_output(out)
    text = fold_permutes(bb.get())["main"].script()
    assert text.count("R.permute_dims(") == 1 and "axes=[3, 0, 1, 2]" in text


def test_region_needing_many_transposes_stays_nchw(caplog):
    w = relax.const(RNG.integers(-1, 2, (8, 8, 3, 3)).astype("float16"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 10, 10), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w))
            # three opaque readers (reflect pads have no layout rule): three exit transposes + one entry
            outs = [bb.emit_te(topi.nn.mirror_pad, y, [0, 0, k, k], [0, 0, k, k], "REFLECT") for k in (1, 2, 3)]
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    mod = bb.get()
    with caplog.at_level(logging.INFO, logger="tvm_ext.cutlass.nhwc"):
        after = convert_conv_to_nhwc(mod)
    tvm.ir.assert_structural_equal(after, mod)
    assert "left in NCHW" in caplog.text and "4 layout transposes" in caplog.text


def _mobilenet_like_block() -> tuple[tvm.IRModule, list[np.ndarray]]:
    """conv -> ReLU6 (maximum/minimum) -> pad -> depthwise -> ReLU6 -> asymmetric pad -> strided
    conv, fp16 with small integer weights (every sum is exact in fp16)."""
    w1 = relax.const(RNG.integers(-1, 2, (16, 8, 3, 3)).astype("float16"))
    w2 = relax.const(RNG.integers(-1, 2, (16, 1, 3, 3)).astype("float16"))
    w3 = relax.const(RNG.integers(-1, 2, (8, 16, 1, 1)).astype("float16"))
    zero, six = relax.const(0.0, "float16"), relax.const(6.0, "float16")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 10, 10), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, w1, padding=1))
            y = bb.emit(relax.op.minimum(relax.op.maximum(y, zero), six))
            y = bb.emit(relax.op.nn.pad(y, [0, 0, 0, 0, 1, 1, 1, 1]))
            y = bb.emit(relax.op.nn.conv2d(y, w2, groups=16))
            y = bb.emit(relax.op.minimum(relax.op.maximum(y, zero), six))
            y = bb.emit(relax.op.nn.pad(y, [0, 0, 0, 0, 0, 1, 0, 1]))
            out = bb.emit_output(relax.op.nn.conv2d(y, w3, strides=2))
        bb.emit_func_output(out)
    return bb.get(), [RNG.integers(-2, 3, (1, 8, 10, 10)).astype("float16")]


def test_mobilenet_like_block_converts_whole_and_computes_the_same(llvm_target):
    mod, args = _mobilenet_like_block()
    after = convert_conv_to_nhwc(mod)
    text = after["main"].script()
    assert text.count('data_layout="NHWC"') == 3                  # the depthwise conv inside the region too
    assert text.count("R.permute_dims(") == 2                     # model entry and exit only
    assert _offloaded_convs(after) == 2                           # both dense convs
    ref = _run(mod, args, llvm_target)
    np.testing.assert_array_equal(_run(pad_conv_channels(after), args, llvm_target), ref)
    assert np.abs(ref).max() > 0


SKELETON_DENSE_CONVS = {"efficientnet_b0": 65, "mobilenet_v2": 35, "convnext_t": 4, "segformer_b0": 12}


@pytest.mark.parametrize("name", [
    "convnext_t", "segformer_b0",   # ~10 s each
    pytest.param("efficientnet_b0", marks=pytest.mark.slow), pytest.param("mobilenet_v2", marks=pytest.mark.slow),
])
def test_skeleton_dense_convs_all_offloadable_in_fp16(name):
    mod = from_onnx(SKELETON_DIR / f"{name}_b1_fp32.onnx", fp16=True)
    after, regions = convert_regions(mod)
    assert sum(r.converted for r in regions) == SKELETON_DENSE_CONVS[name]
    assert _offloaded_convs(after) == SKELETON_DENSE_CONVS[name]


def test_global_pool_reads_nchw_and_leaves_the_layout_rule_alone_elsewhere():
    w = relax.Var("w", relax.TensorType((8, 8, 1, 1), "float16"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 6, 6), "float16"))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(relax.op.nn.conv2d(x, w), w))
            pooled = bb.emit(relax.op.mean(y, axis=[2, 3], keepdims=True))
            per_channel = bb.emit(relax.op.mean(y, axis=[1], keepdims=True))
            out = bb.emit_output(relax.Tuple([pooled, per_channel]))
        bb.emit_func_output(out)
    after = convert_conv_to_nhwc(bb.get())
    text = after["main"].script()
    # the pool over H and W gets its input back in NCHW (contiguous reduction); the channel mean stays NHWC
    assert text.count('data_layout="NHWC"') == 2
    assert "axis=[2, 3]" in text and "axis=[3]" in text
    # outside the conversion, TVM's own rule is used: a plain ConvertLayout keeps the pool in NHWC
    plain = relax.transform.ConvertLayout({"relax.nn.conv2d": ["NHWC", "OHWI"]})(bb.get())["main"].script()
    assert "axis=[1, 2]" in plain


def test_weight_permutes_are_applied_on_the_host():
    """The OIHW -> OHWI permute of a converted convolution's weights becomes the permuted constant
    (TVM's FoldConstant built and ran a kernel per weight: 22 s for NAFNet's 632)."""
    from tvm_ext.cutlass.permutes import fold_permutes

    weights = np.arange(2 * 3 * 1 * 2, dtype="float16").reshape(2, 3, 1, 2)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 1, 2, 3), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            w = bb.emit(relax.op.permute_dims(relax.const(weights), [0, 2, 3, 1]))
            out = bb.emit_output(relax.op.add(x, w))
        bb.emit_func_output(out)
    folded = fold_permutes(bb.get())
    bindings = folded["main"].body.blocks[0].bindings
    assert not [b for b in bindings if isinstance(b.value, relax.Call) and b.value.op.name == "relax.permute_dims"]
    (const,) = [b.value for b in bindings if isinstance(b.value, tvm.ir.Constant)] or \
        [a for b in bindings if isinstance(b.value, relax.Call) for a in b.value.args if isinstance(a, tvm.ir.Constant)]
    np.testing.assert_array_equal(const.value.numpy(), weights.transpose(0, 2, 3, 1))
