"""Stream-K 3.x GEMMs for problems of fewer output tiles than SMs (BERT's FFN down-projection at 128
tokens: 6 tiles of 128x128 on 132 SMs): configuration, candidates, pricing, emitted source and the
host-side contract check of the call."""
from __future__ import annotations

import dataclasses

import pytest

from tvm_ext.cutlass import Epilogue, KernelConfig
from tvm_ext.cutlass.candidates import candidates
from tvm_ext.cutlass.contract import ContractCall, check_calls
from tvm_ext.cutlass.contract_cases import gemm_offload
from tvm_ext.cutlass.instance import instance_key, kernel_for
from tvm_ext.cutlass.pricing import cheapest_config, describe
from tvm_ext.hardware import load_device

H100 = load_device("h100")
STREAM_K = KernelConfig("3x", (128, 128, 64), (2, 1, 1), (64, 128, 16), 0, schedule="cooperative",
                        tile_scheduler="stream_k")
FFN2 = gemm_offload("bert_ffn2_streamk", 128, 768, 3072, Epilogue("bias_residual"))


def test_stream_k_is_a_3x_cooperative_scheduler_with_its_own_name():
    default = dataclasses.replace(STREAM_K, tile_scheduler="")
    assert STREAM_K.name() == default.name() + "_streamk"
    assert KernelConfig.from_dict(STREAM_K.to_dict()) == STREAM_K
    assert instance_key(FFN2.workload, STREAM_K) != instance_key(FFN2.workload, default)
    with pytest.raises(ValueError, match="3.x cooperative"):
        dataclasses.replace(STREAM_K, schedule="pingpong")
    with pytest.raises(ValueError, match="tile_scheduler"):
        dataclasses.replace(STREAM_K, tile_scheduler="persistent")


def test_offered_only_where_the_output_tiles_leave_sms_idle():
    small = [c for c in candidates(FFN2.workload, "sm_90a", H100) if c.tile_scheduler]
    assert small and all(c.schedule == "cooperative" and c.cluster == (1, 1, 1) for c in small)
    big = gemm_offload("big", 4096, 4096, 4096).workload          # 1024 tiles of 128x128
    assert not [c for c in candidates(big, "sm_90a", H100) if c.tile_scheduler]
    assert not [c for c in candidates(FFN2.workload, "sm_80", H100) if c.tile_scheduler]


def test_priced_over_every_sm_and_cheapest_for_the_ffn_down_projection():
    """Modelled: the whole grid of SMs shares the 48 K steps of 6 tiles; each tile is split over
    22 CTAs, whose fp32 partial tiles go through the workspace."""
    desc = describe(FFN2.workload, STREAM_K, H100)
    assert desc.launch.grid == H100.sm_count
    unsplit = describe(FFN2.workload, dataclasses.replace(STREAM_K, tile_scheduler=""), H100)
    assert unsplit.launch.grid == 6
    assert desc.global_bytes - unsplit.global_bytes == 2 * (132 // 6 - 1) * 6 * 128 * 128 * 4
    cfg, _ = cheapest_config(FFN2.workload, "sm_90a", H100)
    assert cfg.tile_scheduler == "stream_k", cfg.name()


def test_the_instance_uses_cutlass_stream_k_scheduler():
    source = kernel_for(FFN2, STREAM_K, "sm_90a").source
    assert "cutlass::gemm::StreamKScheduler" in source


def test_the_stream_k_call_is_accepted_and_right():
    """The launcher's arguments as CUTLASS sees them: can_implement, every operand in bounds, sampled
    outputs (through the kernel's own strides and epilogue) equal to the Relax reference. How the
    stream-K fixup adds the partial tiles up on the GPU is CUTLASS's and is not emulated here."""
    (result,) = check_calls([ContractCall(FFN2, kernel_for(FFN2, STREAM_K, "sm_90a"))])
    assert result.family == "gemm_3x"
    assert result.ok, result.line()
