"""The selection and the report price a kernel's arithmetic in one dtype, by one rule (issue 36:
BERT-large's orchestrate selection priced a GEMM-with-cast kernel in float16 and its report in
float32, the dtype of its last parameter)."""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.script import relax as R

from tvm_ext.graph import OpGraph, weighted_dtype
from tvm_ext.inspect import inspect
from tvm_ext.select.candidate import dominant_dtype

H100 = tvm.target.Target("tvm_ext/h100")


@tvm.script.ir_module
class GemmThenCast:
    """A half-precision GEMM whose result leaves the kernel as float32."""

    @R.function
    def main(x: R.Tensor((128, 768), "float16"), w: R.Tensor((768, 768), "float16")):
        with R.dataflow():
            y = R.matmul(x, w)
            o = R.astype(y, "float32")
            R.output(o)
        return o


def test_the_flop_weighted_dtype_ignores_non_floats_and_breaks_ties_toward_the_output():
    assert weighted_dtype([("float16", 1000), ("float32", 10)]) == "float16"
    assert weighted_dtype([("float16", 0), ("float32", 0)]) == "float32"
    assert weighted_dtype([("int64", 10**6), ("float16", 1)]) == "float16"
    assert weighted_dtype([]) == "float32"


def test_a_gemm_with_a_cast_is_priced_in_the_gemms_dtype_by_selection_and_report():
    legal = relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(GemmThenCast))
    graph = OpGraph.from_module(legal)
    assert dominant_dtype(graph, range(len(graph.nodes))) == "float16"
    report = inspect(GemmThenCast, H100, "baseline")
    (launch,) = [k for k in report.launches if k.measurement]
    assert launch.measurement["dtype"] == "float16"
