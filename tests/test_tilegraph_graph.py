"""TileGraph: edges and connect levels, propagation, traffic, footprint per level, hierarchy, errors."""
from __future__ import annotations

import pytest
from tvm import relax

from tvm_ext.analysis import footprint, propagate, traffic
from tvm_ext.errors import AnalysisError, TvmExtError
from tvm_ext.graph import OpGraph
from tvm_ext.tilegraph import (ConnectLevel, Edge, NonConvexError, TileGraph, TileGraphError, UnknownEdgeError,
                               matmul_like, rstep_regions)
from relax_examples import WelderExample
from test_tilegraph_kernels import skip_edge

MiB = 2**20
ROWS, K, COLS = 98304, 64, 128
F32 = 4




@pytest.fixture(scope="module")
def welder() -> OpGraph:
    return OpGraph.from_module(relax.transform.LegalizeOps()(WelderExample))


@pytest.fixture(scope="module")
def chain() -> OpGraph:
    """x -> exp -> e; e -> sum -> s; (e, s) -> divide -> y: e has two consumers."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((8, 64), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(x), "e")
            s = bb.emit(relax.op.sum(e, axis=[1], keepdims=True), "s")
            y = bb.emit_output(relax.op.divide(e, s), "y")
        bb.emit_func_output(y)
    return OpGraph.from_module(relax.transform.LegalizeOps()(bb.get()))


def _idx(graph: OpGraph, name: str) -> int:
    return graph.node(name).index


def _hand_traffic(rows_tile: int) -> int:
    """A read once, B read once per tile, D written once (C stays on chip)."""
    return F32 * (ROWS * K + (ROWS // rows_tile) * K * COLS + ROWS * COLS)


# ---------------------------------------------------------------- structure and connect levels
def test_edges_and_set_connect(welder):
    tg = TileGraph(welder, [1, 0])
    assert tg.members == (0, 1)
    assert tg.edges == (Edge("C", 0, 1),)
    assert tg.inputs == ["A", "B"] and tg.outputs == ["D"]
    assert tg.connect_level("C") is ConnectLevel.GLOBAL          # Welder's default: level 0
    tg.set_connect("C", "shared")
    assert tg.connect_level(Edge("C", 0, 1)) is ConnectLevel.SHARED
    tg.set_connect((0, 1), 2)
    assert tg.connect_level("C") is ConnectLevel.REGISTER
    tg.set_connect(Edge("C", 0, 1), ConnectLevel.GLOBAL)
    assert tg.connect_level((0, 1)) is ConnectLevel.GLOBAL
    assert TileGraph(welder, [0, 1], level="shared").connect_level("C") is ConnectLevel.SHARED


def test_unknown_edges_and_levels_raise(welder):
    tg = TileGraph(welder, [0, 1])
    for bad in ("A", "nope", (1, 0), Edge("C", 0, 0), 3.5):
        with pytest.raises(UnknownEdgeError):
            tg.set_connect(bad, "shared")
    with pytest.raises(UnknownEdgeError):
        tg.connect_level("D")               # D leaves the tile graph: no edge
    for level in ("l2", 3, True, None):
        with pytest.raises(TileGraphError):
            tg.set_connect("C", level)
    assert issubclass(UnknownEdgeError, TvmExtError) and issubclass(NonConvexError, TvmExtError)
    assert tg.connect_level("C") is ConnectLevel.GLOBAL   # nothing changed


def test_non_convex_node_sets_raise(chain):
    exp, sm, div = (_idx(chain, n) for n in ("e", "s", "y"))
    with pytest.raises(NonConvexError, match="not convex"):
        TileGraph(chain, [exp, div])        # e -> sum -> divide leaves the set and re-enters
    with pytest.raises(AnalysisError):
        TileGraph(chain, [])
    with pytest.raises(AnalysisError):
        TileGraph(chain, [0, 99])
    tg = TileGraph(chain, [exp, sm, div])
    assert {(e.tensor, e.producer, e.consumer) for e in tg.edges} == {("e", exp, sm), ("e", exp, div), ("s", sm, div)}
    # a shared edge e: exp -> divide alone would make the kernel {exp, divide} non-convex: refused and undone
    with pytest.raises(NonConvexError):
        tg.set_connect((exp, div), "shared")
    assert tg.connect_level((exp, div)) is ConnectLevel.GLOBAL
    tg.set_connect("e", "shared")           # both edges of e: kernel {exp, sum, divide} via e
    assert tg.kernels() == [(exp, sm, div)]


def _skip_graph() -> OpGraph:
    return OpGraph.from_module(relax.transform.LegalizeOps()(skip_edge()))


def test_levels_set_together_are_checked_once():
    graph = _skip_graph()
    members = list(range(len(graph.nodes)))
    tg = TileGraph(graph, members)
    skip = next(e for e in tg.edges if e.producer == 0 and e.consumer == len(members) - 1)
    with pytest.raises(NonConvexError):             # alone, the skip edge joins exp and the last multiply
        tg.set_connect(skip, "shared")              # while the path through the other two leaves them
    assert tg.connect_level(skip) is ConnectLevel.GLOBAL          # undone
    tg.set_connects({e: "shared" for e in tg.edges})              # the end state is convex
    assert tg.kernels() == [tuple(members)]
    with pytest.raises(NonConvexError):
        tg.set_connects({e: "global" for e in tg.edges if e != skip})
    assert {tg.connect_level(e) for e in tg.edges} == {ConnectLevel.SHARED}     # all undone


def test_hierarchy_per_level(welder, chain):
    tg = TileGraph(welder, [0, 1])
    assert tg.hierarchy() == {"global": [(0, 1)], "shared": [(0,), (1,)], "register": [(0,), (1,)]}
    tg.set_connect("C", "shared")
    assert tg.hierarchy() == {"global": [(0, 1)], "shared": [(0, 1)], "register": [(0,), (1,)]}
    tg.set_connect("C", "register")
    assert tg.subgraphs("register") == [(0, 1)] and tg.kernels() == [(0, 1)]
    ctg = TileGraph(chain, range(3), level="shared")
    ctg.set_connect("s", "register")        # sum inlined into divide; exp joins through shared e
    assert ctg.hierarchy() == {"global": [(0, 1, 2)], "shared": [(0, 1, 2)], "register": [(0,), (1, 2)]}


# ---------------------------------------------------------------- propagation and traffic
def test_propagate_matches_the_analysis_layer(welder):
    tg = TileGraph(welder, [0, 1])
    with pytest.raises(TileGraphError, match="propagate"):
        tg.mem_traffic()
    config = tg.propagate((16, 128))
    assert tg.config is config
    assert dict(config.regions) == propagate(welder, [0, 1], (16, 128), interior=True)
    assert {n: config.tile(n) for n in "ABCD"} == {"A": (16, 64), "B": (64, 128), "C": (16, 128), "D": (16, 128)}
    assert dict(config.node_tiles) == {0: (16, 128), 1: (16, 128)}
    assert dict(config.output_tiles) == {"D": (16, 128)}
    # a [16x8] output tile still needs whole rows of C (softmax reduces over them)
    assert tg.propagate((16, 8)).tile("C") == (16, 128)
    with pytest.raises(TileGraphError):
        tg.propagate((16, 128), rstep=0)
    with pytest.raises(TileGraphError):
        config.tile("nope")


def test_mem_traffic_per_connect_level(welder):
    tg = TileGraph(welder, [0, 1])
    tg.set_connect("C", "shared")
    tg.propagate((4, 128))
    assert tg.mem_traffic() == 840 * MiB == traffic(welder, [0, 1], (4, 128)).global_bytes   # Welder §2
    tg.propagate((16, 128))
    assert tg.mem_traffic() == 264 * MiB == _hand_traffic(16)                                 # Welder §2
    tg.set_connect("C", "register")
    assert tg.mem_traffic() == 264 * MiB                   # register reuse is just as free in global traffic
    tg.set_connect("C", "global")                          # two kernels: C stored, then loaded again
    c_bytes = ROWS * COLS * F32
    assert tg.mem_traffic() == _hand_traffic(16) + 2 * c_bytes == 360 * MiB
    kernels = tg.kernel_tiles()
    assert [k.members for k in kernels] == [(0,), (1,)]
    assert [dict(k.output_tiles) for k in kernels] == [{"C": (16, 128)}, {"D": (16, 128)}]
    assert kernels[0].traffic.store_bytes == c_bytes and kernels[1].traffic.tensors["C"].global_bytes == c_bytes
    assert [k.num_tiles for k in kernels] == [6144, 6144]


def test_mem_footprint_per_level(welder):
    tg = TileGraph(welder, [0, 1], level="shared")
    tg.propagate((4, 128))
    # A 1 KiB + B 32 KiB + C 2 KiB; D reuses A+B's block (the analysis layer's best fit)
    assert tg.mem_footprint() == {"global": 0, "shared": 35840, "register": 0}
    assert footprint(welder, [0, 1], (4, 128)).peak_bytes == 35840
    tg.set_connect("C", "register")         # C lives in registers: not in shared memory
    assert tg.mem_footprint() == {"global": 0, "shared": 1024 + 32768, "register": 4 * 128 * F32}
    tg.set_connect("C", "global")           # matmul kernel A+B+C, softmax kernel C+D; C in DRAM
    assert tg.mem_footprint() == {"global": ROWS * COLS * F32, "shared": 35840, "register": 0}


def test_rstep_shrinks_footprint_not_traffic(welder):
    info = matmul_like(welder, 0)
    assert info is not None and info.reduce_extent == K and info.inputs == ("A", "B") and not info.tensor_core
    assert matmul_like(welder, 1) is None   # softmax reduces but contracts nothing
    tg = TileGraph(welder, [0, 1], level="shared")
    tg.propagate((32, 128))
    full = tg.mem_footprint()["shared"]
    assert full == (32 * 64 + 64 * 128 + 32 * 128) * F32      # 56 KiB: over the 48 KiB block limit
    tg.propagate((32, 128), rstep=32)
    # A [32x32] 4 KiB + B [32x128] 16 KiB + C 16 KiB; D (16 KiB) reuses A+B's 20 KiB hole
    assert tg.mem_footprint()["shared"] == (32 * 32 + 32 * 128 + 32 * 128) * F32 == 36864
    assert tg.mem_traffic() == _hand_traffic(32) == 168 * MiB
    (kernel,) = tg.kernel_tiles()
    assert kernel.step_regions["B"].extents == (32, 128) and kernel.step_regions["C"].extents == (32, 128)
    regions = propagate(welder, [0, 1], (32, 128), interior=True)
    assert rstep_regions(welder, [0, 1], regions, None) == regions
    assert rstep_regions(welder, [0, 1], regions, 1000)["B"].extents == (64, 128)    # capped at K


def test_tile_graph_views(welder):
    """The notebook view: kernels as clusters, edges with their connect level, tiles, footprint."""
    from tvm_ext.inspect.tile_graph_view import tile_graph_dot, tile_graph_html

    tg = TileGraph(welder, [0, 1])
    assert "propagate(output_tile)" in tile_graph_html(tg, use_graphviz=False)   # no config yet
    tg.set_connect("C", "shared")
    tg.propagate((16, 128))
    dot = tile_graph_dot(tg)
    assert dot.count("subgraph cluster_") == 1                    # one kernel: C connected in shared memory
    assert "tile 16x128" in dot and "style=dashed" in dot and "C\\nshared" in dot
    page = tile_graph_html(tg, use_graphviz=False)
    assert f"global traffic {264 * MiB:,} B" in page                  # Welder §2's 16x128 tile
    assert "footprint per level: global 0 B" in page                  # C is not materialized
    assert "<td>6,144</td>" in page and tg._repr_html_().startswith("<div><b>tile graph</b>")
    tg.set_connect("C", "global")
    dot = tile_graph_dot(tg)
    assert dot.count("subgraph cluster_") == 2 and "style=solid" in dot and "C\\nglobal" in dot
