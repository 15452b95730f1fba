"""ONNX value names that are not C identifiers (``/layer0/MatMul:0``): renamed once by the
frontend, compiled for CUDA, checked against onnxruntime, and fed by their original names."""
from __future__ import annotations

import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import tvm_ext
from tvm_ext.cli import main as cli_main
from tvm_ext.frontend import from_onnx, onnx_input_names, random_inputs, sanitize_value_names
from tvm_ext.hardware.target import resolve_target
from tvm_ext.inspect.kernels import cuda_source
from tvm_ext.testing.oracle import build_cpu, check_model, run_cpu
from tvm_ext.toolchain import compile_cuda_source, nvcc_available

IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
INPUT, OUTPUT = "/input:0", "/layer0/Relu:0"


def _slash_colon_model() -> onnx.ModelProto:
    """relu(x @ W + b) whose every value name (input, weights, intermediates, output) has '/' and ':'."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal((16, 32)).astype(np.float32), "/layer0/weight:0")
    bias = numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "/layer0/bias:0")
    nodes = [helper.make_node("MatMul", [INPUT, "/layer0/weight:0"], ["/layer0/MatMul:0"]),
             helper.make_node("Add", ["/layer0/MatMul:0", "/layer0/bias:0"], ["/layer0/Add:0"]),
             helper.make_node("Relu", ["/layer0/Add:0"], [OUTPUT])]
    graph = helper.make_graph(nodes, "slash_colon", [helper.make_tensor_value_info(INPUT, TensorProto.FLOAT, [4, 16])],
                              [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, [4, 32])], [weight, bias])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("names") / "slash_colon.onnx"
    onnx.save(_slash_colon_model(), str(path))
    return path


def test_every_value_becomes_an_identifier_without_collisions():
    model = _slash_colon_model()
    model.graph.node[0].output[0] = "layer0_weight_0"  # what '/layer0/weight:0' would become
    model.graph.node[1].input[0] = "layer0_weight_0"
    renames = sanitize_value_names(model)
    graph = model.graph
    names = ([i.name for i in graph.input] + [o.name for o in graph.output] + [t.name for t in graph.initializer]
             + [v for n in graph.node for v in list(n.input) + list(n.output)])
    assert all(IDENT.fullmatch(n) for n in names), names
    assert renames[INPUT] == "input_0" and renames[OUTPUT] == "layer0_Relu_0"
    assert renames["/layer0/weight:0"] == "layer0_weight_0_1"  # the clean name was taken
    assert sanitize_value_names(model) == {}  # idempotent


def test_subgraph_names_are_renamed_consistently():
    then = helper.make_graph([helper.make_node("Neg", ["/x:0"], ["/then/out:0"])], "then", [],
                             [helper.make_tensor_value_info("/then/out:0", TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Abs", ["/x:0"], ["/else/out:0"])], "else", [],
                              [helper.make_tensor_value_info("/else/out:0", TensorProto.FLOAT, [2])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["/y:0"], then_branch=then, else_branch=other)], "if",
                              [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("/x:0", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("/y:0", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    sanitize_value_names(model)
    onnx.checker.check_model(model, full_check=True)
    then_branch = next(a.g for a in model.graph.node[0].attribute if a.name == "then_branch")
    assert list(then_branch.node[0].input) == ["x_0"] and then_branch.output[0].name == "then_out_0"


def test_import_keeps_the_onnx_names_of_inputs_and_the_callers_proto(model_path):
    proto = _slash_colon_model()
    mod = from_onnx(proto)
    assert proto.graph.input[0].name == INPUT  # renamed on a copy
    assert [p.name for p in mod["main"].params] == ["input_0"]
    assert onnx_input_names(mod) == {"input_0": INPUT}
    assert onnx_input_names(from_onnx(model_path, shapes={INPUT: [4, 16]})) == {"input_0": INPUT}


def test_inputs_are_fed_by_onnx_or_parameter_name(model_path):
    mod = from_onnx(model_path)
    x = random_inputs(mod)["input_0"]
    want = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"]).run(None, {INPUT: x})[0]
    vm = build_cpu(mod, "baseline")
    np.testing.assert_allclose(run_cpu(vm, {INPUT: x})[0], want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(run_cpu(vm, {"input_0": x})[0], want, rtol=1e-5, atol=1e-5)
    with pytest.raises(tvm_ext.TvmExtError, match=re.escape(f"or by ONNX name ({INPUT})")):
        run_cpu(vm, {"x": x})


def test_compiles_for_cuda_and_passes_the_cpu_check(model_path, tmp_path, capsys):
    ex = tvm_ext.compile(model_path, target="tvm_ext/h100")
    source = cuda_source(ex)
    params = re.findall(r"__restrict__ (\S+?)[,)]", source)
    assert params and all(IDENT.fullmatch(p) for p in params), params
    if nvcc_available():
        compile_cuda_source(source, resolve_target("tvm_ext/h100"))
    assert cli_main(["compile", str(model_path), "--target", "tvm_ext/h100", "-o", str(tmp_path / "m.so")]) == 0
    assert check_model(model_path).ok
    assert cli_main(["check", str(model_path)]) == 0
    assert "ok" in capsys.readouterr().out
