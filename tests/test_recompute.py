"""Recomputation: a cheap node with several readers computed inside each reading kernel (Korch §5).

``Masked``: a float16 mask is cast to float32 and added to two GEMM results. Computed once, the
cast is a kernel of its own whose output both GEMM kernels read back; recomputed, each GEMM
kernel casts the mask itself and the cast's kernel disappears. The BLP solver's side is pinned
against a brute-force oracle in ``test_blp.py``; here the candidates, the selection, the
emitted module and the CPU numerics.
"""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ext.driver import build, get_preset
from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.select import SelectionContext, get_generator
from tvm_ext.select.attrs import SELECTION_ATTR
from tvm_ext.select.recompute import recomputable_nodes, recomputing_candidates
from tvm_ext.testing.oracle import run_cpu

H100 = tvm.target.Target("tvm_ext/h100")
CPU = tvm.target.Target({"kind": "llvm"})
#: ``full`` without its convex-set, tile-graph and merged-kernel candidates, which find other covers
#: of this small graph (the cast fused into one GEMM kernel that writes it for the other; the mask
#: add connected into each GEMM's tile kernel, the cast alone; the whole graph as one grid-synced
#: kernel running both GEMMs side by side): recomputation alone.
FULL = dataclasses.replace(get_preset("full"), name="test_full_fixed_groups",
                           generators=tuple(g for g in get_preset("full").generators
                                            if not g.startswith("orchestrate") and g not in ("tilegraph", "subprogram")))


def _masked(with_mask_output: bool) -> tvm.IRModule:
    """x1 @ w1 + cast(m) and x2 @ w2 + cast(m), each through a softmax (and the cast returned too)."""
    f32 = lambda *shape: relax.TensorType(shape, "float32")  # noqa: E731
    x1, w1, x2, w2 = (relax.Var(n, f32(*s)) for n, s in
                      [("x1", (64, 128)), ("w1", (128, 128)), ("x2", (64, 128)), ("w2", (128, 128))])
    m = relax.Var("m", relax.TensorType((1, 128), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x1, w1, x2, w2, m]):
        with bb.dataflow():
            mask = bb.emit(relax.op.astype(m, "float32"), "mask")
            outs = []
            for x, w in ((x1, w1), (x2, w2)):
                y = bb.emit(relax.op.add(bb.emit(relax.op.matmul(x, w)), mask))
                outs.append(bb.emit_output(relax.op.nn.softmax(y, axis=-1)))
            if with_mask_output:
                outs.append(bb.emit_output(mask))
        bb.emit_func_output(relax.Tuple(outs))
    return bb.get()


def _calls(mod: tvm.IRModule) -> list[tuple[str, list[str]]]:
    """(callee, argument names) of every call_tir in ``main``."""
    out = []
    for binding in mod["main"].body.blocks[0].bindings:
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.args[0], tvm.ir.GlobalVar):
            out.append((value.args[0].name_hint, [a.name for a in value.args[1].fields]))
    return out


def _inputs() -> dict[str, np.ndarray]:
    """In parameter order (a built VM takes them by position)."""
    rng = np.random.default_rng(0)
    out = {}
    for k in ("1", "2"):
        out["x" + k] = rng.standard_normal((64, 128)).astype("float32")
        out["w" + k] = (rng.standard_normal((128, 128)) / 11).astype("float32")
    out["m"] = rng.standard_normal((1, 128)).astype("float16")
    return out


def _reference(inputs) -> list[np.ndarray]:
    mask = inputs["m"].astype("float32")
    out = []
    for k in ("1", "2"):
        y = inputs["x" + k] @ inputs["w" + k] + mask
        e = np.exp(y - y.max(axis=-1, keepdims=True))
        out.append(e / e.sum(axis=-1, keepdims=True))
    return out


def test_the_shared_cast_is_recomputable_and_extends_both_gemm_kernels():
    legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(_masked(False)))
    graph = OpGraph.from_module(legal)
    ctx = SelectionContext(legal, "main", graph, load_device("h100"), H100)
    cands = get_generator("dlight").candidates(ctx)
    (cast,) = [n.index for n in graph.nodes if n.func_name == "cast"]
    assert recomputable_nodes(ctx, cands) == {cast}      # the adds and matmuls have one reader each
    grown = recomputing_candidates(ctx, cands)
    assert grown and all(c.recomputes == (cast,) and cast in c.nodes for c in grown)
    compute = [c for c in grown if c.plan.group == "compute"]
    assert len(compute) == 2 and all(c.plan.rule == "Matmul" for c in compute)
    # a recomputing kernel reads the float16 mask and writes only its own result
    for c in compute:
        assert "m" in c.inputs and not any(graph.tensors[t].producer == cast for t in c.outputs)


def test_full_recomputes_the_cast_and_drops_its_kernel():
    staged = build(_masked(False), H100, FULL)
    report = json.loads(str(staged.graph.attrs[SELECTION_ATTR]))["main"]
    assert report["recomputing"] == 2 and any("1 node(s) recomputed" in n for n in report["notes"])
    calls = _calls(staged.graph)
    assert [args for _, args in calls][:2] == [["m", "x1", "w1"], ["m", "x2", "w2"]]
    assert not any(name == "cast" for name, _ in calls)
    assert len(calls) == 3                                 # two GEMM kernels and the softmaxes


@pytest.mark.parametrize("with_mask_output", [False, True], ids=["recomputed", "also-an-output"])
def test_recomputed_graph_matches_numpy_on_the_cpu(with_mask_output):
    mod = _masked(with_mask_output)
    staged = build(mod, CPU, FULL)
    if with_mask_output:        # the mask is needed outside every kernel: some kernel writes it
        assert any("cast" in name for name, _ in _calls(staged.graph))
    inputs = _inputs()
    got = run_cpu(relax.VirtualMachine(staged.executable, tvm.cpu()), inputs)
    want = _reference(inputs) + ([inputs["m"].astype("float32")] if with_mask_output else [])
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)
