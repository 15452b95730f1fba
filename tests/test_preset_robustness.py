"""Graphs the ONNX node suite showed a technique cannot take: they go to TVM's default lowering."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_ext.frontend import from_onnx
from tvm_ext.testing.onnx_graphs import onnx_model
from tvm_ext.testing.oracle import build_cpu, run_cpu


def _model(nodes, inputs, outputs, inits=(), opset=13):
    return onnx_model(nodes, inputs, outputs, inits, opset=opset)


@pytest.mark.parametrize("preset", ["stitch", "full"])
def test_empty_tensor_reduction_is_left_to_tvm(preset):
    # ReduceSum over axis 1 of a [2, 0, 4] tensor: a [2, 1, 4] result of zeros
    model = _model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=1)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 0, 4])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 1, 4])],
                   [numpy_helper.from_array(np.array([1], "int64"), "axes")])
    out = run_cpu(build_cpu(from_onnx(model), preset), {"x": np.zeros((2, 0, 4), "float32")})
    np.testing.assert_array_equal(out[0], np.zeros((2, 1, 4), "float32"))


@pytest.mark.parametrize("preset", ["orchestrate", "full"])
def test_sets_fusetir_refuses_are_dropped(preset):
    # ONNX Scatter (opset 10): the importer's reshape views make some convex sets unfusable by FuseTIR
    model = _model([helper.make_node("Scatter", ["data", "indices", "updates"], ["y"], axis=1)],
                   [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 5]),
                    helper.make_tensor_value_info("indices", TensorProto.INT64, [1, 2]),
                    helper.make_tensor_value_info("updates", TensorProto.FLOAT, [1, 2])],
                   [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5])], opset=10)
    data = np.arange(1, 6, dtype="float32").reshape(1, 5)
    out = run_cpu(build_cpu(from_onnx(model), preset),
                  {"data": data, "indices": np.array([[1, 3]]), "updates": np.array([[1.1, 2.1]], "float32")})
    np.testing.assert_allclose(out[0], [[1.0, 1.1, 3.0, 2.1, 5.0]])


@pytest.mark.slow
def test_segformer_full_builds_when_fusetir_binds_one_buffer_twice():
    # Segformer-B0 fp16: a stitch group over two reshape views of one value made FuseTIR bind one
    # buffer to two parameters; the set must be dropped, not crash the build
    from tvm_ext.inspect import inspect
    from tvm_ext.models.skeleton import resolve_models

    report = inspect(resolve_models(["segformer_b0_b1_fp32"])[0], "tvm_ext/h100", "full", fp16=True)
    assert 0 < report.kernels < 191  # baseline launches 191
