"""The lowered-kernel emulation on kernels the generators build: clean kernels pass, the H200's
wrong kernels are flagged (a fixture keeps one as the code of 6f8d79c built it)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tvm
from tvm.script import tirx as T

from tvm_ext.checks.kernel import emulate_function, run_device_kernel
from tvm_ext.checks.lowered import lower_device
from tvm_ext.driver import preset_passes
from tvm_ext.checks.thread_serial import call_inputs, compare_scheduled

sys.path.insert(0, str(Path(__file__).parent))
from test_stitch_kernels import layer_norm_module, softmax_module, squeeze_excite_module

FIXTURES = Path(__file__).parent / "fixtures"
TARGET = "tvm_ext/h100"


def _staged(mod: tvm.IRModule, preset: str):
    """Target, graph-stage module, scheduled module and the scheduled PrimFuncs' names."""
    target = tvm.target.Target(TARGET)
    with target:
        stages = preset_passes(preset, target)
        fused = tvm.transform.Sequential(stages.graph)(mod)
        scheduled = tvm.transform.Sequential(stages.schedule)(fused)
    names = [gv.name_hint for gv, f in scheduled.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    return target, fused, scheduled, names


def test_mmoe_merged_kernel_of_6f8d79c_is_flagged_where_the_serialized_check_passed():
    """MMoE's merged subprogram kernel (H200: wrong outputs): its cross-thread reductions reached
    CUDA as plain read-modify-writes of one shared element by every thread."""
    mod = tvm.script.from_source((FIXTURES / "mmoe_merged_6f8d79c.tvmscript").read_text())
    reference, scheduled = mod["reference"], mod["scheduled"]
    assert compare_scheduled(reference, scheduled, inputs=6).ok          # what the old check said
    verdict = emulate_function(reference, scheduled, tvm.target.Target(TARGET), name="merged", inputs=6)
    kinds = [f.kind for f in verdict.findings]
    assert "race" in kinds and "mismatch" in kinds
    assert any("matmul_intermediate_shared[0] = matmul_intermediate_shared[0] +" in f.message
               for f in verdict.findings)


@pytest.mark.parametrize("make", [softmax_module, layer_norm_module, squeeze_excite_module],
                         ids=["softmax", "layer_norm", "squeeze_excite"])
@pytest.mark.parametrize("preset", ["stitch", "baseline"])
def test_kernels_that_are_right_pass_the_emulation(make, preset):
    target, fused, scheduled, names = _staged(make(), preset)
    assert names
    for name in names:
        verdict = emulate_function(fused[name], scheduled[name], target, name=name, inputs=call_inputs(fused, name))
        assert verdict.ok, (name, verdict.findings)
        assert verdict.compared > 0 and verdict.blocks_run > 0


@pytest.mark.parametrize("module", ["ProjSoftmaxProj", "GemvThenGemm"])
def test_merged_subprogram_kernels_run_right_as_lowered(module):
    """The merged kernel's reductions over thread-bound loops reach CUDA as allreduces (a virtual
    block loop of constant trip count; row-chain results in registers, one row per threadIdx.y)."""
    import test_subprogram_merge as merge_tests

    from tvm_ext.subprogram.kernel import build, design

    func = merge_tests._fused(getattr(merge_tests, module))
    made = design(func, merge_tests.DEVICE, merge_tests.H100)
    merged = build(func, made.plan, merge_tests.H100)
    verdict = emulate_function(func, merged.func, merge_tests.H100, name="merged")
    assert verdict.ok, verdict.findings
    assert verdict.compared == sum(int(__import__("numpy").prod([int(d) for d in p.ty.shape]))
                                   for p in list(func.params)[-1:])


def _squeeze_excite_fp16(channels: int = 672, reduced: int = 28, side: int = 14) -> tvm.IRModule:
    """EfficientNet-B0's squeeze-excite block in float16: several rows per block in the stitched kernel."""
    from test_stitch_kernels import _module
    from tvm import relax

    t = relax.TensorType
    params = [relax.Var("x", t((1, channels, side, side), "float16")),
              relax.Var("w1", t((reduced, channels, 1, 1), "float16")), relax.Var("b1", t((1, reduced, 1, 1), "float16")),
              relax.Var("w2", t((channels, reduced, 1, 1), "float16")), relax.Var("b2", t((1, channels, 1, 1), "float16"))]

    def body(x, w1, b1, w2, b2):
        h = relax.op.add(relax.op.nn.conv2d(relax.op.mean(x, axis=[2, 3], keepdims=True), w1), b1)
        h = relax.op.multiply(h, relax.op.sigmoid(h))
        gate = relax.op.sigmoid(relax.op.add(relax.op.nn.conv2d(h, w2), b2))
        return relax.op.multiply(x, gate)
    return _module(params, body)


def test_stitched_squeeze_excite_gate_is_read_after_it_is_written():
    """The gate, one value per row, was written by `threadIdx.x < 1` into shared memory and read by
    the row's other threads with no __syncthreads between (the H200's inf on EfficientNet-B0)."""
    target, fused, scheduled, (name,) = _staged(_squeeze_excite_fp16(), "stitch")
    assert scheduled[name].attrs["tvm_ext.schedule_rule"].startswith("stitched")
    verdict = emulate_function(fused[name], scheduled[name], target, name=name, inputs=call_inputs(fused, name))
    assert verdict.ok, verdict.findings


def _fp16_matmul() -> tvm.IRModule:
    from test_stitch_kernels import _module
    from tvm import relax

    t = relax.TensorType
    return _module([relax.Var("a", t((128, 256), "float16")), relax.Var("b", t((256, 128), "float16"))],
                   lambda a, b: relax.op.matmul(a, b))


def _dlight_tensor_core_kernel():
    target, fused, scheduled, (name,) = _staged(_fp16_matmul(), "baseline")
    return fused[name], scheduled[name], name, target


def test_tensor_core_fragments_are_emulated():
    reference, scheduled, name, target = _dlight_tensor_core_kernel()
    (launch,) = lower_device(scheduled, name, target)
    assert "tvm_mma_sync" in str(launch.func)
    verdict = emulate_function(reference, scheduled, target, name=name, inputs=2)
    assert verdict.ok, verdict.findings
    assert verdict.compared == 128 * 128


def test_a_tensor_core_kernel_without_its_barriers_races():
    """dlight's WMMA GEMM with its __syncthreads removed: warps load fragments from shared memory
    other warps are still writing."""
    import numpy as np
    import tvm_ffi
    from tvm import tirx

    _, scheduled, name, target = _dlight_tensor_core_kernel()
    (launch,) = lower_device(scheduled, name, target)

    def drop_sync(stmt, mutator):
        call = stmt.value
        if isinstance(call, tvm.ir.Call) and isinstance(call.op, tvm.ir.Op) and call.op.name == "tirx.tvm_storage_sync":
            return tirx.Evaluate(tirx.IntImm("int32", 0))
        return stmt

    racy = launch.func.with_body(tvm_ffi.structural_mutate(launch.func.body, (tirx.Evaluate, drop_sync)))
    rng = np.random.default_rng(0)
    arrays = {"a": rng.standard_normal((128, 256)).astype("float16"),
              "b": rng.standard_normal((256, 128)).astype("float16")}
    args = [arrays.get(a, np.zeros((128, 128), "float16")) for a in launch.args]
    poisoned = {i for i, a in enumerate(launch.args) if a not in arrays}
    clean, _ = run_device_kernel(launch.func, args, poisoned=poisoned)
    result, _ = run_device_kernel(racy, args, poisoned=poisoned)
    assert clean.findings == []
    assert "race" in {f.kind for f in result.findings}


def test_executed_work_is_counted_and_recomputation_is_a_warning():
    """TVM's default schedule of squeeze-excite's last kernel recomputes the 1x1 convolution and the
    sigmoid for every output element (49 per channel, each by every lane of its thread group):
    right, but a recomputation (a warning)."""
    target, fused, scheduled, names = _staged(squeeze_excite_module(), "baseline")
    verdicts = {name: emulate_function(fused[name], scheduled[name], target, name=name, inputs=call_inputs(fused, name))
                for name in names}
    gated = next(v for n, v in verdicts.items() if "sigmoid" in n)
    assert gated.ok and [w.kind for w in gated.warnings] == ["recompute"]
    assert gated.planned.transcendentals == 256                      # one sigmoid per channel
    assert gated.executed.transcendentals >= 49 * 256                 # one per output element at least
    assert all(v.executed.ratio_over(v.planned) <= 1.0 for n, v in verdicts.items() if "sigmoid" not in n)


def test_an_emulation_past_its_time_limit_is_listed_unchecked():
    from tvm_ext.checks.model import check_kernel

    target, fused, scheduled, (name,) = _staged(softmax_module(), "stitch")
    line = check_kernel(name, fused[name], scheduled[name], target, call_inputs(fused, name), "stitch", seconds=0.0)
    assert line.verdict == "unchecked" and "ran past its 0 s" in line.details[-1]


def test_verify_checks_a_hand_scheduled_prim_func_of_a_relax_module():
    """A user's own scheduled PrimFunc, called from Relax, is checked against its thread-serialized form."""
    from tvm import relax

    from tvm_ext.checks.model import verify

    _, _, scheduled, (name,) = _staged(softmax_module(), "stitch")
    func = scheduled[name]
    for attr in ("tvm_ext.generator", "tvm_ext.plan", "tvm_ext.schedule_rule"):
        func = func.without_attr(attr)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 12, 128, 128), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.add_func(func, "my_softmax")
            y = bb.emit_output(relax.call_tir(gv, (x,), relax.TensorType((8, 12, 128, 128), "float32")))
        bb.emit_func_output(y)
    report = verify(bb.get(), TARGET, "baseline")
    (line,) = report.lines
    assert (line.kernel, line.generator, line.verdict) == ("my_softmax", "hand-written", "ok")
    assert "emulated" in line.checks


# fmt: off
@T.prim_func(private=True, s_tir=True)
def _two_launches_reference(x: T.Buffer((2048,), "float32"), y: T.Buffer((2048,), "float32")):
    t = T.sblock_alloc_buffer((2048,))
    for i in range(2048):
        with T.sblock("double"):
            vi = T.axis.spatial(2048, i)
            t[vi] = x[vi] * T.float32(2)
    for i in range(2048):
        with T.sblock("reverse"):
            vi = T.axis.spatial(2048, i)
            y[vi] = t[2047 - vi] + T.float32(1)


@T.prim_func(private=True, s_tir=True)
def _two_launches(x: T.Buffer((2048,), "float32"), y: T.Buffer((2048,), "float32")):
    T.func_attr({"tirx.is_scheduled": True})
    t = T.sblock_alloc_buffer((2048,))
    for bx in T.thread_binding(64, thread="blockIdx.x"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("double"):
                vi = T.axis.spatial(2048, bx * 32 + tx)
                t[vi] = x[vi] * T.float32(2)
    for bx in T.thread_binding(64, thread="blockIdx.x"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("reverse"):
                vi = T.axis.spatial(2048, bx * 32 + tx)
                y[vi] = t[2047 - vi] + T.float32(1)
# fmt: on


def test_kernels_passing_a_global_intermediate_are_emulated():
    """A function of two launches with a global buffer between them (orchestrate's kernels in
    Segformer-B0 and ConvNeXt-T): the host allocates it; it was listed unchecked ("not a
    parameter"). The producer runs whole: sampled to 16 of its 64 blocks, the reader read what no
    emulated block wrote (a false "uninitialised")."""
    target = tvm.target.Target(TARGET)
    launches = lower_device(_two_launches, "two", target)
    assert [launch.args for launch in launches] == [("t", "x"), ("t", "y")]
    verdict = emulate_function(_two_launches_reference, _two_launches, target, name="two", inputs=1, max_blocks=16)
    assert verdict.ok, verdict.findings
    assert verdict.kernels == 2 and verdict.blocks_run == 64 + 16 and verdict.compared == 16 * 32


def test_swin_stitched_shifted_window_add_norm_matches_its_function():
    """Found by `tvm-ext verify` on the seed suite (bench/verify_full_seed.md): the kernel read
    `lv205` at negative indices and its outputs differed, on the CPU too. The scheduled TIR was
    right: TVM's FlattenBuffer simplified the inlined roll's index through a padded iterator
    (tvm_ext/tir/flatten_guard.py). The fixture keeps the kernel as a712e55 built it; both the
    CPU build and the GPU lowering (emulated) now keep the index."""
    mod = tvm.script.from_source((FIXTURES / "swin_stitched_roll_add_norm.tvmscript").read_text())
    assert compare_scheduled(mod["reference"], mod["scheduled"], inputs=4).ok
    verdict = emulate_function(mod["reference"], mod["scheduled"], tvm.target.Target(TARGET), name="scheduled",
                               inputs=4, max_blocks=16)
    assert verdict.ok, verdict.findings
    # lowered as TVM's own pipeline (the baseline preset's) lowers it, the same kernel is wrong
    unguarded = emulate_function(mod["reference"], mod["scheduled"], tvm.target.Target(TARGET), name="scheduled",
                                 inputs=4, max_blocks=16, pipeline="default")
    assert not unguarded.ok


def _split_module(parts: int = 4) -> tvm.IRModule:
    """``x[1, parts, 64]`` split into ``parts`` rows along axis 1: legalized, every output
    parameter of the PrimFunc is named ``T_split``."""
    from tvm import relax

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, parts, 64), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(bb.emit(relax.op.split(x, parts, axis=1)))
        bb.emit_func_output(out)
    return bb.get()


def test_outputs_sharing_one_parameter_name_are_told_apart():
    """LSTM s32 under `baseline` (2026-11-30): dlight's `split` kernel, 32 launches each writing
    its own output, was reported wrong (every launch's output taken for the first: the launches'
    arguments are named by parameter, and all 32 outputs are named `T_split`). A false finding
    on TVM's own kernel; now each output is its own buffer and the kernel passes."""
    target, fused, scheduled, names = _staged(_split_module(), "baseline")
    (name,) = [n for n in names if "split" in n]
    assert len({p.name for p in scheduled[name].params}) < len(scheduled[name].params)   # the case
    assert len(lower_device(scheduled[name], name, target)) == 4
    verdict = emulate_function(fused[name], scheduled[name], target, name=name, inputs=call_inputs(fused, name))
    assert verdict.ok, verdict.findings
    assert verdict.compared == 4 * 64
