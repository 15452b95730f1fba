"""The kernel check on shape variants the seed suite lacks (tvm_ext.models.VARIANTS).

Every kernel the stitch generator plans must be built from its plan (no fallback), compile with
nvcc for sm_80 and sm_90, and, run thread-serialized on the CPU, compute what its unscheduled
function computes. The variants cover narrow and wide MLPs, head dims 48/96/128, sequence lengths
that are not powers of two, fp16 and odd convolution sizes, so no rule is only tried on the
seed shapes.
"""
from __future__ import annotations

import pytest
import tvm

from tvm_ext.frontend import from_onnx
from tvm_ext.models import VARIANTS
from tvm_ext.testing.kernel_check import check_planned_kernels, every_candidate
from tvm_ext.toolchain import nvcc_available

pytestmark = pytest.mark.skipif(not nvcc_available(), reason="nvcc / CUDA toolkit not found")


@pytest.mark.parametrize("target_name", ["tvm_ext/a100", "tvm_ext/h100"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_planned_kernels_compile_and_match(name, target_name):
    result = check_planned_kernels(from_onnx(VARIANTS[name]()), tvm.target.Target(target_name),
                                   cpu=target_name.endswith("h100"))       # the CPU check does not depend on the arch
    assert result.kernels >= 1 and result.ok, result.to_json()
    assert result.arch == tvm.target.Target(target_name).attrs["arch"]


def test_pre_norm_narrow_mlp_runs_inside_its_gemm():
    """The pre-LN layer norm feeding a 192-wide MLP (bias + GELU epilogue) and the softmax both run
    inside the GEMM that reads them: two GEMM-with-prologue kernels, the attention norm alone."""
    result = check_planned_kernels(from_onnx(VARIANTS["vit_narrow_mlp_s77"]()), tvm.target.Target("tvm_ext/h100"),
                                   cpu=False)
    assert result.ok and result.kernels == 3
    assert sorted(result.rules.values()) == ["stitched", "stitched+gemm_prologue", "stitched+gemm_prologue"]
    assert [n for n, r in result.rules.items() if r == "stitched"] == ["layer_norm"]


@pytest.mark.parametrize("name", ["bert_head48_s50", "conv_block_odd"])
def test_merged_subprogram_kernels_compile_and_match(name):
    """Every merged kernel the subprogram generator proposes (taken whatever the cost model prefers)
    is built from its plan, compiles with nvcc, marks its grid barriers for cooperative launch and,
    thread-serialized stage by stage, computes what its unscheduled function computes. (This ran on
    bert_head96_s96 until its attention-value stage, dlight's Matmul with the head padded from 96 to
    128, was found to store padding onto the next head: tests/test_write_once.py. dlight now
    schedules that stage with GeneralReduction, which subprogram does not merge.)"""
    result = check_planned_kernels(from_onnx(VARIANTS[name]()), tvm.target.Target("tvm_ext/h100"),
                                   preset=every_candidate("subprogram"), generator="subprogram")
    assert result.kernels >= 1 and result.ok, result.to_json()
    assert set(result.rules.values()) <= {"merged", "merged+grid_sync"}
