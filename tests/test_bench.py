"""tvm_ext.bench building blocks: inputs, weights, numerics, timing, manifest, results, suites."""
from __future__ import annotations

import json
import math

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tvm_ext.bench import inputs as bin
from tvm_ext.bench import numerics, results, suite, timing, weights
from tvm_ext.bench.manifest import BuildEntry, Manifest, ModelEntry, OutputSpec, read_manifest
from tvm_ext.bench.run import roofline_ms
from tvm_ext.errors import BenchError
from tvm_ext.models import get_model
from tvm_ext.models.skeleton import METADATA_KEY, fill_skeleton, make_skeleton


# ---------------------------------------------------------------------------------------------- inputs
def _specs():
    return [bin.spec_for("x", (4, 8), "float16"), bin.spec_for("ids", (2, 16), "int64", (3, 50)),
            bin.spec_for("mask", (2, 16), "bool")]


def test_inputs_are_reproducible_fresh_and_in_range():
    specs = _specs()
    a, b = bin.generate(specs, 7, 0), bin.generate(specs, 7, 0)
    assert bin.digest(a) == bin.digest(b)
    assert bin.digest(bin.generate(specs, 7, 1)) != bin.digest(a)  # another set
    assert bin.digest(bin.generate(specs, 8, 0)) != bin.digest(a)  # another seed
    assert a["x"].dtype == np.float16 and np.count_nonzero(a["x"]) == a["x"].size
    assert a["ids"].dtype == np.int64 and a["ids"].min() >= 3 and a["ids"].max() < 50
    assert a["mask"].dtype == np.bool_ and 0 < a["mask"].sum() < a["mask"].size
    assert list(a) == ["x", "ids", "mask"]


def test_input_spec_validation_and_json():
    spec = bin.spec_for("ids", (1, 4), "int32", (0, 10))
    assert bin.InputSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    with pytest.raises(BenchError, match="empty integer range"):
        bin.InputSpec("i", (2,), "int64", "int", 5, 5)
    with pytest.raises(BenchError, match="kind"):
        bin.InputSpec("i", (2,), "float32", "zeros")
    with pytest.raises(BenchError, match="static and positive"):
        bin.InputSpec("i", (0, 2), "float32", "normal")
    with pytest.raises(BenchError, match="value range"):
        bin.spec_for("ids", (2,), "int64")


def test_timing_set_count_caps_memory():
    specs = [bin.spec_for("x", (1024, 1024), "float32")]  # 4 MiB per set
    assert bin.timing_set_count(specs, 8) == 8
    assert bin.timing_set_count(specs, 8, max_bytes=10 << 20) == 2
    assert bin.timing_set_count(specs, 8, max_bytes=1) == 1


# --------------------------------------------------------------------------------------------- weights
def _skeleton() -> onnx.ModelProto:
    path = suite._skeleton_dir() / "nerf_mlp_b1_fp32.onnx"
    return onnx.load(str(path)) if path.is_file() else make_skeleton(get_model("mlp"))


def test_regenerated_weights_equal_fill_skeleton():
    skeleton = _skeleton()
    record = json.loads({p.key: p.value for p in skeleton.metadata_props}[METADATA_KEY])["tensors"]
    filled = {t.name: numpy_helper.to_array(t) for t in fill_skeleton(skeleton, seed=3).graph.initializer}
    dims = {t.name: tuple(t.dims) for t in skeleton.graph.initializer}
    assert record
    for name, stats in record.items():
        w = weights.WeightTensor(name, dims[name], stats["dtype"], "float16", stats["mean"], stats["std"])
        drawn = weights.draw(w, 3)
        assert drawn.dtype == filled[name].dtype and np.array_equal(drawn, filled[name]), name
        half = next(weights.regenerate([w], 3))
        assert half.dtype == np.float16 and np.array_equal(half, filled[name].astype(np.float16))


def test_weight_digest_detects_changes():
    w = weights.WeightTensor("w", (8, 8), "float32", "float32", 0.1, 0.5)
    d1, d2 = weights.WeightDigest(), weights.WeightDigest()
    d1.update(weights.draw(w, 0))
    d2.update(weights.draw(w, 1))
    assert d1.hexdigest() != d2.hexdigest()
    weights.check_digest(d1.hexdigest(), d1.hexdigest(), "m")
    with pytest.raises(BenchError, match="random streams"):
        weights.check_digest(d1.hexdigest(), d2.hexdigest(), "m")
    const = weights.WeightTensor("c", (3,), "float32", "float32", 2.5, 0.0)
    assert np.all(weights.draw(const, 0) == 2.5)


# -------------------------------------------------------------------------------------------- numerics
@pytest.mark.parametrize("size", [10, 65536, 65537, 2_000_006, 300_000])
def test_sample_indices_are_distinct_and_spread(size):
    sample = numerics.sample_for(size, limit=65536)
    idx = sample.indices()
    assert len(idx) == min(size, 65536) and len(np.unique(idx)) == len(idx)
    assert idx.min() >= 0 and idx.max() < size
    if size > 65536:  # spread over the tensor, not its head
        assert idx.max() > size * 0.9
    assert numerics.Sample.from_json(sample.to_json()) == sample


def test_compare_relative_error_and_poison():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((300, 400)).astype(np.float32)
    sample = numerics.sample_for(ref.size, limit=1000)
    kept = numerics.take_sample(ref, sample)
    out = ref + 1e-4 * rng.standard_normal(ref.shape).astype(np.float32)
    check = numerics.compare("y", out, kept, sample)
    expect = np.linalg.norm((out.reshape(-1) - ref.reshape(-1))[sample.indices()]) / np.linalg.norm(kept)
    assert check.rel_err == pytest.approx(expect, rel=1e-6) and check.ok_values
    assert numerics.summarize([check], "float32")["numerics_ok"] is True
    # an element the model never wrote stays NaN (poison), even off the sample
    unsampled = np.setdiff1d(np.arange(ref.size), sample.indices())[0]
    out.reshape(-1)[unsampled] = np.nan
    bad = numerics.compare("y", out, kept, sample)
    assert bad.nonfinite == 1 and not bad.ok_values
    assert numerics.summarize([bad], "float32")["numerics_ok"] is False
    # a 10% error fails fp32 and fp16 tolerances
    far = numerics.compare("y", ref * 1.1, kept, sample)
    assert far.rel_err == pytest.approx(0.1, rel=1e-5)
    assert numerics.summarize([far], "float16")["numerics_ok"] is False


def test_poison_values():
    assert math.isnan(numerics.poison_value(np.float16))
    assert numerics.poison_value(np.int32) == np.iinfo(np.int32).max
    assert numerics.poison_value(np.bool_) is True


# ---------------------------------------------------------------------------------------------- timing
def test_measure_rotates_sets_and_excludes_warmup():
    calls, prepared = [], []
    samples = timing.measure(calls.append, n_sets=3, warmup=2, runs=5,
                             make_timer=lambda n: timing.HostTimer(lambda: None, n), prepare=prepared.append)
    assert calls == [0, 1, 2, 0, 1, 2, 0] and prepared == calls
    assert len(samples) == 5 and all(s >= 0 for s in samples)
    stats = timing.Stats.of([3.0, 1.0, 2.0, 10.0])
    assert (stats.median_ms, stats.min_ms, stats.max_ms, stats.runs) == (2.5, 1.0, 10.0, 4)
    with pytest.raises(BenchError):
        timing.measure(calls.append, 0, 0, 1, lambda n: timing.HostTimer(lambda: None, n))


# -------------------------------------------------------------------------------------- manifest, results
def _entry() -> ModelEntry:
    return ModelEntry(
        name="m", source="m.onnx", dtype="float16", inputs=_specs(),
        outputs=[OutputSpec("y", (2, 3), "float16", numerics.sample_for(6))],
        weights=[weights.WeightTensor("w", (4, 4), "float32", "float16", 0.0, 1.0)], transform_params=True,
        check_sets=[0, 1], check_digests=["a", "b"], ref_nonfinite=[[0], [0]], flops=2_000_000_000,
        min_traffic_bytes=3_350_000, compute_dtype="float16",
        builds=[BuildEntry("baseline", "baseline", library="lib/m__baseline.so", kernels=7, stage_s={"nvcc": 1.5})])


def _manifest() -> Manifest:
    return Manifest(target="tvm_ext/h100", target_kind="cuda", dtype="float16", created="2026-01-01T00:00:00+00:00",
                    commit="abc", tvm_version="0.27", models=[_entry()],
                    devices={"h100": {"full_name": "NVIDIA H100 SXM5 80GB", "dram_bandwidth_bytes_per_s": 3.35e12,
                                      "peak_flops": {"float16": 1e15, "float32": 6.7e13}}})


def test_manifest_round_trip(tmp_path):
    manifest = _manifest()
    manifest.write(tmp_path)
    back = read_manifest(tmp_path)
    assert back.to_json() == manifest.to_json()
    assert back.model("m").builds[0].kernels == 7 and back.model("m").weight_bytes == 32
    with pytest.raises(BenchError, match="no model 'x'"):
        back.model("x")
    (tmp_path / "manifest.json").write_text(json.dumps({"format": "other"}))
    with pytest.raises(BenchError, match="not a tvm_ext.bench"):
        read_manifest(tmp_path)
    with pytest.raises(BenchError, match="not a benchmark bundle"):
        read_manifest(tmp_path / "nothing")


def test_roofline_uses_the_run_device():
    manifest, entry = _manifest(), _entry()
    ms, name = roofline_ms(manifest, entry, "NVIDIA H100 80GB HBM3")
    assert name == "h100" and ms == pytest.approx(max(2e9 / 1e15, 3.35e6 / 3.35e12) * 1e3)
    assert roofline_ms(manifest, entry, "AMD EPYC") == (None, None)


def _record(**kw):
    base = {"model": "m", "system": "baseline", "device": "NVIDIA H100 80GB HBM3", "driver": "580.1",
            "commit": "abc", "date": "2026-11-22T12:00:00+00:00", "median_ms": 1.5, "min_ms": 1.4, "max_ms": 2.0,
            "kernels": 7, "max_rel_err": 1e-3, "numerics_ok": True, "roofline_ms": 0.5, "roofline_fraction": 1 / 3}
    base.update(kw)
    return base


def test_results_jsonl_and_markdown(tmp_path):
    path = tmp_path / "r" / "x.jsonl"
    results.append_jsonl(path, [_record(), _record(system="torch-eager", max_rel_err=float("nan"), kernels=None)])
    results.append_jsonl(path, [_record(model="n", median_ms=None, min_ms=None, max_ms=None, error="boom")])
    back = results.read_jsonl(path)
    assert [r["system"] for r in back] == ["baseline", "torch-eager", "baseline"]
    assert back[1]["max_rel_err"] is None  # NaN is not JSON
    table = results.markdown_table(back)
    assert "| m | baseline | 1.500 | 1.400 | 2.000 |" in table and "33.3%" in table
    assert "| n | baseline | failed: boom" in table and "| m | 1.500 | 1.500 |" in table
    with pytest.raises(BenchError, match="lacks"):
        results.append_jsonl(path, [{"model": "m"}])
    (tmp_path / "bad.jsonl").write_text("[1]\n")
    with pytest.raises(BenchError, match="not a JSON object"):
        results.read_jsonl(tmp_path / "bad.jsonl")
    assert results.results_name("2026-11-22T12:05:09+00:00", "NVIDIA H100 80GB HBM3", "0123456789abcdef") == \
        "20261122T1205Z_nvidia-h100-80gb-hbm3_0123456789ab"


# ---------------------------------------------------------------------------------------------- suites
def test_suite_resolution():
    skeletons = sorted(suite._skeleton_dir().glob("*.onnx"))
    if skeletons:
        assert [s.path for s in suite.suite("seed")] == skeletons
    else:
        with pytest.raises(BenchError, match="no skeletons"):
            suite.suite("seed")
    assert [s.name for s in suite.suite("small")] == ["mlp", "conv_block"]
    assert suite.resolve(["mlp"])[0].builder == "mlp"
    if skeletons:
        stem = skeletons[0].stem
        short = stem[:-5] if stem.endswith("_fp32") else stem
        assert suite.resolve([stem])[0] == suite.resolve([short])[0] == suite.ModelSource(short, path=skeletons[0])
    with pytest.raises(BenchError, match="unknown model 'nope'.*bundled"):
        suite.resolve(["nope"])
    with pytest.raises(BenchError, match="unique"):
        suite.resolve(["mlp", "mlp"])
    with pytest.raises(BenchError, match="unknown suite"):
        suite.suite("big")


def test_corpus_record_of_a_skeleton():
    path = suite._skeleton_dir() / "bert_base_s128_b1_fp32.onnx"
    if not path.is_file():
        pytest.skip("bert_base skeleton not committed")
    record = suite.corpus_record(onnx.load(str(path), load_external_data=False))
    assert record["model"] == "bert_base" and record["batch"] == 1 and record["seq"] == 128
    assert record["int_inputs"]["attention_mask"] == [1, 2]
    assert suite.corpus_record(get_model("mlp")) is None


# ------------------------------------------------------------------------------------------- prepare
def _odd_names_model() -> onnx.ModelProto:
    """x @ W (W an initializer named like a torch export) -> Relu, with '/'-names inside."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((64, 64)).astype(np.float32), "/enc/W::0")
    b = numpy_helper.from_array(rng.standard_normal((64,)).astype(np.float32), "onnx::Add_7")
    nodes = [onnx.helper.make_node("MatMul", ["x", "/enc/W::0"], ["/enc/MatMul_output_0"]),
             onnx.helper.make_node("Add", ["/enc/MatMul_output_0", "onnx::Add_7"], ["/enc/Add_output_0"]),
             onnx.helper.make_node("Relu", ["/enc/Add_output_0"], ["y"])]
    graph = onnx.helper.make_graph(nodes, "odd", [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 64])],
                                   [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4, 64])], [w, b])
    return onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8)


def test_weights_become_inputs_with_identifier_names(tmp_path):
    import re

    import onnxruntime as ort

    from tvm_ext.bench.prepare import prepare, weights_as_inputs
    from tvm_ext.inspect import inspect

    skeleton = make_skeleton(_odd_names_model())
    model, ws = weights_as_inputs(skeleton, "float32")
    onnx.checker.check_model(model)
    assert [w.name for w in ws] == ["/enc/W::0"] and ws[0].input_name == "enc_W__0"  # bias (64 values) stays
    names = [o for n in model.graph.node for o in n.output] + [i.name for i in model.graph.input]
    assert all(re.fullmatch(r"[A-Za-z_]\w*", n) for n in names), names
    filled = fill_skeleton(skeleton, seed=0)
    x = np.random.default_rng(1).standard_normal((4, 64)).astype(np.float32)
    want = ort.InferenceSession(filled.SerializeToString()).run(None, {"x": x})[0]
    got = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x, "enc_W__0": weights.draw(ws[0], 0)})[0]
    np.testing.assert_array_equal(got, want)
    path = tmp_path / "odd.onnx"
    onnx.save(_odd_names_model(), str(path))
    prepared = prepare(suite.ModelSource("odd", path=path), fp16=True)
    assert prepared.transform_params and [p.name for p in prepared.mod["main"].params][0] == "x"
    report = inspect(prepared.mod, "tvm_ext/h100", "baseline", keep_source=True)  # source only: no nvcc here
    params = re.findall(r"__restrict__ (\S+?)[,)]", report.cuda_source)
    assert params and all(re.fullmatch(r"\w+", p) for p in params), params
