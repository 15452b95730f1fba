"""ONNX import: numerics against onnxruntime, fp16 conversion, canonical form, bad input."""
from __future__ import annotations

import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import tvm
from onnx import TensorProto, helper
from tvm import relax

from tvm_ext.errors import (
    ModelConversionError, ModelLoadError, ShapeOverrideError, TvmExtError,
    UnboundDimensionError, UnsupportedOpsError,
)
from tvm_ext.frontend import (
    ConvertToFloat16, canonicalize_passes, from_onnx, from_torch, input_info, random_inputs,
    unsupported_ops,
)
from tvm_ext.frontend.canonicalize import structural_cleanups
from tvm_ext.models import BUNDLED, bert_layer, conv_block
from tvm_ext.testing.onnx_graphs import onnx_model, tensor_info

LLVM = tvm.target.Target({"kind": "llvm"})
SMALL_BERT = dict(batch=2, seq=16, hidden=32, heads=4, intermediate=64)


# ------------------------------------------------------------------------------ helpers
def _run_tvm(mod: tvm.IRModule, inputs: dict[str, np.ndarray]) -> np.ndarray:
    vm = relax.VirtualMachine(tvm.compile(mod, LLVM), tvm.cpu())
    return vm["main"](*[tvm.runtime.tensor(v) for v in inputs.values()]).numpy()


def _run_ort(model: onnx.ModelProto, inputs: dict[str, np.ndarray]) -> np.ndarray:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, inputs)[0]


def _ops(mod: tvm.IRModule) -> list[str]:
    names = []
    for block in mod["main"].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
                names.append(value.op.name)
    return names


_model, _vi = onnx_model, tensor_info


@pytest.fixture(scope="module")
def imported():
    """name -> (onnx model, fp32 module) for every bundled model at default size."""
    out = {}
    for name, builder in BUNDLED.items():
        model = builder()
        out[name] = (model, from_onnx(model))
    return out


# ------------------------------------------------------------------------------ fp32
@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_bundled_model_matches_onnxruntime(imported, name):
    model, mod = imported[name]
    inputs = random_inputs(mod, seed=1)
    np.testing.assert_allclose(_run_tvm(mod, inputs), _run_ort(model, inputs), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_imported_module_is_canonical(imported, name):
    model, mod = imported[name]
    main = mod["main"]
    assert [p.name for p in main.params] == [i.name for i in model.graph.input]
    blocks = main.body.blocks
    assert len(blocks) == 1 and isinstance(blocks[0], relax.DataflowBlock)
    ops = _ops(mod)
    assert ops and not any(op.startswith("relax.call_tir") for op in ops)
    assert "relax.nn.batch_norm" not in ops
    assert [gv.name_hint for gv in mod.get_global_vars()] == ["main"]


def test_bert_keeps_high_level_ops(imported):
    ops = _ops(imported["bert_layer"][1])
    assert ops.count("relax.matmul") == 8
    assert ops.count("relax.nn.layer_norm") == 2 and ops.count("relax.nn.softmax") == 1
    assert ops.count("relax.nn.gelu") == 1 and "relax.erf" not in ops   # the exported erf GELU, one op


def test_canonicalization_folds_batch_norm_into_conv():
    model = conv_block()
    raw = from_onnx(model, canonicalize=False)
    assert "relax.nn.batch_norm" in _ops(raw)
    ops = _ops(from_onnx(model))
    assert "relax.nn.batch_norm" not in ops and "relax.permute_dims" not in ops
    assert ops[:3] == ["relax.nn.conv2d", "relax.add", "relax.nn.relu"]
    names = [p.info.name for p in canonicalize_passes().passes + structural_cleanups().passes]
    assert {"FoldBatchnormToConv2D", "DecomposeOps", "FoldConstant", "DeadCodeElimination"} <= set(names)


# ------------------------------------------------------------------------------ fp16

@pytest.mark.parametrize("name", sorted(BUNDLED))
def test_fp16_matches_fp32_onnxruntime(imported, name):
    model, _ = imported[name]
    mod = from_onnx(model, fp16=True)
    for p in mod["main"].params:
        assert str(p.ty.dtype) == "float16"
    assert str(mod["main"].ret_ty.dtype) == "float16"
    inputs = random_inputs(mod, seed=2)
    ref = _run_ort(model, {k: v.astype(np.float32) for k, v in inputs.items()})
    out = _run_tvm(mod, inputs)
    assert out.dtype == np.float16
    # fp16 tolerance: elementwise bound scaled by the output range, plus a tight mean bound
    # that catches systematic errors (a wrong cast) the elementwise bound would let pass.
    scale = max(1.0, float(np.abs(ref).max()))
    err = np.abs(out.astype(np.float32) - ref)
    np.testing.assert_array_less(err, 1e-2 * scale + 1e-2 * np.abs(ref))
    assert err.mean() < 1e-3 * scale


def test_fp16_keeps_integer_ids_and_mean_in_fp32():
    table = np.random.default_rng(0).standard_normal((30, 16)).astype(np.float32)
    model = _model(
        [helper.make_node("Gather", ["table", "ids"], ["emb"], axis=0),
         helper.make_node("ReduceMean", ["emb"], ["y"], axes=[1], keepdims=0)],
        [_vi("ids", [4, 7], TensorProto.INT64)], [_vi("y", [4, 16])],
        [onnx.numpy_helper.from_array(table, "table")], opset=17)
    mod = from_onnx(model, fp16=True)
    assert input_info(mod) == {"ids": ((4, 7), "int64")}
    ops = _ops(mod)
    assert "relax.astype" in ops and "relax.mean" in ops  # mean runs as an fp32 island
    inputs = random_inputs(mod, seed=0)
    assert inputs["ids"].min() >= 0 and inputs["ids"].max() < 30  # bounded by the table
    np.testing.assert_allclose(_run_tvm(mod, inputs).astype(np.float32), _run_ort(model, inputs),
                               rtol=1e-2, atol=1e-2)


def test_fp16_clamps_huge_mask_constants():
    fill = np.zeros((1, 8), np.float32)
    fill[0, 5:] = np.finfo(np.float32).min  # torch's finfo.min mask fill
    model = _model(
        [helper.make_node("Add", ["x", "mask"], ["s"]),
         helper.make_node("Softmax", ["s"], ["y"], axis=-1)],
        [_vi("x", [2, 8])], [_vi("y", [2, 8])], [onnx.numpy_helper.from_array(fill, "mask")])
    mod = from_onnx(model, fp16=True)
    x = np.random.default_rng(0).standard_normal((2, 8)).astype(np.float16)
    out = _run_tvm(mod, {"x": x}).astype(np.float32)
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, _run_ort(model, {"x": x.astype(np.float32)}), atol=2e-3)
    assert np.abs(out[:, 5:]).max() == 0.0


def test_fp16_cast_clamps_only_finite_overflow():
    from tvm_ext.frontend.fp16 import _to_fp16_array

    values = np.array([1.5, 7e4, -1e9, np.inf, -np.inf, np.nan, 65519.0, -3.4e38], np.float32)
    out = _to_fp16_array(values)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out[[0, 1, 2, 6, 7]].astype(np.float32), [1.5, 65504, -65504, 65504, -65504])
    assert np.isposinf(out[3]) and np.isneginf(out[4]) and np.isnan(out[5])


def test_import_skips_the_onnx_checker_and_restores_it(monkeypatch):
    """TVM's importer runs onnx.checker on the whole serialized model only to warn; we skip it."""
    model = conv_block()      # the builder checks what it builds
    calls = []
    monkeypatch.setattr(onnx.checker, "check_model", lambda *a, **k: calls.append(1))
    from_onnx(model)
    assert calls == []
    onnx.checker.check_model(None)
    assert calls == [1]       # the caller's checker is back


def test_fp16_runs_opaque_calls_in_fp32(caplog):
    pads = onnx.numpy_helper.from_array(np.array([0, 1, 0, 2], np.int64), "pads")
    model = _model([helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect"),
                    helper.make_node("Relu", ["p"], ["y"])],
                   [_vi("x", [3, 5])], [_vi("y", [3, 8])], [pads])
    with caplog.at_level("WARNING", logger="tvm_ext.frontend.fp16"):
        mod = from_onnx(model, fp16=True)
    assert "kept in fp32" in caplog.text
    x = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float16)
    out = _run_tvm(mod, {"x": x})
    assert out.dtype == np.float16
    np.testing.assert_allclose(out.astype(np.float32), _run_ort(model, {"x": x.astype(np.float32)}),
                               atol=1e-3)


def test_convert_to_float16_retypes_cast_targets():
    model = _model([helper.make_node("Cast", ["i"], ["f"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["f", "x"], ["y"])],
                   [_vi("i", [4], TensorProto.INT32), _vi("x", [4])], [_vi("y", [4])])
    mod = ConvertToFloat16()(from_onnx(model))
    assert input_info(mod) == {"i": ((4,), "int32"), "x": ((4,), "float16")}
    out = _run_tvm(mod, {"i": np.arange(4, dtype=np.int32), "x": np.full(4, 0.5, np.float16)})
    np.testing.assert_array_equal(out, np.array([0, 0.5, 1, 1.5], np.float16))


def test_convert_to_float16_leaves_its_input_alone(imported):
    mod = imported["mlp"][1]
    converted = ConvertToFloat16()(mod)
    assert input_info(mod) == {"x": ((8, 64), "float32")}
    assert input_info(converted) == {"x": ((8, 64), "float16")}


def test_convert_to_float16_casts_results_typed_by_prim_values():
    ids = relax.Var("ids", relax.TensorType((4,), "int64"))
    x = relax.Var("x", relax.TensorType((4, 5), "float32"))
    on, off = (relax.prim_value(tvm.tirx.FloatImm("float32", v)) for v in (2.0, 0.0))
    bb = relax.BlockBuilder()
    with bb.function("main", [ids, x]):
        with bb.dataflow():
            hot = bb.emit(relax.op.one_hot(ids, on, off, 5))  # fp32 from the PrimValues
            out = bb.emit_output(relax.op.multiply(hot, x))
        bb.emit_func_output(out)
    mod = ConvertToFloat16()(bb.get())
    assert str(mod["main"].ret_ty.dtype) == "float16"
    got = _run_tvm(mod, {"ids": np.array([0, 1, 4, 2]), "x": np.full((4, 5), 0.5, np.float16)})
    want = np.zeros((4, 5), np.float16)
    want[[0, 1, 2, 3], [0, 1, 4, 2]] = 1.0
    np.testing.assert_array_equal(got, want)


# ------------------------------------------------------------------------------ shapes
def test_free_dims_are_all_reported():
    model = bert_layer(**SMALL_BERT, dynamic=True)
    with pytest.raises(UnboundDimensionError) as info:
        from_onnx(model)
    msg = str(info.value)
    for fragment in ("input 'hidden_states' has free dimensions 'batch' (axis 0), 'seq' (axis 1)",
                     "input 'attention_mask' has free dimensions 'batch' (axis 0), 'seq' (axis 3)",
                     "shapes={'hidden_states': [batch, seq, 32]}"):
        assert fragment in msg


def test_partially_bound_input_names_only_the_free_dim():
    model = bert_layer(**SMALL_BERT, dynamic=True, attention_mask=False)
    graph_input = model.graph.input[0].type.tensor_type.shape.dim
    graph_input[0].Clear()
    graph_input[0].dim_value = 2  # batch fixed, seq still free
    with pytest.raises(UnboundDimensionError) as info:
        from_onnx(model)
    assert str(info.value) == ("input 'hidden_states' has free dimension 'seq' (axis 1): "
                               "pass shapes={'hidden_states': [2, seq, 32]}")


def test_named_dims_bind_across_inputs_and_match_onnxruntime():
    model = bert_layer(**SMALL_BERT, dynamic=True)
    mod = from_onnx(model, shapes={"hidden_states": [3, 5, 32]})
    assert input_info(mod) == {"hidden_states": ((3, 5, 32), "float32"),
                               "attention_mask": ((3, 1, 1, 5), "float32")}
    inputs = random_inputs(mod, seed=3)
    np.testing.assert_allclose(_run_tvm(mod, inputs), _run_ort(model, inputs), rtol=1e-4, atol=1e-5)


def test_unnamed_free_dim_is_reported():
    model = _model([helper.make_node("Relu", ["x"], ["y"])], [_vi("x", [None, 4])], [_vi("y", [None, 4])])
    with pytest.raises(UnboundDimensionError, match=r"free dimension '\?' \(axis 0\)"):
        from_onnx(model)
    assert input_info(from_onnx(model, shapes={"x": [2, 4]})) == {"x": ((2, 4), "float32")}


@pytest.mark.parametrize("shapes, fragments", [
    ({"hidden_states": [1, 16]}, ["'hidden_states'", "rank 2", "rank 3"]),
    ({"hidden": [1, 16, 32]}, ["unknown input(s) 'hidden'", "'hidden_states'", "'attention_mask'"]),
    ({"hidden_states": [1, 16, 64]}, ["axis 2 to 64", "fixes it to 32"]),
    ({"hidden_states": [1, 16, 32], "attention_mask": [1, 1, 1, 8]}, ["dimension 'seq'", "16", "8"]),
    ({"hidden_states": [0, 16, 32]}, ["non-positive"]),
    ({"hidden_states": [1.5, 16, 32]}, ["only ints"]),
])
def test_bad_shape_overrides(shapes, fragments):
    model = bert_layer(**SMALL_BERT, dynamic=True)
    with pytest.raises(ShapeOverrideError) as info:
        from_onnx(model, shapes=shapes)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_initializers_listed_as_inputs_are_not_user_inputs():
    w = onnx.numpy_helper.from_array(np.full((4,), 2.0, np.float32), "w")
    model = _model([helper.make_node("Mul", ["x", "w"], ["y"])],
                   [_vi("x", [4]), _vi("w", [4])], [_vi("y", [4])], [w])
    mod = from_onnx(model)
    assert list(input_info(mod)) == ["x"] and list(input_info(model)) == ["x"]
    np.testing.assert_allclose(_run_tvm(mod, {"x": np.ones(4, np.float32)}), np.full(4, 2.0))


# ------------------------------------------------------------------------------ ops
def test_all_unsupported_ops_listed_at_once():
    then_graph = helper.make_graph([helper.make_node("NestedOp", ["x"], ["t"])], "then", [],
                                   [_vi("t", [4])])
    else_graph = helper.make_graph([helper.make_node("Identity", ["x"], ["e"])], "else", [],
                                   [_vi("e", [4])])
    nodes = [
        helper.make_node("FancyOp", ["x"], ["a"]),
        helper.make_node("FancyOp", ["a"], ["b"]),
        helper.make_node("OtherOp", ["b"], ["c"]),
        helper.make_node("Frob", ["c"], ["d"], domain="com.example"),
        helper.make_node("If", ["cond"], ["y"], then_branch=then_graph, else_branch=else_graph),
    ]
    model = _model(nodes, [_vi("x", [4]), _vi("cond", [], TensorProto.BOOL)], [_vi("y", [4])])
    with pytest.raises(UnsupportedOpsError) as info:
        from_onnx(model)
    assert info.value.ops == {"FancyOp": 2, "OtherOp": 1, "com.example::Frob": 1, "NestedOp": 1}
    for fragment in ("FancyOp (x2)", "OtherOp (x1)", "com.example::Frob (x1)", "NestedOp (x1)"):
        assert fragment in str(info.value)


def test_supported_contrib_op_passes_the_check():
    node = helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")
    model = _model([node], [_vi("x", [4])], [_vi("y", [4])])
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    assert unsupported_ops(model) == {}


def test_importer_failure_becomes_conversion_error():
    model = _model([helper.make_node("MatMul", ["a", "b"], ["c"])],
                   [_vi("a", [2, 3]), _vi("b", [4, 5])], [_vi("c", [2, 5])])
    with pytest.raises(ModelConversionError, match="reduction length"):
        from_onnx(model)


# ------------------------------------------------------------------------------ files
@pytest.fixture(scope="module")
def model_bytes():
    return bert_layer(**SMALL_BERT).SerializeToString()


def test_load_from_path(tmp_path, model_bytes):
    path = tmp_path / "bert.onnx"
    path.write_bytes(model_bytes)
    assert input_info(from_onnx(path)) == input_info(from_onnx(str(path)))


@pytest.mark.parametrize("kind, fragment", [
    ("truncated", "file is truncated or corrupt"),
    ("text", "not an ONNX model"),
    ("missing", "file not found"),
    ("empty", "file is empty"),
    ("directory", "not a regular file"),
])
def test_bad_files(tmp_path, model_bytes, kind, fragment):
    path = tmp_path / f"{kind}.onnx"
    if kind == "truncated":
        path.write_bytes(model_bytes[: len(model_bytes) // 2])
    elif kind == "text":
        path.write_text("this is a plain text file, not a protobuf\n" * 20)
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "directory":
        path.mkdir()
    with pytest.raises(ModelLoadError) as info:
        from_onnx(path)
    msg = str(info.value)
    assert fragment in msg and str(path) in msg and "\n" not in msg


def test_graph_cut_at_a_field_boundary_is_reported():
    model = bert_layer(**SMALL_BERT)
    del model.graph.node[len(model.graph.node) // 2:]  # what a clean truncation leaves
    with pytest.raises(ModelLoadError, match="truncated or corrupt"):
        from_onnx(model)


def test_protobuf_that_is_not_a_model(tmp_path):
    path = tmp_path / "tensor.onnx"
    # a valid protobuf message that starts like a ModelProto but holds no graph
    path.write_bytes(helper.make_model(helper.make_graph([], "g", [], [])).SerializeToString()[:2])
    with pytest.raises(ModelLoadError, match="not an ONNX model"):
        from_onnx(path)


def test_wrong_model_type():
    with pytest.raises(ModelLoadError, match="expected a path or an onnx.ModelProto"):
        from_onnx(42)


# ------------------------------------------------------------------------------ inputs
def test_input_info_of_onnx_model_keeps_symbols():
    info = input_info(bert_layer(**SMALL_BERT, dynamic=True))
    assert info == {"hidden_states": (("batch", "seq", 32), "float32"),
                    "attention_mask": (("batch", 1, 1, "seq"), "float32")}


def test_random_inputs_are_seeded_and_nontrivial(imported):
    mod = imported["bert_layer"][1]
    a, b, c = random_inputs(mod, seed=0), random_inputs(mod, seed=0), random_inputs(mod, seed=1)
    assert list(a) == ["hidden_states", "attention_mask"]
    for name, arr in a.items():
        assert arr.shape == input_info(mod)[name][0] and arr.dtype == np.float32
        np.testing.assert_array_equal(arr, b[name])
        assert not np.array_equal(arr, c[name])
        assert 0.8 < arr.std() < 1.2


def test_random_inputs_unbounded_ints_are_small():
    model = _model([helper.make_node("Cast", ["i"], ["y"], to=TensorProto.FLOAT)],
                   [_vi("i", [1000], TensorProto.INT64)], [_vi("y", [1000])])
    ids = random_inputs(from_onnx(model))["i"]
    assert ids.dtype == np.int64 and ids.min() >= 0 and ids.max() < 100 and ids.max() > 50


def test_from_torch_without_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # makes `import torch` raise ImportError
    with pytest.raises(TvmExtError, match="torch is required"):
        from_torch(object(), ())
