"""The host-side contract check of CUTLASS library calls, the fixed 2.x launcher and its seeded faults.

The calls below are the H200 run's failures (bench/results/20261126T0116Z_*): dense + bias at
M = 1 and 197 (refused: "Misaligned Operand"), BERT's FFN at M = 128 (wrote D out of bounds), a bias
broadcast along the wrong axis and batched QK^T (read B out of bounds). Each seeded fault is a
copy of a right call whose generated launcher, glue input or configuration is broken in one
place; the check must name it. Slow: two contract programs compile (sm_80, about 1.5 minutes
cold on two cores); results are cached under ``TVM_EXT_CUTLASS_CACHE``.
"""
from __future__ import annotations

import dataclasses
import json

import pytest

from tvm_ext.cutlass import Epilogue, KernelConfig
from tvm_ext.cutlass.contract import ContractCall, check_calls, verdict
from tvm_ext.cutlass.contract_cases import gemm_offload
from tvm_ext.cutlass.instance import kernel_for
from tvm_ext.cutlass.wrapper import emit_glue

ARCH = "sm_80"
CFG = KernelConfig("2x", (128, 128, 32), (2, 2, 1), (16, 8, 16), 3)


def gemm_call(name: str, m: int, n: int, k: int, ep: Epilogue = Epilogue(), *, batch: int = 1,
              b_batched: bool = False, layout_b: str = "col", cfg: KernelConfig = CFG) -> ContractCall:
    """A call as the partitioner makes it (:func:`~tvm_ext.cutlass.contract_cases.gemm_offload`) with ``cfg``."""
    off = gemm_offload(name, m, n, k, ep, batch=batch, b_batched=b_batched, layout_b=layout_b)
    return ContractCall(off, kernel_for(off, cfg, ARCH))


RIGHT = {
    "dense_bias_m1": gemm_call("dense_bias_m1", 1, 768, 768, Epilogue("bias")),
    "dense_bias_m197": gemm_call("dense_bias_m197", 197, 768, 768, Epilogue("bias")),
    "bert_ffn_m128": gemm_call("bert_ffn_m128", 128, 3072, 768, Epilogue("bias", "gelu")),
    "bias_along_n": gemm_call("bias_along_n", 256, 64, 64, Epilogue("bias")),
    "qkt_batched_b": gemm_call("qkt_batched_b", 128, 128, 64, batch=12, b_batched=True, layout_b="row"),
    "bias_residual": gemm_call("bias_residual", 128, 768, 768, Epilogue("bias_residual")),
    "matmul_row_b": gemm_call("matmul_row_b", 128, 256, 64, layout_b="row"),
    "split_k": gemm_call("split_k", 2, 256, 2048, Epilogue("bias"), cfg=dataclasses.replace(CFG, split_k=4)),
}


@pytest.fixture(scope="module")
def right():
    return dict(zip(RIGHT, check_calls(list(RIGHT.values()))))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["dense_bias_m1", "dense_bias_m197"])
def test_dense_bias_at_odd_m_is_accepted(right, name):
    result = right[name]
    assert result.can_implement == "Success" and result.ok, result.line()
    assert result.family == "gemm_2x" and result.samples > 8


@pytest.mark.slow
def test_bert_ffn_writes_only_inside_d(right):
    assert right["bert_ffn_m128"].ok, right["bert_ffn_m128"].line()


@pytest.mark.slow
def test_bias_is_broadcast_along_n(right):
    assert right["bias_along_n"].ok, right["bias_along_n"].line()
    assert right["bias_residual"].ok, right["bias_residual"].line()


@pytest.mark.slow
def test_batched_qkt_stays_in_bounds(right):
    assert right["qkt_batched_b"].ok, right["qkt_batched_b"].line()


@pytest.mark.slow
def test_row_major_b_and_split_k_are_right(right):
    assert right["matmul_row_b"].ok and right["split_k"].ok, (right["matmul_row_b"].line(), right["split_k"].line())


CFG_3X = KernelConfig("3x", (64, 128, 64), (1, 1, 1), (64, 128, 16), 0, cluster=(1, 1, 1), schedule="pingpong")


@pytest.mark.slow
def test_cutlass3_reads_a_b_shared_by_every_batch_once():
    """A [4, M, K] @ B [K, N] on sm_90a: the 3.x launcher took a packed batch stride for B, so
    batches 1-3 read B up to element 65,535 of its 16,384 (found by the coverage matrix)."""
    call = gemm_call("shared_b_m128", 128, 256, 64, batch=4, layout_b="row")
    call = ContractCall(call.offload, kernel_for(call.offload, CFG_3X, "sm_90a"))
    (result,) = check_calls([call])
    assert result.family == "gemm_3x"
    assert result.ok, result.line()


def edited(call: ContractCall, tag: str, old: str, new: str) -> ContractCall:
    """``call`` with its launcher's text ``old`` replaced by ``new`` (a new entry point, so the
    faulty instance and its right twin can share one contract program)."""
    launcher = call.kernel.source.index('extern "C"')
    body = call.kernel.source[launcher:]
    assert old in body, f"the launcher no longer contains {old!r}: update the seeded fault"
    entry = f"{call.kernel.entry}_{tag}"
    source = (call.kernel.source[:launcher] + body.replace(old, new, 1)).replace(call.kernel.entry, entry)
    return dataclasses.replace(call, kernel=dataclasses.replace(call.kernel, entry=entry, source=source))


def with_adapter(call: ContractCall) -> ContractCall:
    """``call`` with the launcher of 6f8d79c: the kernel run through ``GemmUniversalAdapter``."""
    call = edited(call, "adapter", "cutlass::gemm::device::GemmUniversalBase<", "cutlass::gemm::device::GemmUniversalAdapter<")
    source = '#include "cutlass/gemm/device/gemm_universal_adapter.h"\n' + call.kernel.source
    return dataclasses.replace(call, kernel=dataclasses.replace(call.kernel, source=source))


LDS = "args->lda, args->ldb, args->ldc, args->ldd"
FAULTS = {
    "lda_ldb_swapped": (edited(RIGHT["matmul_row_b"], "swapped", LDS, "args->ldb, args->lda, args->ldc, args->ldd"),
                        "differ from the Relax reference"),
    "bias_wrong_stride": (edited(RIGHT["bias_along_n"], "bias_stride", LDS, "args->lda, args->ldb, args->ldd, args->ldd"),
                          "C is read up to element 16,383 of p2, which has 64"),
    "d_past_the_end": (edited(RIGHT["bert_ffn_m128"], "d_offset", "args->source : args->d, args->d,",
                              "args->source : args->d, static_cast<cutlass::half_t*>(args->d) + 8,"),
                       "D is written up to element 393,223 of out, which has 393,216"),
    "misaligned_operand": (dataclasses.replace(RIGHT["dense_bias_m197"], misalign=(("p0", 2),)),
                           "a starts at address"),
    "alignment_refused": (gemm_call("k100", 64, 128, 100, Epilogue("bias")),
                          "can_implement refuses it: Error Misaligned Operand"),
    # the launcher the H200 ran: GemmUniversalAdapter takes the row-major-C kernel for a transposed problem
    "adapter_transposes": (with_adapter(RIGHT["bert_ffn_m128"]),
                           "D is written up to element 9,434,239 of out, which has 393,216"),
}


@pytest.fixture(scope="module")
def faults():
    return dict(zip(FAULTS, check_calls([call for call, _ in FAULTS.values()])))


@pytest.mark.slow
@pytest.mark.parametrize("name", list(FAULTS))
def test_seeded_fault_is_caught(faults, name):
    result = faults[name]
    assert not result.ok
    assert any(FAULTS[name][1] in finding for finding in result.findings), result.line()


@pytest.mark.slow
def test_the_h200_failures_are_reproduced_by_the_old_launcher(faults):
    """M = 128 is accepted and writes far past D, as on the GPU; the wrong-problem mapping shows."""
    result = faults["adapter_transposes"]
    assert result.can_implement == "Success"
    assert "outputs are written into no tensor" in result.line()


def test_alignment_k100_is_what_the_config_says():
    # the faulty case is a configuration that claims 8-element vectors for K = 100
    assert FAULTS["alignment_refused"][0].kernel.config.alignment == (8, 8, 8)
    assert FAULTS["alignment_refused"][0].offload.workload.max_alignment[0] == 4


def test_glue_checks_the_alignment_the_instance_needs():
    call = RIGHT["dense_bias_m1"]
    src = emit_glue([call.offload], [call.kernel.entry], [call.kernel.config])
    assert 'tvm_ext_check_aligned(p0, 16, "dense_bias_m1", "a");' in src
    assert 'tvm_ext_check_aligned(p2, 16, "dense_bias_m1", "bias");' in src
    assert 'tvm_ext_check_aligned(out, 16, "dense_bias_m1", "output");' in src
    narrow = dataclasses.replace(CFG, alignment=(2, 2, 2))
    assert 'tvm_ext_check_aligned(p0, 4, "dense_bias_m1", "a");' in emit_glue([call.offload], ["e"], [narrow])


def test_launcher_runs_the_row_major_problem_through_gemm_universal_base():
    source = RIGHT["bert_ffn_m128"].kernel.source
    launcher = source[source.index('extern "C"'):]
    assert "GemmUniversalBase<" in launcher and "GemmUniversalAdapter" not in source
    assert "tvm_ext_contract::inspect<Launched>(arguments, err, err_len)" in launcher


def _raw(operands, samples, status="Success", bad_reads=()):
    return {"report": {"family": "gemm_2x", "can_implement": status, "operands": operands, "samples": samples,
                       "bad_reads": list(bad_reads)}}


def test_verdict_reads_ranges_writes_and_values():
    call = gemm_call("v", 2, 4, 2)  # a, b: filled; out [1, 2, 4] fp16
    ok = _raw([{"role": "D", "buffer": "out", "offset": 0, "elem": 2, "lo": 0, "hi": 7, "write": True}], [])
    assert "no output was emulated" in verdict(call, ok).line()
    too_far = _raw([{"role": "D", "buffer": "out", "offset": 4, "elem": 2, "lo": 0, "hi": 7, "write": True}], [])
    assert "D is written up to element 9 of out, which has 8" in verdict(call, too_far).line()
    into_input = _raw([{"role": "D", "buffer": "p0", "offset": 0, "elem": 2, "lo": 0, "hi": 3, "write": True}], [])
    assert "D is written into the input p0" in verdict(call, into_input).line()
    nowhere = _raw([{"role": "B", "buffer": None, "offset": 0, "elem": 2, "lo": 0, "hi": 3, "write": False}], [],
                   bad_reads=[["B", 5]])
    assert "B is read through a pointer into no tensor" in verdict(call, nowhere).line()
    assert "the emulation read B outside every tensor" in verdict(call, nowhere).line()
    refused = _raw([], [], status="Error Misaligned Operand")
    assert verdict(call, refused).refused and "Misaligned" in verdict(call, refused).line()


def test_verdict_compares_emulated_outputs_with_the_reference():
    import numpy as np

    from tvm_ext.cutlass.contract_data import filled

    call = gemm_call("v", 2, 4, 8)
    a, b = filled((1, 2, 8), 1), filled((4, 8), 2)
    ref = (a.reshape(2, 8) @ b.T).reshape(-1)
    right = [["out", i, float(ref[i])] for i in range(8)]
    assert verdict(call, _raw([], right)).ok
    wrong = [["out", i, float(ref[(i + 1) % 8]) + 3.0] for i in range(8)]
    assert "emulated outputs differ from the Relax reference" in verdict(call, _raw([], wrong)).line()
    stray = [["p1", 0, 0.0]]
    assert "written into the input p1" in verdict(call, _raw([], stray)).line()
    assert np.isfinite(ref).all()


def test_a_fused_cast_is_compared_at_the_precision_relax_rounds_the_epilogue_in():
    """sigmoid then cast to fp32: Relax rounds the sigmoid to fp16, the kernel keeps fp32, so the
    fp16 tolerance applies (the coverage matrix refused right sigmoid/silu + cast calls)."""
    import numpy as np

    from tvm_ext.cutlass.contract_data import filled, reference_at
    from tvm_ext.cutlass.epilogue import all_epilogues

    ep = next(e for e in all_epilogues() if e.suffix == "_sigmoid_cast")
    off = gemm_offload("v", 2, 4, 8, ep)
    call = ContractCall(off, kernel_for(off, CFG, ARCH))
    tensors = {"a": filled((1, 2, 8), 1), "b": filled((4, 8), 2)}
    ref = reference_at(off, tensors, np.arange(8))
    near = [["out", i, float(ref[i]) * (1 + 4e-4)] for i in range(8)]
    assert verdict(call, _raw([], near)).ok, verdict(call, _raw([], near)).line()
    far = [["out", i, float(ref[i]) * 1.05] for i in range(8)]
    assert "differ from the Relax reference" in verdict(call, _raw([], far)).line()


def _dense_k100():
    from tvm.script import ir as I, relax as R

    @I.ir_module
    class DenseK100:
        @R.function
        def main(x: R.Tensor((64, 100), "float16"), w: R.Tensor((48, 100), "float16"), b: R.Tensor((48,), "float16")):
            with R.dataflow():
                y = R.add(R.matmul(x, R.permute_dims(w)), b)
                R.output(y)
            return y

    return DenseK100


@pytest.mark.slow
def test_generator_passes_over_refused_configurations_and_reports_a_refused_call(monkeypatch):
    """K = 100 allows 4-element vectors only: a configuration claiming 8 is refused by
    ``can_implement``; the generator takes the next one, or drops the call and says why."""
    from tvm_ext.cutlass import generator
    from tvm_ext.inspect import inspect

    wide, narrow = CFG, dataclasses.replace(CFG, alignment=(4, 4, 8))
    monkeypatch.setattr(generator, "ranked_configs", lambda *a: [(wide, False)])
    report = inspect(_dense_k100(), "tvm_ext/a100", "cutlass").to_json()
    dropped = [d for d in report["selection"]["main"]["dropped"] if d["generator"] == "cutlass"]
    assert dropped and "contract check refused 1 configuration" in dropped[0]["reason"]
    assert "can_implement refuses it: Error Misaligned Operand" in dropped[0]["reason"]

    monkeypatch.setattr(generator, "ranked_configs", lambda *a: [(wide, False), (narrow, False)])
    report = inspect(_dense_k100(), "tvm_ext/a100", "cutlass").to_json()
    assert not [d for d in report["selection"]["main"]["dropped"] if d["generator"] == "cutlass"]
    assert narrow.name() in json.dumps(report)


def test_2x_records_timed_with_the_transposing_launcher_are_ignored(tmp_path):
    """A 2.x record from before the launcher fix timed the transposed problem: not used."""
    from tvm_ext.cutlass.generator import CutlassPlan
    from tvm_ext.cutlass.records import best_config, cutlass_record
    from tvm_ext.select.database import Database, Record

    wl = RIGHT["bert_ffn_m128"].offload.workload
    db = Database(tmp_path / "db.jsonl")
    fresh = cutlass_record(wl, CFG, "a100", 9e-6)
    assert fresh.config["launcher"] == 2
    stale = dict(fresh.config)
    del stale["launcher"]
    db.add(Record(fresh.key, "a100", fresh.dtype, "cutlass", 1e-6, stale, "cutlass profiler"))
    assert best_config(db, wl, "a100", ARCH) is None
    db.add(fresh)
    assert best_config(db, wl, "a100", ARCH) == (CFG, 9e-6)
    plan = CutlassPlan("tvm_ext_cutlass.dense_bias_gelu", CFG, ARCH, wl.key(), "float16")
    assert plan.measured_config() == fresh.config  # the measured cost model matches records by it
