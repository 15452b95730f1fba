"""The measurements the package ships price their kernels by default, on their device and its
documented sibling; a user's database adds to them."""
from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path
from types import SimpleNamespace

import pytest

from tvm_ext.hardware import load_device
from tvm_ext.select.analytic import AnalyticCostModel
from tvm_ext.select.database import (
    DATABASE_ENV,
    PACKAGED_MEASUREMENTS_DIR,
    Database,
    DatabaseError,
    Record,
    shipped_database,
)
from tvm_ext.select.describe import description_from_json
from tvm_ext.select.measured import MeasuredCostModel, kernel_description

ROOT = Path(__file__).resolve().parents[1]
H200, H100 = load_device("h200"), load_device("h100")


@pytest.fixture(autouse=True)
def _no_user_database(monkeypatch):
    monkeypatch.delenv(DATABASE_ENV, raising=False)


def _keyed() -> tuple[Record, SimpleNamespace]:
    """A shipped record with a key and its kernel (the description and plan it was measured for)."""
    record = next(r for r in shipped_database() if r.key and r.device == "h200" and r.generator == "stitch")
    config = dict(record.config["measured"])
    plan = SimpleNamespace(measured_config=lambda: config, generator=record.generator)
    kernel = dataclasses.replace(description_from_json(record.config["kernel"]), key=record.key, plan=plan)
    return record, kernel


def test_the_package_ships_the_repositorys_measurements():
    shipped = sorted(p.name for p in PACKAGED_MEASUREMENTS_DIR.glob("*.jsonl"))
    assert "h200.jsonl" in shipped
    bench = ROOT / "bench" / "measurements"
    if not bench.is_dir():
        pytest.skip("an installed package: no repository beside it")
    # one copy: bench/measurements is a link to the package's directory, where a GPU run's ingest appends
    assert bench.resolve() == PACKAGED_MEASUREMENTS_DIR.resolve()
    assert len([r for r in shipped_database() if r.device == "h200"]) == len((bench / "h200.jsonl").read_text().splitlines())
    with pytest.raises(DatabaseError, match="read-only"):
        shipped_database().add(next(iter(shipped_database())))


def test_a_shipped_record_prices_its_kernel_by_default():
    record, kernel = _keyed()
    fastest = min(r.latency_s for r in shipped_database().records(record.key, "h200", record.dtype)
                  if r.config.get("measured") == record.config["measured"])
    est = MeasuredCostModel().cost(kernel, H200)
    assert (est.source, est.seconds) == ("measured", fastest)
    assert MeasuredCostModel(shipped=False).cost(kernel, H200).source == "analytic"
    # another plan of the same key is another kernel
    other = dataclasses.replace(kernel, plan=SimpleNamespace(measured_config=lambda: {"other": 1}, generator="stitch"))
    assert MeasuredCostModel().cost(other, H200).source == "analytic"
    # a device without a sibling and without records: analytic
    assert MeasuredCostModel().cost(kernel, load_device("a100")).source == "analytic"


def test_the_users_database_adds_to_the_shipped_records_and_comes_first(tmp_path):
    record, kernel = _keyed()
    db = Database(tmp_path / "mine.jsonl")
    db.add(dataclasses.replace(record, latency_s=record.latency_s * 3, source="mine"))
    assert MeasuredCostModel(database=db).cost(kernel, H200).seconds == record.latency_s * 3
    # a kernel only the user measured, on a device the package has no records for
    a100 = dataclasses.replace(record, device="a100", latency_s=1e-3)
    db.add(a100)
    assert MeasuredCostModel(database=db).cost(kernel, load_device("a100")).seconds == 1e-3


def test_a_kernel_without_a_key_matches_the_records_of_its_description():
    """TVM's own kernels carry no plan, hence no key: the keyless records with their exact
    description stand for them (several functions may share one: their median)."""
    keyless = [r for r in shipped_database() if not r.key and r.device == "h200"]
    by_desc: dict[str, list[Record]] = {}
    for r in keyless:
        by_desc.setdefault(json.dumps(r.config["kernel"], sort_keys=True), []).append(r)
    desc, records = max(by_desc.items(), key=lambda kv: len(kv[1]))
    assert len(records) >= 2
    kernel = description_from_json(json.loads(desc))
    assert kernel_description(kernel) == json.loads(desc)
    est = MeasuredCostModel().cost(kernel, H200)
    times = sorted(r.latency_s for r in records)
    assert est.source == "measured" and est.seconds == times[(len(times) - 1) // 2]
    assert est.seconds == pytest.approx(statistics.median_low(times))
    # one byte more is another kernel
    moved = dataclasses.replace(kernel, global_bytes=kernel.global_bytes + 1)
    assert MeasuredCostModel().cost(moved, H200).source == "analytic"


def test_the_sibling_device_is_priced_from_its_records_scaled_by_the_model():
    record, kernel = _keyed()
    described = description_from_json(record.config["kernel"])
    model = AnalyticCostModel()
    scale = model.cost(described, H100).seconds / model.cost(described, H200).seconds
    est = MeasuredCostModel().cost(kernel, H100)
    assert est.source == "measured" and est.parts["sibling_scale"] == pytest.approx(scale)
    assert est.seconds == pytest.approx(MeasuredCostModel().cost(kernel, H200).seconds * scale)
    # the H100's DRAM is slower, its SMs the same: a kernel costs there at least what it costs here
    assert scale >= 1.0


def test_a_tensorized_kernel_matches_records_written_before_the_wmma_path():
    """Records of TVM's tensorized GEMMs say ``mma_sync`` (they predate ``wmma``); the description
    of the same kernel built today says ``wmma`` and still finds them."""
    record = next(r for r in shipped_database() if not r.key and r.config["kernel"]["code_path"] == "mma_sync")
    kernel = description_from_json({**record.config["kernel"], "code_path": "wmma"})
    est = MeasuredCostModel().cost(kernel, H200)
    assert est.source == "measured" and est.seconds == pytest.approx(record.latency_s, rel=0.2)


def test_a_tvm_schedule_with_tensor_core_fragments_is_priced_as_wmma():
    """A scheduled kernel without a plan that allocates WMMA fragments (dlight's tensorized
    Matmul) is described with the ``wmma`` path, which the H200's fitted rate prices."""
    from tvm.script import tirx as T

    from tvm_ext.select.candidate import CodePath
    from tvm_ext.select.describe import describe_scheduled

    @T.prim_func(private=True, s_tir=True)
    def graph(a: T.Buffer((16, 16), "float16"), b: T.Buffer((16, 16), "float16")):
        for i, j in T.grid(16, 16):
            with T.sblock("copy"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = a[vi, vj]

    @T.prim_func(private=True, s_tir=True)
    def scheduled(a: T.Buffer((16, 16), "float16"), b: T.Buffer((16, 16), "float16")):
        frag = T.sblock_alloc_buffer((16, 16), "float16", scope="wmma.matrix_a")
        for i, j in T.grid(16, 16):
            with T.sblock("load"):
                vi, vj = T.axis.remap("SS", [i, j])
                frag[vi, vj] = a[vi, vj]
        for i, j in T.grid(16, 16):
            with T.sblock("store"):
                vi, vj = T.axis.remap("SS", [i, j])
                b[vi, vj] = frag[vi, vj]

    assert describe_scheduled(graph, scheduled).code_path == CodePath.WMMA
    assert describe_scheduled(graph, graph).code_path == CodePath.SIMT
