"""Stitch scope (AStitch §4.1) and the StitchMemoryIntensive Relax pass; CPU numerics against baseline."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ext.driver import preset_pipeline
from tvm_ext.frontend import from_onnx, random_inputs
from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.models import get_model
from tvm_ext.select import GENERATOR_ATTR, SelectionContext, boundary_bytes, plan_of
from tvm_ext.stitch import StitchGenerator, StitchMemoryIntensive, stitch_scope

CPU = tvm.target.Target({"kind": "llvm"})
H100 = tvm.target.Target("tvm_ext/h100")


def _t(shape, dtype="float32"):
    return relax.TensorType(shape, dtype)


def _legalize(mod: tvm.IRModule) -> tvm.IRModule:
    return tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                     relax.transform.FoldConstant()])(mod)


def _build(body, params):
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            out = body(bb, *params)
        bb.emit_func_output(out)
    return bb.get()


def cycle_graph() -> tvm.IRModule:
    """a = exp(x); b = a @ w; c = softmax(b); d = a + c: a and d are memory-intensive but a path
    a -> b (compute) -> c -> d forbids one kernel for them."""
    def body(bb, x, w):
        a = bb.emit(relax.op.exp(x), "a")
        b = bb.emit(relax.op.matmul(a, w), "b")
        c = bb.emit(relax.op.nn.softmax(b), "c")
        return bb.emit_output(relax.op.add(a, c))
    return _build(body, [relax.Var("x", _t((64, 128))), relax.Var("w", _t((128, 128)))])


def remote_graph() -> tvm.IRModule:
    """Two independent chains exp(x) and relu(y) meet only after their matmuls."""
    def body(bb, x, y, w1, w2):
        a = bb.emit(relax.op.exp(x), "a")
        r = bb.emit(relax.op.nn.relu(y), "r")
        m1 = bb.emit(relax.op.matmul(a, w1), "m1")
        m2 = bb.emit(relax.op.matmul(r, w2), "m2")
        return bb.emit_output(relax.op.add(m1, m2))
    return _build(body, [relax.Var("x", _t((64, 128))), relax.Var("y", _t((64, 128))),
                         relax.Var("w1", _t((128, 128))), relax.Var("w2", _t((128, 128)))])


def embedding_graph() -> tvm.IRModule:
    """take (a gather TVM marks opaque) -> add -> layer_norm."""
    def body(bb, table, ids, pos, g, b):
        e = bb.emit(relax.op.take(table, ids, axis=0), "e")
        s = bb.emit(relax.op.add(e, pos), "s")
        return bb.emit_output(relax.op.nn.layer_norm(s, g, b, axes=[-1]))
    return _build(body, [relax.Var("table", _t((100, 64))), relax.Var("ids", _t((8,), "int64")),
                         relax.Var("pos", _t((8, 64))), relax.Var("g", _t((64,))), relax.Var("b", _t((64,)))])


def squeeze_excite_graph() -> tvm.IRModule:
    """EfficientNet's squeeze-excitation: mean -> 1x1 conv -> relu -> 1x1 conv -> sigmoid -> scale.
    The 1x1 convolutions on one pixel are matrix-vector products: memory-bound, so stitched."""
    def body(bb, x, w1, w2):
        s = bb.emit(relax.op.mean(x, axis=[2, 3], keepdims=True), "s")
        h = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(s, w1)), "h")
        e = bb.emit(relax.op.sigmoid(relax.op.nn.conv2d(h, w2)), "e")
        return bb.emit_output(relax.op.multiply(x, e))
    return _build(body, [relax.Var("x", _t((1, 256, 7, 7))), relax.Var("w1", _t((64, 256, 1, 1))),
                         relax.Var("w2", _t((256, 64, 1, 1)))])


def _groups(mod, **kw):
    graph = OpGraph.from_module(_legalize(mod))
    scope = stitch_scope(graph, **kw)
    return graph, [[graph.nodes[n].name for n in g.nodes] for g in scope.groups], scope


def test_compute_bounds_groups_and_convexity():
    graph, groups, scope = _groups(cycle_graph())
    where = {n: i for i, g in enumerate(groups) for n in g}
    assert where["a"] != where[graph.nodes[-1].name]          # a -> b (matmul) -> c -> d: no cycle
    assert where["c"] == where[graph.nodes[-1].name]          # softmax and the add stitch together
    assert all(graph.is_convex(g.nodes) for g in scope.groups)
    assert sorted(len(g) for g in groups) == [1, 1, 2]


def test_remote_stitching_merges_independent_groups():
    _, groups, scope = _groups(remote_graph())
    merged = [g for g in scope.groups if g.kind == "stitch"]
    assert len(merged) == 1 and merged[0].parts == 2
    assert {n for g in groups for n in g if n in ("a", "r")} == {"a", "r"}
    assert any(set(g) == {"a", "r"} for g in groups)
    epilogues = [g for g in scope.groups if g.kind == "epilogue"]
    assert len(epilogues) == 1 and len(epilogues[0].nodes) == 2  # m1 + the add (FuseOps-style epilogue)
    _, separate, _ = _groups(remote_graph(), remote=False)
    assert not any(set(g) == {"a", "r"} for g in separate)


def test_gather_and_matrix_vector_products_are_stitched():
    _, groups, _ = _groups(embedding_graph())
    assert len(groups) == 1 and len(groups[0]) == 3
    graph, groups, scope = _groups(squeeze_excite_graph())
    assert len(groups) == 1 and scope.groups[0].kind == "stitch"
    # all six operators, the two (matrix-vector) 1x1 convolutions included, are the one group
    assert [graph.nodes[n].func_name.rstrip("0123456789") for n in scope.groups[0].nodes] == \
        ["mean", "conv2d", "relu", "conv2d", "tir_sigmoid", "multiply"]
    assert len(graph.nodes) == 6


def test_layout_nodes_join_matmuls():
    mod = from_onnx(get_model("bert_layer"))
    graph, groups, scope = _groups(mod)
    transposes = [g for g in scope.groups if any("transpose" in graph.nodes[n].func_name for n in g.nodes)]
    assert transposes and all(g.kind in ("epilogue", "prologue") for g in transposes)   # no data-movement kernels
    singles = sorted(graph.nodes[g.nodes[0]].func_name for g in scope.groups if g.kind == "single")
    assert singles == ["layer_norm", "layer_norm"]
    prologue = [g for g in scope.groups if g.kind == "prologue"]      # softmax inside the P @ V GEMM
    assert len(prologue) == 1 and graph.nodes[prologue[0].nodes[0]].func_name == "softmax"


def test_pass_emits_primitive_functions_with_plans():
    mod = _legalize(remote_graph())
    out = StitchMemoryIntensive(H100)(mod)
    prims = {gv.name_hint: f for gv, f in out.functions_items()
             if isinstance(f, relax.Function) and f.attrs is not None and "Primitive" in f.attrs}
    generators = {name: str(f.attrs[GENERATOR_ATTR]) for name, f in prims.items()}
    assert sorted(generators.values()) == ["dlight", "stitch"]       # the remote group; m1 + its epilogue add
    stitched = prims[next(k for k, v in generators.items() if v == "stitch")]
    plan = plan_of(stitched)
    assert plan.group == "stitch" and plan.parts == 2
    assert len(stitched.params) == 2                                  # x and y
    assert isinstance(stitched.ret_ty, relax.TupleType) and len(stitched.ret_ty.fields) == 2
    fused = relax.transform.FuseTIR()(out)
    assert not any(isinstance(f, relax.Function) and f.attrs is not None and "Primitive" in f.attrs
                   for _, f in fused.functions_items())


def test_candidates_report_traffic_and_launch():
    mod = _legalize(embedding_graph())
    graph = OpGraph.from_module(mod)
    ctx = SelectionContext(mod, "main", graph, load_device("h100"), H100)
    (cand,) = StitchGenerator().candidates(ctx)
    assert cand.plan.group == "stitch" and len(cand.nodes) == 3 and cand.generator == "stitch"
    unfused = sum(graph.nodes[n].bytes_read + graph.nodes[n].bytes_written for n in cand.nodes)
    # one stage, no global intermediates: the kernel moves its boundary tensors once
    assert cand.global_bytes == boundary_bytes(graph, cand.nodes) < unfused
    assert cand.launch.grid == cand.plan.stitch.grid and cand.launch.grid_syncs == 0


def _run(mod, preset, args):
    ex = tvm.compile(mod, CPU, relax_pipeline=preset_pipeline(preset, CPU))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](*[tvm.runtime.tensor(a) for a in args])
    return [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]


def _random_args(mod, rng):
    args = []
    for p in mod["main"].params:
        shape = [int(d) for d in p.ty.shape.values]
        if str(p.ty.dtype) == "int64":
            args.append(rng.integers(0, 100, size=shape).astype("int64"))
        else:
            args.append(rng.standard_normal(shape).astype(str(p.ty.dtype)))
    return args


@pytest.mark.parametrize("make", [cycle_graph, remote_graph, embedding_graph, squeeze_excite_graph])
def test_synthetic_graphs_match_baseline_on_cpu(make):
    mod = make()
    args = _random_args(mod, np.random.default_rng(0))
    gots, wants = _run(mod, "stitch", args), _run(mod, "baseline", args)
    assert len(gots) == len(wants) == 1  # every graph returns one tensor
    for got, want in zip(gots, wants):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["bert_layer", "mlp", "conv_block", "softmax", "layernorm"])
def test_bundled_models_match_baseline_on_cpu(name):
    mod = from_onnx(get_model(name))
    inputs = random_inputs(mod)
    args = list(inputs.values())
    gots, wants = _run(mod, "stitch", args), _run(mod, "baseline", args)
    assert len(gots) == len(wants) == 1  # every bundled model has one output
    for got, want in zip(gots, wants):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
