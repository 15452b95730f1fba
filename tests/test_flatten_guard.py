"""GuardFlattenIndices: indices TVM's FlattenBuffer would simplify to another element are kept."""
from __future__ import annotations

import logging

import numpy as np
import tvm
from tvm.script import tirx as T

from tvm_ext.checks.thread_serial import run_on_cpu
from tvm_ext.tir import PIPELINE_NAME, guard_flatten_indices


# fmt: off
@T.prim_func(private=True, s_tir=True)
def _window_shift(A: T.Buffer((49, 8), "float32"), B: T.Buffer((784, 8), "float32")):
    # a 28x28 grid read from one 7x7 window shifted by 4 rows and columns (Swin-T's roll, inlined)
    for r, c in T.grid(784, 8):
        with T.sblock("B"):
            vr, vc = T.axis.remap("SS", [r, c])
            B[vr, vc] = A[(vr // 28 + 4) % 7 * 7 + (vr % 28 + 4) % 7, vc]


@T.prim_func(private=True, s_tir=True)
def _window_shift_guarded(A: T.Buffer((49, 8), "float32"), B: T.Buffer((784, 8), "float32")):
    for r, c in T.grid(784, 8):
        with T.sblock("B"):
            vr, vc = T.axis.remap("SS", [r, c])
            T.reads(A[(vr // 28 + 4) % 7 * 7 + (vr % 28 + 4) % 7, vc])
            T.writes(B[vr, vc])     # the regions stay as written: only the load's indices are wrapped
            B[vr, vc] = A[T.bitwise_or((vr // 28 + 4) % 7 * 7 + (vr % 28 + 4) % 7, 0), vc]


@T.prim_func(private=True, s_tir=True)
def _tiled_copy(A: T.Buffer((64, 96), "float32"), B: T.Buffer((64, 96), "float32")):
    for bx in T.thread_binding(48, thread="blockIdx.x"):
        for tx in T.thread_binding(128, thread="threadIdx.x"):
            with T.sblock("B"):
                vi = T.axis.spatial(64, (bx * 128 + tx) // 96)
                vj = T.axis.spatial(96, (bx * 128 + tx) % 96)
                B[vi, vj] = A[vi // 8 * 8 + vi % 8, vj]


@T.prim_func(private=True, s_tir=True)
def _shifted_into_an_intermediate(A: T.Buffer((49, 8), "float32"), B: T.Buffer((784, 8), "float32")):
    t = T.sblock_alloc_buffer((784, 8))
    for r, c in T.grid(784, 8):
        with T.sblock("t"):
            vr, vc = T.axis.remap("SS", [r, c])
            t[vr, vc] = A[0, vc]
    for r, c in T.grid(784, 8):
        with T.sblock("B"):
            vr, vc = T.axis.remap("SS", [r, c])
            B[vr, vc] = t[(vr // 28 + 4) % 7 * 7 + (vr % 28 + 4) % 7, vc]
# fmt: on


def _shifted_reference(a: np.ndarray) -> np.ndarray:
    rows = np.arange(784)
    return a[(rows // 28 + 4) % 7 * 7 + (rows % 28 + 4) % 7]


def _run(func, a: np.ndarray, pipeline: str) -> np.ndarray:
    lib = tvm.tirx.build(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}),
                         target=tvm.target.Target({"kind": "llvm"}), pipeline=pipeline)
    out = tvm.runtime.tensor(np.zeros((784, 8), "float32"))
    lib(tvm.runtime.tensor(a), out)
    return out.numpy()


def test_shifted_window_index_is_wrapped():
    tvm.ir.assert_structural_equal(guard_flatten_indices(_window_shift), _window_shift_guarded)


def test_tvm_flattens_the_shifted_window_to_other_elements_and_the_guarded_pipeline_does_not():
    a = np.random.default_rng(0).standard_normal((49, 8)).astype("float32")
    expected = _shifted_reference(a)
    unguarded = _run(_window_shift, a, "default")      # TVM 0.27's s_tir pipeline: (r + 112) % 7 for (r % 28 + 4) % 7
    assert (unguarded != expected).any(axis=1).all()
    np.testing.assert_array_equal(_run(_window_shift, a, PIPELINE_NAME), expected)
    run = run_on_cpu(_window_shift, [a, np.zeros((784, 8), "float32")])     # the checks' CPU build
    np.testing.assert_array_equal(run.values[1], expected)


def test_aligned_splits_are_left_to_the_simplifier():
    assert guard_flatten_indices(_tiled_copy).same_as(_tiled_copy)


def test_an_allocated_buffer_is_left_and_reported(caplog):
    with caplog.at_level(logging.DEBUG, logger="tvm_ext.tir.flatten_guard"):
        assert guard_flatten_indices(_shifted_into_an_intermediate).same_as(_shifted_into_an_intermediate)
    assert "['t']" in caplog.text
