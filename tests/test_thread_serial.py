"""Stitched kernels, threads serialized, against their unscheduled functions on the CPU.

Covers each scheme: regional (layer norm, softmax), global with grid barriers (the paper's
Figure 7 graph, squeeze-excitation), task splitting (few long rows), remote stitching (two
outputs), a gather, and the GEMM prologue including a partial last row tile (197 rows). A
corrupted schedule must fail the check.
"""
from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import tirx
from tvm.script import tirx as T

from test_stitch_kernels import figure7_module, layer_norm_module, long_rows_module, softmax_module, \
    squeeze_excite_module
from test_stitch_prologue import attention, norm_then_gemm
from test_stitch_scope import embedding_graph, remote_graph
from tvm_ext.driver import graph_passes
from tvm_ext.driver.apply_plans import ApplyPlans
from tvm_ext.hardware import device_from_target
from tvm_ext.checks.thread_serial import SerialComparison, call_inputs, compare_scheduled, serialize_threads
from tvm_ext.tir import has_grid_sync

TARGET = "tvm_ext/h100"
CASES = {
    "layer_norm": (layer_norm_module, "stitched"),
    "softmax": (softmax_module, "stitched"),
    "figure7": (figure7_module, "stitched+grid_sync"),
    "squeeze_excite": (squeeze_excite_module, "stitched+grid_sync"),
    "long_rows": (long_rows_module, "stitched+grid_sync"),
    "attention_197": (lambda: attention(heads=12, seq=197), "stitched+gemm_prologue"),
    "norm_gemm": (norm_then_gemm, "stitched+gemm_prologue"),
    "remote_two_outputs": (remote_graph, "stitched"),
    "embedding_gather_norm": (embedding_graph, "stitched"),
}


def _stages(make):
    target = tvm.target.Target(TARGET)
    with target:
        fused = graph_passes("stitch", target)(make())
        scheduled = ApplyPlans(device_from_target(target), target)(fused)
    from test_stitch_kernels import _stitch_rules

    return fused, scheduled, _stitch_rules(scheduled)


@pytest.mark.parametrize("case", sorted(CASES))
def test_serialized_kernel_matches_unscheduled(case):
    make, verdict = CASES[case]
    fused, scheduled, report = _stages(make)
    names = [n for n, v in report.items() if v == verdict]
    assert names, report
    for name in names:
        check = compare_scheduled(fused[name], scheduled[name], inputs=call_inputs(fused, name))
        assert check.ok, (name, check)
        assert check.outputs == len(fused[name].params) - call_inputs(fused, name)


def test_grid_barriers_become_stage_loops():
    _, scheduled, report = _stages(figure7_module)
    name = next(n for n, v in report.items() if v == "stitched+grid_sync")
    assert has_grid_sync(scheduled[name])
    serial = serialize_threads(scheduled[name])
    assert not has_grid_sync(serial)
    loops: list = []
    tvm_ffi.structural_walk(serial.body, (tirx.For, loops.append))
    assert all(lp.thread_binding is None for lp in loops)


def test_a_corrupted_schedule_fails_the_check():
    fused, scheduled, report = _stages(lambda: attention(heads=12, seq=197))
    name = next(n for n, v in report.items() if v == "stitched+gemm_prologue")
    shrunk = []

    def on_for(loop, mutator):
        new = mutator.default_mutate(loop)
        if not shrunk and new.thread_binding is not None and str(new.thread_binding.thread_tag) == "blockIdx.x":
            shrunk.append(True)
            return tirx.For(new.loop_var, new.min, new.extent - 1, new.kind, new.body, new.thread_binding,
                            new.annotations)
        return new

    broken = scheduled[name].with_body(tvm_ffi.structural_mutate(scheduled[name].body, (tirx.For, on_for)))
    assert shrunk and not compare_scheduled(fused[name], broken).ok      # the last row tile is never computed


@T.prim_func(private=True, s_tir=True)
def _doubled(a: T.Buffer((T.int64(6),), "float32"), b: T.Buffer((T.int64(6),), "float32")):
    for i in range(T.int64(6)):
        with T.sblock("b"):
            vi = T.axis.spatial(T.int64(6), i)
            b[vi] = a[vi] * T.float32(2.0)


@T.prim_func(private=True, s_tir=True)
def _doubled_past_the_end(a: T.Buffer((T.int64(6),), "float32"), b: T.Buffer((T.int64(6),), "float32")):
    T.func_attr({"tirx.noalias": True})
    for i in range(T.int64(8)):       # a border tile without its predicate: two stores past the end
        b[i] = a[T.min(i, T.int64(5))] * T.float32(2.0)


def test_a_store_past_the_end_of_an_output_fails_the_check_by_name():
    check = compare_scheduled(_doubled, _doubled_past_the_end, inputs=1)
    assert not check.ok and check.out_of_bounds == ("b",) and check.max_abs_err == 0.0
    assert compare_scheduled(_doubled, _doubled, inputs=1) == SerialComparison(True, 0.0, 1, ())


@T.prim_func(private=True, s_tir=True)
def _scaled(a: T.Buffer((T.int64(6),), "float32"), s: T.Buffer((), "float32"), b: T.Buffer((T.int64(6),), "float32")):
    for i in range(T.int64(6)):
        with T.sblock("b"):
            vi = T.axis.spatial(T.int64(6), i)
            b[vi] = a[vi] * s[()]


def test_a_scalar_tensor_parameter_is_passed_as_one():
    """A 0-d parameter (BERT's attention mask selects between two scalar tensors) is run as a 0-d
    array, not the 1-element vector ``np.ascontiguousarray`` makes of it."""
    assert compare_scheduled(_scaled, _scaled, inputs=2).ok


def test_schedule_stage_leaves_its_input_alone():
    from tvm_ext.dlight import SafeDefaultSchedule

    target = tvm.target.Target(TARGET)
    with target:
        fused = graph_passes("stitch", target)(attention())
        before = {gv.name_hint: tvm_ffi.structural_hash(f) for gv, f in fused.functions_items()}
        stitched = ApplyPlans(device_from_target(target), target)(fused)
        SafeDefaultSchedule()(fused)
    assert {gv.name_hint: tvm_ffi.structural_hash(f) for gv, f in fused.functions_items()} == before
    assert {gv.name_hint: tvm_ffi.structural_hash(f) for gv, f in stitched.functions_items()} != before
