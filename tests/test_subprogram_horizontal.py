"""SOUFFLE's horizontal transform: the Relax pass (Q/K/V, gate/up) and the TE form of Fig. 3."""
from __future__ import annotations

import logging

import numpy as np
import pytest
import tvm
from tvm import relax, te
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ext.analysis import func_access_maps
from tvm_ext.subprogram import HORIZONTAL_ATTR, HorizontalMatmul
from tvm_ext.subprogram.te_horizontal import stack_computes

LLVM = tvm.target.Target({"kind": "llvm"})


@I.ir_module
class QKV:
    @R.function
    def main(x: R.Tensor((1, 8, 16), "float32"), wq: R.Tensor((16, 16), "float32"), wk: R.Tensor((16, 16), "float32"),
             wv: R.Tensor((16, 8), "float32"), bq: R.Tensor((16,), "float32"), bk: R.Tensor((16,), "float32"),
             bv: R.Tensor((8,), "float32")):
        with R.dataflow():
            q0 = R.matmul(x, wq)
            q = R.add(bq, q0)                 # the bias first, as the ONNX importer writes it
            k0 = R.matmul(x, wk)
            k = R.add(k0, bk)
            v0 = R.matmul(x, wv)
            v = R.add(v0, bv)
            s = R.matmul(q, R.permute_dims(k, [0, 2, 1]))
            o = R.matmul(s, v)
            R.output(o)
        return o


@I.ir_module
class QKVExpected:
    @R.function
    def main(x: R.Tensor((1, 8, 16), "float32"), wq: R.Tensor((16, 16), "float32"), wk: R.Tensor((16, 16), "float32"),
             wv: R.Tensor((16, 8), "float32"), bq: R.Tensor((16,), "float32"), bk: R.Tensor((16,), "float32"),
             bv: R.Tensor((8,), "float32")):
        with R.dataflow():
            w = R.concat((wq, wk, wv), axis=-1)
            mm = R.matmul(x, w)
            b = R.concat((bq, bk, bv), axis=0)
            y = R.add(mm, b)
            q = R.strided_slice(y, axes=[2], begin=[0], end=[16])
            k = R.strided_slice(y, axes=[2], begin=[16], end=[32])
            v = R.strided_slice(y, axes=[2], begin=[32], end=[40])
            s = R.matmul(q, R.permute_dims(k, [0, 2, 1]))
            o = R.matmul(s, v)
            R.output(o)
        return o


def test_qkv_block_becomes_one_matmul_with_offsets():
    """Q/K/V with variable weights: one concat of the weights and of the biases, one matmul, one
    add, and a slice per branch at its column offset (N = 16, 16, 8: offsets 0, 16, 32)."""
    out = HorizontalMatmul()(QKV)
    tvm.ir.assert_structural_equal(out["main"], QKVExpected["main"])
    assert str(out.attrs[HORIZONTAL_ATTR]) == "3/1"


@I.ir_module
class Linear:
    @R.function
    def main(x: R.Tensor((8, 16), "float32"), wq: R.Tensor((16, 16), "float32"), wk: R.Tensor((8, 16), "float32")):
        with R.dataflow():
            q = R.matmul(x, R.permute_dims(wq))   # Linear layers: y = x W^T, the transpose bound first
            k = R.matmul(x, R.permute_dims(wk))
            o = R.add(R.sum(q, axis=[1]), R.sum(k, axis=[1]))
            R.output(o)
        return o


@I.ir_module
class LinearExpected:
    @R.function
    def main(x: R.Tensor((8, 16), "float32"), wq: R.Tensor((16, 16), "float32"), wk: R.Tensor((8, 16), "float32")):
        with R.dataflow():
            tq = R.permute_dims(wq)
            tk = R.permute_dims(wk)
            w = R.concat((tq, tk), axis=-1)
            mm = R.matmul(x, w)
            q = R.strided_slice(mm, axes=[1], begin=[0], end=[16])
            k = R.strided_slice(mm, axes=[1], begin=[16], end=[24])
            o = R.add(R.sum(q, axis=[1]), R.sum(k, axis=[1]))
            R.output(o)
        return o


def test_linear_layers_weights_transposed_in_front():
    """``matmul(x, permute_dims(w))`` branches: the transposes, bound after the first matmul in
    the importers' order, move in front of the concat and their bindings go."""
    out = HorizontalMatmul()(Linear)
    tvm.ir.assert_structural_equal(out["main"], LinearExpected["main"])


def _run(mod: tvm.IRModule, *args: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, LLVM), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _constant_model(widths: list[int], bias: list[bool], act: bool, transposed: bool = False) -> tvm.IRModule:
    """x @ W_i (+ b_i) per branch with constant weights (``transposed``: as ``permute_dims(W_i^T)``),
    branches summed after a per-branch op."""
    rng = np.random.default_rng(len(widths))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 8, 32), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            outs = []
            for n, has_bias in zip(widths, bias):
                w = rng.standard_normal((32, n)).astype("float32")
                rhs = bb.emit(relax.op.permute_dims(relax.const(w.T.copy()))) if transposed else relax.const(w)
                y = bb.emit(relax.op.matmul(x, rhs))
                if has_bias:
                    b = relax.const(rng.standard_normal((1, 1, n)).astype("float32"))
                    y = bb.emit(relax.op.add(b, y))
                if act:
                    y = bb.emit(relax.op.nn.silu(y))
                outs.append(bb.emit(relax.op.sum(y, axis=[-1])))
            total = outs[0]
            for o in outs[1:]:
                total = bb.emit(relax.op.add(total, o))
            result = bb.emit_output(total)
        bb.emit_func_output(result)
    return bb.get()


@pytest.mark.parametrize("widths,bias,act,transposed", [
    ([16, 16, 16], [True, True, True], False, False),      # BERT's Q/K/V
    ([24, 8, 8], [False, False, False], False, False),     # LLaMA's Q/K/V (GQA: different N)
    ([24, 24], [False, False], True, False),               # gate/up, activation on one branch each
    ([16, 8], [True, False], False, False),                # one bias: the adds stay on their branch
    ([16, 16, 16], [True, True, True], False, True),       # Linear layers: permute_dims(W^T) folded
])
def test_constant_weights_numerics(widths, bias, act, transposed):
    """Constant weights are concatenated at compile time; the transformed module computes the
    same outputs as the original on the CPU."""
    mod = _constant_model(widths, bias, act, transposed)
    out = HorizontalMatmul()(mod)
    calls = [b.value.op.name for blk in out["main"].body.blocks for b in blk.bindings
             if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]
    assert calls.count("relax.matmul") == 1 and "relax.concat" not in calls and "relax.permute_dims" not in calls
    assert calls.count("relax.strided_slice") == len(widths)
    assert calls.count("relax.add") == (len(widths) - 1) + (1 if all(bias) else sum(bias))
    x = np.random.default_rng(7).standard_normal((2, 8, 32)).astype("float32")
    np.testing.assert_allclose(_run(out, x), _run(mod, x), rtol=1e-5, atol=1e-4)


@I.ir_module
class Dependent:
    @R.function
    def main(x: R.Tensor((16, 16), "float32"), w: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            w2 = R.multiply(a, R.const(2.0, "float32"))
            b = R.matmul(x, w2)          # its weight is computed from the first branch
            R.output(b)
        return b


def test_what_it_cannot_combine_is_left_unchanged(caplog):
    """A branch whose weight depends on another branch is left as it is (and said so)."""
    with caplog.at_level(logging.INFO, logger="tvm_ext.subprogram.horizontal"):
        out = HorizontalMatmul()(Dependent)
    tvm.ir.assert_structural_equal(out["main"], Dependent["main"])
    assert str(out.attrs[HORIZONTAL_ATTR]) == "0/0"
    assert "computed after the group's first matmul" in caplog.text


def test_bert_base_qkv_is_one_gemm_per_layer():
    """BERT-base s128 fp16: 12 layers x (Q, K, V) -> 12 GEMMs; 96 matmuls become 72."""
    from tvm_ext.frontend import from_onnx
    from tvm_ext.models.skeleton import SKELETON_DIR

    mod = from_onnx(str(SKELETON_DIR / "bert_base_s128_b1_fp32.onnx"), fp16=True)
    out = HorizontalMatmul()(mod)
    assert str(out.attrs[HORIZONTAL_ATTR]) == "36/12"
    widths = [b.value.ty.shape.values[-1] for blk in out["main"].body.blocks for b in blk.bindings
              if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
              and b.value.op.name == "relax.matmul"]
    assert len(widths) == 72 and sum(int(w) == 2304 for w in widths) == 12


def _fig3():
    A1, B1 = te.placeholder((4, 8), name="A1"), te.placeholder((8, 16), name="B1")
    A2, B2 = te.placeholder((2, 8), name="A2"), te.placeholder((8, 16), name="B2")
    rk = te.reduce_axis((0, 8), name="rk")
    C1 = te.compute((4, 16), lambda i, j: te.sum(A1[i, rk] * B1[rk, j], axis=[rk]), name="C1")
    rk2 = te.reduce_axis((0, 8), name="rk")
    C2 = te.compute((2, 16), lambda i, j: te.sum(A2[i, rk2] * B2[rk2, j], axis=[rk2]), name="C2")
    return (A1, B1, A2, B2), C1, C2


def test_fig3_two_gemms_stacked_with_the_offset():
    """Fig. 3: (4, 16) and (2, 16) GEMMs with equal reduce extents become one (6, 16) TE; rows 4
    and 5 read A2 at ``i - 4`` (the figure omits the offset), checked on the access map and
    numerically."""
    inputs, C1, C2 = _fig3()
    C = stack_computes([C1, C2], axis=0)
    assert [int(d) for d in C.shape] == [6, 16]
    func = te.create_prim_func([*inputs, C])
    (a2_read,) = func_access_maps(func)["horizontal"].accesses["A2"]
    assert str(a2_read.indices[0]) == "o0 - 4"
    lib = tvm.compile(func, LLVM)
    rng = np.random.default_rng(0)
    a1, b1, a2, b2 = (rng.standard_normal(s).astype("float32") for s in [(4, 8), (8, 16), (2, 8), (8, 16)])
    out = tvm.runtime.tensor(np.zeros((6, 16), "float32"))
    lib(*[tvm.runtime.tensor(v) for v in (a1, b1, a2, b2)], out)
    np.testing.assert_allclose(out.numpy(), np.concatenate([a1 @ b1, a2 @ b2]), rtol=1e-5, atol=1e-5)


def test_fig3_refuses_unequal_reduce_extents():
    A = te.placeholder((4, 8), name="A")
    B = te.placeholder((2, 6), name="B")
    r1, r2 = te.reduce_axis((0, 8), name="r1"), te.reduce_axis((0, 6), name="r2")
    C1 = te.compute((4,), lambda i: te.sum(A[i, r1], axis=[r1]), name="C1")
    C2 = te.compute((2,), lambda i: te.sum(B[i, r2], axis=[r2]), name="C2")
    with pytest.raises(ValueError, match="reduction extents differ"):
        stack_computes([C1, C2])


def _priced_by_matmuls(seconds_per_matmul: float, calls: list):
    """A stand-in graph stage: the 'selection' costs ``seconds_per_matmul`` per matmul left."""
    import json

    from tvm_ext.select.attrs import SELECTION_ATTR

    @tvm.transform.module_pass(opt_level=0, name="PriceMatmuls")
    def price(mod, ctx):
        calls.append(1)
        n = sum(1 for blk in mod["main"].body.blocks for b in blk.bindings
                if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)
                and b.value.op.name == "relax.matmul")
        return mod.with_attr(SELECTION_ATTR, json.dumps({"main": {"objective_s": n * seconds_per_matmul + 1e-5}}))

    return price


@pytest.mark.parametrize("per_matmul,kept", [(1e-6, True), (-1e-6, False)])
def test_cheaper_of_keeps_the_transform_only_when_priced_lower(per_matmul, kept):
    """The driver's one "cheaper of two graphs" mechanism: the graph stage runs on both modules
    and the lower objective wins (a tie would undo the horizontal transform)."""
    import json

    from tvm_ext.driver.graph_choice import HORIZONTAL_CHOICE_ATTR, CheaperOf

    calls: list = []
    out = CheaperOf("horizontal", HORIZONTAL_CHOICE_ATTR, HorizontalMatmul(), [_priced_by_matmuls(per_matmul, calls)])(QKV)
    choice = json.loads(str(out.attrs[HORIZONTAL_CHOICE_ATTR]))
    assert choice["kept"] is kept and len(calls) == 2
    assert (choice["with_s"] < choice["without_s"]) is kept
    assert (HORIZONTAL_ATTR in out.attrs) is kept


def test_cheaper_of_runs_once_when_nothing_changes():
    from tvm_ext.driver.graph_choice import HORIZONTAL_CHOICE_ATTR, CheaperOf

    calls: list = []
    CheaperOf("horizontal", HORIZONTAL_CHOICE_ATTR, HorizontalMatmul(), [_priced_by_matmuls(1e-6, calls)])(Dependent)
    assert len(calls) == 1


def test_full_preset_decides_and_matches_the_original_on_cpu():
    """``full`` has the horizontal flag; its CPU build of a constant-weight Q/K/V block records the
    decision, keeps the cheaper graph and computes what the original module computes."""
    import json

    from tvm_ext.driver import build, get_preset
    from tvm_ext.driver.graph_choice import HORIZONTAL_CHOICE_ATTR

    assert get_preset("full").horizontal and not get_preset("stitch").horizontal
    mod = _constant_model([16, 16, 16], [True, True, True], False)
    staged = build(mod, LLVM, "full")
    choice = json.loads(str(staged.graph.attrs[HORIZONTAL_CHOICE_ATTR]))
    assert choice["kept"] == (choice["with_s"] < choice["without_s"])
    x = np.random.default_rng(3).standard_normal((2, 8, 32)).astype("float32")
    got = relax.VirtualMachine(staged.executable, tvm.cpu())["main"](tvm.runtime.tensor(x)).numpy()
    np.testing.assert_allclose(got, _run(mod, x), rtol=1e-5, atol=1e-4)
