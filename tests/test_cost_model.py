"""The analytic cost model pinned on hand-computed cases, and the measured / learned layers on top.

Every expected number below is worked out from the H100 file's hardware (tvm_ext/hardware/
devices/h100.yaml: DRAM 3.35 TB/s, L2 10.1376 TB/s and 50 MiB, 132 SMs, FP16 tensor cores 989.4
TFLOP/s, CUDA cores FP32 66.9 TFLOP/s and FP16 133.8 TFLOP/s) with the reference cost constants
:data:`REFERENCE` (the file's before they were fitted to GPU measurements): launch 3 us (1 us from a
CUDA graph), grid barrier 2 us, DRAM efficiency 0.9, DRAM latency 600 ns with 32 bytes in flight per
thread, mma.sync at 0.45, wgmma at 0.7, SIMT at 0.6. They pin the formulas, whatever the fit says;
the file's own constants are checked by ``test_constants_are_the_h100_file`` (and, against the
measurements they were fitted to, by tests/test_calibration.py).
"""
from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import pytest

from tvm_ext.hardware import load_device
from tvm_ext.hardware.device_spec import FrozenMap
from tvm_ext.select.analytic import AnalyticCostModel, dram_bytes, fits_l2, wave_factor
from tvm_ext.select.candidate import CodePath, LaunchShape, StageWork
from tvm_ext.select.database import Database
from tvm_ext.select.measured import MIN_RECORDS, MeasuredCostModel, kernel_description, measurement_record

H100_FILE = load_device("h100")
#: Cost constants the hand-computed cases are worked out with.
REFERENCE = {"launch_overhead_s": 3e-6, "launch_overhead_graph_s": 1e-6, "grid_sync_s": 2e-6, "dram_latency_s": 6e-7,
             "bytes_in_flight_per_thread": 32, "dram_efficiency": 0.9, "simt_dram_efficiency": 0.0,
             "efficiency": FrozenMap({"simt": 0.6, "simt_contraction": 0.03, "wmma_tile": 0.008, "mma_sync": 0.45,
                                      "wgmma": 0.7})}
H100 = dataclasses.replace(H100_FILE, cost=dataclasses.replace(H100_FILE.cost, **REFERENCE))
US = 1e-6
DRAM_BW = 3.35e12 * 0.9          # achievable DRAM bandwidth when enough bytes are in flight
L2_BW = 10.1376e12


#: The fields the analytic model reads of a kernel, and nothing else.
Kernel = StageWork


def test_constants_are_the_h100_file():
    c = H100_FILE.cost
    assert (c.launch_overhead_graph_s, c.dram_latency_s, c.dram_efficiency) == (1e-6, 6e-7, 0.9)
    assert (c.efficiency["mma_sync"], c.efficiency["wgmma"]) == (0.45, 0.7)
    assert H100_FILE.sm_count == 132 and H100_FILE.l2_cache_bytes == 50 * 2 ** 20
    # every constant has a source; the ones without a document say why they are assumed
    for name in ("launch_overhead_graph_s", "dram_latency_s", "dram_efficiency", "efficiency.mma_sync",
                 "efficiency.wgmma"):
        source = H100_FILE.sources[f"cost_model.{name}"]
        assert source.startswith("assumed: ") and len(source) > 40
    # the ones the GPU measurements speak to were fitted on the H200, which has the H100's SMs
    h200 = load_device("h200")
    for name in ("launch_overhead_s", "grid_sync_s", "bytes_in_flight_per_thread", "simt_dram_efficiency",
                 "efficiency.simt", "efficiency.simt_contraction", "efficiency.wmma", "efficiency.wmma_tile"):
        assert H100_FILE.sources[f"cost_model.{name}"].startswith("fitted on h200: "), name
        assert h200.sources[f"cost_model.{name}"].startswith("fitted: "), name
        group, _, key = name.partition(".")
        mine, its = ((c.efficiency[key], h200.cost.efficiency[key]) if key
                     else (getattr(c, group), getattr(h200.cost, group)))
        assert mine == its, name


def test_large_copy_is_dram_bound():
    # 256 MiB fp32 in, 256 MiB out (no L2 reuse possible: 512 MiB > 50 MiB); 262144 blocks of 256
    # threads, 8 resident per SM (2048 threads) -> 1056 x 256 x 32 B = 8.65 MB in flight, / 600 ns
    # = 14.4 TB/s > 3.015 TB/s: the datasheet bandwidth binds
    moved = 512 * 2 ** 20
    copy = Kernel(0, moved, LaunchShape(grid=262144, threads=256))
    parts = AnalyticCostModel().parts(copy, H100)
    assert parts["compute_s"] == 0.0 and parts["sync_s"] == 0.0
    assert parts["memory_s"] == pytest.approx(moved / DRAM_BW) == pytest.approx(178.07 * US, rel=1e-4)
    assert AnalyticCostModel().cost(copy, H100).seconds == pytest.approx(3 * US + moved / DRAM_BW)
    assert AnalyticCostModel(cuda_graph=True).cost(copy, H100).seconds == pytest.approx(1 * US + moved / DRAM_BW)


def test_small_grid_copy_is_latency_bound():
    # 4 blocks x 256 threads x 32 B = 32 KiB in flight / 600 ns = 54.6 GB/s (Little's law): a
    # 1 MiB copy by 4 blocks takes 38.4 us, not the 0.7 us the bandwidth alone would give
    copy = Kernel(0, 2 * 2 ** 20, LaunchShape(grid=4, threads=256))
    parts = AnalyticCostModel().parts(copy, H100)
    assert parts["memory_s"] == pytest.approx(2 * 2 ** 20 / (4 * 256 * 32 / 600e-9)) == pytest.approx(38.4 * US, rel=1e-3)
    wide = dataclasses.replace(copy, launch=LaunchShape(grid=1024, threads=256))
    assert AnalyticCostModel().parts(wide, H100)["memory_s"] == pytest.approx(2 * 2 ** 20 / DRAM_BW)


def test_simt_kernels_stream_at_their_own_dram_efficiency():
    # a device file may give SIMT kernels their own fraction of the DRAM bandwidth (TVM's SIMT
    # kernels stream far below a copy benchmark); tensor-core kernels keep dram_efficiency
    slow = dataclasses.replace(H100, cost=dataclasses.replace(H100.cost, simt_dram_efficiency=0.2))
    moved = 512 * 2 ** 20
    copy = Kernel(0, moved, LaunchShape(grid=262144, threads=256))
    assert AnalyticCostModel().parts(copy, slow)["memory_s"] == pytest.approx(moved / (3.35e12 * 0.2))
    gemm = dataclasses.replace(copy, code_path=CodePath.WMMA, launch=LaunchShape(grid=262144, threads=256,
                                                                                   shared_bytes=32768))
    assert AnalyticCostModel().parts(gemm, slow)["memory_s"] == pytest.approx(moved / DRAM_BW)


def test_l2_reuse_only_when_the_working_set_fits():
    small = Kernel(0, global_bytes=10 * 2 ** 20, unique_bytes=2 ** 20, launch=LaunchShape(grid=1024, threads=256))
    assert fits_l2(small.unique_bytes, H100) and dram_bytes(small, H100) == 2 ** 20
    big = dataclasses.replace(small, global_bytes=200 * 2 ** 20, unique_bytes=100 * 2 ** 20)
    assert not fits_l2(big.unique_bytes, H100) and dram_bytes(big, H100) == 200 * 2 ** 20
    # a generator that knows its tiling says what reaches DRAM (CUTLASS: per wave of CTAs)
    tiled = dataclasses.replace(big, dram_bytes=120 * 2 ** 20)
    assert dram_bytes(tiled, H100) == 120 * 2 ** 20
    # re-reads still cost L2 bandwidth: 10 MiB through L2 is the bound of the small one
    assert AnalyticCostModel().parts(small, H100)["memory_s"] == pytest.approx(10 * 2 ** 20 / L2_BW)


@pytest.mark.parametrize("m, n, k, grid, expected_us", [
    # 1024^3: 2.147 GFLOP / (989.4 T x 0.45) = 4.823 us; 64 CTAs on 132 SMs: x 132/64 -> 9.947 us
    (1024, 1024, 1024, 64, 9.947),
    # 4096 x 4096 x 1024: 34.36 GFLOP -> 77.17 us; 1024 CTAs = 7.76 waves: x 8/7.76 -> 79.58 us
    (4096, 4096, 1024, 1024, 79.58),
    # 128 x 768 x 768 (a BERT projection): 0.151 GFLOP -> 0.339 us; 24 CTAs: x 132/24 -> 1.865 us
    (128, 768, 768, 24, 1.865),
])
def test_tensor_core_gemm_compute(m, n, k, grid, expected_us):
    flops = 2 * m * n * k
    operands = (m * k + k * n + m * n) * 2
    gemm = Kernel(flops, operands, LaunchShape(grid=grid, threads=256, shared_bytes=32768), CodePath.MMA_SYNC, "float16")
    parts = AnalyticCostModel().parts(gemm, H100)
    assert parts["compute_s"] == pytest.approx(expected_us * US, rel=1e-3)
    assert parts["compute_s"] == pytest.approx(flops / (989.4e12 * 0.45) * wave_factor(H100, grid))
    # the same GEMM on the wgmma path: 0.7 instead of 0.45 of the peak
    wg = AnalyticCostModel().parts(dataclasses.replace(gemm, code_path=CodePath.WGMMA), H100)
    assert wg["compute_s"] == pytest.approx(parts["compute_s"] * 0.45 / 0.7)


def test_gemv_is_memory_bound():
    # 1 x 4096 x 4096 fp16 on CUDA cores: 33.5 MFLOP / (133.8 T x 0.6) = 0.42 us, but 32 MiB of
    # weights at 3.015 TB/s = 11.13 us (512 blocks of 128 threads keep 2 MiB in flight: enough)
    weights = 4096 * 4096 * 2
    gemv = Kernel(2 * 4096 * 4096, weights + 2 * 4096 * 2, LaunchShape(grid=512, threads=128), CodePath.SIMT, "float16")
    parts = AnalyticCostModel().parts(gemv, H100)
    assert parts["compute_s"] == pytest.approx(2 * 4096 * 4096 / (133.8e12 * 0.6) * (4 / (512 / 132)))
    assert parts["memory_s"] == pytest.approx((weights + 16384) / DRAM_BW) == pytest.approx(11.13 * US, rel=1e-3)
    assert AnalyticCostModel().cost(gemv, H100).seconds == pytest.approx(3 * US + parts["memory_s"])


def test_softmax_rows():
    # 4096 rows x 1024 fp32, one 256-thread block per row: 16 MiB read + 16 MiB written (fits in
    # L2, each byte once); ~5 flop per element on CUDA cores: 21 MFLOP / (66.9 T x 0.6) = 0.52 us;
    # memory 32 MiB / 3.015 TB/s = 11.13 us
    elems = 4096 * 1024
    softmax = Kernel(5 * elems, 2 * elems * 4, LaunchShape(grid=4096, threads=256))
    parts = AnalyticCostModel().parts(softmax, H100)
    assert parts["compute_s"] == pytest.approx(5 * elems / (66.9e12 * 0.6) * (32 / (4096 / 132)))
    assert parts["memory_s"] == pytest.approx(2 * elems * 4 / DRAM_BW)
    assert AnalyticCostModel().cost(softmax, H100).seconds == pytest.approx(3 * US + 11.13 * US, rel=1e-3)


def test_grid_synced_kernel_pays_its_barriers():
    # a stitched kernel with two grid barriers, one wave of 132 blocks: 2 x 2 us on top; 1 MiB at
    # 132 x 256 x 32 B / 600 ns = 1.80 TB/s (under the 3.015 TB/s cap): 0.58 us
    stitched = Kernel(2 ** 20, 2 ** 20, LaunchShape(grid=132, threads=256, grid_syncs=2))
    parts = AnalyticCostModel().parts(stitched, H100)
    assert parts["sync_s"] == pytest.approx(4 * US)
    assert parts["memory_s"] == pytest.approx(2 ** 20 / (132 * 256 * 32 / 600e-9))
    assert AnalyticCostModel().cost(stitched, H100).seconds == pytest.approx(3 * US + parts["memory_s"] + 4 * US)


def test_a_view_costs_nothing_and_multi_kernel_launches_add_up():
    view = Kernel(0, 4096, LaunchShape(grid=1, threads=1, kernels=0))
    assert AnalyticCostModel().cost(view, H100).seconds == 0.0
    two = Kernel(0, 4096, LaunchShape(grid=1, threads=256, kernels=2))
    assert AnalyticCostModel().parts(two, H100)["launch_s"] == pytest.approx(6 * US)


# ---------------------------------------------------------------- measured and learned
def _kernel(i: int, key: str = "") -> SimpleNamespace:
    launch = LaunchShape(grid=64 * (i + 1), threads=128 * (1 + i % 4))
    plan = SimpleNamespace(to_json=lambda: {"tile": i})
    return SimpleNamespace(flops=10 ** 6 * (i + 1), global_bytes=2 ** 20 * (i + 1), unique_bytes=2 ** 20 * (i + 1),
                           launch=launch, code_path=CodePath.SIMT, dtype="float16", key=key or f"k{i}", plan=plan,
                           database_dtype="float16", generator="test")


def test_measured_record_overrides_the_analytic_cost(tmp_path):
    db = Database(tmp_path / "m.jsonl")
    kernel = _kernel(0)
    model = MeasuredCostModel(database=db)
    assert model.cost(kernel, H100).source == "analytic"
    db.add(measurement_record(kernel, "h100", 7e-6, "bench"))
    db.add(measurement_record(kernel, "h100", 5e-6, "bench"))
    est = MeasuredCostModel(database=db).cost(kernel, H100)
    assert (est.source, est.seconds) == ("measured", 5e-6)              # the fastest record
    # another device's record, or another plan of the same key, is not this kernel's measurement
    assert MeasuredCostModel(database=db).cost(kernel, load_device("a100")).source == "analytic"
    other_plan = SimpleNamespace(**{**vars(kernel), "plan": SimpleNamespace(to_json=lambda: {"tile": 99})})
    assert MeasuredCostModel(database=db).cost(other_plan, H100).source == "analytic"


def test_learned_correction_needs_enough_records(tmp_path):
    """Records measured at twice the analytic time teach the residual; a new kernel is priced ~2x."""
    analytic = AnalyticCostModel()
    db = Database(tmp_path / "m.jsonl")
    for i in range(MIN_RECORDS - 1):
        k = _kernel(i)
        db.add(measurement_record(k, "h100", 2 * analytic.cost(k, H100).seconds, "bench"))
    fresh = _kernel(MIN_RECORDS + 5, key="unseen")
    assert MeasuredCostModel(database=db).cost(fresh, H100).source == "analytic"   # 19 records: not yet
    k = _kernel(MIN_RECORDS - 1)
    db.add(measurement_record(k, "h100", 2 * analytic.cost(k, H100).seconds, "bench"))
    est = MeasuredCostModel(database=db).cost(_kernel(7, key="unseen"), H100)
    assert est.source == "learned"
    ratio = est.seconds / analytic.cost(_kernel(7), H100).seconds
    assert math.isclose(ratio, 2.0, rel_tol=0.1), ratio
    assert est.parts["log_correction"] == pytest.approx(math.log(ratio))


def test_records_carry_the_kernel_description(tmp_path):
    kernel = _kernel(3)
    rec = measurement_record(kernel, "h100", 1e-5, "bench")
    assert rec.config["kernel"] == kernel_description(kernel)
    assert rec.config["kernel"]["launch"]["grid"] == 256 and rec.config["measured"] == {"tile": 3}
