"""GEMM extents CUTLASS cannot take for their alignment padded to an aligned access (cutlass/gemm_padding.py):
structure, partition and CPU numerics."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from cutlass_graphs import offloaded as _offloaded
from cutlass_graphs import run_llvm as _run
from tvm import relax

from tvm_ext.cutlass.gemm_padding import pad_gemm_extents

RNG = np.random.default_rng(0)


def _weight_model(n: int, dense: bool, k: int = 64) -> tvm.IRModule:
    """x[2, 8, k] @ W with a constant weight of ``n`` columns: ``[k, n]``, or a dense layer's ``[n, k]``
    (small integers keep fp16 sums exact)."""
    w = RNG.integers(-1, 2, (n, k) if dense else (k, n)).astype("float16")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8, k), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            rhs = bb.emit(relax.op.permute_dims(relax.const(w), [1, 0])) if dense else relax.const(w)
            out = bb.emit_output(bb.emit(relax.op.matmul(x, rhs)))
        bb.emit_func_output(out)
    return bb.get()


def _activation_model(k: int, n: int) -> tvm.IRModule:
    """x[2, 8, k] @ y[k, n], both activations."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8, k), "float16"))
    y = relax.Var("y", relax.TensorType((k, n), "float16"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.matmul(x, y)))
        bb.emit_func_output(out)
    return bb.get()


def _attention_model(tokens: int = 29, head: int = 16) -> tvm.IRModule:
    """ViT-style attention core at an odd token count: (q @ k^T) then p @ v, all activations."""
    bb = relax.BlockBuilder()
    q, k, v = (relax.Var(n, relax.TensorType((2, tokens, head), "float16")) for n in "qkv")
    with bb.function("main", [q, k, v]):
        with bb.dataflow():
            scores = bb.emit(relax.op.matmul(q, bb.emit(relax.op.permute_dims(k, [0, 2, 1]))))
            out = bb.emit_output(bb.emit(relax.op.matmul(scores, v)))
        bb.emit_func_output(out)
    return bb.get()






@pytest.mark.parametrize("dense", [False, True], ids=["matmul", "dense"])
def test_constant_weight_with_odd_columns_is_a_dense_layer_writing_them_all(dense, llvm_target):
    """GPT-2's head has N = 50257: here 57 columns. The weight is stored [N, K] (transposed at
    compile time when it was [K, N]), CUTLASS writes the 57 columns with one-element stores: no
    padded columns, no slice, the same product."""
    mod = _weight_model(57, dense)
    padded = pad_gemm_extents(mod)
    script = padded["main"].script()
    assert "R.strided_slice(" not in script and "R.nn.pad(" not in script, script
    assert "R.permute_dims(" in script
    (wl,) = _offloaded(padded)
    assert (wl.op, wl.n, wl.k, wl.max_alignment) == ("dense", 57, 64, (8, 8, 1))
    if dense:
        tvm.ir.assert_structural_equal(padded, mod)      # already a dense layer: CUTLASS takes it now
    x = RNG.integers(-2, 3, (2, 8, 64)).astype("float16")
    out = _run(padded, [x], llvm_target)
    assert out.shape == (2, 8, 57)
    np.testing.assert_array_equal(out, _run(mod, [x], llvm_target))


def test_activation_columns_padded_and_the_product_sliced_back(llvm_target):
    """B is an activation [K, N] with N = 57: its rows are N long, so N is padded to 64 and the
    product sliced back."""
    mod = _activation_model(64, 57)
    padded = pad_gemm_extents(mod)
    script = padded["main"].script()
    assert "R.strided_slice(" in script and "(57,)" in script and "R.nn.pad(" in script, script
    assert [w.n for w in _offloaded(padded)] == [64] and not _offloaded(mod)
    x_val = RNG.integers(-2, 3, (2, 8, 64)).astype("float16")
    y_val = RNG.integers(-1, 2, (64, 57)).astype("float16")
    np.testing.assert_array_equal(_run(padded, [x_val, y_val], llvm_target), _run(mod, [x_val, y_val], llvm_target))


def test_odd_token_attention_padded_on_both_gemms(llvm_target):
    """q @ k^T: N = 29 -> 32 (k^T padded, scores sliced); p @ v: K = 29 -> 32 (both padded)."""
    mod = _attention_model()
    padded = pad_gemm_extents(mod)
    script = padded["main"].script()
    assert script.count("R.nn.pad(") == 3 and script.count("R.strided_slice(") == 1, script
    assert sorted((w.n, w.k) for w in _offloaded(padded)) == [(16, 32), (32, 16)] and not _offloaded(mod)
    args = [RNG.integers(-2, 3, (2, 29, 16)).astype("float16") for _ in range(3)]
    out = _run(padded, args, llvm_target)
    assert out.shape == (2, 29, 16)
    np.testing.assert_array_equal(out, _run(mod, args, llvm_target))


def test_window_attention_padded_to_the_widest_access_within_the_share(llvm_target):
    """Swin's 7x7 windows: 49 tokens. 56 (one 128-bit access) would add 14% (MAX_EXTRA_SHARE is
    1/8); 52 adds 6%, so both products are padded to 52 and CUTLASS reads them 4 halves at a
    time (alignment 4)."""
    mod = _attention_model(tokens=49, head=32)
    padded = pad_gemm_extents(mod)
    script = padded["main"].script()
    assert script.count("R.nn.pad(") == 3 and script.count("R.strided_slice(") == 1, script
    workloads = sorted(_offloaded(padded), key=lambda w: w.n)
    assert [(w.n, w.k) for w in workloads] == [(32, 52), (52, 32)] and not _offloaded(mod)
    assert [w.max_alignment for w in workloads] == [(4, 8, 8), (8, 4, 4)]
    args = [RNG.integers(-2, 3, (2, 49, 32)).astype("float16") for _ in range(3)]
    out = _run(padded, args, llvm_target)
    assert out.shape == (2, 49, 32)
    np.testing.assert_array_equal(out, _run(mod, args, llvm_target))


@pytest.mark.parametrize("model", [lambda: _weight_model(64, dense=False), lambda: _weight_model(58, dense=False),
                                   lambda: _activation_model(64, 7)], ids=["aligned", "cutlass-takes-it", "narrow"])
def test_not_padded(model):
    """64 and 58 CUTLASS takes as they are; an activation's 7 -> 8, the least any alignment
    needs, would be 14% more work (MAX_EXTRA_SHARE)."""
    mod = model()
    tvm.ir.assert_structural_equal(pad_gemm_extents(mod), mod)


def test_one_extent_padded_only_when_the_other_then_suits_cutlass():
    """K = 101 could take 3 zeros, but an activation's N = 7 would need 1 (14%): CUTLASS would
    refuse the GEMM either way, so neither is padded. With a constant weight N = 7 is no obstacle
    (stored [N, K]): K is padded and the weight transposed."""
    mod = _activation_model(101, 7)
    tvm.ir.assert_structural_equal(pad_gemm_extents(mod), mod)
    padded = pad_gemm_extents(_weight_model(7, dense=False, k=101))
    (wl,) = _offloaded(padded)
    assert (wl.op, wl.n, wl.k) == ("dense", 7, 104)


def test_a_bias_after_padded_columns_is_added_before_the_slice(llvm_target):
    """x @ y + b with N = 45: y gets 3 zero columns, the bias 3 zeros, and the slice back to 45
    columns follows the add, so CUTLASS takes the bias as its epilogue (it took the product alone
    when the slice sat between them)."""
    b = RNG.integers(-2, 3, (45,)).astype("float16")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8, 64), "float16"))
    y = relax.Var("y", relax.TensorType((64, 45), "float16"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, y)), relax.const(b))))
        bb.emit_func_output(out)
    mod = bb.get()
    padded = pad_gemm_extents(mod)
    (wl,) = _offloaded(padded)
    assert wl.n == 48 and wl.epilogue.source == "bias"
    script = padded["main"].script()
    assert script.count("R.strided_slice(") == 1 and script.index("R.add(") < script.index("R.strided_slice(")
    args = [RNG.integers(-2, 3, (2, 8, 64)).astype("float16"), RNG.integers(-1, 2, (64, 45)).astype("float16")]
    np.testing.assert_array_equal(_run(padded, args, llvm_target), _run(mod, args, llvm_target))
