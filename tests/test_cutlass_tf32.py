"""float32 models on CUTLASS: TF32 tensor cores behind ``tvm_ext.cutlass.allow_tf32`` (off by default).

Fast tests cover the switch, the partition, the TF32 candidates and emitted sources, the cost model
and the report without the switch. The BERT layer with the switch is slow: its CUTLASS instances
go through nvcc for sm_90 (about 80 s on 2 cores cold; cached under ``TVM_EXT_CUTLASS_CACHE``).
Nothing here runs on a GPU.
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

import tvm_ext.cutlass as tc
from tvm_ext.cutlass.candidates import candidates
from tvm_ext.cutlass.emit_conv import emit_conv2d
from tvm_ext.cutlass.emit_gemm import emit_gemm
from tvm_ext.cutlass.generator import CutlassPlan
from tvm_ext.cutlass.patterns import Rejections, cutlass_patterns
from tvm_ext.cutlass.precision import allow_tf32, math_dtype, precision_label, tf32_allowed
from tvm_ext.cutlass.pricing import describe
from tvm_ext.cutlass.records import workload_dtype
from tvm_ext.hardware import load_device
from tvm_ext.select.analytic import AnalyticCostModel, peak_flops
from tvm_ext.select.candidate import CodePath

BERT = Path(__file__).resolve().parents[1] / "tvm_ext" / "models" / "bert_layer.onnx"
NOT_ALLOWED = "TF32 tensor cores not allowed (allow_tf32=False"


@I.ir_module
class Fp32MatmulBiasRelu:
    @R.function
    def main(x: R.Tensor((64, 33), "float32"), w: R.Tensor((33, 48), "float32"), b: R.Tensor((48,), "float32")):
        with R.dataflow():
            o = R.nn.relu(R.add(R.matmul(x, w), b))
            R.output(o)
        return o


def _gemm(dtype: str = "float32", layout_b: str = "row", m: int = 512, n: int = 512, k: int = 512) -> tc.GemmWorkload:
    return tc.GemmWorkload("matmul", 1, m, n, k, dtype, dtype, dtype, layout_b, tc.Epilogue("bias", "relu"))


def _codegen_funcs(mod: tvm.IRModule) -> list:
    return [f for _, f in mod.functions_items() if f.attrs is not None and "Codegen" in f.attrs]


def test_switch_is_off_by_default_and_scoped():
    assert not tf32_allowed()
    with allow_tf32():
        assert tf32_allowed()
        with allow_tf32(False):
            assert not tf32_allowed()
        assert tf32_allowed()
    assert not tf32_allowed()
    assert (math_dtype("float32"), math_dtype("float16")) == ("tfloat32", "float16")
    assert (precision_label("float32"), precision_label("bfloat16")) == ("tf32 tensor cores", "bf16 tensor cores")


def test_fp32_partition_needs_the_switch_and_takes_odd_k():
    tvm.ir.assert_structural_equal(tc.partition_for_cutlass(Fp32MatmulBiasRelu), Fp32MatmulBiasRelu)
    with allow_tf32():
        part = tc.partition_for_cutlass(Fp32MatmulBiasRelu)
    (func,) = _codegen_funcs(part)
    off = tc.workload_from_function(func)
    # K = 33 is fine for float32: the cp.async main loop copies one 4-byte element at a time
    assert off.composite == "tvm_ext_cutlass.matmul_bias_relu"
    assert (off.workload.dtype, off.workload.k, off.workload.max_alignment) == ("float32", 33, (1, 4, 4))


def test_rejections_say_why_per_operator():
    rejections = Rejections()
    relax.transform.FuseOpsByPattern(cutlass_patterns(rejections=rejections), bind_constants=False,
                                     annotate_codegen=True)(Fp32MatmulBiasRelu)
    ((var, reason),) = list(rejections.items())
    assert NOT_ALLOWED in reason and "allow_tf32()" in reason and "--allow-tf32" in reason
    assert isinstance(var, relax.Var)


def test_tf32_candidates_use_tf32_tiles_and_instructions():
    h100 = load_device("h100")
    cands = candidates(_gemm(), "sm_90a", h100)
    two, three = [c for c in cands if c.api == "2x"], [c for c in cands if c.api == "3x"]
    assert two and three
    assert {c.instruction for c in two} == {(16, 8, 8)}       # mma.sync m16n8k8 tf32
    assert {c.threadblock[2] for c in two} == {16, 32}          # 64 / 128 bytes of K per stage row
    assert all(c.instruction == (64, c.threadblock[1], 8) and c.threadblock[2] == 32 for c in three)  # wgmma k8
    assert {c.alignment for c in cands} == {(4, 4, 4)}           # 128-bit accesses of float32
    fp16 = candidates(_gemm("float16"), "sm_90a", h100)
    assert {c.instruction[2] for c in fp16} == {16}


def test_tf32_sources():
    gemm = _gemm()
    cfg2 = next(c for c in candidates(gemm, "sm_80", load_device("a100")) if c.split_k == 1)
    src = emit_gemm(gemm, cfg2, 80, "tf32_2x")
    assert "cutlass::gemm::GemmShape<16, 8, 8>" in src and "cutlass::arch::OpMultiplyAdd" in src
    assert "float, cutlass::layout" in src and "half_t" not in src
    cfg3 = next(c for c in candidates(_gemm(layout_b="col"), "sm_90a", load_device("h100")) if c.api == "3x")
    src3 = emit_gemm(_gemm(layout_b="col"), cfg3, 90, "tf32_3x")
    assert "KernelTmaWarpSpecialized" in src3 and "half_t" not in src3
    conv = tc.Conv2dWorkload(1, 16, 16, 64, 64, 3, 3, 16, 16, (1, 1), (1, 1), (1, 1), "float32", "float32", "float32",
                             tc.Epilogue("bias", "relu"))
    cfgc = candidates(conv, "sm_80", load_device("a100"))[0]
    srcc = emit_conv2d(conv, cfgc, "tf32_conv")
    assert "cutlass::gemm::GemmShape<16, 8, 8>" in srcc and "half_t" not in srcc


def test_cost_model_prices_tf32_at_the_tensor_core_peak():
    h100 = load_device("h100")
    assert peak_flops(h100, CodePath.MMA_SYNC, "tfloat32") == h100.peak_flops["tfloat32"] == 494.7e12
    wl32, wl16 = _gemm(m=4096, n=4096, k=4096), _gemm("float16", m=4096, n=4096, k=4096)
    cfg = next(c for c in candidates(wl32, "sm_80", h100) if c.split_k == 1)
    k32, k16 = describe(wl32, cfg, h100), describe(wl16, cfg, h100)
    assert (k32.dtype, k16.dtype) == ("tfloat32", "float16")
    model = AnalyticCostModel()
    # same tiles and work: TF32 runs at half the fp16 tensor-core rate (494.7 vs 989.4 TFLOP/s)
    ratio = model.parts(k32, h100)["compute_s"] / model.parts(k16, h100)["compute_s"]
    assert ratio == pytest.approx(h100.peak_flops["float16"] / h100.peak_flops["tfloat32"])
    assert workload_dtype(wl32) == "tfloat32->float32" and workload_dtype(wl16) == "float16->float16"


def test_plan_says_which_precision():
    cfg = next(iter(candidates(_gemm(), "sm_80", load_device("a100"))))
    plan = CutlassPlan("tvm_ext_cutlass.matmul_bias_relu", cfg, "sm_80", _gemm().key(), "float32")
    assert "tf32 tensor cores" in plan.summary()
    assert tc.CutlassGenerator().plan_from_json(plan.to_json()) == plan


@pytest.fixture(scope="module")
def bert():
    from tvm_ext.frontend import from_onnx

    return from_onnx(BERT)   # float32, not converted


def _cutlass_launches(report) -> list:
    return [k for k in report.launches if k.generator == "cutlass"]


def test_fp32_bert_without_tf32_offloads_nothing_and_says_why(bert):
    from tvm_ext.inspect import inspect

    report = inspect(bert, "tvm_ext/h100", "cutlass")
    assert _cutlass_launches(report) == []
    dropped = report.to_json()["selection"]["main"]["dropped"]
    gemms = [d for d in dropped if d["generator"] == "cutlass" and not d["reason"].startswith("attention core")]
    assert len(gemms) == 8 and all(NOT_ALLOWED in d["reason"] for d in gemms)   # 6 dense + 2 attention
    (core,) = [d for d in dropped if d["generator"] == "cutlass" and d["reason"].startswith("attention core")]
    assert "float16 or bfloat16" in core["reason"]     # the fused kernel takes no float32, TF32 or not


@pytest.mark.slow
def test_fp32_bert_with_tf32_offloads_its_gemms(bert, tmp_path):
    from tvm_ext.inspect import inspect
    from tvm_ext.inspect.kernels import library_kernels
    from tvm_ext.toolchain import export_library

    with allow_tf32():
        report = inspect(bert, "tvm_ext/h100", "cutlass")   # RunCodegen compiles the instances with nvcc
    launches = _cutlass_launches(report)
    assert sum(k.launches for k in launches) == 8
    assert all("tf32 tensor cores" in k.plan for k in launches)
    dropped = [d["reason"] for d in report.to_json()["selection"]["main"]["dropped"] if d["generator"] == "cutlass"]
    assert len(dropped) == 1 and dropped[0].startswith("attention core")   # float32: no fused attention
    records = library_kernels(report.build.lowered)
    assert {json.loads(str(records[k.func]["kernel"]))["dtype"] for k in launches} == {"tfloat32"}
    assert {str(records[k.func]["record_dtype"]) for k in launches} == {"tfloat32->float32"}
    path = tmp_path / "bert_tf32.so"
    export_library(report.executable, path)
    symbols = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True,
                             check=True).stdout
    assert all(f"__tvm_ffi_{k.func}" in symbols for k in launches)


@pytest.mark.slow
def test_cli_allow_tf32(capsys):
    from tvm_ext.cli import build_parser, main

    assert build_parser().parse_args(["inspect", str(BERT)]).allow_tf32 is False
    assert "allow_tf32" not in build_parser().parse_args(["check", str(BERT)])   # CPU build: no CUTLASS
    assert main(["-q", "inspect", str(BERT), "--preset", "cutlass", "--allow-tf32", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    plans = [k["plan"] for k in report["launches"] if k["generator"] == "cutlass"]
    assert len(plans) == 6 and all("tf32 tensor cores" in p for p in plans)
    assert not tf32_allowed()


@pytest.mark.slow
def test_tf32_conv_and_cutlass3_sources_compile():
    """nvcc builds a TF32 convolution (sm_80) and a CUTLASS 3.x TF32 GEMM with a row-major
    (MN-major) B (sm_90a, about 2 minutes cold)."""
    from tvm_ext.cutlass import nvcc

    conv = tc.Conv2dWorkload(1, 16, 16, 64, 64, 3, 3, 16, 16, (1, 1), (1, 1), (1, 1), "float32", "float32", "float32",
                             tc.Epilogue("bias", "relu"))
    cfgc = tc.cheapest_config(conv, "sm_80", load_device("a100"))[0]
    cfg3 = next(c for c in candidates(_gemm(), "sm_90a", load_device("h100")) if c.api == "3x")
    jobs = [(emit_conv2d(conv, cfgc, "tf32_conv"), "sm_80"), (emit_gemm(_gemm(), cfg3, 90, "tf32_3x"), "sm_90a")]
    assert all(nvcc.compile_object(src, arch).stat().st_size > 0 for src, arch in jobs)


@pytest.mark.slow
def test_tvm_compile_pipeline_reads_the_switch(tmp_path):
    from tvm_ext.toolchain import export_library

    symbols = []
    for allowed in (False, True):
        with allow_tf32(allowed):
            ex = tvm.compile(Fp32MatmulBiasRelu, target="tvm_ext/h100", relax_pipeline="tvm_ext.cutlass")
        path = tmp_path / f"m{int(allowed)}.so"
        export_library(ex, path)
        nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True)
        symbols.append([s for s in nm.stdout.split() if s.endswith("_tvm_ext_cutlass")])
    assert symbols == [[], ["__tvm_ffi_fused_relax_matmul_relax_add_relax_nn_relu_tvm_ext_cutlass"]]
