"""Roller-style tile enumeration over a TileGraph (Welder §3.2, §4.1): growth, pruning, alignment, ranking."""
from __future__ import annotations

import dataclasses

import pytest
import tvm
from tvm import relax

from tvm_ext.graph import OpGraph
from tvm_ext.hardware import device_from_target, load_device
from tvm_ext.tilegraph import (MMA_FRAGMENT, TileGraph, TileGraphError, coalesced_run, enumerate_tiles,
                               uncoalesced_extra)
from relax_examples import WelderExample

MiB = 2**20
ROWS, K, COLS = 98304, 64, 128
F32 = 4




def _graph(build) -> OpGraph:
    bb = relax.BlockBuilder()
    params, body = build
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(body(bb, *params))
        bb.emit_func_output(out)
    return OpGraph.from_module(relax.transform.LegalizeOps()(bb.get()))


def _matmul(m: int, k: int, n: int, dtype: str, softmax: bool = False) -> OpGraph:
    a = relax.Var("A", relax.TensorType((m, k), dtype))
    b = relax.Var("B", relax.TensorType((k, n), dtype))

    def body(bb, a, b):
        c = bb.emit(relax.op.matmul(a, b), "C")
        return relax.op.nn.softmax(c) if softmax else c
    return _graph(([a, b], body))


@pytest.fixture(scope="module")
def welder() -> OpGraph:
    return OpGraph.from_module(relax.transform.LegalizeOps()(WelderExample))


@pytest.fixture(scope="module")
def h100():
    return device_from_target(tvm.target.Target("tvm_ext/h100"))


def _fused_hand_count(m: int, n: int) -> int:
    """C on chip: each [m x n] tile loads A[m x 64] and B[64 x 128] (softmax needs whole rows of C)
    and stores D[m x n]. Tiles: (98304/m) x (128/n)."""
    tiles = (ROWS // m) * (COLS // n)
    return F32 * tiles * (m * K + K * COLS + m * n)


def _unfused_hand_count(m: int, n: int) -> int:
    """C through DRAM: the matmul kernel (tile [m x 128]) reads A once, B per tile, stores C once;
    the softmax kernel (tile [m x n]) loads whole rows of C per tile and stores D once."""
    matmul = ROWS * K + (ROWS // m) * K * COLS + ROWS * COLS
    softmax = (COLS // n) * ROWS * COLS + ROWS * COLS
    return F32 * (matmul + softmax)


# ---------------------------------------------------------------- Welder §2
def test_welder_shared_edge_best_tile(welder, h100):
    tg = TileGraph(welder, [0, 1])
    tg.set_connect("C", "shared")
    cands = enumerate_tiles(tg, h100)
    best = cands[0]
    m, n = best.output_tile
    assert n == COLS and m <= 64                  # the [16x128] class: whole rows (softmax reduces over them)
    # hand count: A read once, B read once per tile, D written once
    hand = F32 * (ROWS * K + (ROWS // m) * K * COLS + ROWS * COLS)
    assert best.global_bytes == hand
    # On H100 with the 48 KiB per-block limit: [32x128] with rstep 32 (A 4 KiB + B 16 KiB + C 16 KiB,
    # D reusing A+B) = 36 KiB -> 6 blocks/SM; 3072 tiles / (132 x 6) -> 4 waves. [16x128] costs
    # 264 MiB in 10 waves; [64x128] needs >= 64 KiB for C and D and is pruned.
    assert (best.output_tile, best.rstep) == ((32, 128), 32)
    assert best.global_bytes == 168 * MiB and best.shared_bytes == 36864
    assert best.blocks_per_sm == (6,) and best.waves == 4 and best.num_tiles == (3072,)
    paper = next(c for c in cands if c.output_tile == (16, 128))
    assert paper.global_bytes == 264 * MiB and paper.score > best.score
    assert all(c.output_tile[0] < 64 or c.output_tile[1] < COLS for c in cands)
    for c in cands:                               # every candidate obeys the same hand count
        assert c.global_bytes == _fused_hand_count(*c.output_tile), c
    assert tg.config.output_tiles == {"D": (32, 128)} and tg.config.rstep == 32   # left at the best


def test_welder_global_edge_adds_the_intermediate(welder, h100):
    tg = TileGraph(welder, [0, 1])                # the default connect level is global
    cands = enumerate_tiles(tg, h100)
    assert cands
    c_bytes = ROWS * COLS * F32
    for c in cands:
        assert c.global_bytes == _unfused_hand_count(*c.output_tile), c
        assert len(c.num_tiles) == 2              # two kernels
    best = cands[0]
    m, n = best.output_tile
    # the fused count for the matmul's [m x 128] tile, plus C stored once and loaded 128/n times
    assert best.global_bytes == _fused_hand_count(m, COLS) + c_bytes + (COLS // n) * c_bytes
    tg.set_connect("C", "shared")
    fused = enumerate_tiles(tg, h100)[0]
    assert best.global_bytes - fused.global_bytes >= 2 * c_bytes   # C's write and read are extra


# ---------------------------------------------------------------- pruning, alignment, penalties
def test_footprint_pruning(welder, h100):
    tg = TileGraph(welder, [0, 1], level="shared")
    limit = h100.max_shared_memory_per_block
    assert limit == 48 * 1024
    default = enumerate_tiles(tg, h100, top_k=100)
    for c in default:
        assert c.shared_bytes <= limit
        tg.propagate(c.output_tile, c.rstep)
        assert tg.mem_footprint()["shared"] == c.shared_bytes
    # with the opt-in maximum the pruned tiles come back: the limit is what excluded them
    optin = enumerate_tiles(tg, h100, top_k=100, shared_capacity=h100.max_shared_memory_per_block_optin)
    assert any(c.shared_bytes > limit for c in optin)
    assert {c.output_tile for c in optin} > {c.output_tile for c in default}
    # a device with 16 KiB per block: [16x128] needs at least 17 KiB (rstep 16: A 1 KiB + B 8 KiB
    # + C 8 KiB, D reusing A+B's hole) and is gone
    small = dataclasses.replace(h100, max_shared_memory_per_block=16 * 1024)
    tg.propagate((16, 128), 16)
    assert tg.mem_footprint()["shared"] == 17 * 1024
    tight = enumerate_tiles(tg, small, top_k=100)
    assert tight and all(c.shared_bytes <= 16 * 1024 for c in tight)
    assert (16, 128) in {c.output_tile for c in default} and (16, 128) not in {c.output_tile for c in tight}
    assert enumerate_tiles(tg, h100, shared_capacity=1024) == []   # not even the minimal tile fits
    with pytest.raises(TileGraphError):
        enumerate_tiles(tg, h100, shared_capacity=h100.max_shared_memory_per_block_optin + 1)


@pytest.mark.parametrize("m, k, n, softmax", [(512, 256, 40, False), (4096, 64, 100, True), (1000, 200, 72, False)])
def test_fp16_matmul_tiles_are_mma_aligned(h100, m, k, n, softmax):
    graph = _matmul(m, k, n, "float16", softmax)
    tg = TileGraph(graph, range(len(graph.nodes)), level="shared")
    cands = enumerate_tiles(tg, h100, top_k=100)
    assert cands
    for c in cands:
        config = tg.propagate(c.output_tile, c.rstep)
        for extent, dim in zip(config.tile("C"), (m, n)):
            assert extent % MMA_FRAGMENT == 0 or extent == dim, c
        assert c.rstep is None or c.rstep % MMA_FRAGMENT == 0, c
        assert c.shared_bytes % 32 == 0           # Welder §4.2: 32-byte aligned TensorCore buffers
    # the same shapes in fp32 (no TensorCore) are only transaction-aligned: some extent is not a multiple of 16
    f32 = TileGraph(_matmul(m, k, n, "float32", softmax), range(len(graph.nodes)), level="shared")
    assert any(e % MMA_FRAGMENT and e not in (m, n) for c in enumerate_tiles(f32, h100, top_k=100)
               for e in c.output_tile)


def test_uncoalesced_penalty_on_a_transpose(h100):
    x = relax.Var("x", relax.TensorType((4096, 4096), "float32"))
    graph = _graph(([x], lambda bb, x: relax.op.permute_dims(x, [1, 0])))
    tg = TileGraph(graph, [0])
    tg.propagate((1, 8))                          # output rows of 8 floats read x as 8 columns of 1 float
    (kernel,) = tg.kernel_tiles()
    shapes = {n: t.shape for n, t in graph.tensors.items()}
    dtypes = {n: t.dtype for n, t in graph.tensors.items()}
    x_bytes = 4096 * 4096 * F32
    assert kernel.traffic.tensors["x"].region.extents == (8, 1)
    assert uncoalesced_extra(kernel, shapes, dtypes, 32) == 7 * x_bytes     # 4 B used of each 32 B sector
    assert uncoalesced_extra(kernel, shapes, dtypes, 4) == 0
    cands = enumerate_tiles(tg, h100)
    best = cands[0]
    assert best.uncoalesced_bytes == 0 and min(best.output_tile) >= 8
    assert best.global_bytes == 2 * x_bytes
    assert coalesced_run((4, 8), (100, 128)) == 8 and coalesced_run((4, 128), (100, 128)) == 512
    assert coalesced_run((1, 1, 128), (2, 3, 128)) == 128 and coalesced_run((2, 3, 128), (2, 3, 128)) == 768


def test_ranking_and_low_parallelism_penalty(h100):
    graph = _matmul(256, 256, 256, "float32")
    tg = TileGraph(graph, [0])
    cands = enumerate_tiles(tg, h100, top_k=100)
    assert len(cands) > 5
    scores = [c.score for c in cands]
    assert scores == sorted(scores)
    sm = h100.sm_count
    low = [c for c in cands if c.num_tiles[0] < sm]
    assert low, "a 256x256 output has tiles with fewer blocks than SMs"
    for c in cands:
        base = c.global_bytes + c.uncoalesced_bytes
        factor = sm / c.num_tiles[0] if c.num_tiles[0] < sm else 1.0
        assert c.cost == pytest.approx(base * factor)
        assert c.waves == -(-c.num_tiles[0] // (sm * c.blocks_per_sm[0]))
        assert c.score == pytest.approx((c.cost + 1) * c.waves)
    assert all(c.cost > c.global_bytes for c in low)
    assert len(enumerate_tiles(tg, h100, top_k=3)) == 3
    by_name = enumerate_tiles(tg, "tvm_ext/h100", top_k=3)
    assert [c.output_tile for c in by_name] == [c.output_tile for c in cands[:3]]


def test_enumeration_errors():
    x = relax.Var("x", relax.TensorType((8, 64), "float32"))

    def body(bb, x):
        e = bb.emit(relax.op.exp(x), "e")
        s = bb.emit(relax.op.sum(e, axis=[1], keepdims=True), "s")
        return relax.op.divide(e, s)
    graph = _graph(([x], body))
    h100 = load_device("h100")
    with pytest.raises(TileGraphError, match="one shape"):
        enumerate_tiles(TileGraph(graph, [0, 1]), h100)      # outputs e [8x64] and s [8x1]
    tg = TileGraph(graph, [0, 1, 2], level="shared")
    assert enumerate_tiles(tg, h100)
    for bad in ({"top_k": 0}, {"branch": 0}, {"transaction_bytes": 0}, {"max_visits": 0}):
        with pytest.raises(TileGraphError):
            enumerate_tiles(tg, h100, **bad)
