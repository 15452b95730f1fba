"""The order in which planning builds a group's ranked tiles (``tilegraph.planning._best_buildable``):
by the lowest key a tile could have, stopping at the first that cannot beat the best so far. The
plan must be the one building every ranked tile gives, with fewer tiles built."""
from __future__ import annotations

import pytest
import tvm
from tvm import relax

from tvm_ext.driver import load_module
from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.models._onnx_builder import GraphBuilder
from tvm_ext.models.bert import bert_layer
from tvm_ext.models.swin import swin_block
from tvm_ext.select.context import SelectionContext
from tvm_ext.tilegraph import planning
from tvm_ext.tilegraph.planning import border_padding

H100 = "tvm_ext/h100"


def _context(model) -> SelectionContext:
    legal = relax.transform.LegalizeOps()(load_module(model, fp16=True))
    return SelectionContext(legal, "main", OpGraph.from_module(legal), load_device("h100"), tvm.target.Target(H100))


def _groups(ctx: SelectionContext, size: int, limit: int) -> list[tuple[int, ...]]:
    calls = ctx.call_nodes()
    runs = (tuple(calls[k:k + size]) for k in range(len(calls) - size + 1))
    return [g for g in runs if ctx.graph.is_convex(g)][:limit]


def _plans(ctx: SelectionContext, groups, monkeypatch, *, exhaustive: bool) -> tuple[list, int]:
    """The plans of ``groups`` and the tile schedules built for them, with the search's stop or
    (``exhaustive``) building every ranked tile."""
    built = []

    class Counted(planning.TileWork):
        def __call__(self, tile, padded=(), kstep=0):
            built.append((tile, padded, kstep))
            return super().__call__(tile, padded, kstep)

    with monkeypatch.context() as m:
        m.setattr(planning, "TileWork", Counted)
        if exhaustive:
            m.setattr(planning, "_cannot_beat", lambda best, cand, shape: False)
        plans = [(planning.plan_group(ctx, g), planning.whole_reduction_plan(ctx, g)) for g in groups]
    return plans, len(built)


@pytest.mark.parametrize("model", [swin_block(size=14, window=7, shift=3, channels=32, heads=2),
                                   bert_layer(seq=197, hidden=128, heads=2, intermediate=256)],
                         ids=["swin-49-token-windows", "vit-like-197-tokens"])
def test_the_stop_gives_the_plans_of_building_every_tile(model, monkeypatch):
    groups = [g for size in (2, 3, 4) for g in _groups(_context(model), size, 6)]
    fast, fast_built = _plans(_context(model), groups, monkeypatch, exhaustive=False)
    full, full_built = _plans(_context(model), groups, monkeypatch, exhaustive=True)
    assert fast == full
    assert sum(isinstance(p, planning.TilePlan) for p, _ in fast) >= 3       # tiles were weighed
    assert fast_built < full_built


def inverted_residual(channels: int = 16, expand: int = 4, image: int = 14):
    """MobileNet-V2's block: 1x1 expansion, ReLU, 3x3 depthwise, ReLU, 1x1 projection (NCHW): no
    contraction of it is ``C += A * B`` on fragments in any tile."""
    g = GraphBuilder("inverted_residual", seed=0)
    x = g.input("x", [1, channels, image, image])
    wide = channels * expand
    h = g.op("Conv", [x, g.weight("expand.weight", (wide, channels, 1, 1), fan_in=channels)], "expand")
    h = g.op("Relu", [h], "relu1")
    h = g.op("Conv", [h, g.weight("dw.weight", (wide, 1, 3, 3), fan_in=9)], "dw", kernel_shape=[3, 3],
             pads=[1, 1, 1, 1], group=wide)
    h = g.op("Relu", [h], "relu2")
    h = g.op("Conv", [h, g.weight("project.weight", (channels, wide, 1, 1), fan_in=wide)], "project")
    g.output(h, [1, channels, image, image])
    return g.model("inverted residual block")


def test_contractions_no_tile_puts_on_tensor_cores_do_not_hold_the_search(monkeypatch):
    """A best tile that recomputes nothing and whose SIMT contractions are SIMT in every tile
    (:class:`~tvm_ext.tilegraph.tensor_core.Unfit`: depthwise and NCHW 1x1 convolutions), in a cut
    border tile too, stops the search like one with every contraction on tensor cores
    (MobileNet-V2: 5751 -> 2384 tile schedules asked for, the same plans)."""
    model = inverted_residual()
    groups = [g for size in (1, 2, 3) for g in _groups(_context(model), size, 6)]
    fast, fast_built = _plans(_context(model), groups, monkeypatch, exhaustive=False)
    full, full_built = _plans(_context(model), groups, monkeypatch, exhaustive=True)
    assert fast == full
    assert any(isinstance(p, planning.TilePlan) and p.code_path == "simt_contraction" for p, _ in fast)
    assert 4 * fast_built <= full_built, (fast_built, full_built)     # 48 of 215


def test_border_padding_is_the_cut_tiles_share():
    assert border_padding((4, 49, 96), (1, 16, 96)) == pytest.approx(64 / 49)
    assert border_padding((4, 48, 96), (2, 16, 32)) == 1.0
