"""Back-to-back GEMM and convolution fusion: chosen only when the database says it is faster.

Every shape rule is tested with measurements that favour fusion, so only the rule itself can
reject the pair (a test without records would pass whatever the rule says).
"""
from __future__ import annotations

import dataclasses
import textwrap

import pytest
import tvm
from tvm.script import from_source

from tvm_ext.cutlass import KernelConfig, cutlass_record, partition_for_cutlass, workload_from_function
from tvm_ext.cutlass.b2b import B2bGemmWorkload, b2b_patterns
from tvm_ext.cutlass.b2b_conv import B2bConv2dWorkload, b2b_conv_patterns
from tvm_ext.select.database import Database
from tvm_ext.cutlass.emit_b2b import b2b_candidates, emit_b2b_conv2d, emit_b2b_gemm
from tvm_ext.cutlass.wrapper import emit_glue

BEFORE = """
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((4096, 256), "float16"), w0: R.Tensor((64, 256), "float16"), b0: R.Tensor((64,), "float16"),
             w1: R.Tensor((128, 64), "float16"), b1: R.Tensor((128,), "float16")):
        with R.dataflow():
            t0 = R.permute_dims(w0)
            g0 = R.matmul(x, t0)
            s0 = R.add(g0, b0)
            a0 = R.nn.relu(s0)
            t1 = R.permute_dims(w1)
            g1 = R.matmul(a0, t1)
            s1 = R.add(g1, b1)
            gv = R.nn.gelu(s1)
            R.output(gv)
        return gv
"""

EXPECTED_FUSED = """
@I.ir_module
class Module:
    @R.function
    def fused_relax_permute_dims_relax_matmul_relax_add_relax_nn_relu_relax_permute_dims_relax_matmul_relax_add_relax_nn_gelu_tvm_ext_cutlass(
            w0: R.Tensor((64, 256), "float16"), x: R.Tensor((4096, 256), "float16"), b0: R.Tensor((64,), "float16"),
            w1: R.Tensor((128, 64), "float16"), b1: R.Tensor((128,), "float16")):
        R.func_attr({"Codegen": "tvm_ext_cutlass"})
        @R.function
        def local_func(w0_1: R.Tensor((64, 256), "float16"), x_1: R.Tensor((4096, 256), "float16"),
                       b0_1: R.Tensor((64,), "float16"), w1_1: R.Tensor((128, 64), "float16"),
                       b1_1: R.Tensor((128,), "float16")):
            R.func_attr({"Composite": "tvm_ext_cutlass.b2b_gemm"})
            with R.dataflow():
                t0 = R.permute_dims(w0_1)
                g0 = R.matmul(x_1, t0)
                s0 = R.add(g0, b0_1)
                a0 = R.nn.relu(s0)
                t1 = R.permute_dims(w1_1)
                g1 = R.matmul(a0, t1)
                s1 = R.add(g1, b1_1)
                gv = R.nn.gelu(s1)
                R.output(gv)
            return gv
        output = local_func(w0, x, b0, w1, b1)
        return output

    @R.function
    def main(x: R.Tensor((4096, 256), "float16"), w0: R.Tensor((64, 256), "float16"), b0: R.Tensor((64,), "float16"),
             w1: R.Tensor((128, 64), "float16"), b1: R.Tensor((128,), "float16")):
        cls = Module
        with R.dataflow():
            gv = cls.fused_relax_permute_dims_relax_matmul_relax_add_relax_nn_relu_relax_permute_dims_relax_matmul_relax_add_relax_nn_gelu_tvm_ext_cutlass(w0, x, b0, w1, b1)
            R.output(gv)
        return gv
"""

WL = B2bGemmWorkload(4096, 64, 256, 128, "float16", "gelu")


def _parse(text: str) -> tvm.IRModule:
    from tvm.script import ir as I
    from tvm.script import relax as R

    return from_source(textwrap.dedent(text), extra_vars={"I": I, "R": R})


DEVICE, ARCH = "a100", "sm_80"
SINGLE = KernelConfig("2x", (128, 64, 32), (2, 2, 1), (16, 8, 16), 3)


def _db(tmp_path, fused_us: float | None, wl: B2bGemmWorkload = WL, residency: str = "rf") -> Database:
    """Measurements on the a100: the two GEMMs take 10 and 8 us, the fused pair (its ``residency``
    variant) ``fused_us``."""
    db = Database(tmp_path / "db.jsonl")
    for part, us in zip(wl.parts(), (10.0, 8.0)):
        db.add(cutlass_record(part, SINGLE, DEVICE, us * 1e-6))
    if fused_us is not None:
        fused = next(c for c in b2b_candidates(WL) if c.residency == residency)
        db.add(cutlass_record(wl, fused, DEVICE, fused_us * 1e-6))
    return db


def _partition(db, device=DEVICE, arch=ARCH, text=BEFORE):
    return partition_for_cutlass(_parse(text), extra_patterns=b2b_patterns(db, device, arch))


def test_fused_when_measured_faster(tmp_path):
    after = _partition(_db(tmp_path, fused_us=12.0))
    tvm.ir.assert_structural_equal(after, _parse(EXPECTED_FUSED))
    (func,) = [f for _, f in after.functions_items() if f.attrs and "Codegen" in f.attrs]
    off = workload_from_function(func)
    assert off.workload == WL
    assert off.roles == ("b", "a", "bias", "b1", "bias1")


@pytest.mark.parametrize("fused_us", [None, 18.0, 25.0])
def test_not_fused_without_a_win(tmp_path, fused_us):
    after = _partition(_db(tmp_path, fused_us))
    composites = sorted(str(f.body.blocks[0].bindings[0].value.attrs["Composite"])
                        for _, f in after.functions_items() if f.attrs and "Codegen" in f.attrs)
    assert composites == ["tvm_ext_cutlass.dense_bias_gelu", "tvm_ext_cutlass.dense_bias_relu"]


def test_not_fused_for_other_device_or_no_database(tmp_path):
    db = _db(tmp_path, fused_us=12.0)
    for after in (_partition(db, "h100", "sm_90a"), _partition(None)):
        names = [gv.name_hint for gv in after.get_global_vars()]
        assert not any("relu_relax_permute_dims" in n for n in names) and len(names) == 3


@pytest.mark.parametrize("n0,fused", [(128, True), (144, False), (192, False)])
def test_intermediate_width_rule(tmp_path, n0, fused):
    """The fused kernel holds whole rows of the intermediate: N0 <= 128 (measured faster in every case)."""
    text = BEFORE.replace("(64, 256)", f"({n0}, 256)").replace("(64,)", f"({n0},)").replace("(128, 64)", f"(128, {n0})")
    wide = B2bGemmWorkload(4096, n0, 256, 128, "float16", "gelu")
    after = _partition(_db(tmp_path, fused_us=1.0, wl=wide), text=text)
    assert any("relu_relax_permute_dims" in gv.name_hint for gv in after.get_global_vars()) == fused


def test_b2b_candidates_and_source():
    cands = b2b_candidates(WL)
    assert {c.residency for c in cands} == {"rf", "smem"}
    for c in cands:
        assert c.threadblock[1] == WL.n0 and c.threadblock1[1] == WL.n1  # whole-N threadblocks
        warps0 = c.warp_count[0] * c.warp_count[1]
        assert warps0 == c.warp_count1[0] * c.warp_count1[1] == 4
    rf = next(c for c in cands if c.residency == "rf")
    assert rf.threadblock[1] // rf.warp_count[1] == WL.n0  # RF residency: warp N == threadblock N
    src = emit_b2b_gemm(WL, rf, "b2b_entry")
    assert "cutlass::gemm::device::B2bGemm<" in src and "LinearCombinationRelu<" in src
    assert "cutlass::epilogue::thread::GELU" in src and ", 3, false," in src
    smem = emit_b2b_gemm(WL, next(c for c in cands if c.residency == "smem"), "b2b_entry")
    assert ", 3, true," in smem


def test_b2b_glue(tmp_path):
    after = _partition(_db(tmp_path, fused_us=12.0))
    (func,) = [f for _, f in after.functions_items() if f.attrs and "Codegen" in f.attrs]
    off = workload_from_function(func)
    src = emit_glue([off], ["b2b_entry"], b2b_candidates(off.workload)[:1])
    assert "TvmExtB2bGemmArgs args{};" in src and "args.n0 = 64; args.k0 = 256; args.n1 = 128;" in src


# --- back-to-back convolution (Bolt Table 2: conv3x3+bias+relu -> conv1x1+bias+relu) ---

CONV_BEFORE = """
@I.ir_module
class Module:
    @R.function
    def main(x: R.Tensor((1, 56, 56, 64), "float16"), w0: R.Tensor((64, 3, 3, 64), "float16"),
             b0: R.Tensor((1, 1, 1, 64), "float16"), w1: R.Tensor((64, 1, 1, 64), "float16"),
             b1: R.Tensor((1, 1, 1, 64), "float16")):
        with R.dataflow():
            c0 = R.nn.conv2d(x, w0, padding=1, data_layout="NHWC", kernel_layout="OHWI")
            s0 = R.add(c0, b0)
            a0 = R.nn.relu(s0)
            c1 = R.nn.conv2d(a0, w1, data_layout="NHWC", kernel_layout="OHWI")
            s1 = R.add(c1, b1)
            gv = R.nn.relu(s1)
            R.output(gv)
        return gv
"""

CONV_FNAME = "fused_relax_nn_conv2d_relax_add_relax_nn_relu_relax_nn_conv2d_relax_add_relax_nn_relu_tvm_ext_cutlass"
CONV_EXPECTED = f"""
@I.ir_module
class Module:
    @R.function
    def {CONV_FNAME}(x: R.Tensor((1, 56, 56, 64), "float16"), w0: R.Tensor((64, 3, 3, 64), "float16"),
            b0: R.Tensor((1, 1, 1, 64), "float16"), w1: R.Tensor((64, 1, 1, 64), "float16"),
            b1: R.Tensor((1, 1, 1, 64), "float16")):
        R.func_attr({{"Codegen": "tvm_ext_cutlass"}})
        @R.function
        def local_func(x_1: R.Tensor((1, 56, 56, 64), "float16"), w0_1: R.Tensor((64, 3, 3, 64), "float16"),
                       b0_1: R.Tensor((1, 1, 1, 64), "float16"), w1_1: R.Tensor((64, 1, 1, 64), "float16"),
                       b1_1: R.Tensor((1, 1, 1, 64), "float16")):
            R.func_attr({{"Composite": "tvm_ext_cutlass.b2b_conv2d"}})
            with R.dataflow():
                c0 = R.nn.conv2d(x_1, w0_1, padding=1, data_layout="NHWC", kernel_layout="OHWI")
                s0 = R.add(c0, b0_1)
                a0 = R.nn.relu(s0)
                c1 = R.nn.conv2d(a0, w1_1, data_layout="NHWC", kernel_layout="OHWI")
                s1 = R.add(c1, b1_1)
                gv = R.nn.relu(s1)
                R.output(gv)
            return gv
        output = local_func(x, w0, b0, w1, b1)
        return output

    @R.function
    def main(x: R.Tensor((1, 56, 56, 64), "float16"), w0: R.Tensor((64, 3, 3, 64), "float16"),
             b0: R.Tensor((1, 1, 1, 64), "float16"), w1: R.Tensor((64, 1, 1, 64), "float16"),
             b1: R.Tensor((1, 1, 1, 64), "float16")):
        cls = Module
        with R.dataflow():
            gv = cls.{CONV_FNAME}(x, w0, b0, w1, b1)
            R.output(gv)
        return gv
"""

CONV_WL = B2bConv2dWorkload(1, 56, 56, 64, 64, 3, 3, 56, 56, (1, 1), (1, 1), 64, "float16", "relu")


def _conv_db(tmp_path, fused_us: float | None, wl: B2bConv2dWorkload = CONV_WL) -> Database:
    db = Database(tmp_path / "conv_db.jsonl")
    single = KernelConfig("2x", (64, 64, 64), (2, 2, 1), (16, 8, 16), 5, swizzle=4)
    for part, us in zip(wl.parts(), (10.0, 8.0)):
        db.add(cutlass_record(part, single, DEVICE, us * 1e-6))
    if fused_us is not None:
        db.add(cutlass_record(wl, b2b_candidates(CONV_WL)[0], DEVICE, fused_us * 1e-6))
    return db


def _partition_conv(db, arch=ARCH, text=CONV_BEFORE):
    return partition_for_cutlass(_parse(text), extra_patterns=b2b_conv_patterns(db, DEVICE, arch))


def test_b2b_conv_fused_when_measured_faster(tmp_path):
    after = _partition_conv(_conv_db(tmp_path, fused_us=12.0))
    tvm.ir.assert_structural_equal(after, _parse(CONV_EXPECTED))
    off = workload_from_function(after[CONV_FNAME])
    assert off.workload == CONV_WL
    assert off.roles == ("a", "b", "bias", "b1", "bias1")
    src = emit_glue([off], ["b2b_conv_entry"], b2b_candidates(off.workload)[:1])
    assert "TvmExtB2bConv2dArgs args{};" in src
    assert "args.r = 3; args.s = 3; args.p = 56; args.q = 56; args.k1 = 64;" in src


@pytest.mark.parametrize("fused_us", [None, 18.0])
def test_b2b_conv_not_fused_without_a_win(tmp_path, fused_us):
    after = _partition_conv(_conv_db(tmp_path, fused_us))
    composites = sorted(str(f.body.blocks[0].bindings[0].value.attrs["Composite"])
                        for _, f in after.functions_items() if f.attrs and "Codegen" in f.attrs)
    assert composites == ["tvm_ext_cutlass.conv2d_bias_relu", "tvm_ext_cutlass.conv2d_bias_relu"]


def _conv_text(k0: int) -> str:
    return CONV_BEFORE.replace("w0: R.Tensor((64, 3, 3, 64)", f"w0: R.Tensor(({k0}, 3, 3, 64)").replace(
        "b0: R.Tensor((1, 1, 1, 64)", f"b0: R.Tensor((1, 1, 1, {k0})").replace(
        "w1: R.Tensor((64, 1, 1, 64)", f"w1: R.Tensor((64, 1, 1, {k0})")


def _b2b_chosen(after) -> bool:
    return any("b2b" in str(f.body.blocks[0].bindings[0].value.attrs["Composite"])
               for _, f in after.functions_items() if f.attrs and "Codegen" in f.attrs)


@pytest.mark.parametrize("change", ["3x3 second conv", "strided second conv"])
def test_b2b_conv_shape_rules(tmp_path, change):
    if change == "3x3 second conv":
        text = CONV_BEFORE.replace("(64, 1, 1, 64)", "(64, 3, 3, 64)").replace(
            'c1 = R.nn.conv2d(a0, w1, data_layout', 'c1 = R.nn.conv2d(a0, w1, padding=1, data_layout')
    else:
        text = CONV_BEFORE.replace("c1 = R.nn.conv2d(a0, w1, data_layout", "c1 = R.nn.conv2d(a0, w1, strides=2, data_layout")
    assert not _b2b_chosen(_partition_conv(_conv_db(tmp_path, fused_us=1.0), text=text))


@pytest.mark.parametrize("k0,fused", [(128, True), (144, False), (192, False)])
def test_b2b_conv_channel_rule(tmp_path, k0, fused):
    """The first convolution's output channels are the fused kernel's threadblock N: K0 <= 128
    (measured faster in every case, so only the rule decides)."""
    wl = B2bConv2dWorkload(1, 56, 56, 64, k0, 3, 3, 56, 56, (1, 1), (1, 1), 64, "float16", "relu")
    assert _b2b_chosen(_partition_conv(_conv_db(tmp_path, fused_us=1.0, wl=wl), text=_conv_text(k0))) == fused


def test_b2b_conv_source_and_instance_key():
    from tvm_ext.cutlass.instance import kernel_for
    from tvm_ext.cutlass.workload import Offload

    cands = b2b_candidates(CONV_WL)
    assert {c.residency for c in cands} == {"rf", "smem"}
    smem = next(c for c in cands if c.residency == "smem")
    assert smem.warp_count1 == (2, 2, 1)  # N1 = 64: 1x4 warps would be 16 wide
    src = emit_b2b_conv2d(CONV_WL, cands[0], "b2b_conv_entry")
    assert "cutlass::conv::kernel::DefaultB2bConv2dFprop<" in src and "B2bImplicitGemmConvolution<" in src
    assert "IteratorAlgorithm::kOptimized, false>::Kernel" in src
    assert 'extern "C" int b2b_conv_entry(const TvmExtB2bConv2dArgs* args' in src
    other = B2bConv2dWorkload(2, 28, 28, 64, 64, 3, 3, 14, 14, (1, 1), (2, 2), 64, "float16", "relu")
    a, b = (kernel_for(Offload("s", "", wl, (), (), ()), cands[0], "sm_80") for wl in (CONV_WL, other))
    assert a.entry == b.entry and a.key.startswith("b2b_conv2d|float16|bias_relu,bias_relu|")


def test_b2b_needs_m_a_multiple_of_the_vector_width(tmp_path):
    """B2bGemm::can_implement refuses M % 8 != 0 (8-element vectors): such a pair is never fused,
    even when measurements favour it (the H200 build would have failed at run time)."""
    odd = dataclasses.replace(WL, m=4100)
    text = BEFORE.replace("(4096, 256)", "(4100, 256)").replace("(4096, 128)", "(4100, 128)")
    assert "4100" in text
    after = _partition(_db(tmp_path, fused_us=12.0, wl=odd), text=text)
    codegen = [f for _, f in after.functions_items() if f.attrs and "Codegen" in f.attrs]
    assert codegen and all("b2b" not in str(f.attrs.get("Composite", "")) for f in codegen)
    assert not any(workload_from_function(f).workload.kind == "b2b_gemm" for f in codegen)
