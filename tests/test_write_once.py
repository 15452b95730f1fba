"""Output elements stored by two threads: the write-once lint, and dlight's rules judged by it."""
from __future__ import annotations

import tvm
from test_checks_kernels import _staged
from tvm import relax
from tvm.s_tir import dlight as dl
from tvm.script import tirx as T

from tvm_ext.checks.kernel import emulate_function
from tvm_ext.checks.thread_serial import call_inputs
from tvm_ext.checks.write_once import duplicate_writes
from tvm_ext.select.attrs import RULE_ATTR


# fmt: off
@T.prim_func(private=True, s_tir=True)
def _heads_padded_onto_each_other(A: T.Buffer((6, 64), "float32"), B: T.Buffer((2, 96), "float32")):
    # 2 rows x 3 heads of 32 columns, each head computed on 64 (padded) columns
    for h in T.thread_binding(6, thread="blockIdx.x"):
        for c in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("B"):
                v0, v2 = T.axis.remap("SS", [h, c])
                T.where(h % 3 * 32 + c < 96)      # the output's bound: a head's padding lands on the next head
                B[v0 // 3, v2 + v0 % 3 * 32] = A[v0, v2]


@T.prim_func(private=True, s_tir=True)
def _heads_padded_apart(A: T.Buffer((6, 64), "float32"), B: T.Buffer((2, 96), "float32")):
    for h in T.thread_binding(6, thread="blockIdx.x"):
        for c in T.thread_binding(64, thread="threadIdx.x"):
            with T.sblock("B"):
                v0, v2 = T.axis.remap("SS", [h, c])
                T.where(c < 32)                     # the head's own bound
                B[v0 // 3, v2 + v0 % 3 * 32] = A[v0, v2]


@T.prim_func(private=True, s_tir=True)
def _every_block_recomputes(A: T.Buffer((24,), "float32"), B: T.Buffer((24,), "float32")):
    # a merged kernel's last stage: one block's work, run by every block of the grid
    for bx in T.thread_binding(8, thread="blockIdx.x"):
        for tx in T.thread_binding(32, thread="threadIdx.x"):
            with T.sblock("B"):
                v = T.axis.spatial(24, tx)
                T.where(tx < 24)
                B[v] = A[v] * T.float32(2)
# fmt: on


def test_a_padded_head_stored_onto_the_next_is_found():
    assert duplicate_writes(_heads_padded_onto_each_other) == ["B"]
    assert duplicate_writes(_heads_padded_apart) == []


def test_a_value_recomputed_by_every_block_is_not_a_finding():
    assert duplicate_writes(_every_block_recomputes) == []


def _swin_attention_value() -> tvm.IRModule:
    """Swin-T's attention probabilities times V, V sliced from the fused QKV projection; 49 tokens
    per window, 3 heads of 32."""
    t = relax.TensorType
    qkv, probs = relax.Var("qkv", t((64, 49, 288), "float16")), relax.Var("probs", t((64, 3, 49, 49), "float16"))
    bb = relax.BlockBuilder()
    with bb.function("main", [qkv, probs]):
        with bb.dataflow():
            v = bb.emit(relax.op.strided_slice(qkv, axes=[2], begin=[192], end=[288]))
            v = bb.emit(relax.op.permute_dims(bb.emit(relax.op.reshape(v, (64, 49, 3, 32))), [0, 2, 1, 3]))
            o = bb.emit(relax.op.permute_dims(bb.emit(relax.op.matmul(probs, v)), [0, 2, 1, 3]))
            out = bb.emit_output(relax.op.reshape(o, (64, 49, 96)))
        bb.emit_func_output(out)
    return bb.get()


def test_dlight_matmul_storing_padding_onto_the_next_head_is_not_used():
    """Swin-T under `full` (bench/verify_full_seed.md): dlight's Matmul rule padded the head dimension
    to 64 and kept the reshape's bound as the store predicate; the emulator (blocks in reversed order)
    saw zeros in two heads of three. Built under `stitch`, which leaves the product to dlight as
    `full` did then (`full` pads its 49 keys to 52 for CUTLASS since c18a223)."""
    target, fused, scheduled, (name,) = _staged(_swin_attention_value(), "stitch")
    with target:
        matmul = dl.gpu.Matmul().apply(fused[name], target, False)
    assert duplicate_writes(matmul.mod["main"]) == ["T_reshape_intermediate_1"]
    assert str(scheduled[name].attrs[RULE_ATTR]) != "Matmul"
    verdict = emulate_function(fused[name], scheduled[name], target, name=name, inputs=call_inputs(fused, name))
    assert verdict.ok, verdict.findings

