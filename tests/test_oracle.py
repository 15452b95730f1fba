"""The CPU oracle: check_model passes on a correct build and can fail."""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tvm_ext.errors import NumericsMismatchError, PresetError
from tvm_ext.testing import oracle
from tvm_ext.testing.compare import assert_close, compare_outputs
from tvm_ext.testing.onnx_backend import backend_for
from tvm_ext.testing.tolerance import tolerance_for

pytestmark = pytest.mark.filterwarnings("ignore:Renaming name:UserWarning")  # TVM's importer on "x.1"


def _mlp_softmax(n: int = 8, k: int = 32, m: int = 48, batch_dim: str | int = 8) -> onnx.ModelProto:
    """MatMul + Add + Relu + Softmax with two outputs (the softmax and the relu)."""
    rng = np.random.default_rng(1)
    w = numpy_helper.from_array(rng.standard_normal((k, m)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal((m,)).astype(np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x.1", "w"], ["mm"]),
         helper.make_node("Add", ["mm", "b"], ["biased"]),
         helper.make_node("Relu", ["biased"], ["act"]),
         helper.make_node("Softmax", ["act"], ["prob"], axis=-1)],
        "mlp_softmax",
        [helper.make_tensor_value_info("x.1", TensorProto.FLOAT, [batch_dim, k])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [batch_dim, m]),
         helper.make_tensor_value_info("act", TensorProto.FLOAT, [batch_dim, m])],
        [w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _log_model() -> onnx.ModelProto:
    """y = Log(x): NaN for negative inputs, in onnxruntime and in ours alike."""
    graph = helper.make_graph([helper.make_node("Log", ["x"], ["y"])], "log",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def model() -> onnx.ModelProto:
    return _mlp_softmax()


@pytest.fixture(scope="module")
def baseline_result(model):
    return oracle.check_model(model, "baseline")


def test_check_model_passes_baseline(baseline_result):
    r = baseline_result
    assert r.ok, r.message()
    assert r.preset == "baseline" and (r.rtol, r.atol) == tolerance_for("float32")
    assert [o.name for o in r.outputs] == ["prob", "act"]
    assert all(o.ok and o.shape == (8, 48) and o.size == 8 * 48 for o in r.outputs)
    assert 0.0 <= r.max_abs_err < 1e-5 and r.max_rel_err < 1e-4 and r.max_tol_ratio < 1.0
    r.raise_on_mismatch()  # no exception


def test_symbolic_batch_with_shapes():
    r = oracle.check_model(_mlp_softmax(batch_dim="n"), shapes={"x.1": [3, 32]}, seed=5)
    assert r.ok, r.message()
    assert r.outputs[0].shape == (3, 48)


def test_perturbed_build_is_caught(model, monkeypatch):
    real_run = oracle.run_cpu

    def perturbed(vm, inputs, **kw):
        outs = real_run(vm, inputs, **kw)
        outs[0] = outs[0].copy()
        outs[0][2, 3] += 1e-2  # one element of the softmax off by 1e-2
        return outs

    monkeypatch.setattr(oracle, "run_cpu", perturbed)
    r = oracle.check_model(model, "baseline")
    assert not r.ok
    prob, act = r.outputs
    assert not prob.ok and prob.mismatched == 1 and prob.max_abs_err == pytest.approx(1e-2, rel=1e-3)
    assert act.ok
    with pytest.raises(NumericsMismatchError, match=r"prob: max abs err 0\.01"):
        r.raise_on_mismatch()


def test_wrong_reference_is_caught(model, monkeypatch):
    real_ref = oracle.onnxruntime_outputs
    monkeypatch.setattr(oracle, "onnxruntime_outputs",
                        lambda m, feeds: [o[::-1].copy() for o in real_ref(m, feeds)])  # rows swapped
    r = oracle.check_model(model, "baseline")
    assert not r.ok and r.max_abs_err > 1e-2


def test_nan_detection():
    # Log of standard-normal inputs: NaN at negative entries on both sides -> still ok.
    assert oracle.check_model(_log_model()).ok
    ref = np.array([1.0, np.nan, 3.0])
    errs = compare_outputs([np.array([1.0, np.nan, 3.0])], [ref], rtol=1e-4, atol=1e-5)
    assert errs[0].ok and errs[0].nan_mismatch == 0
    errs = compare_outputs([np.array([np.nan, np.nan, 3.0])], [ref], rtol=1e-4, atol=1e-5)
    assert not errs[0].ok and errs[0].nan_mismatch == 1 and errs[0].mismatched == 0
    errs = compare_outputs([np.array([1.0, 2.0, 3.0])], [ref], rtol=1e-4, atol=1e-5)
    assert not errs[0].ok and errs[0].nan_mismatch == 1  # reference NaN we did not produce
    errs = compare_outputs([np.array([np.inf, np.nan, 3.0])], [np.array([-np.inf, np.nan, 3.0])],
                           rtol=1e-4, atol=1e-5)
    assert not errs[0].ok and errs[0].mismatched == 1


def test_nan_in_ours_fails_check_model(model, monkeypatch):
    real_run = oracle.run_cpu

    def with_nan(vm, inputs, **kw):
        outs = real_run(vm, inputs, **kw)
        outs[1] = outs[1].copy()
        outs[1][0, 0] = np.nan
        return outs

    monkeypatch.setattr(oracle, "run_cpu", with_nan)
    r = oracle.check_model(model)
    assert not r.ok and r.has_nan_mismatch and r.outputs[1].nan_mismatch == 1
    assert "NaN" in r.message()


def test_relative_error_definition():
    # a reference of RMS < 1, so atol stays 1e-5 (larger outputs scale it: see below)
    errs = compare_outputs([np.array([1.0 + 5e-5, 2e-9, 0.5])], [np.array([1.0, 1e-9, 0.5])],
                           rtol=1e-4, atol=1e-5)
    e = errs[0]
    assert e.ok
    # |b| floored at atol: 1e-9 / 1e-5 = 1e-4 for the tiny element, 5e-5 for the first.
    assert e.max_rel_err == pytest.approx(1e-4, rel=1e-6)
    assert e.max_abs_err == pytest.approx(5e-5, rel=1e-6)
    # share of tolerance: 5e-5 / (1e-5 + 1e-4 * 1) is the worst element.
    assert e.tol_ratio == pytest.approx(5e-5 / 1.1e-4, rel=1e-6)


def test_assert_close_and_shape_dtype():
    assert_close(np.ones(3), np.ones(3) + 1e-7)
    with pytest.raises(NumericsMismatchError, match="1 of 1 outputs differ"):
        assert_close(np.ones(3), np.array([1.0, 1.0, 1.1]))
    assert not compare_outputs([np.ones((2, 3))], [np.ones((3, 2))], rtol=0, atol=0)[0].ok
    assert not compare_outputs([np.ones(2, "int32")], [np.ones(2, "int64")], rtol=0, atol=0,
                               check_dtype=True)[0].ok
    assert not compare_outputs([np.array([3], "int64")], [np.array([4], "int64")], rtol=1, atol=1)[0].ok
    assert not compare_outputs([np.ones(2)], [np.ones(2), np.ones(2)], rtol=0, atol=0)[0].ok


def test_unknown_preset_raises(model, planned_preset):
    with pytest.raises(PresetError, match="unknown preset 'nope'"):
        oracle.check_model(model, "nope")
    with pytest.raises(PresetError, match="not implemented"):
        oracle.check_model(model, planned_preset)
    with pytest.raises(PresetError):
        backend_for("nope")


def test_fp16_within_tolerance(model):
    r = oracle.check_model(model, fp16=True)
    assert r.ok, r.message()
    assert (r.rtol, r.atol) == tolerance_for("float16") and r.fp16
    # fp16 rounding is visible (so the fp16 path really ran) but uses little of the tolerance.
    assert r.max_abs_err > 1e-4
    assert 0.0 < r.max_tol_ratio < 0.5


def test_backend_prepare_and_run(model, baseline_result):
    backend = backend_for("baseline")
    assert backend.supports_device("CPU") and not backend.supports_device("CUDA")
    rep = backend.prepare(model, "CPU")
    x = np.random.default_rng(0).standard_normal((8, 32)).astype(np.float32)
    out = rep.run([x])
    ref = oracle.onnxruntime_outputs(model, {"x.1": x})
    assert len(out) == 2 and out.prob.shape == (8, 48)
    assert_close(list(out), ref, names=["prob", "act"])
    np.testing.assert_array_equal(rep.run({"x.1": x})["act"], out[1])


def test_backend_passes_onnx_runner(monkeypatch):
    """onnx's own BackendTest drives the backend (prepare + run on CPU, cuda variants skipped)."""
    import unittest

    import onnx.backend.test
    import onnx.backend.test.runner as onnx_runner

    # Only the shipped "simple" models here: loading the node kind would run every onnx case
    # module (~8 s); node cases have their own suite (test_node_suite.py).
    real_load = onnx_runner.load_model_tests
    monkeypatch.setattr(onnx_runner, "load_model_tests",
                        lambda data_dir=None, kind=None: [] if kind != "simple" else real_load(kind=kind))
    runner = onnx.backend.test.BackendTest(backend_for("baseline"), __name__)
    runner.include(r"^test_(single_relu|sign)_model_")
    cases = unittest.defaultTestLoader.loadTestsFromTestCase(runner.test_cases["OnnxBackendSimpleModelTest"])
    result = unittest.TestResult()
    cases.run(result)
    ran = result.testsRun - len(result.skipped)
    assert ran == 2 and not result.failures and not result.errors, result.failures + result.errors
    skipped = {t.id().rsplit(".", 1)[-1]: why for t, why in result.skipped}
    assert "test_single_relu_model_cuda" in skipped  # supports_device("CUDA") is False


def test_one_tolerance_policy():
    from tvm_ext.testing.tolerance import normwise_tolerance_for

    assert tolerance_for("float32") == (1e-4, 1e-5) and tolerance_for(np.dtype("float64")) == (1e-4, 1e-5)
    assert tolerance_for("float16") == tolerance_for("bfloat16") == (2e-2, 2e-2)
    assert normwise_tolerance_for("float32") == 1e-3 and normwise_tolerance_for("int64") == 1e-3
    assert normwise_tolerance_for("float16") == 3e-2


def test_absolute_tolerance_follows_the_output_scale():
    """fp16 logits of magnitude ~100: an element near zero off by a few of its terms' ulps passes,
    a sign error does not, and a unit-scale output keeps the base atol."""
    from tvm_ext.testing.tolerance import scaled_atol

    rtol, atol = tolerance_for("float16")
    ref = np.array([120.0, -95.0, 0.01, 80.0])
    ours = ref + np.array([0.5, -0.4, 0.3, 0.2])              # 0.3 on the near-zero element: cancellation
    (err,) = compare_outputs([ours], [ref], rtol=rtol, atol=atol)
    rms = float(np.sqrt(np.mean(ref ** 2)))
    assert err.ok and err.atol == pytest.approx(atol * rms) == pytest.approx(scaled_atol(atol, rms))
    assert not compare_outputs([ref * [1, 1, 1, -1]], [ref], rtol=rtol, atol=atol)[0].ok
    small = np.array([0.5, -0.2, 0.01])
    (unit,) = compare_outputs([small + [0, 0, 0.03]], [small], rtol=rtol, atol=atol)
    assert unit.atol == atol and not unit.ok
