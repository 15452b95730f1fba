"""CUTLASS codegen pieces without nvcc: workloads, emitted CUDA, glue, offload pass wiring, layout."""
from __future__ import annotations

from pathlib import Path

import dataclasses
import subprocess

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R, ir as I

from tvm_ext.cutlass import (Epilogue, GemmWorkload, Conv2dWorkload, KernelConfig, offload_passes,
                             partition_for_cutlass, workload_from_function, convert_conv_to_nhwc)
from tvm_ext.cutlass.emit_gemm import emit_gemm, epilogue_declaration
from tvm_ext.cutlass.emit_conv import emit_conv2d
from tvm_ext.cutlass.errors import CutlassCodegenError
from tvm_ext.cutlass.workload import ROLE_A, ROLE_B, ROLE_BIAS, ROLE_RESIDUAL, ROLE_SCALAR, Offload
from tvm_ext.cutlass.wrapper import compile_glue, emit_glue
from tvm_ext.cutlass.instance import kernel_for

CFG_2X = KernelConfig("2x", (128, 128, 32), (2, 2, 1), (16, 8, 16), 3)
CFG_3X = KernelConfig("3x", (128, 128, 64), (2, 1, 1), (64, 128, 16), 0, schedule="cooperative")


@I.ir_module
class DenseModel:
    @R.function
    def main(x: R.Tensor((2, 64, 32), "float16"), w: R.Tensor((48, 32), "float16"), b: R.Tensor((48,), "float16"),
             r: R.Tensor((2, 64, 48), "float16")):
        with R.dataflow():
            wt = R.permute_dims(w)
            y = R.matmul(x, wt)
            s = R.add(y, b)
            h0 = R.add(s, R.const(3, "float16"))
            h1 = R.clip(h0, 0, 6)
            h2 = R.divide(h1, R.const(6, "float16"))
            a = R.multiply(s, h2)
            c = R.astype(a, "float32")
            z = R.matmul(r, R.permute_dims(r, axes=[0, 2, 1]))
            z2 = R.add(z, R.zeros((2, 64, 64), "float16"))
            o = (c, z2)
            R.output(o)
        return o


def _offloads(mod):
    part = partition_for_cutlass(mod)
    return {str(f.attrs["global_symbol"]): workload_from_function(f)
            for _, f in part.functions_items() if f.attrs and "Codegen" in f.attrs}


def test_workload_dense_hardswish_cast():
    offs = _offloads(DenseModel)
    dense = next(o for o in offs.values() if o.composite.startswith("tvm_ext_cutlass.dense"))
    wl = dense.workload
    assert dense.composite == "tvm_ext_cutlass.dense_bias_hardswish"  # the cast stays outside
    assert (wl.batch, wl.m, wl.n, wl.k, wl.layout_b) == (1, 128, 48, 32, "col")
    assert (wl.dtype, wl.out_dtype, wl.final_dtype) == ("float16", "float16", "float16")
    assert dense.roles == (ROLE_B, ROLE_A, ROLE_BIAS, ROLE_SCALAR, ROLE_SCALAR)
    assert dense.out_shape == (2, 64, 48)
    assert wl.max_alignment == (8, 8, 8)


def test_workload_matmul_relu_cast():
    @I.ir_module
    class Cast:
        @R.function
        def main(x: R.Tensor((64, 32), "bfloat16"), w: R.Tensor((32, 48), "bfloat16")):
            with R.dataflow():
                o = R.astype(R.nn.relu(R.matmul(x, w)), "float32")
                R.output(o)
            return o

    (off,) = _offloads(Cast).values()
    assert off.composite == "tvm_ext_cutlass.matmul_relu_cast"
    wl = off.workload
    assert (wl.dtype, wl.out_dtype, wl.final_dtype, wl.max_alignment) == ("bfloat16", "bfloat16", "float32", (8, 8, 4))
    assert "LinearCombinationGeneric<cutlass::epilogue::thread::ReLu, float, 4, float, float>" in emit_gemm(
        wl, CFG_2X.with_alignment((8, 8, 4)), 80, "e")


def test_workload_batch_matmul_residual():
    offs = _offloads(DenseModel)
    bmm = next(o for o in offs.values() if o.composite.startswith("tvm_ext_cutlass.batch_matmul"))
    assert bmm.composite == "tvm_ext_cutlass.batch_matmul_residual"
    wl = bmm.workload
    assert (wl.batch, wl.m, wl.n, wl.k, wl.layout_b, wl.b_batched) == (2, 64, 64, 48, "row", True)
    assert bmm.roles.count(ROLE_RESIDUAL) == 1 and bmm.roles.count(ROLE_A) == 1


def test_workload_conv2d():
    @I.ir_module
    class Conv:
        @R.function
        def main(x: R.Tensor((2, 16, 16, 32), "float16"), w: R.Tensor((64, 3, 3, 32), "float16"),
                 b: R.Tensor((1, 1, 1, 64), "float16")):
            with R.dataflow():
                y = R.nn.conv2d(x, w, strides=2, padding=1, data_layout="NHWC", kernel_layout="OHWI")
                o = R.nn.relu(R.add(y, b))
                R.output(o)
            return o

    (off,) = _offloads(Conv).values()
    wl = off.workload
    assert off.composite == "tvm_ext_cutlass.conv2d_bias_relu"
    assert (wl.n, wl.h, wl.w, wl.c, wl.k, wl.r, wl.s, wl.p, wl.q) == (2, 16, 16, 32, 64, 3, 3, 8, 8)
    assert wl.pad == (1, 1) and wl.stride == (2, 2) and wl.gemm_mnk == (128, 64, 288)
    assert off.roles == (ROLE_A, ROLE_B, ROLE_BIAS)


def test_workload_rejects_foreign_function():
    with pytest.raises(CutlassCodegenError):
        workload_from_function(DenseModel["main"])


GEMM = GemmWorkload("dense", 1, 256, 512, 128, "float16", "float16", "float16", "col", Epilogue("bias", "gelu"))


def _template_args(src: str, template: str) -> list[str]:
    """Top-level template arguments of the first ``template<...>`` in C++ ``src`` (comments dropped)."""
    body = src[src.index(template + "<") + len(template) + 1:]
    text = "\n".join(line.split("//")[0] for line in body.splitlines())
    args, depth, cur = [], 0, ""
    for ch in text:
        if ch == "<":
            depth += 1
        elif ch == ">":
            if depth == 0:
                return [a for a in (" ".join(x.split()) for x in args + [cur]) if a]
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(cur)
            cur = ""
            continue
        cur += ch
    raise ValueError(f"unterminated {template}<...>")


def test_emit_2x_gemm_source():
    src = emit_gemm(GEMM, CFG_2X, 80, "entry_2x")
    assert 'extern "C" int entry_2x(const TvmExtGemmArgs* args' in src
    assert "cutlass::gemm::kernel::DefaultGemmUniversal<" in src and "cutlass::arch::Sm80" in src
    assert "LinearCombinationGeneric<cutlass::epilogue::thread::GELU, cutlass::half_t, 8, float, float>" in src
    # cutlass_library's 2.x emitter instantiates the transposed problem; described transposed, the
    # kernel reads our A row-major, the dense weight [N, K] column-major and writes D row-major.
    # DefaultGemmUniversal<ElementA, LayoutA, TransformA, AlignA, ElementB, LayoutB, TransformB, AlignB,
    #   ElementC, LayoutC, Accumulator, OpClass, Arch, TB, Warp, Instruction, Epilogue, Swizzle, Stages, Op>
    args = _template_args(src, "cutlass::gemm::kernel::DefaultGemmUniversal")
    assert len(args) == 20
    assert (args[1], args[5], args[9]) == ("cutlass::layout::RowMajor", "cutlass::layout::ColumnMajor",
                                           "cutlass::layout::RowMajor")
    assert (args[3], args[7]) == ("8", "8")                     # 128-bit loads: 8 halves
    assert args[12:16] == ["cutlass::arch::Sm80", "cutlass::gemm::GemmShape<128, 128, 32>",
                           "cutlass::gemm::GemmShape<64, 64, 32>", "cutlass::gemm::GemmShape<16, 8, 16>"]
    # warps (2, 2, 1) split the 128x128 threadblock into 64x64 warp tiles; swizzle 8 and 3 stages
    assert args[17:19] == ["cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<8>", "3"]
    # a row-major B (plain matmul) keeps its layout in the same slot
    row = _template_args(emit_gemm(dataclasses.replace(GEMM, layout_b="row"), CFG_2X, 80, "e"),
                         "cutlass::gemm::kernel::DefaultGemmUniversal")
    assert (row[1], row[5], row[9]) == ("cutlass::layout::RowMajor",) * 3


def test_emit_3x_gemm_source():
    src = emit_gemm(GEMM, CFG_3X, 90, "entry_3x")
    assert "cutlass::arch::Sm90" in src and "KernelTmaWarpSpecializedCooperative" in src
    assert ("cutlass::epilogue::fusion::LinCombPerColBiasEltAct<cutlass::epilogue::thread::GELU, "
            "cutlass::half_t, float, cutlass::half_t, void, float>") in src
    assert "arguments.epilogue.thread.bias_ptr" in src


@pytest.mark.parametrize("ep,expected", [
    (Epilogue(), "fusion::LinearCombination<cutlass::half_t, float, void, float>"),
    (Epilogue("residual", "silu"), "fusion::LinCombEltAct<cutlass::epilogue::thread::SiLu, cutlass::half_t, float, cutlass::half_t, float>"),
    (Epilogue(activation="gelu_tanh"), "LinCombEltAct<cutlass::epilogue::thread::GELU_taylor, cutlass::half_t, float, void"),
])
def test_3x_epilogue_declarations(ep, expected):
    assert expected in epilogue_declaration(ep, "3x", "float16", 0)


def test_emit_conv_source():
    wl = Conv2dWorkload(1, 16, 16, 64, 64, 3, 3, 16, 16, (1, 1), (1, 1), (1, 1), "float16", "float16", "float16",
                        Epilogue("bias", "relu"))
    src = emit_conv2d(wl, CFG_2X, "conv_entry")
    assert "DefaultConv2dFprop<" in src and "IteratorAlgorithm::kOptimized" in src
    assert "LinearCombinationGeneric<cutlass::epilogue::thread::ReLu, ElementOutput" in src
    assert "Layout(Layout::Stride(0))" in src  # bias broadcast over N, P, Q
    with pytest.raises(CutlassCodegenError):
        emit_conv2d(wl, CFG_3X, "conv_entry")


def test_kernel_entry_is_content_addressed():
    off = next(iter(_offloads(DenseModel).values()))
    a, b = kernel_for(off, CFG_2X, "sm_80"), kernel_for(off, CFG_2X, "sm_90a")
    assert a.entry == b.entry and a.source == b.source  # a 2.x kernel is the same code for sm_80 and sm_90a
    c = kernel_for(off, KernelConfig.from_dict({**CFG_2X.to_dict(), "stages": 4}), "sm_80")
    assert c.entry != a.entry


def test_glue_source_and_gxx_compile():
    offs = list(_offloads(DenseModel).values())
    src = emit_glue(offs, ["entry_a", "entry_b"], [CFG_2X, CFG_2X])
    for off in offs:
        assert f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({off.symbol}, {off.symbol}_impl);" in src
    dense = next(o for o in offs if "dense" in o.composite)
    start = src.index(f"static void {dense.symbol}_impl(")
    dense_body = src[start:src.index("TVM_FFI_DLL_EXPORT_TYPED_FUNC", start)]
    assert "args.ldc = 0;" in dense_body and "args.ldb = 32;" in dense_body  # bias broadcast, [N, K] weight
    assert "TVMFFIEnvGetStream" in src
    obj = compile_glue(src)
    # the object exports one TVM-FFI function per offload and calls the instance entries it was given
    nm = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout.split("\n")
    defined = {line.split()[-1] for line in nm if " T " in line}
    undefined = {line.split()[-1] for line in nm if line.strip().startswith("U ")}
    assert {f"__tvm_ffi_{o.symbol}" for o in offs} <= defined
    assert {"entry_a", "entry_b"} <= undefined


def test_offload_passes_targets():
    assert offload_passes(tvm.target.Target({"kind": "llvm"})) == []
    assert offload_passes(tvm.target.Target({"kind": "cuda", "arch": "sm_75"})) == []
    names = [p.info.name for p in offload_passes(tvm.target.Target({"kind": "cuda", "arch": "sm_90a"}))]
    assert names == ["tvm_ext.cutlass.ConvertConvToNHWC", "tvm_ext.cutlass.FoldChannelScales",
                     "tvm_ext.cutlass.PadConvChannels",
                     "tvm_ext.cutlass.PadGemmExtents", "tvm_ext.cutlass.PartitionAttention",
                     "tvm_ext.cutlass.Partition", "RunCodegen"]


def test_offload_leaves_fp32_model_unchanged_and_cpu_numerics(llvm_target):
    @I.ir_module
    class Fp32:
        @R.function
        def main(x: R.Tensor((8, 16), "float32"), w: R.Tensor((16, 32), "float32"), b: R.Tensor((32,), "float32")):
            with R.dataflow():
                o = R.nn.relu(R.add(R.matmul(x, w), b))
                R.output(o)
            return o

    after = tvm.transform.Sequential(offload_passes(tvm.target.Target({"kind": "cuda", "arch": "sm_80"})))(Fp32)
    tvm.ir.assert_structural_equal(after, Fp32)
    rng = np.random.default_rng(0)
    x, w, b = (rng.standard_normal(s).astype("float32") for s in ((8, 16), (16, 32), (32,)))
    vm = relax.VirtualMachine(tvm.compile(after, llvm_target), tvm.cpu())
    got = vm["main"](*(tvm.runtime.tensor(a) for a in (x, w, b))).numpy()
    np.testing.assert_allclose(got, np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)


def test_nhwc_conversion_transposes_only_at_entry_and_exit(llvm_target):
    rng = np.random.default_rng(0)
    # small integers: every fp16 sum is exact, so both layouts must agree bit for bit
    w1 = rng.integers(-1, 2, (16, 8, 3, 3)).astype("float16")
    w2 = rng.integers(-1, 2, (16, 16, 1, 1)).astype("float16")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 10, 10), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(x, relax.const(w1), padding=1)))
            y = bb.emit(relax.op.nn.relu(relax.op.nn.conv2d(y, relax.const(w2))))
            out = bb.emit_output(relax.op.add(y, y))
        bb.emit_func_output(out)
    mod = bb.get()
    nhwc = convert_conv_to_nhwc(mod)
    text = nhwc["main"].script()
    assert text.count("R.permute_dims") == 2  # model entry and exit only (weights folded)
    assert text.count('data_layout="NHWC"') == 2 and text.count('kernel_layout="OHWI"') == 2
    xin = rng.integers(-1, 2, (1, 8, 10, 10)).astype("float16")
    outs = []
    for m in (mod, nhwc):
        vm = relax.VirtualMachine(tvm.compile(m, llvm_target), tvm.cpu())
        outs.append(vm["main"](tvm.runtime.tensor(xin)).numpy().astype("float32"))
    np.testing.assert_array_equal(outs[0], outs[1])
    assert np.abs(outs[0]).max() > 0
    # after the conversion both convolutions (+ bias-free relu epilogues) are offloadable
    part = partition_for_cutlass(nhwc)
    assert sum(1 for _, f in part.functions_items() if f.attrs and "Codegen" in f.attrs) == 2


def test_nhwc_conversion_converts_each_conv_between_opaque_ops_alone(llvm_target):
    from tvm import topi

    rng = np.random.default_rng(0)
    # sparse small integers: every partial sum stays exact in fp16, so both layouts agree bit for bit
    w = relax.const(rng.choice([-1, 0, 1], (8, 8, 3, 3), p=[0.1, 0.8, 0.1]).astype("float16"))
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 8, 10, 10), "float16"))
    with bb.function("main", [x]):
        with bb.dataflow():
            y = x
            for _ in range(4):  # conv -> opaque pad (call_tir): a layout pass cannot see through it
                y = bb.emit(relax.op.nn.conv2d(y, w))
                y = bb.emit_te(topi.nn.pad, y, [0, 0, 1, 1], [0, 0, 1, 1])
            out = bb.emit_output(y)
        bb.emit_func_output(out)
    mod = bb.get()
    after = convert_conv_to_nhwc(mod)
    # region by region: each convolution is an NHWC island with one entry and one exit transpose
    text = after["main"].script()
    assert text.count('data_layout="NHWC"') == 4 and text.count("R.permute_dims(") == 8
    xin = rng.integers(-1, 2, (1, 8, 10, 10)).astype("float16")
    outs = [relax.VirtualMachine(tvm.compile(m, llvm_target), tvm.cpu())["main"](tvm.runtime.tensor(xin)).numpy()
            for m in (mod, after)]
    np.testing.assert_array_equal(outs[0], outs[1])
    assert np.abs(outs[0]).max() > 0


BIAS_RESIDUAL = GemmWorkload("matmul", 1, 128, 768, 3072, "float16", "float16", "float16", "row",
                             Epilogue("bias_residual", "relu"))


def test_emit_2x_bias_residual_gemm_uses_broadcast_epilogue():
    src = emit_gemm(BIAS_RESIDUAL, CFG_2X, 80, "br")
    assert "cutlass::gemm::kernel::DefaultGemmWithBroadcast<" in src and "DefaultGemmUniversal<" not in src
    assert ("LinearCombinationResidualBlock<cutlass::half_t, float, float, cutlass::half_t, 8, "
            "cutlass::epilogue::thread::Identity, cutlass::plus, cutlass::epilogue::thread::ReLu>") in src
    assert "GemmUniversalBase<" in src and "const_cast<void*>(args->bias)" in src
    assert '#include "cutlass/gemm/kernel/default_gemm_with_broadcast.h"' in src


def test_emit_3x_bias_residual_gemm():
    src = emit_gemm(BIAS_RESIDUAL, CFG_3X, 90, "br3")
    assert ("LinCombPerColBiasEltAct<cutlass::epilogue::thread::ReLu, cutlass::half_t, float, cutlass::half_t, "
            "cutlass::half_t, float>") in src
    assert "arguments.epilogue.thread.beta = 1.0f;" in src
    assert "bias_ptr = static_cast<const ElementD*>(args->bias)" in src
    assert "static_cast<const ElementC*>(args->source)" in src


def test_emit_conv_bias_residual():
    wl = Conv2dWorkload(1, 16, 16, 64, 64, 3, 3, 16, 16, (1, 1), (1, 1), (1, 1), "float16", "float16", "float16",
                        Epilogue("bias_residual", "relu"))
    src = emit_conv2d(wl, CFG_2X, "cbr")
    assert "DefaultConv2dFpropWithBroadcast<" in src and "LinearCombinationResidualBlock<ElementOutput" in src
    assert "cutlass::conv::SplitKMode::kSerial, const_cast<void*>(args->bias)" in src


def test_bias_residual_glue_and_no_split_k():
    from tvm_ext.cutlass.candidates import candidates
    from tvm_ext.hardware import load_device

    @I.ir_module
    class Bert:
        @R.function
        def main(x: R.Tensor((128, 3072), "float16"), w: R.Tensor((3072, 768), "float16"),
                 b: R.Tensor((768,), "float16"), r: R.Tensor((128, 768), "float16")):
            with R.dataflow():
                o = R.add(r, R.add(b, R.matmul(x, w)))
                R.output(o)
            return o

    (off,) = _offloads(Bert).values()
    assert off.composite == "tvm_ext_cutlass.matmul_bias_residual"
    assert off.roles == (ROLE_A, ROLE_B, ROLE_BIAS, ROLE_RESIDUAL)
    src = emit_glue([off], ["e"], [CFG_2X])
    assert "args.source = tvm_ext_ptr(p3); args.bias = tvm_ext_ptr(p2);" in src
    assert "args.ldc = 768;" in src and "args.batch_stride_c = 98304;" in src
    # serial split-K would add the bias once per K slice: never a candidate for bias + residual
    assert all(c.split_k == 1 for c in candidates(off.workload, "sm_80", load_device("a100")))
    assert any(c.split_k > 1 for c in candidates(dataclasses.replace(off.workload, epilogue=Epilogue("bias")),
                                                 "sm_80", load_device("a100")))


def test_instances_are_shape_generic():
    """One instance per template configuration: shapes, batch and split-K are runtime arguments."""
    from tvm_ext.cutlass.instance import instance_key

    small = GemmWorkload("matmul", 1, 64, 256, 512, "float16", "float16", "float16", "row", Epilogue("bias"))
    big = GemmWorkload("batch_matmul", 12, 384, 768, 3072, "float16", "float16", "float16", "row",
                       Epilogue("bias"), b_batched=True)
    split = KernelConfig.from_dict({**CFG_2X.to_dict(), "split_k": 4})
    kernels = [kernel_for(Offload("s", "", wl, (), (), ()), cfg, "sm_80")
               for wl, cfg in ((small, CFG_2X), (big, CFG_2X), (small, split))]
    assert len({k.entry for k in kernels}) == 1 and len({k.source for k in kernels}) == 1
    assert kernels[0].key == instance_key(small, CFG_2X)
    assert "384" not in kernels[0].source and "3072" not in kernels[0].source
    # what is a template parameter does make another instance
    for wl, cfg in ((dataclasses.replace(small, epilogue=Epilogue("bias", "relu")), CFG_2X),
                    (dataclasses.replace(small, layout_b="col"), CFG_2X),
                    (small, CFG_2X.with_alignment((4, 4, 4))),
                    (small, KernelConfig.from_dict({**CFG_2X.to_dict(), "swizzle": 1}))):
        assert kernel_for(Offload("s", "", wl, (), (), ()), cfg, "sm_80").entry != kernels[0].entry


def test_glue_passes_shapes_and_split_k():
    offs = sorted(_offloads(DenseModel).values(), key=lambda o: "dense" not in o.composite)
    src = emit_glue(offs, ["same_entry"] * len(offs), [dataclasses.replace(CFG_2X, split_k=4), CFG_2X])
    assert src.count('extern "C" int same_entry(') == len(offs)
    assert "args.m = 128; args.n = 48; args.k = 32; args.split_k = 4;" in src
    assert "args.batch = 2; args.m = 64; args.n = 64; args.k = 48; args.split_k = 1;" in src


def test_every_cutlass_header_is_package_data():
    """The CUTLASS builds include the package's own headers (the attention adapter, the contract
    hook, the empty curand_kernel.h example 41 asks for): every one must be package data, or an
    installed wheel cannot build (test_install.py checks a real install where a wheel builds)."""
    import fnmatch
    import tomllib

    repo = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["tvm_ext"]
    package = repo / "tvm_ext"
    headers = [str(p.relative_to(package)) for p in (package / "cutlass" / "include").rglob("*.h")]
    assert headers and all(any(fnmatch.fnmatch(h, g) for g in globs) for h in headers), (headers, globs)
