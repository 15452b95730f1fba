"""Back-to-back GEMM fusion: chosen only when the database says it is faster."""
from __future__ import annotations

import textwrap

import pytest
import tvm
from tvm.script import from_source

from tvm_ext.cutlass import Database, TuningRecord, partition_for_cutlass, workload_from_function
from tvm_ext.cutlass.b2b import B2bGemmWorkload, b2b_patterns
from tvm_ext.cutlass.emit_b2b import b2b_candidates, emit_b2b_gemm
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


def _db(tmp_path, fused_us: float | None) -> Database:
    db = Database(tmp_path / "db.jsonl")
    g0, g1 = WL.parts()
    single = b2b_candidates(WL)[0].to_dict()
    for k in ("threadblock1", "warp_count1"):
        single[k] = None
    single["residency"] = ""
    from tvm_ext.cutlass import KernelConfig

    for part, us in ((g0, 10.0), (g1, 8.0)):
        db.add(TuningRecord(part.key(), "float16->float16", "sm_80", KernelConfig.from_dict(single), us))
    if fused_us is not None:
        db.add(TuningRecord(WL.key(), "float16->float16", "sm_80", b2b_candidates(WL)[-1], fused_us))
    return db


def _partition(db, arch="sm_80"):
    return partition_for_cutlass(_parse(BEFORE), extra_patterns=b2b_patterns(db, arch))


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


def test_not_fused_for_other_arch_or_no_database(tmp_path):
    db = _db(tmp_path, fused_us=12.0)
    for after in (_partition(db, "sm_90a"), _partition(None)):
        names = [gv.name_hint for gv in after.get_global_vars()]
        assert not any("relu_relax_permute_dims" in n for n in names) and len(names) == 3


def test_too_wide_intermediate_not_fused(tmp_path):
    text = BEFORE.replace("(64, 256)", "(192, 256)").replace("(64,)", "(192,)").replace("(128, 64)", "(128, 192)")
    wide = B2bGemmWorkload(4096, 192, 256, 128, "float16", "gelu")
    db = Database(tmp_path / "wide.jsonl")
    after = partition_for_cutlass(_parse(text), extra_patterns=b2b_patterns(db, "sm_80"))
    assert wide.n0 > 128 and not any("relu_relax_permute_dims" in gv.name_hint for gv in after.get_global_vars())


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
    src = emit_glue([off], ["b2b_entry"])
    assert "TvmExtB2bGemmArgs args{};" in src and "args.n0 = 64; args.k0 = 256; args.n1 = 128;" in src
