"""OpGraph over a small legalized Relax module: nodes, classes, costs, order, convexity, groups."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ext.graph import DEFAULT_INTENSITY_THRESHOLD, OpClass, OpGraph, TensorKind


def _t(shape, dtype="float32"):
    return relax.TensorType(shape, dtype)


def _module() -> tvm.IRModule:
    """matmul -> bias add -> softmax -> layer_norm -> transpose -> reshape -> add const -> split -> add halves."""
    bb = relax.BlockBuilder()
    x, w, bias = relax.Var("x", _t((4, 8))), relax.Var("w", _t((8, 16))), relax.Var("bias", _t((16,)))
    g, be = relax.Var("g", _t((16,))), relax.Var("be", _t((16,)))
    with bb.function("main", [x, w, bias, g, be]):
        with bb.dataflow():
            mm = bb.emit(relax.op.matmul(x, w), "mm")
            ba = bb.emit(relax.op.add(mm, bias), "ba")
            sm = bb.emit(relax.op.nn.softmax(ba), "sm")
            ln = bb.emit(relax.op.nn.layer_norm(sm, g, be, axes=[-1]), "ln")
            tr = bb.emit(relax.op.permute_dims(ln, [1, 0]), "tr")
            rs = bb.emit(relax.op.reshape(tr, (8, 8)), "rs")
            ad = bb.emit(relax.op.add(rs, relax.const(np.ones((8, 8), "float32"))), "ad")
            sp = bb.emit(relax.op.split(ad, 2, axis=1), "sp")
            out = bb.emit_output(relax.op.add(relax.TupleGetItem(sp, 0), relax.TupleGetItem(sp, 1)))
        bb.emit_func_output(out)
    return relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(bb.get()))


@pytest.fixture(scope="module")
def mod() -> tvm.IRModule:
    return _module()


@pytest.fixture(scope="module")
def graph(mod) -> OpGraph:
    return OpGraph.from_module(mod)


def _ix(graph: OpGraph, *names: str) -> list[int]:
    return [graph.node(n).index for n in names]


def test_nodes_and_tensors(mod, graph):
    assert [n.name for n in graph.nodes] == ["mm", "ba", "sm", "ln", "tr", "rs", "ad", "sp", "gv"]
    assert [n.func_name for n in graph.nodes][:4] == ["matmul", "add", "softmax", "layer_norm"]
    assert graph.node("ln").inputs == ("sm", "g", "be")
    assert graph.node("sp").outputs == ("sp.0", "sp.1")
    assert graph.node("gv").inputs == ("sp.0", "sp.1")
    assert graph.tensors["sp.0"].shape == (8, 4) and graph.tensors["sp.0"].consumers == (8,)
    kinds = {n: t.kind for n, t in graph.tensors.items()}
    assert kinds["x"] == TensorKind.INPUT and kinds["gv"] == TensorKind.OUTPUT
    assert kinds["mm"] == TensorKind.INTERMEDIATE
    const = [n for n, k in kinds.items() if k == TensorKind.CONSTANT]
    assert len(const) == 1 and graph.tensors[const[0]].consumers == (graph.node("ad").index,)
    assert graph.tensors["mm"].nbytes == 4 * 16 * 4
    assert all(isinstance(n.func, tvm.tirx.PrimFunc) and n.func.same_as(mod[n.func_name]) for n in graph.nodes)


def test_op_classes(graph):
    classes = {n.name: n.op_class for n in graph.nodes}
    assert classes == {
        "mm": OpClass.COMPUTE, "ba": OpClass.BROADCAST, "sm": OpClass.REDUCE, "ln": OpClass.REDUCE,
        "tr": OpClass.INJECTIVE, "rs": OpClass.INJECTIVE, "ad": OpClass.ELEMENTWISE,
        "sp": OpClass.INJECTIVE, "gv": OpClass.ELEMENTWISE,
    }
    assert graph.node("mm").pattern == 4 and graph.node("tr").pattern == 2


def test_flops_and_bytes(graph):
    mm = graph.node("mm")
    assert mm.flops == 2 * 4 * 16 * 8
    assert (mm.bytes_read, mm.bytes_written) == ((4 * 8 + 8 * 16) * 4, 4 * 16 * 4)
    assert graph.node("ba").flops == 4 * 16
    assert graph.node("ad").flops == 8 * 8
    assert graph.node("tr").flops == 0
    # softmax on 4x16: max (64) + sub, exp (128) + sum (64) + divide (64)
    assert graph.node("sm").flops == 320
    assert graph.node("ln").bytes_read == (4 * 16 + 16 + 16) * 4
    assert graph.node("sp").bytes_written == 2 * 8 * 4 * 4


def test_memory_intensive_threshold(mod, graph):
    for n in graph.nodes:
        assert n.memory_intensive == (n.arithmetic_intensity < DEFAULT_INTENSITY_THRESHOLD), n.name
    assert graph.node("mm").arithmetic_intensity == pytest.approx(1024 / 896)
    loose = OpGraph.from_module(mod, intensity_threshold=1.0)
    assert not loose.node("mm").memory_intensive           # 1.14 flop/B >= 1.0
    assert loose.node("sm").memory_intensive                # 0.625 flop/B
    # layer norm on 4x16: row sum (1 add x 64) + mean (1 divide x 4) + variance sum (2 subtracts, multiply,
    # add: 4 x 64) + normalise ((x - mean) * rsqrt(var / 16 + eps) * g + b: 7 x 64), over
    # (64 + 16 + 16) * 4 B read + 64 * 4 B written = 640 B
    assert graph.node("ln").flops == 64 + 4 + 4 * 64 + 7 * 64 == 772
    assert graph.node("ln").bytes_read + graph.node("ln").bytes_written == 640
    assert loose.node("ln").memory_intensive is False       # 772 / 640 = 1.21


def test_topological_order_and_neighbours(graph):
    order = graph.topological_order()
    assert sorted(order) == list(range(len(graph)))
    position = {i: p for p, i in enumerate(order)}
    for n in graph.nodes:
        for p in graph.producers(n.index):
            assert position[p] < position[n.index]
    assert graph.producers(graph.node("ln").index) == _ix(graph, "sm")
    assert graph.consumers(graph.node("sp").index) == _ix(graph, "gv")
    assert graph.producers(graph.node("mm").index) == []


def test_is_convex(graph):
    assert graph.is_convex(_ix(graph, "mm", "ba"))
    assert graph.is_convex(_ix(graph, "sm", "ln", "tr"))
    assert graph.is_convex(_ix(graph, "ad", "sp", "gv"))
    assert not graph.is_convex(_ix(graph, "ba", "ln"))            # ba -> sm -> ln leaves and re-enters
    assert not graph.is_convex(_ix(graph, "rs", "gv"))            # rs -> ad -> sp -> gv
    assert graph.is_convex(range(len(graph)))


def test_boundary(graph):
    assert graph.boundary(_ix(graph, "sm", "ln")) == (["ba", "g", "be"], ["ln"])
    assert graph.boundary(_ix(graph, "sp")) == (["ad"], ["sp.0", "sp.1"])
    inputs, outputs = graph.boundary(_ix(graph, "ad", "sp", "gv"))
    assert inputs[0] == "rs" and graph.tensors[inputs[1]].kind == TensorKind.CONSTANT and outputs == ["gv"]


def test_groups_after_fuse_ops(mod):
    fused = OpGraph.from_module(relax.transform.FuseOps()(mod))
    assert len(fused) == 9
    groups = {name: [fused.nodes[i].func_name for i in members] for name, members in fused.groups().items()}
    assert sorted(groups.values()) == sorted([["matmul", "add"], ["softmax"], ["layer_norm"],
                                              ["transpose", "reshape", "add1", "split", "add2"]])
    for name, members in fused.groups().items():
        assert fused.is_convex(members), name
    tail = next(m for m in fused.groups().values() if len(m) == 5)
    assert len(fused.boundary(tail)[1]) == 1
    assert all(fused.nodes[i].group is not None for i in tail)
    unfused = OpGraph.from_module(mod)
    assert unfused.groups() == {n.name: [n.index] for n in unfused.nodes}


def test_one_group_per_call_site_of_a_fused_function():
    bb = relax.BlockBuilder()
    x = relax.Var("x", _t((4, 8)))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(x, x)))
        bb.emit_func_output(out)
    base = relax.transform.LegalizeOps()(bb.get())
    base = relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(base))
    fused_gv = next(gv for gv in base.get_global_vars() if gv.name_hint.startswith("fused"))
    bb2 = relax.BlockBuilder(base)
    y = relax.Var("y", _t((4, 8)))
    with bb2.function("twice", [y]):
        with bb2.dataflow():
            a = bb2.emit(relax.Call(fused_gv, [y]))
            out = bb2.emit_output(relax.Call(fused_gv, [a]))
        bb2.emit_func_output(out)
    graph = OpGraph.from_module(bb2.get(), "twice")
    groups = graph.groups()
    assert len(groups) == 2 and sorted(len(m) for m in groups.values()) == [2, 2]
    assert all(graph.is_convex(m) for m in groups.values())


def test_bad_input(mod, graph):
    with pytest.raises(KeyError):
        OpGraph.from_module(mod, "nope")
    with pytest.raises(KeyError):
        graph.node("nope")


def test_scalar_operands_stay_elementwise_column_operands_broadcast():
    bb = relax.BlockBuilder()
    x = relax.Var("x", _t((4, 6)))
    with bb.function("main", [x]):
        with bb.dataflow():
            a = bb.emit(relax.op.add(x, relax.const(np.ones((1, 1), "float32"))), "a")
            b = bb.emit(relax.op.multiply(a, relax.const(np.float32(2.0))), "b")
            c = bb.emit(relax.op.add(b, relax.const(np.ones((4, 1), "float32"))), "c")
            out = bb.emit_output(relax.op.expand_dims(c, 0))
        bb.emit_func_output(out)
    graph = OpGraph.from_module(relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(bb.get())))
    assert [n.op_class for n in graph.nodes] == [OpClass.ELEMENTWISE, OpClass.ELEMENTWISE, OpClass.BROADCAST,
                                                 OpClass.INJECTIVE]


def test_padded_conv2d_is_compute():
    """Legalized conv2d with padding reads its own pad_temp buffer: still a contraction."""
    from tvm.script import relax as R

    @tvm.script.ir_module
    class Conv:
        @R.function
        def main(x: R.Tensor((1, 8, 16, 16), "float32"), w: R.Tensor((16, 8, 3, 3), "float32")):
            with R.dataflow():
                y = R.nn.conv2d(x, w, padding=1)
                R.output(y)
            return y

    legal = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern()])(Conv)
    (node,) = OpGraph.from_module(legal).nodes
    assert node.op_class == OpClass.COMPUTE
    assert node.flops == 2 * 16 * 16 * 16 * 8 * 9


def test_shape_values_carry_no_tensors():
    """shape_of / shape literals are not tensors: they neither fail the graph nor become edges."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((2, 3), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            bb.emit(relax.op.shape_of(x))
            y = bb.emit(relax.op.reshape(x, relax.ShapeExpr([3, 2])))
            out = bb.emit_output(relax.op.add(y, y))
        bb.emit_func_output(out)
    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(),
                                    relax.transform.AnnotateTIROpPattern()])(bb.get())
    graph = OpGraph.from_module(mod)
    assert [n.func_name for n in graph.nodes] == ["relax.shape_of", "reshape", "add"]
    assert graph.nodes[0].outputs == () and graph.consumers(0) == []    # the shape value is no tensor
    y = graph.nodes[1].outputs[0]
    assert graph.nodes[2].inputs == (y, y) and graph.producers(2) == [1]
    assert {n: (t.shape, t.kind) for n, t in graph.tensors.items()} == {
        "x": ((2, 3), TensorKind.INPUT), y: ((3, 2), TensorKind.INTERMEDIATE), "gv": ((3, 2), TensorKind.OUTPUT)}
    assert graph.topological_order() == [0, 1, 2]
    assert graph.nodes[-1].op_class == OpClass.ELEMENTWISE


def _gathers() -> tvm.IRModule:
    """An embedding lookup (take of 128 rows of a 1000 x 64 table), a gather_elements, and an
    add that reads the table whole."""
    bb = relax.BlockBuilder()
    table = relax.Var("table", _t((1000, 64), "float16"))
    ids, idx = relax.Var("ids", _t((1, 128), "int64")), relax.Var("idx", _t((10, 64), "int64"))
    with bb.function("main", [table, ids, idx]):
        with bb.dataflow():
            emb = bb.emit(relax.op.take(table, ids, axis=0), "emb")
            gat = bb.emit(relax.op.gather_elements(table, idx, axis=0), "gat")
            whole = bb.emit(relax.op.add(table, table), "whole")
            out = bb.emit_output(relax.Tuple([emb, gat, whole]))
        bb.emit_func_output(out)
    return relax.transform.LegalizeOps()(bb.get())


def test_gathers_read_what_they_gather_not_the_whole_table():
    graph = OpGraph.from_module(_gathers())
    emb, gat, whole = graph.node("emb"), graph.node("gat"), graph.node("whole")
    table = "table"
    assert graph.tensors[table].nbytes == 1000 * 64 * 2
    # take: one table element per output element (128 x 64), plus the ids read whole
    assert dict(emb.gathered) == {table: 128 * 64 * 2}
    assert emb.bytes_read == 128 * 64 * 2 + 128 * 8
    assert dict(gat.gathered) == {table: 10 * 64 * 2}
    assert whole.gathered == ()
    assert graph.read_bytes(table, [emb.index]) == 128 * 64 * 2
    assert graph.read_bytes(table, [emb.index, gat.index]) == (128 + 10) * 64 * 2
    # a set in which one member reads the table whole reads all of it, once
    assert graph.read_bytes(table, [emb.index, whole.index]) == 1000 * 64 * 2
    assert graph.boundary_bytes([emb.index]) == 128 * 64 * 2 + 128 * 8 + 128 * 64 * 2


def test_components_keep_item_order():
    from tvm_ext.graph import components

    assert components([1, 2, 3, 4, 5], [(3, 1), (5, 3)]) == [[1, 3, 5], [2], [4]]
    assert components("abc", []) == [["a"], ["b"], ["c"]]
