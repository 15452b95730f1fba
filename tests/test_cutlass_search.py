"""Template search without a GPU: candidates, the cost model's pick, JSON-lines database, profiler source."""
from __future__ import annotations

import json
import math

from dataclasses import replace

import pytest

from tvm_ext.hardware import load_device
from tvm_ext.cutlass import Conv2dWorkload, Epilogue, GemmWorkload, KernelConfig, best_config, cutlass_record
from tvm_ext.cutlass import candidates, cheapest_config, describe
from tvm_ext.cutlass.candidates import uses_3x
from tvm_ext.select.analytic import AnalyticCostModel
from tvm_ext.cutlass.codegen import choose_config
from tvm_ext.cutlass.errors import CutlassSetupError
from tvm_ext.cutlass.profiler import emit_profiler_main, problem_argv, tune
from tvm_ext.select.database import Database, DatabaseError, Record

A100, H100 = load_device("a100"), load_device("h100")


def gemm(m, n, k, batch=1, layout="row", final="float16"):
    return GemmWorkload("batch_matmul" if batch > 1 else "matmul", batch, m, n, k, "float16", "float16", final,
                        layout, Epilogue("bias", "relu"), b_batched=batch > 1)


def test_candidates_sm80_pruned_and_fit_shared_memory():
    big = candidates(gemm(4096, 4096, 4096), "sm_80", A100)
    # every one of the 16 SM80_TILES fits 4096^3 and A100's 166912 B opt-in shared memory (the largest,
    # 256x128x64 x 3 stages, needs 3 * (256 + 128) * 64 * 2 = 147456 B); two swizzles (8, 1) each; no split-K
    # (the coarsest grid, 256x128 tiles, already has 16 * 32 = 512 CTAs for 108 SMs).
    assert all(c.api == "2x" for c in big) and len(big) == 16 * 2
    assert {c.swizzle for c in big} == {8, 1} and all(c.split_k == 1 for c in big)
    for c in big:
        assert c.threads in (128, 256)  # 4 or 8 warps (Bolt guideline ii)
    # RTX 3090 (sm_86) allows 101376 B per block: 256x128x64/3 stages and 128x256x64/3 stages (147456 B) and
    # 128x128x64/4 stages (4 * 256 * 64 * 2 = 131072 B) are dropped, the other 13 tiles stay.
    rtx = candidates(gemm(4096, 4096, 4096), "sm_86", load_device("rtx3090"))
    assert len(rtx) == 13 * 2
    assert not {((256, 128, 64), 3), ((128, 256, 64), 3), ((128, 128, 64), 4)} & {(c.threadblock, c.stages) for c in rtx}
    # 16x64 output: threadblocks at most max(64, 2 * 16) = 64 rows and max(64, 2 * 64) = 128 columns (Bolt iii);
    # K = 64 is too short for split-K (needs K >= 4 * 2 * 32)
    small = candidates(gemm(16, 64, 64), "sm_80", A100)
    assert {c.threadblock for c in small} == {(64, 64, 32), (64, 64, 64), (64, 128, 32), (64, 128, 64)}
    assert len(small) == 4 * 2


def test_split_k_only_for_small_output_long_k():
    assert any(c.split_k > 1 for c in candidates(gemm(64, 128, 8192), "sm_80", A100))
    assert not any(c.split_k > 1 for c in candidates(gemm(4096, 4096, 4096), "sm_80", A100))
    assert not any(c.split_k > 1 for c in candidates(gemm(64, 128, 8192, batch=4), "sm_80", A100))


def test_3x_kernels_only_on_sm90a_when_aligned():
    wl = gemm(1024, 1024, 1024)
    assert uses_3x(wl, "sm_90a") and not uses_3x(wl, "sm_90") and not uses_3x(wl, "sm_80")
    cands = candidates(wl, "sm_90a", H100)
    assert {c.api for c in cands} == {"2x", "3x"}
    assert {c.schedule for c in cands if c.api == "3x"} == {"cooperative", "pingpong"}
    unaligned = gemm(1024, 1022, 1024)  # N % 8 != 0: no TMA
    assert not uses_3x(unaligned, "sm_90a")
    assert all(c.api == "2x" for c in candidates(unaligned, "sm_90a", H100))
    assert candidates(wl, "sm_75", A100) == []


def test_alignment_from_shapes():
    assert gemm(100, 96, 64).max_alignment == (8, 8, 8)
    assert gemm(100, 98, 68).max_alignment == (4, 2, 2)
    assert gemm(100, 96, 64, final="float32").max_alignment == (8, 8, 4)
    conv = Conv2dWorkload(1, 8, 8, 12, 18, 3, 3, 8, 8, (1, 1), (1, 1), (1, 1), "float16", "float16", "float16", Epilogue())
    assert conv.max_alignment == (4, 4, 2)
    assert all(c.alignment == (4, 4, 2) and c.swizzle == 4 for c in candidates(conv, "sm_80", A100))


def test_describe_prices_the_tiling():
    """Padded flops, re-reads of A and B per tile column / row, split-K's extra output passes."""
    wl = gemm(256, 512, 128)                                      # bias epilogue, fp16 in and out
    cfg = KernelConfig("2x", (128, 128, 32), (2, 2, 1), (16, 8, 16), 3)
    k = describe(wl, cfg, H100)
    assert k.flops == 2 * 256 * 512 * 128                         # 2 x 4 tiles cover the problem exactly
    a, b, out, bias = 256 * 128 * 2, 128 * 512 * 2, 256 * 512 * 2, 512 * 2
    assert k.global_bytes == a * 4 + b * 2 + out + bias           # A read by 4 tile columns, B by 2 tile rows
    assert k.unique_bytes == a + b + out + bias
    assert k.dram_bytes == k.unique_bytes                         # 0.4 MB fit in L2: re-reads hit it
    assert (k.launch.grid, k.launch.threads, k.launch.shared_bytes) == (8, 128, 3 * (128 + 128) * 32 * 2)
    ragged = describe(gemm(200, 500, 128), cfg, H100)                   # 2 x 4 tiles of 128 x 128 still
    assert ragged.flops == 2 * 256 * 512 * 128
    split = describe(wl, KernelConfig("2x", (128, 128, 32), (2, 2, 1), (16, 8, 16), 3, split_k=4), H100)
    assert split.launch.grid == 32 and split.global_bytes == k.global_bytes + 2 * 3 * out


def test_dram_bytes_of_a_gemm_larger_than_l2():
    """4096^3 fp16 on H100, 128x256 cooperative tiles: 512 CTAs, 2 resident per SM (98 KiB of
    stages + 1 KiB reserved each, of 228 KiB) -> waves of 264 CTAs, each a 17 x 16 tile patch
    reading 17 x 128 rows of A and all 4096 columns of B once from DRAM."""
    wl = gemm(4096, 4096, 4096)
    cfg = KernelConfig("3x", (128, 256, 64), (2, 1, 1), (64, 256, 16), 0, cluster=(1, 1, 1), schedule="cooperative")
    k = describe(wl, cfg, H100)
    assert (k.launch.grid, k.launch.threads, k.launch.shared_bytes) == (512, 384, 2 * (128 + 256) * 64 * 2)
    operand, out, bias = 4096 * 4096 * 2, 4096 * 4096 * 2, 4096 * 2
    assert k.unique_bytes == 2 * operand + out + bias > H100.l2_cache_bytes
    assert k.global_bytes == operand * 16 + operand * 32 + out + bias     # A by 16 tile columns, B by 32 tile rows
    bands = 17 * 128 * 4096 * 2 + 4096 * 4096 * 2
    assert k.dram_bytes == 2 * bands + out + bias
    est = AnalyticCostModel().cost(k, H100)
    # compute-bound in the model: 2 x 4096^3 at 0.7 x 989.4 TFLOP/s, x 4 / (512 / 132) for the last wave
    compute = 2 * 4096 ** 3 / (0.7 * 989.4e12) * (4 / (512 / 132))
    assert est.parts["compute_s"] == pytest.approx(compute) and est.parts["memory_s"] < compute


def test_cheapest_config_follows_the_model():
    # one 128 x 128 tile would use 1 of 108 SMs: any configuration with more CTAs is cheaper
    small, _ = cheapest_config(gemm(128, 128, 4096), "sm_80", A100)
    assert (128 // small.threadblock[0]) * (128 // small.threadblock[1]) * small.split_k > 1
    # aligned on Hopper: warp-group MMA (efficiency 0.7) beats mma.sync (0.45) in the model, by more than the
    # ratio of the efficiencies' reciprocal times any wave penalty a 2.x tile could save (at most 1 + 1/7)
    cfg, est = cheapest_config(gemm(2048, 2048, 2048), "sm_90a", H100)
    assert cfg.api == "3x" and est.source == "analytic"
    model = AnalyticCostModel()
    best_2x = min(model.cost(describe(gemm(2048, 2048, 2048), c, H100), H100).seconds
                  for c in candidates(gemm(2048, 2048, 2048), "sm_90a", H100) if c.api == "2x")
    assert best_2x > est.seconds * 1.2


def test_kernel_config_roundtrip_and_validation():
    cfg = KernelConfig("3x", (128, 256, 64), (2, 1, 1), (64, 256, 16), 0, cluster=(2, 1, 1), schedule="cooperative")
    assert KernelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    with pytest.raises(ValueError):
        KernelConfig("3x", (128, 128, 64), (2, 1, 1), (64, 128, 16), 0)  # 3.x needs a schedule
    with pytest.raises(ValueError):
        KernelConfig("4x", (128, 128, 64), (2, 1, 1), (64, 128, 16), 0)


def test_database_jsonl_best_record_and_reload(tmp_path):
    path = tmp_path / "db.jsonl"
    db = Database(path)
    wl = gemm(256, 512, 128)
    c1, c2 = candidates(wl, "sm_80", A100)[:2]
    db.add(cutlass_record(wl, c1, "a100", 20e-6))
    db.add(cutlass_record(wl, c2, "a100", 10e-6))
    db.add(cutlass_record(wl, c1, "h100", 5e-6))
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(line)["key"] == wl.key() for line in lines)
    again = Database(path)
    assert len(again) == 2                                           # (key, device, dtype)
    assert again.best(wl.key(), "a100", "float16->float16").latency_s == 10e-6
    assert KernelConfig.from_dict(again.best(wl.key(), "a100", "float16->float16").config) == c2
    assert again.best(wl.key(), "a100", "float16->float32") is None
    assert len(again.records(wl.key(), "a100", "float16->float16")) == 2
    assert best_config(again, wl, "a100", "sm_80") == (c2, 10e-6)
    assert choose_config(wl, "sm_80", A100, again) == (c2, True)
    assert choose_config(wl, "sm_80", A100, None) == (cheapest_config(wl, "sm_80", A100)[0], False)


def test_measured_3x_configs_only_for_sm90a(tmp_path):
    wl = gemm(1024, 1024, 1024)
    three = next(c for c in candidates(wl, "sm_90a", H100) if c.api == "3x")
    two = next(c for c in candidates(wl, "sm_90a", H100) if c.api == "2x")
    db = Database(tmp_path / "db.jsonl")
    db.add(cutlass_record(wl, three, "h100", 1e-6))
    db.add(cutlass_record(wl, two, "h100", 2e-6))
    assert best_config(db, wl, "h100", "sm_90a") == (three, 1e-6)
    assert best_config(db, wl, "h100", "sm_90") == (two, 2e-6)     # the 3.x kernel does not build for sm_90


def test_records_of_a_same_shape_workload_keep_to_its_epilogue_rules(tmp_path):
    """Records are keyed by shape: a 3.x or split-K record measured for a plain bias epilogue is
    not used for a workload whose epilogue rules them out (residual after the activation: no
    3.x fusion; bias + residual: no split-K, the bias would be added once per K slice)."""
    plain = GemmWorkload("dense", 1, 64, 1024, 4096, "float16", "float16", "float16", "col", Epilogue("bias", "gelu"))
    after = replace(plain, epilogue=Epilogue("bias_residual", "gelu", residual_after_act=True))
    residual = replace(plain, epilogue=Epilogue("bias_residual", "gelu"))
    three = next(c for c in candidates(plain, "sm_90a", H100) if c.api == "3x")
    split = next(c for c in candidates(plain, "sm_90a", H100) if c.split_k > 1)
    two = next(c for c in candidates(after, "sm_90a", H100) if c.split_k == 1)
    assert after.key() == residual.key() == plain.key()
    db = Database(tmp_path / "db.jsonl")
    for cfg, latency in ((three, 1e-6), (split, 2e-6), (two, 3e-6)):
        db.add(cutlass_record(plain, cfg, "h100", latency))
    assert best_config(db, plain, "h100", "sm_90a") == (three, 1e-6)
    assert best_config(db, after, "h100", "sm_90a") == (two, 3e-6)
    assert best_config(db, residual, "h100", "sm_90a") == (three, 1e-6)   # 3.x fuses act(acc + bias + residual)
    assert best_config(db, residual, "h100", "sm_80") == (two, 3e-6)


def test_database_rejects_malformed_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"key": "x"}\n')
    with pytest.raises(DatabaseError, match="bad.jsonl:1"):
        Database(path)
    with pytest.raises(ValueError, match="positive"):
        Record("k", "h100", "float16", "cutlass", 0.0)


def test_profiler_main_source_and_argv():
    wl = gemm(256, 512, 128, layout="col")
    src = emit_profiler_main(wl, "my_entry")
    assert 'extern "C" int my_entry(const TvmExtGemmArgs*' in src
    assert "args.ldb = args.k;" in src and "args.ldc = 0;" in src and "cudaEventElapsedTime" in src
    assert problem_argv(wl) == ["gemm", "1", "256", "512", "128"]
    conv = Conv2dWorkload(2, 8, 8, 16, 32, 3, 3, 4, 4, (1, 1), (2, 2), (1, 1), "float16", "float16", "float16",
                          Epilogue("residual"))
    # kind, then N H W C K R S P Q, padding, stride, dilation: the workload's own fields in that order
    assert problem_argv(conv) == ["conv2d", "2", "8", "8", "16", "32", "3", "3", "4", "4", "1", "1", "2", "2", "1", "1"]
    assert "TvmExtConv2dArgs" in emit_profiler_main(conv, "e")


def test_tune_with_fake_runner_records_fastest(tmp_path, monkeypatch):
    """The search loop (compile errors count as inf, argmin, record) with compilation stubbed out."""
    wl = gemm(64, 128, 8192)
    cands = candidates(wl, "sm_80", A100)
    built = {}

    def fake_build(w, cfg, arch):
        built[cfg.name()] = cfg
        return tmp_path / cfg.name()

    monkeypatch.setattr("tvm_ext.cutlass.profiler.build_profiler", fake_build)
    target = cands[len(cands) // 2]
    runner = lambda prog, argv: 1.0 if prog.name == target.name() else (math.inf if "s10" in prog.name else 5.0)
    db = Database(tmp_path / "db.jsonl")
    rec = tune(wl, "sm_80", A100, db, runner=runner, progress=False)
    assert KernelConfig.from_dict(rec.config) == target and rec.latency_s == 1e-6 and len(built) == len(cands)
    assert best_config(Database(tmp_path / "db.jsonl"), wl, "a100", "sm_80") == (target, 1e-6)


def test_tune_without_gpu_is_a_clear_error(tmp_path):
    from tvm_ext.toolchain import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(CutlassSetupError, match="GPU"):
        tune(gemm(64, 64, 64), "sm_80", A100, Database(tmp_path / "d.jsonl"), progress=False)
