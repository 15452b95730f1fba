"""CUTLASS instances through nvcc (slow) and on a GPU (gpu).

Cold runtime on 2 cores: about 4 minutes (one sm_80 GEMM, one sm_90a CUTLASS 3.x GEMM, one sm_80
convolution compiled two at a time, a b2b GEMM and a b2b convolution, plus the glue and a profiler
link). Objects are cached under ``~/.cache/tvm_ext/cutlass`` (``TVM_EXT_CUTLASS_CACHE``), so a warm
rerun takes seconds. The whole seed suite is compiled by ``test_cutlass_suite.py``.
"""
from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R, ir as I

import tvm_ext.cutlass as tc

sys.path.insert(0, os.path.dirname(__file__))  # sibling test module with the b2b model
from tvm_ext.cutlass import nvcc
from tvm_ext.cutlass.codegen import module_kernels
from tvm_ext.cutlass.instance import kernel_for
from tvm_ext.cutlass.workload import Offload
from tvm_ext.select.database import Database
from tvm_ext.toolchain import export_library, has_cutlass_objects

pytestmark = pytest.mark.slow


@I.ir_module
class DenseGelu:
    @R.function
    def main(x: R.Tensor((256, 128), "float16"), w: R.Tensor((512, 128), "float16"), b: R.Tensor((512,), "float16")):
        with R.dataflow():
            y = R.nn.gelu(R.add(R.matmul(x, R.permute_dims(w)), b))
            o = R.exp(y)
            R.output(o)
        return o


@I.ir_module
class ConvBiasRelu:
    @R.function
    def main(x: R.Tensor((1, 16, 16, 64), "float16"), w: R.Tensor((64, 3, 3, 64), "float16"),
             b: R.Tensor((1, 1, 1, 64), "float16")):
        with R.dataflow():
            y = R.nn.conv2d(x, w, padding=1, data_layout="NHWC", kernel_layout="OHWI")
            o = R.nn.relu(R.add(y, b))
            R.output(o)
        return o


def _target(arch: str) -> tvm.target.Target:
    return tvm.target.Target({"kind": "cuda", "arch": arch})


@pytest.fixture(scope="module")
def warm_cache():
    """Compile the distinct instances of this file two at a time (nvcc is single-threaded)."""
    jobs = []
    for mod, arch in ((DenseGelu, "sm_90a"), (DenseGelu, "sm_80"), (ConvBiasRelu, "sm_80")):
        part = tc.partition_for_cutlass(mod)
        jobs += [(src, arch) for src in module_kernels(part, {"arch": arch}).values()]
    with ThreadPoolExecutor(max_workers=2) as pool:
        objs = list(pool.map(lambda job: nvcc.compile_object(*job), jobs))
    return objs


def _export(mod, arch, path):
    target = _target(arch)
    offloaded = tvm.transform.Sequential(tc.offload_passes(target))(mod)
    (ext,) = offloaded.attrs["external_mods"]
    assert ext.kind == "static_library"
    with target:
        ex = tvm.compile(offloaded, target, relax_pipeline=relax.get_pipeline("default_build"))
    export_library(ex, str(path))
    return offloaded


def _runtime_only_load(path) -> subprocess.CompletedProcess:
    code = ("import tvm; m = tvm.runtime.load_module(%r); "
            "print(m.kind, sorted({i.kind for i in m.imports}))" % str(path))
    env = {**os.environ, "TVM_USE_RUNTIME_LIB": "1"}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_export_and_load_with_runtime_only(arch, warm_cache, tmp_path):
    path = tmp_path / f"dense_gelu_{arch}.so"
    offloaded = _export(DenseGelu, arch, path)
    symbol = "fused_relax_permute_dims_relax_matmul_relax_add_relax_nn_gelu_tvm_ext_cutlass"
    assert f'R.call_dps_packed("{symbol}"' in offloaded["main"].script()
    nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True).stdout
    assert f"__tvm_ffi_{symbol}" in nm
    result = _runtime_only_load(path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[0] == "relax.VMExecutable"


@I.ir_module
class BigDenseGelu:  # large enough that the cost model prefers warp-group MMA on H100 (see test_cutlass_search)
    @R.function
    def main(x: R.Tensor((2048, 2048), "float16"), w: R.Tensor((2048, 2048), "float16"),
             b: R.Tensor((2048,), "float16")):
        with R.dataflow():
            o = R.nn.gelu(R.add(R.matmul(x, R.permute_dims(w)), b))
            R.output(o)
        return o


def test_sm90a_uses_cutlass3_and_sm80_uses_cutlass2():
    part = tc.partition_for_cutlass(BigDenseGelu)
    (src90,) = module_kernels(part, {"arch": "sm_90a"}).values()
    (src80,) = module_kernels(part, {"arch": "sm_80"}).values()
    assert "KernelTmaWarpSpecialized" in src90 and "cutlass::arch::Sm90" in src90
    assert "DefaultGemmUniversal" in src80 and "cutlass::arch::Sm80" in src80


def test_conv2d_instance_compiles_and_exports(warm_cache, tmp_path):
    path = tmp_path / "conv.so"
    _export(ConvBiasRelu, "sm_80", path)
    result = _runtime_only_load(path)
    assert result.returncode == 0, result.stderr[-2000:]


def test_profiler_program_links(warm_cache):
    from tvm_ext.cutlass.profiler import build_profiler
    from tvm_ext.hardware import load_device

    part = tc.partition_for_cutlass(DenseGelu)
    (func,) = [f for _, f in part.functions_items() if f.attrs and "Codegen" in f.attrs]
    wl = tc.workload_from_function(func).workload
    cfg, _ = tc.cheapest_config(wl, "sm_80", load_device("a100"))
    program = build_profiler(wl, cfg, "sm_80")
    assert os.access(program, os.X_OK)
    # the executable contains the instance it profiles: the entry defined, not just referenced
    entry = kernel_for(Offload("p", "", wl, (), (), ()), cfg, "sm_80").entry
    nm = subprocess.run(["nm", str(program)], capture_output=True, text=True, check=True).stdout.split("\n")
    assert any(line.split()[1:] == ["T", entry] for line in nm if line.strip()), entry


def _gpu_arch() -> str:
    """The visible GPU's arch (an sm_80 cubin does not run on sm_90: build for the GPU at hand)."""
    major, minor = tvm.cuda(0).compute_version.split(".")
    return f"sm_{major}{minor}" + ("a" if major == "9" else "")


@pytest.mark.gpu
def test_numerics_on_gpu(tmp_path):
    path = tmp_path / "dense_gelu_gpu.so"
    _export(DenseGelu, _gpu_arch(), path)
    ex = tvm.runtime.load_module(str(path))
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((256, 128)) * 0.1).astype("float16")
    w = (rng.standard_normal((512, 128)) * 0.1).astype("float16")
    b = (rng.standard_normal((512,)) * 0.1).astype("float16")
    got = vm["main"](*(tvm.runtime.tensor(a, dev) for a in (x, w, b))).numpy().astype("float32")
    import scipy.special

    z = x.astype("float32") @ w.astype("float32").T + b.astype("float32")
    ref = np.exp(0.5 * z * (1 + scipy.special.erf(z / np.sqrt(2))))
    np.testing.assert_allclose(got, ref, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_tune_on_gpu(tmp_path):
    from tvm_ext.cutlass.profiler import tune
    from tvm_ext.hardware import load_device

    wl = tc.GemmWorkload("matmul", 1, 256, 256, 256, "float16", "float16", "float16", "row", tc.Epilogue())
    db = Database(tmp_path / "db.jsonl")
    rec = tune(wl, "sm_80", load_device("a100"), db, progress=False)
    assert rec.latency_s > 0
    assert tc.best_config(db, wl, "a100", "sm_80") == (tc.KernelConfig.from_dict(rec.config), rec.latency_s)


@pytest.mark.parametrize("residency", ["rf", "smem"])
def test_b2b_gemm_compiles_and_exports(tmp_path, residency):
    """A measured-faster pair becomes one B2bGemm kernel in the exported library, with GEMM0's
    accumulators kept in registers (``rf``) or staged in shared memory (``smem``)."""
    from test_cutlass_b2b import BEFORE, WL, _db, _parse
    from test_cutlass_codegen import _template_args

    from tvm_ext.cutlass.codegen import plan_kernels

    db = _db(tmp_path, fused_us=12.0, residency=residency)
    target = _target("sm_80")
    passes = tc.offload_passes(target, database=db.path)
    partitioned = tvm.transform.Sequential(passes[:-1])(_parse(BEFORE))
    funcs = [f for _, f in partitioned.functions_items() if f.attrs is not None and "Codegen" in f.attrs]
    _, kernels = plan_kernels(funcs, {"arch": "sm_80", "device": "a100", "database": str(db.path)})
    assert [k.config.residency for k in kernels] == [residency]
    # B2bGemm<..., Swizzle, Stages, SmemAccumulator, AlignA, AlignB>: the residency reaches the template;
    # registers need GEMM0's warp tile to span all N0 = 64 columns, shared memory splits them over 2 warps
    args = _template_args(kernels[0].source, "cutlass::gemm::device::B2bGemm")
    assert args[18] == {"rf": "false", "smem": "true"}[residency]
    warp0_n = int(args[11].split("<")[1].split(",")[1])
    assert warp0_n == {"rf": WL.n0, "smem": WL.n0 // 2}[residency]
    offloaded = tvm.transform.Sequential(passes)(_parse(BEFORE))
    main = offloaded["main"].script()
    assert main.count("R.call_dps_packed") == 1 and "relu_relax_permute_dims" in main
    with target:
        ex = tvm.compile(offloaded, target, relax_pipeline=relax.get_pipeline("default_build"))
    path = tmp_path / "b2b.so"
    export_library(ex, str(path))
    result = _runtime_only_load(path)
    assert result.returncode == 0, result.stderr[-2000:]


def test_cutlass_preset_through_tvm_compile(warm_cache, tmp_path):
    """The preset wiring: offload + baseline graph + dlight for the rest, one exportable module."""
    import tvm_ext

    ex = tvm.compile(DenseGelu, target="tvm_ext/a100", relax_pipeline="tvm_ext.cutlass")
    assert has_cutlass_objects(ex)
    source = ex.mod.imports[0].imports
    cuda = [m for m in source if m.kind == "cuda"]
    assert cuda and "__global__" in cuda[0].inspect_source()  # the exp stays a TVM kernel
    path = tmp_path / "dense_gelu_preset.so"
    tvm_ext.export_library(ex, path)
    # Loading it needs the CUDA loader (a driver) for the TVM kernels: check the CUTLASS symbol.
    nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True).stdout
    assert "__tvm_ffi_fused_relax_permute_dims_relax_matmul_relax_add_relax_nn_gelu_tvm_ext_cutlass" in nm


def test_b2b_conv_compiles_and_exports(tmp_path):
    """A measured-faster conv3x3 -> conv1x1 pair becomes one B2bImplicitGemmConvolution kernel."""
    from test_cutlass_b2b import CONV_BEFORE, CONV_FNAME, _conv_db, _parse

    db = _conv_db(tmp_path, fused_us=12.0)
    target = _target("sm_80")
    offloaded = tvm.transform.Sequential(tc.offload_passes(target, database=db.path))(_parse(CONV_BEFORE))
    main = offloaded["main"].script()
    assert main.count("R.call_dps_packed") == 1 and f'R.call_dps_packed("{CONV_FNAME}"' in main
    with target:
        ex = tvm.compile(offloaded, target, relax_pipeline=relax.get_pipeline("default_build"))
    path = tmp_path / "b2b_conv.so"
    export_library(ex, str(path))
    result = _runtime_only_load(path)
    assert result.returncode == 0, result.stderr[-2000:]


@I.ir_module
class ResidualBlocks:
    """BERT's dense+bias+residual and ResNet's first conv (3 channels: padded) + bias + residual + relu."""

    @R.function
    def main(x: R.Tensor((128, 256), "float16"), w: R.Tensor((256, 768), "float16"), b: R.Tensor((768,), "float16"),
             r: R.Tensor((128, 768), "float16"), img: R.Tensor((1, 3, 16, 16), "float16"),
             wc: R.Tensor((64, 3, 3, 3), "float16"), bc: R.Tensor((1, 64, 1, 1), "float16"),
             rc: R.Tensor((1, 64, 16, 16), "float16")):
        with R.dataflow():
            d = R.add(r, R.add(R.matmul(x, w), b))
            c = R.nn.relu(R.add(R.add(R.nn.conv2d(img, wc, padding=1), bc), rc))
            o = (d, c)
            R.output(o)
        return o


@pytest.mark.gpu
def test_bias_residual_and_padding_numerics_on_gpu(llvm_target):
    """Both bias + residual epilogues (and the padded 3-channel conv) against TVM on the CPU."""
    target = tvm.target.Target({"kind": "cuda", "arch": _gpu_arch()})
    offloaded = tvm.transform.Sequential(tc.offload_passes(target))(ResidualBlocks)
    composites = offloaded["main"].script()
    assert composites.count("R.call_dps_packed") == 2
    rng = np.random.default_rng(0)
    shapes = [p.ty.shape for p in ResidualBlocks["main"].params]
    args = [(rng.standard_normal([int(d) for d in shape]) * 0.5).astype("float16") for shape in shapes]
    ref_vm = relax.VirtualMachine(tvm.compile(ResidualBlocks, llvm_target), tvm.cpu())
    refs = [t.numpy().astype("float32") for t in ref_vm["main"](*(tvm.runtime.tensor(a) for a in args))]
    ex = tvm.compile(ResidualBlocks, target=target, relax_pipeline="tvm_ext.cutlass")
    dev = tvm.cuda(0)
    outs = relax.VirtualMachine(ex, dev)["main"](*(tvm.runtime.tensor(a, dev) for a in args))
    for got, ref in zip(outs, refs):
        np.testing.assert_allclose(got.numpy().astype("float32"), ref, rtol=2e-2, atol=5e-2)


@I.ir_module
class ConvSiluShortcut:  # YOLO's bottleneck: conv + bias + SiLU (as x * sigmoid(x)), then the shortcut
    @R.function
    def main(x: R.Tensor((1, 16, 16, 64), "float16"), w: R.Tensor((64, 3, 3, 64), "float16"),
             b: R.Tensor((1, 1, 1, 64), "float16"), r: R.Tensor((1, 16, 16, 64), "float16")):
        with R.dataflow():
            z = R.add(R.nn.conv2d(x, w, padding=[1, 1, 1, 1], data_layout="NHWC", kernel_layout="OHWI",
                                  out_layout="NHWC"), b)
            o = R.add(r, R.multiply(z, R.sigmoid(z)))
            R.output(o)
        return o


@I.ir_module
class DenseGeluShortcut:
    @R.function
    def main(x: R.Tensor((256, 128), "float16"), w: R.Tensor((512, 128), "float16"), b: R.Tensor((512,), "float16"),
             r: R.Tensor((256, 512), "float16")):
        with R.dataflow():
            o = R.add(R.nn.gelu(R.add(R.matmul(x, R.permute_dims(w)), b)), r)
            R.output(o)
        return o


@pytest.mark.parametrize("mod, arch", [(ConvSiluShortcut, "sm_80"), (DenseGeluShortcut, "sm_90a")],
                         ids=["conv_silu_sm80", "dense_gelu_sm90a"])
def test_residual_after_activation_is_one_2x_kernel_that_compiles(mod, arch):
    """act(acc + bias) + residual: one composite, the residual block epilogue with the activation
    inside and Identity outside, a 2.x kernel even on sm_90a (3.x has no such fusion)."""
    part = tc.partition_for_cutlass(mod)
    (func,) = [f for _, f in part.functions_items() if f.attrs is not None and "Codegen" in f.attrs]
    name = tc.workload_from_function(func).composite
    assert name.endswith("_bias_silu_residual" if mod is ConvSiluShortcut else "_bias_gelu_residual")
    (src,) = module_kernels(part, {"arch": arch}).values()
    act = "SiLu" if mod is ConvSiluShortcut else "GELU"
    assert ("LinearCombinationResidualBlock<" in src
            and f"cutlass::epilogue::thread::{act}, cutlass::plus, cutlass::epilogue::thread::Identity>" in src)
    assert "cutlass::arch::Sm80" in src and "Sm90" not in src
    nvcc.compile_object(src, arch)
