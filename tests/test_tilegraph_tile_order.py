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


def test_border_padding_is_the_cut_tiles_share():
    assert border_padding((4, 49, 96), (1, 16, 96)) == pytest.approx(64 / 49)
    assert border_padding((4, 48, 96), (2, 16, 32)) == 1.0
