"""Register write-backs predicated like their producers (tvm_ext.tir.write_back)."""
from __future__ import annotations

import tvm
from test_checks_kernels import _staged
from tvm.script import tirx as T

from tvm_ext.checks.kernel import emulate_function
from tvm_ext.checks.thread_serial import call_inputs
from tvm_ext.checks.write_once import duplicate_writes
from tvm_ext.frontend import from_onnx
from tvm_ext.models import VARIANTS
from tvm_ext.tir.write_back import predicate_write_backs


# fmt: off
@T.prim_func(private=True, s_tir=True)
def _padded_tile(A: T.Buffer((192,), "float32"), B: T.Buffer((192,), "float32")):
    # two tiles of 96 outputs on 128 threads; the write-back as reverse_compute_at leaves it
    acc = T.sblock_alloc_buffer((192,), scope="local")
    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for tx in T.thread_binding(128, thread="threadIdx.x"):
            with T.sblock("acc"):
                v = T.axis.spatial(192, bx * 96 + tx)
                T.where(tx < 96)
                acc[v] = A[v] * T.float32(2)
            with T.sblock("acc_local"):
                v = T.axis.spatial(192, bx * 96 + tx)
                T.where(bx * 96 + tx < 192)
                B[v] = acc[v]


@T.prim_func(private=True, s_tir=True)
def _padded_tile_predicated(A: T.Buffer((192,), "float32"), B: T.Buffer((192,), "float32")):
    acc = T.sblock_alloc_buffer((192,), scope="local")
    for bx in T.thread_binding(2, thread="blockIdx.x"):
        for tx in T.thread_binding(128, thread="threadIdx.x"):
            with T.sblock("acc"):
                v = T.axis.spatial(192, bx * 96 + tx)
                T.where(tx < 96)
                acc[v] = A[v] * T.float32(2)
            with T.sblock("acc_local"):
                v = T.axis.spatial(192, bx * 96 + tx)
                T.where(bx * 96 + tx < 192 and tx < 96)
                B[v] = acc[v]
# fmt: on


def test_a_write_back_gets_its_producers_tile_predicate():
    assert duplicate_writes(_padded_tile) == ["B"]      # lanes 96..127 of tile 0 store onto tile 1
    fixed = predicate_write_backs(_padded_tile)
    tvm.ir.assert_structural_equal(fixed, _padded_tile_predicated)
    assert duplicate_writes(fixed) == []
    assert predicate_write_backs(_padded_tile_predicated).same_as(_padded_tile_predicated)


def test_stitched_softmax_gemm_at_head_dimension_48_writes_each_output_once():
    """Found by the write-once lint on the kernel-variant suite: 4 rows x 48 columns on 4 x 32
    threads, two iterations; the extra 64 lanes wrote stale registers onto the next tile's rows.
    The thread-serialized check had passed it (the next tile's store landed last)."""
    target, fused, scheduled, names = _staged(from_onnx(VARIANTS["bert_head48_s50"]()), "stitch")
    (name,) = [n for n in names if "softmax_matmul" in n]
    kernel = scheduled[name]
    assert str(kernel.attrs["tvm_ext.schedule_rule"]) == "stitched+gemm_prologue"
    assert duplicate_writes(kernel) == []
    verdict = emulate_function(fused[name], kernel, target, name=name, inputs=call_inputs(fused, name))
    assert verdict.ok, verdict.findings
