"""Kernel counts of the seed suite under ``stitch`` against ``baseline`` (codegen-free, no GPU).

Both presets run their graph and schedule stages for an H100 target; kernels are counted per
``call_tir`` launch and classified memory-intensive or compute (:mod:`tvm_ext.stitch.kernels`).
The baseline is scheduled with the same dlight rules, applied with
:class:`~tvm_ext.stitch.SafeDefaultSchedule`, because TVM's own pass aborts on EfficientNet-B0.

Measured (memory-intensive kernels, stitch / baseline): BERT-base 25/91, ViT-B/16 25/88,
Swin-T 27/121, ConvNeXt-T 23/66, EfficientNet-B0 31/78. In the transformers TVM's FuseOps
already fuses every elementwise epilogue into the GEMMs, so what remains between consecutive
GEMMs is one softmax and two layer norms per layer. Stitching makes each layer norm one kernel
and computes each softmax inside the attention GEMM that reads it (a row-reduction prologue,
:mod:`tvm_ext.stitch.prologue`): two memory-intensive kernels per layer against seven.
"""
from __future__ import annotations

import pytest
import tvm

from tvm_ext.frontend import from_onnx
from tvm_ext.models.skeleton import SKELETON_DIR, load_model
from tvm_ext.pipeline import get_preset
from tvm_ext.stitch import REPORT_ATTR, SafeDefaultSchedule, count_kernels, stitch_graph_passes, stitch_schedule_passes

TARGET = "tvm_ext/h100"
#: model -> (upper bound on the memory-intensive kernel ratio, transformer layers or None)
MODELS = {
    "bert_base_s128_b1_fp32": (0.40, 12),
    "vit_b16_b1_fp32": (0.40, 12),
    "swin_t_b1_fp32": (0.40, None),
    "convnext_t_b1_fp32": (0.40, None),
    "efficientnet_b0_b1_fp32": (0.40, None),
}


def _path(name: str):
    return SKELETON_DIR / f"{name}.onnx"


@pytest.fixture(scope="module", params=sorted(MODELS))
def counted(request):
    name = request.param
    if not _path(name).exists():
        pytest.skip(f"skeleton {name} not in {SKELETON_DIR}")
    mod = from_onnx(load_model(_path(name)))
    target = tvm.target.Target(TARGET)
    with target:
        base = tvm.transform.Sequential(get_preset("baseline").graph(target) + [SafeDefaultSchedule()])(mod)
        stitched = tvm.transform.Sequential(stitch_graph_passes(target) + stitch_schedule_passes(target))(mod)
    return name, count_kernels(base), count_kernels(stitched), dict(stitched.attrs[REPORT_ATTR])


def test_fewer_memory_intensive_kernels(counted):
    name, base, stitched, _ = counted
    bound, _ = MODELS[name]
    ratio = stitched.memory_intensive / base.memory_intensive
    assert ratio <= bound, f"{name}: {stitched.memory_intensive}/{base.memory_intensive} = {ratio:.2f}"
    assert stitched.compute <= base.compute + 6       # compute kernels stay (epilogues kept with GEMMs)


def test_every_stitched_group_is_one_kernel(counted):
    name, _, stitched, report = counted
    assert report and not [k for k, v in report.items() if not v.startswith("stitched")], report
    for fname in report:
        if fname in stitched.per_function:
            _, mi, comp = stitched.per_function[fname]
            assert mi + comp == 1, f"{name}: {fname} has {mi + comp} kernels"


def test_transformer_layer(counted):
    """Layer norms are one kernel each; every softmax is computed inside the GEMM reading it."""
    name, _, stitched, report = counted
    _, layers = MODELS[name]
    if layers is None:
        pytest.skip("not a plain transformer stack")
    per = stitched.per_function
    norms = sum(n for f, (n, mi, _) in per.items() if f.startswith("layer_norm") and mi == 1)
    in_gemm = sum(n for f, (n, mi, comp) in per.items() if "softmax" in f and "matmul" in f and (mi, comp) == (0, 1))
    assert in_gemm == layers and report[next(f for f in per if "softmax" in f)] == "stitched+gemm_prologue"
    assert not [f for f, (_, mi, _) in per.items() if "softmax" in f and mi]
    assert norms >= 2 * layers - 1
    assert stitched.memory_intensive <= 2 * layers + 2
