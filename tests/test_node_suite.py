"""Node test generation and the node suite runner (a handful of cases, baseline preset)."""
from __future__ import annotations

import json
import os
import shutil
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from tvm_ext.errors import PresetError, TvmExtError
from tvm_ext.testing.isolated_pool import IsolatedPool
from tvm_ext.testing.node_cases import generate_node_tests, list_cases, load_case
from tvm_ext.testing.node_suite import CaseResult, NodeSuiteResult, run_node_suite

PATTERNS = ["test_add*", "test_relu", "test_softmax_axis_0", "test_softmax_axis_0_expanded",
            "test_adagrad",                   # training-domain op: the importer rejects it
            "test_sequence_insert_at_back"]   # sequence-typed graph inputs: out of scope
ADD_CASES = ["test_add", "test_add_bcast", "test_add_int16", "test_add_int8", "test_add_uint16",
             "test_add_uint32", "test_add_uint64", "test_add_uint8"]


@pytest.fixture(scope="module")
def cases_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("node_cases")
    written = generate_node_tests(out, PATTERNS, modules=["add", "relu", "softmax", "adagrad", "sequenceinsert"])
    # A copy of test_relu whose stored expectation is wrong in one element.
    bad = out / "test_relu_corrupted"
    shutil.copytree(out / "test_relu", bad)
    meta = json.loads((bad / "meta.json").read_text())
    (bad / "meta.json").write_text(json.dumps({**meta, "name": bad.name}))
    out_pb = bad / "test_data_set_0" / "output_0.pb"
    expected = numpy_helper.to_array(onnx.load_tensor(str(out_pb))).copy()
    expected.flat[7] += 0.5
    out_pb.write_bytes(numpy_helper.from_array(expected, "y").SerializeToString())
    return out, written


@pytest.fixture(scope="module")
def suite(cases_dir):
    return run_node_suite(cases_dir[0], ["baseline"], jobs=1, timeout_per_case=120, progress=False)


def test_generated_layout(cases_dir):
    out, written = cases_dir
    assert sorted(written) == sorted(ADD_CASES + ["test_relu", "test_softmax_axis_0", "test_softmax_axis_0_expanded",
                                                  "test_adagrad", "test_sequence_insert_at_back"])
    assert len(list_cases(out)) == len(written) + 1
    assert [p.name for p in list_cases(out, "test_softmax*")] == ["test_softmax_axis_0",
                                                                 "test_softmax_axis_0_expanded"]
    case = load_case(out / "test_add_bcast")
    assert case.op_type == "Add" and (case.rtol, case.atol) == (1e-3, 1e-7)
    (a, b), (y,) = case.data_sets[0]
    assert a.shape == (3, 4, 5) and b.shape == (5,)
    np.testing.assert_array_equal(y, a + b)
    expanded = load_case(out / "test_softmax_axis_0_expanded")
    assert expanded.op_type == "Softmax" and expanded.expanded and len(expanded.model.graph.node) > 1
    seq = load_case(out / "test_sequence_insert_at_back")
    assert isinstance(seq.data_sets[0][0][0], list)  # sequence input read back as a list


def test_suite_counts(suite):
    counts = suite.counts("baseline")
    # 8 Add + Relu + Softmax + its expansion pass; the corrupted Relu mismatches.
    assert counts == {"pass": 11, "mismatch": 1, "import-fail": 1, "build-fail": 0, "run-fail": 0,
                      "timeout": 0, "crash": 0, "skipped": 1}
    by_case = {r.case: r for r in suite.for_preset("baseline")}
    assert all(by_case[c].status == "pass" for c in ADD_CASES)
    bad = by_case["test_relu_corrupted"]
    assert bad.status == "mismatch" and bad.op_type == "Relu"
    assert bad.max_abs_err == pytest.approx(0.5, abs=1e-6) and "1/60 elements" in bad.message
    assert by_case["test_adagrad"].status == "import-fail"
    assert by_case["test_adagrad"].error_type == "UnsupportedOpsError"
    assert by_case["test_sequence_insert_at_back"].status == "skipped"
    assert "sequence" in by_case["test_sequence_insert_at_back"].message


def test_suite_summaries(suite, tmp_path):
    by_op = suite.by_op("baseline")
    assert by_op["Add"]["pass"] == 8 and by_op["Relu"] == {**by_op["Relu"], "pass": 1, "mismatch": 1}
    assert by_op["Softmax"]["pass"] == 2
    failing = dict((op, n) for op, n, _ in suite.top_failing_ops("baseline"))
    assert failing == {"Relu": 1, "Adagrad": 1}
    report = suite.format_report()
    assert "baseline" in report and "Adagrad" in report and "Add " not in report.split("per op")[1]
    path = tmp_path / "suite.json"
    suite.write_json(path)
    data = json.loads(path.read_text())
    assert data["summary"]["baseline"]["counts"]["pass"] == 11
    assert len(data["results"]) == 14


def test_new_failures_vs_baseline():
    rows = [CaseResult("a", "Add", "baseline", "pass"), CaseResult("a", "Add", "stitch", "mismatch"),
            CaseResult("b", "Relu", "baseline", "import-fail"), CaseResult("b", "Relu", "stitch", "import-fail"),
            CaseResult("c", "Relu", "baseline", "pass"), CaseResult("c", "Relu", "stitch", "pass")]
    result = NodeSuiteResult("x", ["baseline", "stitch"], rows)
    assert [r.case for r in result.new_failures("stitch")] == ["a"]
    assert "new failures vs baseline: 1" in result.format_report()
    assert result.to_dict()["summary"]["stitch"]["new_failures_vs_baseline"] == ["a"]


def test_suite_rejects_bad_arguments(cases_dir):
    with pytest.raises(PresetError):
        run_node_suite(cases_dir[0], ["nope"], progress=False)
    with pytest.raises(TvmExtError, match="no node test case"):
        run_node_suite(cases_dir[0], ["baseline"], pattern="test_does_not_exist", progress=False)


def pool_task(task: tuple[str, object]) -> object:
    """Sleeps, exits the process, or raises, as the task says (runs in a pool worker)."""
    kind, value = task
    if kind == "sleep":
        time.sleep(value)
    elif kind == "exit":
        os._exit(value)
    elif kind == "segfault":
        import ctypes

        ctypes.string_at(0)
    elif kind == "print_and_exit":
        print(value, file=sys.stderr, flush=True)
        os._exit(1)
    elif kind == "raise":
        raise ValueError(value)
    return value


def test_isolated_pool_survives_timeout_and_crash():
    # One worker at a time: a raising task is reported, a dying worker is replaced, the hung task is
    # cut off, and the pool goes on after each.
    tasks = [("sleep", 0.0), ("raise", "boom"), ("exit", 3), ("print_and_exit", "last words"), ("sleep", 60.0),
             ("segfault", None), ("sleep", 0.0)]
    start = time.monotonic()
    with IsolatedPool(pool_task, jobs=1, timeout=2.0) as pool:
        outcomes = list(pool.map(tasks))
    assert time.monotonic() - start < 45
    assert [o.index for o in outcomes] == list(range(len(tasks)))
    assert [o.failure for o in outcomes] == [None, "crash", "crash", "crash", "timeout", "crash", None]
    assert outcomes[0].value == 0.0
    assert "ValueError: boom" in outcomes[1].message
    assert outcomes[2].message == "worker died: no output"
    assert outcomes[3].message == "worker died: last words"  # the task's own stderr, not the pool's
    assert "no result after 2 s" in outcomes[4].message and outcomes[4].seconds >= 2.0
    assert outcomes[5].message == "worker died: Fatal Python error: Segmentation fault"


def test_shape_inputs_are_bound_from_each_data_set(tmp_path):
    # Reshape's shape and ReduceSum's axes arrive as graph inputs in these cases; the runner binds
    # them from the data set, as a user would with bind=
    generate_node_tests(tmp_path, ["test_reshape_reduced_dims", "test_reduce_sum_keepdims_example"],
                        modules=["reshape", "reducesum"])
    suite = run_node_suite(tmp_path, ["baseline"], jobs=0, progress=False)
    assert suite.counts()["pass"] == 2, suite.format_report()
