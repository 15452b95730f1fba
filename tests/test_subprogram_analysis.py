"""SOUFFLE's global analysis: dependence and intensity classes, reuse, and the vertical transform
on the paper's Fig. 4 (with the erratum: the chain reads ``A[2*j, i]``)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
import tvm_ffi
from tvm import relax, te, tirx
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ext.analysis import func_access_maps
from tvm_ext.graph import OpGraph
from tvm_ext.subprogram.te_graph import Dependence, ReuseKind, TEGraph
from tvm_ext.subprogram.vertical import IndexMap, index_map, inline_one_to_one, vertical_chains
from relax_examples import Attention

LLVM = tvm.target.Target({"kind": "llvm"})


def _graph(mod: tvm.IRModule) -> OpGraph:
    return OpGraph.from_module(relax.transform.LegalizeOps()(mod))


def _relu(A):
    return te.compute(A.shape, lambda i, j: tirx.if_then_else(A[i, j] > 0, A[i, j], tirx.const(0, "float32")), name="B")


def _slice(B):
    return te.compute((2, 4), lambda i, j: B[2 * i, j], name="C")     # strided slice


def _permute(C):
    return te.compute((4, 2), lambda i, j: C[j, i], name="D")


def _fig4():
    A = te.placeholder((4, 8), name="A")
    B = _relu(A)
    C = _slice(B)
    return A, B, C, _permute(C)


def _map(stage, in_shape) -> IndexMap:
    """The index map of one TE on its own (its own PrimFunc)."""
    inp = te.placeholder(in_shape, name="inp")
    out = stage(inp)
    return index_map(func_access_maps(te.create_prim_func([inp, out]))[out.op.name], "inp")


def test_fig4_maps_compose_consumer_first():
    """Per-TE maps: permute (i, j) -> (j, i), slice (i, j) -> (2i, j), relu identity. Composed from
    the consumer: D[i, j] reads A[2*j, i], M = [[0, 2], [1, 0]]. The paper's order (Perm . Slice)
    gives its misprinted A[j, 2*i]."""
    A, _, _, D = _fig4()
    perm, slc, relu = _map(_permute, (2, 4)), _map(_slice, (4, 8)), _map(_relu, (4, 8))
    assert perm.matrix() == (((0, 1), (1, 0)), (0, 0))
    assert slc.matrix() == (((2, 0), (0, 1)), (0, 0))
    composed = perm.compose(slc).compose(relu)
    assert composed.matrix() == (((0, 2), (1, 0)), (0, 0))
    assert composed(3, 1) == (2, 3)
    wrong = slc.compose(perm)          # the paper's order, on C's coordinates
    assert wrong.matrix() == (((0, 1), (2, 0)), (0, 0))
    # the same map as the analysis layer's composition through a whole PrimFunc
    whole = index_map(func_access_maps(te.create_prim_func([A, D]))["D"], "A")
    assert all(whole(i, j) == composed(i, j) for i in range(4) for j in range(2))


def test_fig4_chain_inlined_is_relu_of_a_2j_i():
    """The vertical transform in TVM: the chain inlined into one block reading A[2*j, i]; checked
    numerically against relu(A[2*j, i])."""
    A, _, _, D = _fig4()
    func = inline_one_to_one(te.create_prim_func([A, D]))
    blocks: list = []
    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlock, lambda b: blocks.append(b.name_hint)))
    assert [b for b in blocks if b != "root"] == ["D"]
    lib = tvm.compile(func, LLVM)
    a = np.random.default_rng(0).standard_normal((4, 8)).astype("float32")
    out = tvm.runtime.tensor(np.zeros((4, 2), "float32"))
    lib(tvm.runtime.tensor(a), out)
    expected = np.array([[max(a[2 * j, i], 0.0) for j in range(2)] for i in range(4)], "float32")
    np.testing.assert_array_equal(out.numpy(), expected)


@I.ir_module
class Small:
    @R.function
    def main(x: R.Tensor((8, 16), "float32"), w: R.Tensor((16, 32), "float32"), b: R.Tensor((32,), "float32"),
             ids: R.Tensor((4,), "int64")):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.add(y, b)
            r = R.reshape(z, (8, 4, 8))
            p = R.permute_dims(r, [1, 0, 2])
            e = R.exp(p)
            s = R.sum(e, axis=[2])
            g = R.take(s, ids, axis=0)
            R.output(g)
        return g


def test_dependence_and_intensity_classes():
    """GEMM and sum: one-relies-on-many; bias add, reshape, permute, exp: one-relies-on-one; take
    by indices: opaque. Only the GEMM reaches 3 operations per element (2*16 per output)."""
    graph = _graph(Small)
    teg = TEGraph(graph)
    by_output = {(e.tensor, e.output): e.dependence for e in teg.edges}
    assert by_output[("x", "y")] is Dependence.ONE_ON_MANY
    assert by_output[("w", "y")] is Dependence.ONE_ON_MANY
    assert by_output[("y", "z")] is Dependence.ONE_ON_ONE and by_output[("b", "z")] is Dependence.ONE_ON_ONE
    assert by_output[("z", "r")] is Dependence.ONE_ON_ONE and by_output[("r", "p")] is Dependence.ONE_ON_ONE
    assert by_output[("e", "s")] is Dependence.ONE_ON_MANY
    assert by_output[("s", "g")] is Dependence.OPAQUE
    ci = {graph.nodes[i].outputs[0] for i in range(len(graph)) if teg.compute_intensive(i)}
    assert ci == {"y"}
    mm = graph.node("y").index
    assert teg.intensity(mm) == pytest.approx(2 * 8 * 32 * 16 / (8 * 16 + 16 * 32 + 8 * 32))
    assert teg.dependence(graph.node("g").index) is Dependence.OPAQUE


def test_vertical_chain_attaches_to_the_gemm():
    """bias add -> reshape -> permute -> exp after the GEMM is one chain attached to it; the
    composed map reads y[i1, 8*i0 + i2] and the bias at b[8*i0 + i2]."""
    graph = _graph(Small)
    (chain,) = vertical_chains(TEGraph(graph))
    assert [graph.nodes[i].outputs[0] for i in chain.nodes] == ["z", "r", "p", "e"]
    assert chain.source == "y" and chain.output == "e" and chain.attach == graph.node("y").index
    assert chain.index_map.matrix() == (((0, 1, 0), (8, 0, 1)), (0, 0))
    assert chain.side_reads["b"].matrix() == (((8, 0, 1),), (0,))


def test_reuse_spatial_qkv_then_temporal_residual():
    """x is read by Q, K, V (independent: spatial) and by the residual add that depends on them:
    temporal, with the independent set (Q, K, V) kept as the horizontal opportunity."""
    graph = _graph(Attention)
    reuse = {r.tensor: r for r in TEGraph(graph).reuse()}
    qkv = tuple(graph.node(n).index for n in ("q", "k", "v"))
    assert reuse["x"].kind is ReuseKind.TEMPORAL
    assert reuse["x"].spatial_sets == (qkv,)
    assert reuse["x"].independent[1] == (graph.node("res").index,)


@I.ir_module
class TwoStepRNN:
    @R.function
    def main(x1: R.Tensor((1, 16), "float32"), x2: R.Tensor((1, 16), "float32"), h0: R.Tensor((1, 16), "float32"),
             w: R.Tensor((16, 16), "float32"), u: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            a1 = R.matmul(x1, w)
            b1 = R.matmul(h0, u)
            h1 = R.tanh(R.add(a1, b1))
            a2 = R.matmul(x2, w)
            b2 = R.matmul(h1, u)
            h2 = R.tanh(R.add(a2, b2))
            R.output(h2)
        return h2


def test_reuse_temporal_recurrent_weight_spatial_input_weight():
    """An unrolled 2-step RNN: the recurrent weight u is read at step 2 by a node depending on
    step 1 (temporal: keep it on chip); the input weight w is read by two independent GEMMs
    (spatial: the horizontal transform's case)."""
    reuse = {r.tensor: r for r in TEGraph(_graph(TwoStepRNN)).reuse()}
    assert reuse["u"].kind is ReuseKind.TEMPORAL and not reuse["u"].spatial_sets
    assert reuse["w"].kind is ReuseKind.SPATIAL and len(reuse["w"].spatial_sets[0]) == 2


def test_live_range():
    graph = _graph(TwoStepRNN)
    teg = TEGraph(graph)
    start, end = teg.live_range("h1")
    assert start == teg.position[graph.tensors["h1"].producer]
    assert end == max(teg.position[c] for c in graph.tensors["h1"].consumers)
    assert teg.live_range("u")[0] == -1 and teg.live_range("h2")[1] == len(graph)
