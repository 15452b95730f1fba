"""Per-channel constant scales folded into the convolution's weight (cutlass/fold_scales.py): structure,
what CUTLASS then takes, CPU numerics, and what is left alone."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from cutlass_graphs import offloaded as _offloaded
from cutlass_graphs import run_llvm as _run
from tvm import relax

from tvm_ext.cutlass.fold_scales import fold_channel_scales

RNG = np.random.default_rng(0)
SHAPE = (1, 8, 8, 16)


def _weight() -> np.ndarray:
    return RNG.integers(-1, 2, (32, 3, 3, 16)).astype("float16")


def _vector(shape=(1, 1, 1, 32), low=-2, high=3) -> np.ndarray:
    return RNG.integers(low, high, shape).astype("float16")


def _powers_of_two(shape=(1, 1, 1, 32)) -> np.ndarray:
    """Scales whose products with small integers are exact in fp16."""
    return RNG.choice(np.array([0.5, 1.0, 2.0], "float16"), shape)


def _conv(x, w):
    return relax.op.nn.conv2d(x, relax.const(w), padding=1, data_layout="NHWC", kernel_layout="OHWI")


def _module(body) -> tvm.IRModule:
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(SHAPE, "float16"))
    r = relax.Var("r", relax.TensorType((1, 8, 8, 32), "float16"))
    with bb.function("main", [x, r]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x, r))
        bb.emit_func_output(out)
    return bb.get()






def _args():
    return [RNG.integers(-2, 3, SHAPE).astype("float16"), RNG.integers(-2, 3, (1, 8, 8, 32)).astype("float16")]


def test_a_batch_norm_left_as_multiply_and_add_becomes_the_weight_and_a_bias(llvm_target):
    """DETR-R50's frozen batch norms: conv -> * scale -> + shift -> relu. Folded, CUTLASS takes the
    shift and the relu as its epilogue (before: the convolution alone)."""
    w, s, t = _weight(), _powers_of_two(), _vector()
    mod = _module(lambda bb, x, r: bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(
        bb.emit(relax.op.multiply(bb.emit(_conv(x, w)), relax.const(s))), relax.const(t))))))
    folded = fold_channel_scales(mod)
    expected = _module(lambda bb, x, r: bb.emit(relax.op.nn.relu(bb.emit(relax.op.add(
        bb.emit(_conv(x, (w.astype("float32") * s.reshape(32, 1, 1, 1).astype("float32")).astype("float16"))),
        relax.const(t))))))
    tvm.ir.assert_structural_equal(folded, expected)
    (before,) = _offloaded(mod)
    (after,) = _offloaded(folded)
    assert before.epilogue.source == "none" and after.epilogue.source == "bias" and after.epilogue.activation == "relu"
    args = _args()
    ref = _run(mod, args, llvm_target)
    np.testing.assert_array_equal(_run(folded, args, llvm_target), ref)
    assert np.abs(ref).max() > 0


def test_a_scale_after_the_bias_scales_both_and_leaves_a_bias_residual_epilogue(llvm_target):
    """NAFNet's blocks: (conv + b) * beta + residual -> conv(W * beta) + b * beta + residual."""
    w, b, beta = _weight(), _vector(), _powers_of_two()
    mod = _module(lambda bb, x, r: bb.emit(relax.op.add(bb.emit(relax.op.multiply(
        relax.const(beta), bb.emit(relax.op.add(bb.emit(_conv(x, w)), relax.const(b))))), r)))
    folded = fold_channel_scales(mod)
    script = folded["main"].script()
    assert "R.multiply" not in script and script.count("R.add(") == 2
    (wl,) = _offloaded(folded)
    assert wl.epilogue.source == "bias_residual"
    args = _args()
    np.testing.assert_array_equal(_run(folded, args, llvm_target), _run(mod, args, llvm_target))


def test_one_number_scales_every_channel(llvm_target):
    w = _weight()
    mod = _module(lambda bb, x, r: bb.emit(relax.op.multiply(bb.emit(_conv(x, w)), relax.const(np.float16(2.0)))))
    folded = fold_channel_scales(mod)
    assert "R.multiply" not in folded["main"].script()
    args = _args()
    np.testing.assert_array_equal(_run(folded, args, llvm_target), _run(mod, args, llvm_target))


@pytest.mark.parametrize("case", ["scale_is_a_parameter", "conv_read_twice", "scale_over_rows", "weight_is_a_parameter",
                                  "float16_overflows", "float16_flushes_to_zero"])
def test_left_alone(case: str):
    w, s = _weight(), _powers_of_two()
    if case.startswith("float16"):      # the folded weight must hold W * s: 65504 is float16's largest
        if case == "float16_overflows":
            s, w = np.full((1, 1, 1, 32), 60000.0, "float16"), (w * 2).astype("float16")
        else:                           # 2**-24, float16's smallest subnormal, times 0.5 rounds to 0
            s, w = np.full((1, 1, 1, 32), 2.0 ** -24, "float16"), (w * 0.5).astype("float16")
        s[..., 0] = 1.0
    if case == "scale_is_a_parameter":      # NAFNet's channel attention: computed at run time
        mod = _module(lambda bb, x, r: bb.emit(relax.op.multiply(bb.emit(_conv(x, w)), r)))
    elif case == "conv_read_twice":
        def body(bb, x, r):
            c = bb.emit(_conv(x, w))
            return bb.emit(relax.op.add(bb.emit(relax.op.multiply(c, relax.const(s))), c))
        mod = _module(body)
    elif case.startswith("float16"):
        mod = _module(lambda bb, x, r: bb.emit(relax.op.multiply(bb.emit(_conv(x, w)), relax.const(s))))
    elif case == "scale_over_rows":
        mod = _module(lambda bb, x, r: bb.emit(relax.op.multiply(bb.emit(_conv(x, w)),
                                                                 relax.const(_powers_of_two((1, 8, 1, 1))))))
    else:
        bb = relax.BlockBuilder()
        x = relax.Var("x", relax.TensorType(SHAPE, "float16"))
        wv = relax.Var("w", relax.TensorType(w.shape, "float16"))
        with bb.function("main", [x, wv]):
            with bb.dataflow():
                c = bb.emit(relax.op.nn.conv2d(x, wv, padding=1, data_layout="NHWC", kernel_layout="OHWI"))
                out = bb.emit_output(bb.emit(relax.op.multiply(c, relax.const(s))))
            bb.emit_func_output(out)
        mod = bb.get()
    tvm.ir.assert_structural_equal(fold_channel_scales(mod), mod)


@pytest.mark.parametrize("dense", [False, True], ids=["matmul_KN", "dense_NK"])
def test_a_layer_scale_after_a_linear_layer_is_folded_into_its_weight(dense, llvm_target):
    """ConvNeXt's ``gamma * (x @ W + b)``: the scale goes into W's columns (a dense layer's rows)."""
    w = RNG.integers(-1, 2, (32, 16) if dense else (16, 32)).astype("float16")
    b, gamma = _vector((32,)), _powers_of_two((32,))

    def body(bb, x, r):
        weight = bb.emit(relax.op.permute_dims(relax.const(w), [1, 0])) if dense else relax.const(w)
        y = bb.emit(relax.op.add(relax.const(b), bb.emit(relax.op.matmul(x, weight))))
        return bb.emit(relax.op.multiply(relax.const(gamma), y))

    mod = _module(body)
    folded = fold_channel_scales(mod)
    assert "R.multiply" not in folded["main"].script()
    (wl,) = _offloaded(folded)
    assert wl.epilogue.source == "bias"
    args = _args()
    np.testing.assert_array_equal(_run(folded, args, llvm_target), _run(mod, args, llvm_target))
