"""Skeleton models: make/fill round trip, committed corpus skeletons vs onnxruntime and TVM."""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_ext.errors import ModelLoadError, TvmExtError
from tvm_ext.models.skeleton import (METADATA_KEY, SKELETON_DIR, SkeletonError, fill_skeleton,
                                     is_skeleton, load_model, make_skeleton)

ort = pytest.importorskip("onnxruntime")

#: Committed skeletons run end to end: the three cheapest to build for llvm on 2 cores.
RUN_SKELETONS = ["mmoe_b1_fp32.onnx", "lstm_s32_b1_fp32.onnx", "mobilenet_v2_b1_fp32.onnx"]


def _toy_model() -> onnx.ModelProto:
    """y = reshape(relu(x @ w1 + b) @ w2h(cast to fp32) * mask, [4, 32]); mixed initializers."""
    rng = np.random.default_rng(7)
    inits = [
        numpy_helper.from_array((rng.standard_normal((64, 32)) * 0.3 + 0.1).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.standard_normal(32).astype(np.float32), "b"),          # small
        numpy_helper.from_array((rng.standard_normal((32, 64)) * 2.0).astype(np.float16), "w2h"),
        numpy_helper.from_array(np.where(np.arange(2048) % 3 == 0, -1e4, 0.0)
                                .astype(np.float32).reshape(32, 64), "mask"),          # 2 values
        numpy_helper.from_array(np.ones((1, 2048), np.float32), "ones"),               # constant
        numpy_helper.from_array(np.arange(1200, dtype=np.int64), "idx"),               # integer
        numpy_helper.from_array(np.array([4, 32], np.int64), "shape"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("Cast", ["w2h"], ["w2"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["w2", "mask"], ["w2m"]),
        helper.make_node("MatMul", ["r", "w2m"], ["z"]),
        helper.make_node("Reshape", ["z", "shape"], ["y0"]),
        helper.make_node("ReduceSum", ["ones"], ["s"], keepdims=0),
        helper.make_node("Mul", ["y0", "s"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "toy", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])], initializer=inits)
    # "idx" is unused by the graph but must survive verbatim like any integer initializer
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    return model


def _inits(model: onnx.ModelProto) -> dict[str, TensorProto]:
    return {t.name: t for t in model.graph.initializer}


def _run_ort(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def test_make_skeleton_drops_only_large_float_weights():
    model = _toy_model()
    skel = make_skeleton(model)
    assert is_skeleton(skel) and not is_skeleton(model)
    before, after = _inits(model), _inits(skel)
    assert list(before) == list(after)
    for name in before:  # dims and data types always kept
        assert list(after[name].dims) == list(before[name].dims)
        assert after[name].data_type == before[name].data_type
    for name in ("w1", "w2h", "ones"):  # dropped: no data left
        assert not after[name].raw_data and not after[name].float_data
        assert not after[name].int32_data
    for name in ("b", "mask", "idx", "shape"):  # small, structural (2 values), or integer
        np.testing.assert_array_equal(numpy_helper.to_array(after[name]),
                                      numpy_helper.to_array(before[name]))
    record = json.loads({p.key: p.value for p in skel.metadata_props}[METADATA_KEY])
    assert sorted(record["tensors"]) == ["ones", "w1", "w2h"]
    assert record["tensors"]["ones"] == {"dtype": "float32", "mean": 1.0, "std": 0.0}
    w1 = numpy_helper.to_array(before["w1"]).astype(np.float64)
    assert record["tensors"]["w1"]["mean"] == pytest.approx(w1.mean())
    assert record["tensors"]["w1"]["std"] == pytest.approx(w1.std())
    assert record["tensors"]["w2h"]["dtype"] == "float16"
    saved = len(model.SerializeToString()) - len(skel.SerializeToString())
    assert saved > 0.9 * (64 * 32 * 4 + 32 * 64 * 2)  # the bytes of w1 and w2h
    # a higher threshold keeps everything
    assert not json.loads({p.key: p.value for p in make_skeleton(model, 4096).metadata_props}
                          [METADATA_KEY])["tensors"]


def test_fill_skeleton_statistics_and_determinism():
    model = _toy_model()
    skel = make_skeleton(model)
    filled = fill_skeleton(skel, seed=3)
    assert not is_skeleton(filled)
    onnx.checker.check_model(filled)
    orig, got = _inits(model), _inits(filled)
    np.testing.assert_array_equal(numpy_helper.to_array(got["ones"]),
                                  numpy_helper.to_array(orig["ones"]))  # constants: exact
    for name in ("w1", "w2h"):
        a = numpy_helper.to_array(orig[name]).astype(np.float64)
        b = numpy_helper.to_array(got[name])
        assert b.dtype == numpy_helper.to_array(orig[name]).dtype and b.shape == a.shape
        assert b.astype(np.float64).mean() == pytest.approx(a.mean(), abs=0.1 * a.std())
        assert b.astype(np.float64).std() == pytest.approx(a.std(), rel=0.05)
        assert not np.array_equal(a, b)  # statistics, not values, are restored
    again = fill_skeleton(skel, seed=3)
    other = fill_skeleton(skel, seed=4)
    w1 = numpy_helper.to_array(got["w1"])
    np.testing.assert_array_equal(numpy_helper.to_array(_inits(again)["w1"]), w1)
    assert not np.allclose(numpy_helper.to_array(_inits(other)["w1"]), w1)
    # different tensors of one seed draw different streams
    assert not np.allclose(w1[:32, :].ravel()[:1024],
                           numpy_helper.to_array(got["w2h"]).astype(np.float32).ravel()[:1024])
    x = np.random.default_rng(0).standard_normal((2, 64)).astype(np.float32)
    y = _run_ort(filled, {"x": x})[0]
    assert y.shape == (4, 32) and np.isfinite(y).all() and y.std() > 1e-3


def test_fill_constant_tensor_and_errors():
    model = _toy_model()
    w1 = _inits(model)["w1"]
    w1.CopyFrom(numpy_helper.from_array(np.linspace(-1, 1, 2048, dtype=np.float32)
                                        .reshape(64, 32), "w1"))
    skel = make_skeleton(model)
    record = json.loads({p.key: p.value for p in skel.metadata_props}[METADATA_KEY])
    record["tensors"]["w1"]["std"] = 0.0
    record["tensors"]["w1"]["mean"] = 0.25
    del skel.metadata_props[:]
    skel.metadata_props.add(key=METADATA_KEY, value=json.dumps(record))
    filled = fill_skeleton(skel)
    assert np.all(numpy_helper.to_array(_inits(filled)["w1"]) == np.float32(0.25))

    with pytest.raises(SkeletonError, match="already a skeleton"):
        make_skeleton(skel)
    with pytest.raises(SkeletonError, match="not a skeleton"):
        fill_skeleton(model)
    with pytest.raises(SkeletonError, match="min_elements"):
        make_skeleton(model, min_elements=0)
    broken = onnx.ModelProto()
    broken.CopyFrom(skel)
    broken.metadata_props[0].value = "{not json"
    with pytest.raises(SkeletonError, match="malformed"):
        fill_skeleton(broken)
    record["tensors"]["w1"]["dtype"] = "float16"
    broken.metadata_props[0].value = json.dumps(record)
    with pytest.raises(SkeletonError, match="data type"):
        fill_skeleton(broken)
    record["tensors"]["missing"] = record["tensors"].pop("w1")
    broken.metadata_props[0].value = json.dumps(record)
    with pytest.raises(SkeletonError, match="no such initializer"):
        fill_skeleton(broken)
    assert issubclass(SkeletonError, TvmExtError)


def test_load_model_handles_skeletons_and_plain_files(tmp_path):
    model = _toy_model()
    onnx.save(model, str(tmp_path / "plain.onnx"))
    onnx.save(make_skeleton(model), str(tmp_path / "skel.onnx"))
    plain = load_model(tmp_path / "plain.onnx")
    assert plain.SerializeToString() == model.SerializeToString()
    loaded = load_model(tmp_path / "skel.onnx", seed=5)
    assert not is_skeleton(loaded)
    assert loaded.SerializeToString() == fill_skeleton(make_skeleton(model), 5).SerializeToString()
    with pytest.raises(ModelLoadError):
        load_model(tmp_path / "missing.onnx")
    (tmp_path / "junk.onnx").write_bytes(b"\x00\xffnot a protobuf\x12\x99")
    with pytest.raises(ModelLoadError):
        load_model(tmp_path / "junk.onnx")


def _committed() -> list:
    return sorted(SKELETON_DIR.glob("*.onnx"))


def _registry_batch1_files() -> list[str]:
    """File names make_skeletons.py writes: the fp32 batch-1 variant(s) of every model in
    scripts/corpus/registry.py (read with ast: the registry itself imports torch)."""
    import ast
    from pathlib import Path

    tree = ast.parse((Path(__file__).resolve().parents[1] / "scripts" / "corpus" / "registry.py").read_text())
    names = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "_spec"):
            continue
        model = ast.literal_eval(call.args[0])
        variants = [(1, None)]  # the default, _B1
        if len(call.args) > 3:
            variants = [tuple(ast.literal_eval(a) for a in v.args) + (None,) for v in call.args[3].elts]
        for batch, seq, *_ in variants:
            if batch == 1:
                names.append(f"{model}_{'' if seq is None else f's{seq}_'}b1_fp32.onnx")
    return sorted(names)


def test_committed_skeletons_are_small_and_consistent():
    files = _committed()
    expected = _registry_batch1_files()
    assert len(expected) == 20  # 18 models; bert_base and bert_large at seq 128 and 384
    assert [f.name for f in files] == expected, f"expected the whole corpus in {SKELETON_DIR}"
    assert sum(f.stat().st_size for f in files) < 6 * 2 ** 20
    for path in files:
        model = onnx.load(str(path))
        assert is_skeleton(model), path.name
        record = json.loads({p.key: p.value for p in model.metadata_props}[METADATA_KEY])
        inits = _inits(model)
        assert record["tensors"], path.name
        for name in record["tensors"]:
            assert not inits[name].raw_data, (path.name, name)


def _corpus_inputs(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    meta = {p.key: p.value for p in model.metadata_props}
    ranges = json.loads(meta.get("tvm_ext.corpus", "{}")).get("int_inputs", {})
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        t = vi.type.tensor_type
        shape = [d.dim_value for d in t.shape.dim]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.integer):
            low, high = ranges.get(vi.name, (0, 2))
            feeds[vi.name] = rng.integers(low, high, shape).astype(dtype)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


@pytest.mark.parametrize("name", RUN_SKELETONS)
def test_committed_skeleton_tvm_matches_onnxruntime(name, llvm_target):
    import tvm
    from tvm import relax

    from tvm_ext.frontend import from_onnx

    model = load_model(SKELETON_DIR / name, seed=0)
    feeds = _corpus_inputs(model)
    expected = _run_ort(model, feeds)
    mod = from_onnx(model)
    vm = relax.VirtualMachine(tvm.compile(mod, llvm_target), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(feeds[vi.name]) for vi in model.graph.input])
    got = [out.numpy()] if hasattr(out, "numpy") else [o.numpy() for o in out]
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4)
    flat = np.concatenate([e.ravel() for e in expected])
    assert np.isfinite(flat).all() and flat.std() > 1e-3


def test_resolve_models_names_paths_and_missing(tmp_path):
    from tvm_ext.errors import ModelLoadError
    from tvm_ext.models.skeleton import SKELETON_DIR, resolve_models

    every = resolve_models([])
    assert every == [SKELETON_DIR / name for name in _registry_batch1_files()]
    assert resolve_models(["resnet50_b1_fp32"]) == [SKELETON_DIR / "resnet50_b1_fp32.onnx"]
    with pytest.raises(ModelLoadError, match="nosuch_model.*missing.onnx"):
        resolve_models(["nosuch_model", str(tmp_path / "missing.onnx")])
