"""The bundled ONNX models: valid, runnable, deterministic, and what they claim to be."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from scipy.special import erf

from tvm_ext.errors import TvmExtError
from tvm_ext.models import BUNDLED, BUNDLED_FILE, bert_layer, get_model, write_bundled

SMALL_BERT = dict(batch=2, seq=16, hidden=32, heads=4, intermediate=64)


def _session(model: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _feed(sess: ort.InferenceSession, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    dtypes = {"tensor(float)": np.float32, "tensor(float16)": np.float16}
    return {i.name: rng.standard_normal(i.shape).astype(dtypes[i.type]) for i in sess.get_inputs()}


@pytest.mark.parametrize("name", sorted(BUNDLED))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_bundled_model_is_valid_and_runs(name, dtype):
    model = get_model(name, dtype=dtype)
    onnx.checker.check_model(model, full_check=True)
    sess = _session(model)
    outputs = sess.run(None, _feed(sess))
    declared = model.graph.output
    assert len(outputs) == len(declared) == 1
    out = outputs[0].astype(np.float64)
    assert list(out.shape) == [d.dim_value for d in declared[0].type.tensor_type.shape.dim]
    assert np.isfinite(out).all()
    assert np.abs(out).max() > 0 and out.std() > 1e-3


def test_bundled_file_matches_generator(tmp_path):
    assert BUNDLED_FILE.is_file(), "run tvm_ext.models.write_bundled() to create it"
    size = BUNDLED_FILE.stat().st_size
    assert 1_000_000 < size < 4 * 1024 * 1024
    fresh = write_bundled(tmp_path / "bert_layer.onnx")
    assert fresh.read_bytes() == BUNDLED_FILE.read_bytes()
    model = onnx.load(str(BUNDLED_FILE))
    onnx.checker.check_model(model)
    shapes = {i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in model.graph.input}
    assert shapes == {"hidden_states": [1, 128, 256], "attention_mask": [1, 1, 1, 128]}


def test_builders_are_deterministic_and_seeded():
    a = bert_layer(**SMALL_BERT, seed=3).SerializeToString(deterministic=True)
    b = bert_layer(**SMALL_BERT, seed=3).SerializeToString(deterministic=True)
    c = bert_layer(**SMALL_BERT, seed=4).SerializeToString(deterministic=True)
    assert a == b and a != c


def test_get_model_unknown_name_lists_known_models():
    with pytest.raises(TvmExtError) as info:
        get_model("resnet9000")
    msg = str(info.value)
    assert "resnet9000" in msg
    for name in BUNDLED:
        assert name in msg


@pytest.mark.parametrize("kwargs, fragment", [
    (dict(hidden=30, heads=4), "divisible"),
    (dict(seq=0), "seq must be positive"),
    (dict(dtype="int8"), "float32"),
])
def test_bert_layer_rejects_bad_sizes(kwargs, fragment):
    with pytest.raises(TvmExtError, match=fragment):
        bert_layer(**kwargs)


def _weights(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: onnx.numpy_helper.to_array(t).astype(np.float64) for t in model.graph.initializer}


def _bert_numpy(x, mask, w, heads):
    """Textbook post-LN BERT layer in float64."""
    b, s, hidden = x.shape
    d = hidden // heads

    def lin(t, name):
        return t @ w[f"{name}.weight"] + w[f"{name}.bias"]

    def ln(t, name):
        mu = t.mean(-1, keepdims=True)
        var = ((t - mu) ** 2).mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(var + 1e-12) * w[f"{name}.weight"] + w[f"{name}.bias"]

    def split(t):
        return t.reshape(b, s, heads, d).transpose(0, 2, 1, 3)

    q, k, v = (split(lin(x, f"attention.{n}")) for n in ("query", "key", "value"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + mask
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, hidden)
    h1 = ln(lin(ctx, "attention.output.dense") + x, "attention.output.LayerNorm")
    inter = lin(h1, "intermediate.dense")
    gelu = 0.5 * inter * (1.0 + erf(inter / np.sqrt(2.0)))
    return ln(lin(gelu, "output.dense") + h1, "output.LayerNorm")


def test_bert_layer_is_a_bert_layer():
    model = bert_layer(**SMALL_BERT)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 16, 32)).astype(np.float32)
    mask = np.zeros((2, 1, 1, 16), np.float32)
    mask[1, ..., 10:] = -10000.0  # second sequence: last 6 tokens are padding
    got = _session(model).run(None, {"hidden_states": x, "attention_mask": mask})[0]
    want = _bert_numpy(x.astype(np.float64), mask.astype(np.float64), _weights(model), heads=4)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    ops = [n.op_type for n in model.graph.node]
    assert ops.count("MatMul") == 8 and ops.count("LayerNormalization") == 2
    assert ops.count("Erf") == 1 and ops.count("Softmax") == 1


def test_bert_mask_is_additive_and_optional():
    with_mask, without = bert_layer(**SMALL_BERT), bert_layer(**SMALL_BERT, attention_mask=False)
    assert [i.name for i in without.graph.input] == ["hidden_states"]
    x = np.random.default_rng(2).standard_normal((2, 16, 32)).astype(np.float32)
    zero = np.zeros((2, 1, 1, 16), np.float32)
    masked = zero.copy()
    masked[..., 8:] = -10000.0
    out_zero = _session(with_mask).run(None, {"hidden_states": x, "attention_mask": zero})[0]
    out_masked = _session(with_mask).run(None, {"hidden_states": x, "attention_mask": masked})[0]
    out_plain = _session(without).run(None, {"hidden_states": x})[0]
    np.testing.assert_allclose(out_zero, out_plain, rtol=1e-5, atol=1e-6)
    assert np.abs(out_masked - out_zero).max() > 1e-2


def test_dynamic_bert_runs_at_any_size():
    model = bert_layer(**SMALL_BERT, dynamic=True)
    dims = [d.dim_param for d in model.graph.input[0].type.tensor_type.shape.dim[:2]]
    assert dims == ["batch", "seq"]
    sess = _session(model)
    for b, s in ((1, 5), (3, 16)):
        x = np.ones((b, s, 32), np.float32)
        out = sess.run(None, {"hidden_states": x, "attention_mask": np.zeros((b, 1, 1, s), np.float32)})[0]
        assert out.shape == (b, s, 32)


def test_conv_block_structure():
    model = get_model("conv_block", batch=2, image=16)
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Conv", "BatchNormalization", "Relu", "MaxPool", "GlobalAveragePool", "Flatten", "Gemm"]
    out = _session(model).run(None, {"x": np.ones((2, 3, 16, 16), np.float32)})[0]
    assert out.shape == (2, 10)


def test_mlp_layers_follow_sizes():
    model = get_model("mlp", batch=4, sizes=(8, 16, 32, 2))
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["Gemm", "Relu", "Gemm", "Relu", "Gemm"]
    out = _session(model).run(None, {"x": np.ones((4, 8), np.float32)})[0]
    assert out.shape == (4, 2)
