"""Per-kernel profiles joined with a bundle manifest (tvm_ext.bench.kernel_report), without a GPU."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from tvm_ext.bench.kernel_report import (LIBRARY, NCU_SOURCE, database_records, kernel_rows, markdown,
                                         parse_ncu_csv, summary)
from tvm_ext.bench.manifest import BuildEntry, Manifest, ModelEntry
from tvm_ext.errors import BenchError
from tvm_ext.hardware import load_device
from tvm_ext.select.describe import description_from_json
from tvm_ext.select.database import Database
from tvm_ext.select.measured import MeasuredCostModel

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size",'
          '"Grid Size","Device","CC","dram__bytes_read.sum","dram__bytes_write.sum","gpu__time_duration.sum"')
UNITS = '"","","","","","","","","","","","Kbyte","byte","usecond"'


def _row(i: int, name: str, read_kb: float, write_b: float, us: float) -> str:
    return (f'"{i}","77","python3","host","{name}","1","7","(256, 1, 1)","(64, 1, 1)","0","9.0",'
            f'"{read_kb:,}","{write_b:,}","{us}"')


def _csv(*rows: str) -> str:
    return "\n".join(["==PROF== Connected to process 77", "info: one inference profiled", HEADER, UNITS, *rows])


def _description(global_bytes: int) -> dict:
    return {"flops": 1000, "global_bytes": global_bytes, "unique_bytes": global_bytes, "dram_bytes": 0,
            "launch": {"grid": 64, "threads": 256, "shared_bytes": 0, "registers": None, "kernels": 1,
                       "grid_syncs": 0}, "code_path": "simt", "dtype": "float16"}


def _manifest() -> Manifest:
    kernel_list = [
        {"func": "fused_add_softmax", "kernel_names": ["fused_add_softmax_kernel"], "calls": 2,
         "generator": "stitch", "rule": "stitched", "modelled_s": 4e-6, "cost_source": "analytic",
         "measurement": {"key": "abc123", "dtype": "float16", "generator": "stitch",
                         "config": {"kernel": _description(2_000_000), "measured": {"group": "stitch"}}}},
        {"func": "fused_matmul", "kernel_names": ["fused_matmul_kernel"], "calls": 1, "generator": "dlight",
         "rule": "Matmul", "modelled_s": 10e-6, "cost_source": "analytic",
         "measurement": {"key": "", "dtype": "float16", "generator": "dlight",
                         "config": {"kernel": _description(8_000_000)}}},
        {"func": "tvm_ext_cutlass_gemm0", "kernel_names": ["tvm_ext_cutlass_gemm0"], "calls": 1,
         "generator": "cutlass", "rule": "library", "modelled_s": 5e-6, "cost_source": "analytic",
         "measurement": None},
    ]
    build = BuildEntry(system="full", preset="full", kernels=4, kernel_list=kernel_list)
    model = ModelEntry(name="m", source="m.onnx", dtype="float16", builds=[build])
    return Manifest(target="tvm_ext/h200", target_kind="cuda", dtype="float16", created="now", commit="c0ffee",
                    tvm_version="0.27", models=[model])


def _profile() -> str:
    return _csv(_row(0, "fused_add_softmax_kernel", 1000.0, 1_000_000, 5.0),
                _row(1, "void cutlass::Kernel2<cutlass_80_tensorop_h16816gemm<(int)1>>(Params)", 4000.0, 0, 6.5),
                _row(2, "fused_matmul_kernel", 7000.0, 1_000_000, 12.0),
                _row(3, "fused_add_softmax_kernel", 1000.0, 1_000_000, 3.0))


def test_parse_scales_units_and_strips_signatures():
    kernels = parse_ncu_csv(_profile())
    assert [k.name for k in kernels] == ["fused_add_softmax_kernel",
                                         "cutlass::Kernel2<cutlass_80_tensorop_h16816gemm<(int)1>>",
                                         "fused_matmul_kernel", "fused_add_softmax_kernel"]
    assert kernels[0].seconds == pytest.approx(5e-6)
    assert kernels[0].dram_read == pytest.approx(1e6) and kernels[0].dram_write == pytest.approx(1e6)


def test_rows_per_function_per_call():
    rows = {r.func: r for r in kernel_rows(_manifest(), "m", "full", parse_ncu_csv(_profile()))}
    soft = rows["fused_add_softmax"]
    assert soft.launches_seen == 2 and soft.measured_s == pytest.approx(4e-6)   # (5 + 3) µs over 2 calls
    assert soft.time_ratio == pytest.approx(1.0) and soft.bytes_ratio == pytest.approx(1.0)
    assert rows["fused_matmul"].bytes_ratio == pytest.approx(1.0)
    lib = rows[LIBRARY]
    assert lib.generator == "cutlass" and lib.measured_s == pytest.approx(6.5e-6) and lib.modelled_s == 5e-6
    stats = summary(list(rows.values()))
    assert stats["all"]["functions"] == 2 and stats["all"]["bytes_within_20pct"] == 2
    assert stats["dlight"]["time_ratio_geomean"] == pytest.approx(1.2)
    assert "| m | full | fused_add_softmax | stitch | 2 | 4.0 | 4.0 | 1.00 |" in markdown(list(rows.values()))


def test_records_feed_the_measured_cost_model(tmp_path):
    manifest = _manifest()
    rows = kernel_rows(manifest, "m", "full", parse_ncu_csv(_profile()))
    records = database_records(manifest, rows, "h200")
    assert sorted(r.generator for r in records) == ["dlight", "stitch"]      # no record for the library sum
    assert all(r.source == NCU_SOURCE and r.device == "h200" for r in records)
    db = Database(tmp_path / "db.jsonl")
    for r in records:
        db.add(r)
    stitched = next(r for r in Database(tmp_path / "db.jsonl") if r.key == "abc123")
    assert stitched.latency_s == pytest.approx(4e-6) and stitched.config["measured"] == {"group": "stitch"}
    # a kernel with that key and plan is now priced by the measurement
    plan = SimpleNamespace(generator="stitch", measured_config=lambda: {"group": "stitch"})
    kernel = description_from_json({**_description(2_000_000)})
    kernel = dataclasses.replace(kernel, key="abc123", plan=plan)
    estimate = MeasuredCostModel(database=db).cost(kernel, load_device("h200"))
    assert estimate.source == "measured" and estimate.seconds == pytest.approx(4e-6)


def test_bad_profiles_are_named():
    with pytest.raises(BenchError, match="no ncu raw CSV header"):
        parse_ncu_csv("==PROF== nothing profiled\n")
    with pytest.raises(BenchError, match="lacks the columns"):
        parse_ncu_csv('"ID","Kernel Name","gpu__time_duration.sum"\n"","","nsecond"\n')
    with pytest.raises(BenchError, match="no units row"):
        parse_ncu_csv("\n".join([HEADER, _row(0, "k", 1.0, 1.0, 1.0)]))
    with pytest.raises(BenchError, match="no build 'stitch'"):
        kernel_rows(_manifest(), "m", "stitch", [])
