"""A dlight candidate is priced as the report prices the kernel its rule builds (dlight/generator.py)."""
from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.select import SelectionContext, get_generator
from tvm_ext.select.analytic import AnalyticCostModel
from tvm_ext.select.describe import describe_scheduled

H100 = tvm.target.Target("tvm_ext/h100")


@tvm.script.ir_module
class NormThenGemm:
    """GPT-2's pre-norm projection: a layer norm read by a GEMM (orchestrate fuses the pair)."""

    @R.function
    def main(x: R.Tensor((64, 256), "float16"), g: R.Tensor((256,), "float16"), b: R.Tensor((256,), "float16"),
             w: R.Tensor((256, 512), "float16")) -> R.Tensor((64, 512), "float16"):
        with R.dataflow():
            n = R.nn.layer_norm(x, g, b, axes=[-1])
            y = R.matmul(n, w)
            R.output(y)
        return y


def test_candidate_is_priced_as_its_built_kernel():
    legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(NormThenGemm))
    device = load_device("h100")
    ctx = SelectionContext(legal, "main", OpGraph.from_module(legal), device, H100)
    gen = get_generator("dlight")
    members = tuple(ctx.call_nodes())
    cand = gen.candidate(ctx, members, "orchestrate", "test: norm + GEMM")
    func = ctx.fused_function(members)
    with H100:
        built = gen.schedule(func, cand.plan, device).func
    kernel = describe_scheduled(func, built)
    # the rule recomputes the norm per output: the report prices that, and so must the selection
    assert kernel.executed_flops_ratio > 2.0
    assert cand.flops == pytest.approx(kernel.flops, rel=0.01)
    # its re-reads are loads of tensors it touches once each (they hit L2, as the report says)
    assert cand.global_bytes > kernel.unique_bytes and cand.unique_bytes == kernel.unique_bytes
    assert "priced as built" in cand.provenance
    model = AnalyticCostModel()
    assert model.cost(cand, device).seconds == pytest.approx(model.cost(kernel, device).seconds, rel=0.05)


def test_a_grown_candidate_says_once_how_it_is_priced():
    legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(NormThenGemm))
    ctx = SelectionContext(legal, "main", OpGraph.from_module(legal), load_device("h100"), H100)
    gen = get_generator("dlight")
    norm, gemm = ctx.call_nodes()
    base = gen.candidate(ctx, (norm, gemm), "orchestrate", "test: norm + GEMM")
    grown = gen.extend(ctx, base, ())       # the same kernel, re-planned as an extension is
    assert base.provenance.count("priced as built") == 1
    assert grown.provenance.count("priced as built") == 1 and grown.flops == base.flops
