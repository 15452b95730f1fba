"""Measuring planned kernels: MetaSchedule's builder and runner behind our Runner, records the
cost model then prefers. Timed for real on this machine's CPU (no GPU needed)."""
from __future__ import annotations

import pytest
import tvm
from tvm import relax

from tvm_ext.cli import main
from tvm_ext.driver.measure import parse_rpc
from tvm_ext.driver.stages import build
from tvm_ext.errors import TvmExtError
from tvm_ext.hardware import load_device
from tvm_ext.select.database import Database
from tvm_ext.select.measured import MeasuredCostModel
from tvm_ext.select.runner import MetaScheduleRunner, NullRunner, device_type, measure_jobs, record_outcomes
from tvm_ext.toolchain import gpu_available

CPU = tvm.target.Target({"kind": "llvm", "num-cores": 1})


def _norm_softmax() -> tvm.IRModule:
    t = relax.TensorType
    x, g, b = relax.Var("x", t((8, 128, 256), "float32")), relax.Var("g", t((256,), "float32")), \
        relax.Var("b", t((256,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.softmax(relax.op.add(relax.op.nn.layer_norm(x, g, b, axes=[-1]), x)))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def cpu_jobs():
    return measure_jobs(build(_norm_softmax(), CPU, "stitch"))


def test_jobs_are_the_planned_kernels_with_their_selection_keys(cpu_jobs):
    (job,) = cpu_jobs                                   # layer norm + add + softmax: one stitched kernel
    assert job.kernel.generator == "stitch" and job.kernel.key
    # the same kernel built for the GPU has the same key: a CPU- or GPU-side measurement finds it
    (gpu_job,) = measure_jobs(build(_norm_softmax(), tvm.target.Target("tvm_ext/h100"), "stitch"))
    assert gpu_job.kernel.key == job.kernel.key and gpu_job.name == job.name
    assert gpu_job.kernel.launch.grid > 1                # the GPU job is the scheduled kernel


def test_null_runner_measures_nothing_and_says_why(cpu_jobs, tmp_path):
    outcomes = NullRunner("no GPU here").measure(cpu_jobs, CPU)
    assert [(o.latency_s, o.error) for o in outcomes] == [(None, "no GPU here")]
    assert record_outcomes(outcomes, Database(tmp_path / "m.jsonl"), "h100", "none") == 0


def test_metaschedule_runner_times_the_kernel_and_the_cost_model_uses_it(cpu_jobs, tmp_path):
    outcomes = MetaScheduleRunner().measure(cpu_jobs, CPU)
    (out,) = outcomes
    assert out.error is None and 0 < out.latency_s < 1.0
    db = Database(tmp_path / "m.jsonl")
    # filed under "h100" only to show the lookup: a real record comes from that GPU
    assert record_outcomes(outcomes, db, "h100", "local") == 1
    (rec,) = list(db)
    assert (rec.key, rec.device, rec.generator, rec.latency_s) == (out.job.kernel.key, "h100", "stitch", out.latency_s)
    est = MeasuredCostModel(database=db).cost(out.job.kernel, load_device("h100"))
    assert (est.source, est.seconds) == ("measured", out.latency_s)
    assert MeasuredCostModel(database=Database(db.path)).cost(out.job.kernel, load_device("a100")).source == "analytic"


def test_device_type_and_rpc_argument():
    assert device_type(CPU) == "cpu" and device_type(tvm.target.Target("tvm_ext/h100")) == "cuda"
    assert parse_rpc("tracker.local:9190:h100") == ("tracker.local", 9190, "h100")
    for bad in ("tracker", "tracker:x:h100", ":9190:h100", "tracker:9190:"):
        with pytest.raises(TvmExtError, match="HOST:PORT:KEY"):
            parse_rpc(bad)


@pytest.mark.skipif(gpu_available(), reason="checks the message a machine without a GPU gives")
def test_measure_without_gpu_or_tracker_is_a_clear_error(capsys, tmp_path):
    code = main(["-q", "measure", "tvm_ext/models/bert_layer.onnx", "--database", str(tmp_path / "m.jsonl")])
    err = capsys.readouterr().err
    assert code == 2 and "no CUDA GPU" in err and "--rpc" in err
    assert not (tmp_path / "m.jsonl").exists()
