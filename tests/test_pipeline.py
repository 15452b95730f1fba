"""Presets and their registration with tvm.compile."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import tvm_ext
from tvm_ext.errors import PresetError
from tvm_ext.driver import DEFAULT_PRESET, get_preset, list_presets, preset_pipeline, use_preset
from tvm_ext.inspect import global_kernel_names


@tvm.script.ir_module
class SmallMLP:
    @R.function
    def main(x: R.Tensor((8, 32), "float32"), w: R.Tensor((32, 64), "float32"),
             b: R.Tensor((64,), "float32")) -> R.Tensor((8, 64), "float32"):
        with R.dataflow():
            y = R.matmul(x, w)
            z = R.add(y, b)
            s = R.nn.softmax(R.nn.relu(z), axis=-1)
            R.output(s)
        return s


def _cuda_source(ex) -> str:
    return ex.mod.imports[0].imports[0].inspect_source()


def _small_mlp_inputs() -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(s).astype("float32") for s in ((8, 32), (32, 64), (64,))]


def _small_mlp_ref() -> np.ndarray:
    """softmax(relu(x @ w + b)) in numpy."""
    x, w, b = _small_mlp_inputs()
    z = np.maximum(x @ w + b, 0)
    ref = np.exp(z - z.max(-1, keepdims=True))
    return ref / ref.sum(-1, keepdims=True)


def _run_small_mlp(vm: relax.VirtualMachine) -> np.ndarray:
    return vm["main"](*(tvm.runtime.tensor(a) for a in _small_mlp_inputs())).numpy()


def test_registered_pipelines():
    names = relax.pipeline.PIPELINE_MAP
    assert "tvm_ext" in names
    for preset in list_presets():
        assert f"tvm_ext.{preset.name}" in names


def test_baseline_reproduces_tvm_default_cuda_pipeline(cuda_target):
    default = tvm.compile(SmallMLP, cuda_target)
    ours = tvm.compile(SmallMLP, cuda_target, relax_pipeline="tvm_ext.baseline")
    src_default, src_ours = _cuda_source(default), _cuda_source(ours)
    # matmul + bias + relu fuse into one kernel, softmax (a reduction) is its own
    assert sorted(global_kernel_names(src_default)) == ["fused_matmul_add_relu_kernel", "softmax_kernel"]
    assert src_ours == src_default


def test_tvm_compile_with_tag_and_pipeline_name():
    ex = tvm.compile(SmallMLP, target="tvm_ext/h100", relax_pipeline="tvm_ext.baseline")
    # baseline: the same two kernels as TVM's default pipeline
    assert sorted(global_kernel_names(_cuda_source(ex))) == ["fused_matmul_add_relu_kernel", "softmax_kernel"]
    assert tvm.target.Target("tvm_ext/h100").attrs["arch"].startswith("sm_90")


def test_tvm_ext_pipeline_runs_the_default_preset_unless_told_otherwise():
    assert DEFAULT_PRESET == "full"
    kernels = {}
    for name in ("tvm_ext", "tvm_ext.full", "tvm_ext.baseline"):
        ex = tvm.compile(SmallMLP, target="tvm_ext/h100", relax_pipeline=name, tir_pipeline="tvm_ext")
        kernels[name] = sorted(global_kernel_names(_cuda_source(ex)))
    assert kernels["tvm_ext"] == kernels["tvm_ext.full"] == ["fused_matmul_add_relu_softmax_kernel"]
    assert kernels["tvm_ext.baseline"] == ["fused_matmul_add_relu_kernel", "softmax_kernel"]
    with tvm_ext.use_preset("baseline"):
        ex = tvm.compile(SmallMLP, target="tvm_ext/h100", relax_pipeline="tvm_ext")
    assert sorted(global_kernel_names(_cuda_source(ex))) == kernels["tvm_ext.baseline"]


def test_unimplemented_preset_names_what_exists(planned_preset):
    with pytest.raises(PresetError, match=r"not implemented yet; available presets: .*baseline"):
        get_preset(planned_preset)
    with pytest.raises(PresetError, match=r"unknown preset 'nope'; available presets: .*baseline"):
        get_preset("nope")


def test_unimplemented_preset_through_tvm_compile_fails_clearly(cuda_target, planned_preset):
    with pytest.raises(PresetError, match=f"'{planned_preset}'.*not implemented"):
        tvm.compile(SmallMLP, cuda_target, relax_pipeline=f"tvm_ext.{planned_preset}")


def test_use_preset_scopes_the_choice():
    assert tvm_ext.driver.active_preset().name == DEFAULT_PRESET == "full"
    with use_preset("baseline") as preset:
        assert preset.name == "baseline" and tvm_ext.driver.active_preset().name == "baseline"
    assert tvm_ext.driver.active_preset().name == "full"
    with pytest.raises(PresetError):
        with use_preset("no_such_preset"):
            pass


def test_cpu_build_of_baseline_matches_numpy(llvm_target):
    ex = tvm.compile(SmallMLP, llvm_target, relax_pipeline=preset_pipeline("baseline", llvm_target))
    np.testing.assert_allclose(_run_small_mlp(relax.VirtualMachine(ex, tvm.cpu())), _small_mlp_ref(),
                               rtol=1e-5, atol=1e-6)


def test_graph_stage_fuses_and_is_target_independent(llvm_target):
    fused = tvm_ext.graph_passes("baseline")(SmallMLP)
    prim_funcs = [gv.name_hint for gv, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]
    assert sorted(prim_funcs) == ["fused_matmul_add_relu", "softmax"]  # matmul+add+relu fuse; softmax separate
    assert not any(f.attrs is not None and "tirx.is_scheduled" in f.attrs
                   for _, f in fused.functions_items() if isinstance(f, tvm.tirx.PrimFunc))
    ex = tvm.compile(fused, llvm_target, relax_pipeline="default_build")  # unscheduled: builds for the CPU
    np.testing.assert_allclose(_run_small_mlp(relax.VirtualMachine(ex, tvm.cpu())), _small_mlp_ref(),
                               rtol=1e-5, atol=1e-6)


def test_tvm_compile_bert_layer_with_tvm_ext_pipeline():
    from tvm_ext.frontend import from_onnx
    from tvm_ext.models import BUNDLED_FILE

    mod = from_onnx(BUNDLED_FILE)
    ex = tvm.compile(mod, target="tvm_ext/h100", relax_pipeline="tvm_ext.baseline")
    src = _cuda_source(ex)
    # Distinct kernels by FuseOps' rules (a GEMM takes following elementwise/broadcast ops; reshapes
    # and transposes fuse with each other, not into a GEMM): Q/K/V dense + bias (one kernel, same
    # shapes), reshape + transpose for Q/V and for K (two layouts), Q @ K^T / 8 + mask, softmax,
    # P @ V, transpose + reshape back, output dense + bias + residual, layer norm (both calls),
    # FFN1 + bias + GELU, FFN2 + bias + residual: 11.
    names = global_kernel_names(src)
    assert len(names) == 11
    assert {"softmax_kernel", "layer_norm_kernel"} <= set(names)
    (gelu,) = [n for n in names if "gelu" in n]
    assert gelu.startswith("fused_matmul")                           # GELU inside the FFN1 GEMM kernel


def test_stitch_preset_compiles_with_its_tir_pipeline():
    assert get_preset("stitch").tir_pipeline == "tvm_ext"
    assert get_preset("cutlass").tir_pipeline == "tvm_ext"     # TVM's lowering fixes for its other kernels
    assert get_preset("baseline").tir_pipeline == "default"
    ex = tvm_ext.compile(SmallMLP, target="tvm_ext/h100", preset="stitch")
    assert "__global__" in _cuda_source(ex)


def test_every_preset_but_baseline_captures_cuda_graphs_and_prices_launches_so():
    """Issue 37: CUDA graphs by default for static shapes (TVM's RewriteCUDAGraph in the lower
    stage, which ``tvm.compile(..., relax_pipeline="tvm_ext.<preset>")`` runs too), and the
    selection and report price a launch as a graph replay; ``baseline`` stays TVM's pipeline unless
    asked, and then is priced as captured too."""
    from tvm_ext.driver.stages import build, cost_model

    assert [p.name for p in list_presets() if p.implemented and not p.cuda_graph] == ["baseline"]
    target = tvm.target.Target("tvm_ext/h100")
    stitch = build(SmallMLP, target, "stitch")
    assert "vm.builtin.cuda_graph" in stitch.lowered.script()
    assert cost_model(stitch.preset).analytic.cuda_graph
    baseline = build(SmallMLP, target, "baseline")
    assert "vm.builtin.cuda_graph" not in baseline.lowered.script() and not baseline.preset.cuda_graph
    asked = build(SmallMLP, target, "baseline", cuda_graph=True)
    assert "vm.builtin.cuda_graph" in asked.lowered.script()
    assert asked.preset.cuda_graph and cost_model(asked.preset).analytic.cuda_graph


def test_import_registers_everything_tvm_compile_needs():
    """A fresh process: `import tvm_ext` alone must register tags, Relax and TIR pipelines."""
    import subprocess
    import sys

    code = ("import tvm_ext, tvm\n"
            "from tvm.tirx import compilation_pipeline as tir\n"
            "assert 'tvm_ext' in tir.PIPELINE_MAP\n"
            "assert 'tvm_ext.stitch' in tvm.relax.pipeline.PIPELINE_MAP\n"
            "assert tvm.target.Target('tvm_ext/h200').model == 'h200'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Failed to autoload" not in done.stderr
