"""Import of shape-like values: bound graph inputs, Constant attribute forms, static shape folding."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper, numpy_helper
from tvm import relax

from tvm_ext.errors import InputBindingError, ModelConversionError
from tvm_ext.frontend import from_onnx
from tvm_ext.frontend.bind import bind_inputs, constant_operand_inputs, parse_bind_arg
from tvm_ext.frontend.constant_nodes import normalize_constant_nodes
from tvm_ext.frontend.shape_folding import fold_shape_arithmetic
from tvm_ext.testing.onnx_graphs import onnx_model, tensor_info

LLVM = tvm.target.Target({"kind": "llvm"})


def _model(nodes, inputs, outputs, initializers=(), opset=18) -> onnx.ModelProto:
    return onnx_model(nodes, inputs, outputs, initializers, opset=opset)


_vi = tensor_info


def _run(mod: tvm.IRModule, *args: np.ndarray) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, LLVM), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(a) for a in args]).numpy()


def _ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)[0]


def _reshape_model() -> onnx.ModelProto:
    """y = reduce_sum(reshape(x, shape), axes) with shape and axes as graph inputs."""
    return _model([helper.make_node("Reshape", ["x", "shape"], ["r"]),
                   helper.make_node("ReduceSum", ["r", "axes"], ["y"], keepdims=0)],
                  [_vi("x", [2, 12]), _vi("shape", [3], TensorProto.INT64), _vi("axes", [1], TensorProto.INT64)],
                  [_vi("y", None)])


# ------------------------------------------------------------------------------ binding
def test_inputs_feeding_constant_operands_are_found():
    assert constant_operand_inputs(_reshape_model().graph) == {
        "shape": ["Reshape 'r' input 1"], "axes": ["ReduceSum 'y' input 1"]}


def test_unbound_shape_input_fails_with_a_hint_naming_it():
    with pytest.raises(ModelConversionError, match=r"'shape' feeds Reshape.*bind=\{'shape'"):
        from_onnx(_reshape_model())


def test_bound_inputs_become_constants_and_match_onnxruntime():
    model = _reshape_model()
    bind = {"shape": [2, 3, 4], "axes": [2]}
    mod = from_onnx(model, bind=bind)
    assert [p.name for p in mod["main"].params] == ["x"]
    x = np.random.default_rng(0).standard_normal((2, 12)).astype("float32")
    expected = _ort(model, {"x": x, "shape": np.array([2, 3, 4]), "axes": np.array([2])})
    np.testing.assert_allclose(_run(mod, x), expected, rtol=1e-5, atol=1e-6)
    assert len(model.graph.input) == 3  # the caller's model is not modified


@pytest.mark.parametrize("bind, match", [
    ({"nope": [1]}, r"cannot bind 'nope': not a graph input; graph inputs are 'x', 'shape', 'axes'"),
    ({"shape": [2.5, 3, 4]}, r"'shape': it is int64, the value has fractions"),
    ({"shape": [2, 12]}, r"value shape \[2\] does not match the declared shape \[3\]"),
    ({"axes": ["a"]}, r"not convertible to int64"),
])
def test_bad_bindings_name_the_problem(bind, match):
    with pytest.raises(InputBindingError, match=match):
        bind_inputs(_reshape_model(), bind)


def test_binding_an_initializer_is_refused():
    model = _model([helper.make_node("Add", ["x", "w"], ["y"])], [_vi("x", [2])], [_vi("y", [2])],
                   [numpy_helper.from_array(np.ones(2, "float32"), "w")])
    with pytest.raises(InputBindingError, match="'w' .already a constant initializer."):
        bind_inputs(model, {"w": [1, 2]})


def test_scalar_input_binds_from_one_number():
    model = _model([helper.make_node("Add", ["x", "s"], ["y"])], [_vi("x", [2]), _vi("s", [])], [_vi("y", [2])])
    bound = bind_inputs(model, {"s": [3]})
    assert numpy_helper.to_array(bound.graph.initializer[0]).shape == ()


@pytest.mark.parametrize("text, expected", [
    ("shape=1,-1,64", ("shape", [1, -1, 64])), ("k=3", ("k", [3])), ("scales=1,1,2.0,2", ("scales", [1.0, 1.0, 2.0, 2.0])),
    ("axes=", ("axes", [])),
])
def test_parse_bind_arg(text, expected):
    assert parse_bind_arg(text) == expected


@pytest.mark.parametrize("text", ["shape", "=1,2", "k=three"])
def test_parse_bind_arg_rejects(text):
    with pytest.raises(InputBindingError):
        parse_bind_arg(text)


# ------------------------------------------------------------------------------ Constant forms
def test_constant_attribute_forms_become_tensors_and_import():
    nodes = [helper.make_node("Constant", [], ["alpha"], value_float=0.25),
             helper.make_node("Constant", [], ["axes"], value_ints=[1]),
             helper.make_node("Mul", ["x", "alpha"], ["m"]),
             helper.make_node("ReduceSum", ["m", "axes"], ["y"], keepdims=0)]
    model = _model(nodes, [_vi("x", [2, 3])], [_vi("y", None)])
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert normalize_constant_nodes(copy) == 2
    values = [numpy_helper.to_array(n.attribute[0].t) for n in copy.graph.node[:2]]
    assert values[0].dtype == np.float32 and values[0].shape == () and values[0] == 0.25
    assert values[1].dtype == np.int64 and values[1].tolist() == [1]
    x = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_allclose(_run(from_onnx(model), x), _ort(model, {"x": x}))


# ------------------------------------------------------------------------------ shape folding
def _shape_chain_model() -> onnx.ModelProto:
    """y = reshape(x, [shape(x)[0], -1]) + reduce_mean over axes range(1, rank(x)) (as exporters write it)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["b"], axis=0),
        helper.make_node("Unsqueeze", ["b", "axis0"], ["b1"]),
        helper.make_node("Concat", ["b1", "minus1"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["flat"]),
        helper.make_node("Size", ["s"], ["rank"]),
        helper.make_node("Range", ["one", "rank", "one"], ["axes"]),
        helper.make_node("ReduceMean", ["x", "axes"], ["mean"], keepdims=0),
        helper.make_node("Unsqueeze", ["mean", "axis1"], ["mean1"]),
        helper.make_node("Sub", ["flat", "mean1"], ["y"]),
    ]
    inits = [numpy_helper.from_array(np.array(0, "int64"), "zero"), numpy_helper.from_array(np.array([0], "int64"), "axis0"),
             numpy_helper.from_array(np.array([1], "int64"), "axis1"),
             numpy_helper.from_array(np.array([-1], "int64"), "minus1"), numpy_helper.from_array(np.array(1, "int64"), "one")]
    return _model(nodes, [_vi("x", ["batch", 3, 4])], [_vi("y", None)], inits)


def test_static_shape_arithmetic_is_folded():
    model = _shape_chain_model()
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert fold_shape_arithmetic(copy, {"x": [2, 3, 4]}) == 6  # Shape Gather Unsqueeze Concat Size Range
    ops = [n.op_type for n in copy.graph.node]
    assert "Shape" not in ops and "Size" not in ops and ops.count("Constant") == 6
    consts = {n.output[0]: numpy_helper.to_array(n.attribute[0].t) for n in copy.graph.node if n.op_type == "Constant"}
    assert consts["target"].tolist() == [2, -1] and consts["axes"].tolist() == [1, 2]


def test_shape_chain_model_imports_and_matches_onnxruntime():
    model = _shape_chain_model()
    x = np.random.default_rng(1).standard_normal((2, 3, 4)).astype("float32")
    mod = from_onnx(model, shapes={"x": [2, 3, 4]})
    np.testing.assert_allclose(_run(mod, x), _ort(model, {"x": x}), rtol=1e-5, atol=1e-6)


def test_weight_arithmetic_is_left_to_the_importer():
    model = _model([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
                    helper.make_node("Shape", ["x"], ["s"]),
                    helper.make_node("MatMul", ["x", "wt"], ["y"])],
                   [_vi("x", [2, 3])], [_vi("y", [2, 3]), _vi("s", [2], TensorProto.INT64)],
                   [numpy_helper.from_array(np.eye(3, dtype="float32"), "w")])
    assert fold_shape_arithmetic(model, {"x": [2, 3]}) == 1  # the Shape only, not the weight's Transpose
    assert [n.op_type for n in model.graph.node] == ["Constant", "Transpose", "MatMul"]


# ------------------------------------------------------------------------------ through the API
def test_check_model_binds_in_both_builds(tmp_path):
    from tvm_ext.testing.oracle import check_model

    path = tmp_path / "reshape.onnx"
    onnx.save(_reshape_model(), str(path))
    result = check_model(str(path), "baseline", bind={"shape": [4, 3, 2], "axes": [1]})
    result.raise_on_mismatch()


def test_load_module_refuses_bind_for_an_imported_module():
    from tvm_ext.driver.pipeline import load_module
    from tvm_ext.errors import TvmExtError

    mod = from_onnx(_reshape_model(), bind={"shape": [2, 3, 4], "axes": [2]})
    with pytest.raises(TvmExtError, match="bind= apply to ONNX models"):
        load_module(mod, bind={"shape": [1]})
