"""Kernels the build turns into views are priced with no launch, whichever generator proposed
them (tvm_ext/select/views.py: TVM's RewriteDataflowReshape on the scheduled function)."""
from __future__ import annotations

import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.inspect import inspect
from tvm_ext.select import SelectionContext, get_generator
from tvm_ext.select.analytic import AnalyticCostModel
from tvm_ext.select.views import as_view, is_view

H100 = tvm.target.Target("tvm_ext/h100")


@tvm.script.ir_module
class ReshapeBetween:
    """A reshape between two kernels (a view in the build) and one that is the function's output
    (a kernel: TVM rewrites only reshapes into dataflow variables)."""

    @R.function
    def main(x: R.Tensor((64, 256), "float16"), w: R.Tensor((256, 256), "float16")):
        with R.dataflow():
            y = R.matmul(x, w)
            r = R.reshape(y, (64, 16, 16))
            s = R.nn.softmax(r, axis=-1)
            o = R.reshape(s, (64, 256))
            R.output(o)
        return o


def test_a_reshape_the_build_makes_a_view_is_priced_as_none():
    """Whichever generator proposed it (the selection spine prices every candidate so)."""
    legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(ReshapeBetween))
    ctx = SelectionContext(legal, "main", OpGraph.from_module(legal), load_device("h100"), H100)
    node = {ctx.graph.nodes[n].func_name: n for n in ctx.call_nodes()}
    gen, model = get_generator("dlight"), AnalyticCostModel()
    inner = as_view(ctx, gen.candidate(ctx, (node["reshape"],), "single", "test"))
    last = as_view(ctx, gen.candidate(ctx, (node["reshape1"],), "single", "test"))
    assert is_view(ctx, (node["reshape"],)) and inner.launch.kernels == 0
    assert model.cost(inner, ctx.device).seconds == 0.0
    assert not is_view(ctx, (node["reshape1"],)) and last.launch.kernels == 1
    assert not is_view(ctx, (node["matmul"],))
    # the selection priced what was built
    report = inspect(ReshapeBetween, H100, "full")
    assert report.selection["main"]["objective_s"] == pytest.approx(report.modelled_time_s, rel=1e-6)


@tvm.script.ir_module
class TransposeRoundTrip:
    """Segformer's patch-embedding reshape: transpose, reshape, transpose keeps the element order."""

    @R.function
    def main(x: R.Tensor((1, 1024, 32), "float16")):
        with R.dataflow():
            a = R.exp(x)
            u = R.permute_dims(R.reshape(R.permute_dims(a, (0, 2, 1)), (1, 32, 32, 32)), (0, 2, 3, 1))
            v = R.permute_dims(R.reshape(R.permute_dims(a, (0, 2, 1)), (1, 32, 32, 32)), (0, 3, 2, 1))
            o = R.add(R.exp(u), v)
            R.output(o)
        return o


def test_a_data_movement_chain_that_keeps_the_element_order_is_a_view():
    legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(TransposeRoundTrip))
    ctx = SelectionContext(legal, "main", OpGraph.from_module(legal), load_device("h100"), H100)
    (exp,) = [n for n in ctx.call_nodes() if ctx.graph.nodes[n].func_name == "tir_exp"]
    chains = []
    for first in ctx.graph.consumers(exp):          # transpose -> reshape -> transpose, twice
        (second,) = ctx.graph.consumers(first)
        (third,) = ctx.graph.consumers(second)
        chains.append((first, second, third))
    keeps, reorders = sorted(chains, key=lambda c: ctx.graph.nodes[c[2]].func_name)   # (0, 2, 3, 1) first
    assert is_view(ctx, keeps)
    assert not is_view(ctx, reorders)            # the same elements in another order: a kernel
    assert not is_view(ctx, keeps[:1])
