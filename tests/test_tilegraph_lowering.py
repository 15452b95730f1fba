"""A tile kernel lowers with the shared memory its plan weighed: TVM compacts shared buffers before it
simplifies indices, and a producer's tile read back through a layout change (a layer norm's rows
through the reshape to an image) then kept the whole tensor in shared memory (Segformer-B0, Swin-T)."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ext.driver import load_module
from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.models._onnx_builder import GraphBuilder
from tvm_ext.select.context import SelectionContext
from tvm_ext.tilegraph.planning import plan_group
from tvm_ext.tilegraph.plans import TilePlan
from tvm_ext.tilegraph.schedule import build_tile_schedule
from tvm_ext.tir.launch_params import PIPELINE_NAME, register_tir_pipeline
from tvm_ext.checks.lowering import static_shared_bytes

H100 = "tvm_ext/h100"


def _norm_to_image(rows: int, cols: int, channels: int, image: list[int]):
    g = GraphBuilder("norm_to_image", dtype="float32")
    x = g.input("x", [1, rows * cols, channels])
    gamma, beta = g.noise("gamma", [channels], 0.1, 1.0), g.noise("beta", [channels], 0.1)
    y = g.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=1e-5)
    g.output(g.op("Reshape", [y, g.const("shape", np.array(image, dtype=np.int64))]), image)
    return g.model()


@pytest.mark.parametrize("image", [[1, 64, 64, 32], [64, 64, 32]])
def test_a_norm_read_back_through_a_reshape_lowers_with_its_planned_shared_memory(image):
    legal = relax.transform.LegalizeOps()(load_module(_norm_to_image(64, 64, 32, image), fp16=True))
    target = tvm.target.Target(H100)
    ctx = SelectionContext(legal, "main", OpGraph.from_module(legal), load_device("h100"), target)
    members = tuple(ctx.call_nodes())
    plan = plan_group(ctx, members)
    assert isinstance(plan, TilePlan) and plan.shared_bytes < 4096        # a 16-row tile of the norm
    kernel = build_tile_schedule(ctx.fused_function(members), plan)
    with target:
        built = tvm.tirx.build(tvm.IRModule({"k": kernel.with_attr("global_symbol", "k")}), target=target,
                               pipeline=register_tir_pipeline(PIPELINE_NAME))
    used = static_shared_bytes(built.imports[0].inspect_source())
    assert used == [plan.shared_bytes]      # was the whole 64x64x32 tensor: 262272 B
