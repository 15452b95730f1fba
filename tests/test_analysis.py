"""Analysis layer: access maps, dependency kinds, tile propagation, traffic, footprint."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import tvm
from tvm import relax

from tvm_ext.analysis import (
    BestFitAllocator, Buffer, DependencyKind, Region, edge_kinds, footprint, func_access_maps,
    group_traffic_default, iter_tiles, min_traffic, node_access_maps, num_tiles, plan_best_fit,
    propagate, tile_grid, tile_region, traffic,
)
from tvm_ext.errors import AnalysisError
from relax_examples import WelderExample
from tvm_ext.graph import OpGraph

MiB = 2**20




def _legalize(mod: tvm.IRModule) -> tvm.IRModule:
    return relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))


def _t(shape, dtype="float32"):
    return relax.TensorType(shape, dtype)


def _ops_module() -> tvm.IRModule:
    """One small module holding every operator kind the analysis must cover."""
    bb = relax.BlockBuilder()
    x, w = relax.Var("x", _t((2, 3, 8, 8))), relax.Var("w", _t((4, 3, 3, 3)))
    a, bmat = relax.Var("a", _t((4, 8))), relax.Var("bmat", _t((8, 16)))
    ba, bb3 = relax.Var("ba", _t((2, 4, 8))), relax.Var("bb3", _t((2, 8, 6)))
    m, bias = relax.Var("m", _t((4, 6))), relax.Var("bias", _t((6,)))
    tab, ids = relax.Var("tab", _t((10, 6))), relax.Var("ids", _t((5,), "int64"))
    with bb.function("main", [x, w, a, bmat, ba, bb3, m, bias, tab, ids]):
        with bb.dataflow():
            outs = [
                bb.emit(relax.op.matmul(a, bmat), "mm"),
                bb.emit(relax.op.matmul(ba, bb3), "bmm"),
                bb.emit(relax.op.nn.conv2d(x, w, strides=2, padding=1), "conv"),
            ]
            outs += [
                bb.emit(relax.op.nn.max_pool2d(outs[2], pool_size=2, strides=2), "maxpool"),
                bb.emit(relax.op.nn.avg_pool2d(outs[2], pool_size=3, strides=1, padding=1), "avgpool"),
                bb.emit(relax.op.permute_dims(m, [1, 0]), "tr"),
                bb.emit(relax.op.add(m, bias), "biasadd"),
                bb.emit(relax.op.sum(m, axis=[1]), "rsum"),
                bb.emit(relax.op.take(tab, ids, axis=0), "gather"),
                bb.emit(relax.op.reshape(m, (2, 12)), "rs"),
                bb.emit(relax.op.nn.softmax(m), "sm"),
                bb.emit(relax.op.strided_slice(m, axes=[1], begin=[1], end=[6], strides=[2]), "ss"),
                bb.emit(relax.op.expand_dims(m, 0), "ed"),
            ]
            sp = bb.emit(relax.op.split(m, 2, axis=1), "sp")
            outs.append(bb.emit(relax.op.add(relax.TupleGetItem(sp, 0), relax.TupleGetItem(sp, 1)), "halves"))
            out = bb.emit_output(relax.Tuple(outs))
        bb.emit_func_output(out)
    return _legalize(bb.get())


@pytest.fixture(scope="module")
def ops() -> OpGraph:
    return OpGraph.from_module(_ops_module())


@pytest.fixture(scope="module")
def welder() -> OpGraph:
    return OpGraph.from_module(_legalize(WelderExample))


def _idx(graph: OpGraph, name: str) -> int:
    return graph.node(name).index


def _regions(graph, name, tile, index=None, interior=False):
    got = propagate(graph, _idx(graph, name), tile, tile_index=index, interior=interior)
    return {k: v.ranges for k, v in got.items()}


# ---------------------------------------------------------------- Welder §2 numbers
def test_welder_traffic_840_and_264_mib(welder):
    mm, sm = (n.index for n in welder.nodes)
    small = traffic(welder, [mm, sm], (4, 128))
    assert small.num_tiles == 24576
    assert small.global_bytes == 840 * MiB == 24576 * (4 * 64 + 64 * 128 + 4 * 128) * 4
    big = traffic(welder, [mm, sm], (16, 128))
    assert big.num_tiles == 6144
    assert big.global_bytes == 264 * MiB


def test_welder_breakdown_and_footprint(welder):
    report = traffic(welder, [0, 1], (4, 128))
    roles = {n: (t.role, t.region.extents, t.tile_bytes) for n, t in report.tensors.items()}
    c, d = welder.nodes[0].outputs[0], welder.nodes[1].outputs[0]
    assert roles == {"A": ("input", (4, 64), 1024), "B": ("input", (64, 128), 32768),
                     c: ("intermediate", (4, 128), 2048), d: ("output", (4, 128), 2048)}
    assert report.tensors[c].global_bytes == 0
    assert report.store_bytes == 24576 * 2048 == welder.tensors[d].nbytes
    # best fit: A, B, C live during matmul; D reuses A+B's freed block during softmax
    assert report.shared_bytes == 1024 + 32768 + 2048
    assert report.footprint.offset(d) == 0
    assert traffic(welder, [0, 1], (16, 128)).shared_bytes == (16 * 64 + 64 * 128 + 16 * 128) * 4
    assert report.levels == {"global": 840 * MiB, "shared": 35840}
    assert report.lower_bound_bytes == group_traffic_default(welder, [0, 1]) == (98304 * 64 + 64 * 128 + 98304 * 128) * 4
    assert min_traffic(welder, [0, 1]) - group_traffic_default(welder, [0, 1]) == 2 * 98304 * 128 * 4
    assert min_traffic(welder, 0) == group_traffic_default(welder, 0) == welder.nodes[0].bytes_read + welder.nodes[0].bytes_written


def test_welder_shared_memory_fit(welder):
    device = SimpleNamespace(max_shared_memory_per_block=40 * 1024)
    assert traffic(welder, [0, 1], (4, 128), device).fits_shared is True
    assert traffic(welder, [0, 1], (16, 128), device).fits_shared is False
    assert traffic(welder, [0, 1], (4, 128)).fits_shared is None
    with pytest.raises(AnalysisError):
        traffic(welder, [0, 1], (4, 128), device=object())


def test_unfused_matmul_traffic_reads_b_per_tile(welder):
    report = traffic(welder, 0, (4, 128))
    assert report.global_bytes == 24576 * (4 * 64 + 64 * 128 + 4 * 128) * 4  # C now leaves the kernel
    assert report.tensors[welder.nodes[0].outputs[0]].role == "output"


# ---------------------------------------------------------------- propagation per operator
def test_matmul_and_batch_matmul_regions(ops):
    assert _regions(ops, "mm", (2, 8), (1, 1)) == {"mm": ((2, 2), (8, 8)), "a": ((2, 2), (0, 8)),
                                                   "bmat": ((0, 8), (8, 8))}
    got = _regions(ops, "bmm", (1, 2, 6), (1, 1, 0))
    assert got["ba"] == ((1, 1), (2, 2), (0, 8)) and got["bb3"] == ((1, 1), (0, 8), (0, 6))


def test_conv2d_stride2_pad1_border_and_interior(ops):
    # out[y] reads x[2y + ry - 1], ry in 0..2
    border = _regions(ops, "conv", (1, 4, 2, 2))
    assert border["x"] == ((0, 1), (0, 3), (0, 4), (0, 4))      # rows -1..3 clamped at the padding
    assert border["w"] == ((0, 4), (0, 3), (0, 3), (0, 3))
    interior = _regions(ops, "conv", (1, 4, 2, 2), (0, 0, 1, 1))
    assert interior["x"] == ((0, 1), (0, 3), (3, 5), (3, 5))    # rows 3..7: full 2*2+1 window
    corner = _regions(ops, "conv", (1, 2, 1, 1), (1, 1, 3, 0))
    assert corner["x"] == ((1, 1), (0, 3), (5, 3), (0, 2)) and corner["w"] == ((2, 2), (0, 3), (0, 3), (0, 3))
    # the representative (interior) tile keeps the full window even at the origin
    assert _regions(ops, "conv", (1, 4, 2, 2), interior=True)["x"] == ((0, 1), (0, 3), (0, 5), (0, 5))


def test_pooling_regions(ops):
    assert _regions(ops, "maxpool", (1, 2, 1, 1), (1, 1, 1, 0))["conv"] == ((1, 1), (2, 2), (2, 2), (0, 2))
    assert _regions(ops, "avgpool", (1, 1, 2, 2))["conv"] == ((0, 1), (0, 1), (0, 3), (0, 3))
    assert _regions(ops, "avgpool", (1, 1, 2, 2), (0, 0, 1, 1))["conv"] == ((0, 1), (0, 1), (1, 3), (1, 3))


def test_transpose_broadcast_reduction_regions(ops):
    assert _regions(ops, "tr", (3, 2), (1, 1))["m"] == ((2, 2), (3, 3))
    got = _regions(ops, "biasadd", (2, 3), (1, 1))
    assert got["m"] == ((2, 2), (3, 3)) and got["bias"] == ((3, 3),)
    assert _regions(ops, "rsum", (2,), (1,))["m"] == ((2, 2), (0, 6))
    assert _regions(ops, "sm", (2, 3), (1, 1))["m"] == ((2, 2), (0, 6))


def test_gather_is_conservative_along_the_gathered_dim(ops):
    got = _regions(ops, "gather", (2, 3), (1, 1))
    assert got["tab"] == ((0, 10), (3, 3))     # the whole table along axis 0
    assert got["ids"] == ((2, 2),)


def test_a_representative_gather_tile_reads_one_row_per_index(ops):
    """Traffic and footprint are priced on the representative tile: 2 indices read 2 rows of the
    10-row table (where they lie is data), not all 10."""
    got = _regions(ops, "gather", (2, 3), interior=True)
    assert got["tab"] == ((0, 2), (0, 3)) and got["ids"] == ((0, 2),)
    assert _regions(ops, "gather", (5, 6), interior=True)["tab"] == ((0, 5), (0, 6))
    report = traffic(ops, _idx(ops, "gather"), (1, 6))
    assert report.num_tiles == 5 and report.load_bytes == 5 * (6 * 4 + 8)     # a row and an index per tile


def test_reshape_exact_and_conservative(ops):
    assert _regions(ops, "rs", (1, 6), (1, 1))["m"] == ((3, 1), (0, 6))   # flat 18..23 = row 3
    # flat 4..7 = m[0, 4:6] + m[1, 0:2]: the bounding box is both rows, all columns
    assert _regions(ops, "rs", (1, 4), (0, 1))["m"] == ((0, 2), (0, 6))


def test_split_halves_and_slices(ops):
    assert _regions(ops, "ss", (2, 2), (1, 1))["m"] == ((2, 2), (5, 1))    # column 2*2+1
    group = [_idx(ops, "sp"), _idx(ops, "halves")]
    got = propagate(ops, group, (4, 1), tile_index=(0, 2))
    sp0, sp1 = ops.node("sp").outputs
    assert got[sp0].ranges == ((0, 4), (2, 1)) and got[sp1].ranges == ((0, 4), (2, 1))
    assert got["m"].ranges == ((0, 4), (2, 4))      # columns 2 and 5: bounding box


# ---------------------------------------------------------------- dependency kinds
def test_dependency_kinds_per_edge(ops):
    K = DependencyKind
    expect = {
        "mm": {"a": K.REDUCTION, "bmat": K.REDUCTION},
        "bmm": {"ba": K.REDUCTION, "bb3": K.REDUCTION},
        "conv": {"x": K.WINDOW, "w": K.REDUCTION},
        "maxpool": {"conv": K.WINDOW},
        "avgpool": {"conv": K.WINDOW},
        "tr": {"m": K.INJECTIVE_REMAP},
        "biasadd": {"m": K.ONE_TO_ONE, "bias": K.BROADCAST},
        "rsum": {"m": K.REDUCTION},
        "gather": {"tab": K.OPAQUE, "ids": K.BROADCAST},
        "rs": {"m": K.INJECTIVE_REMAP},
        "sm": {"m": K.REDUCTION},
        "ss": {"m": K.INJECTIVE_REMAP},
        "ed": {"m": K.ONE_TO_ONE},
    }
    for name, kinds in expect.items():
        node = ops.node(name)
        assert edge_kinds(ops, node.index) == {(i, node.outputs[0]): k for i, k in kinds.items()}, name
    sp0, sp1 = ops.node("sp").outputs
    assert edge_kinds(ops, _idx(ops, "sp")) == {("m", sp0): K.ONE_TO_ONE, ("m", sp1): K.ONE_TO_ONE}
    assert [k.is_one_to_many for k in K] == [False, False, True, True, True, False]


def test_softmax_access_map_is_the_union_of_its_blocks(ops):
    am = node_access_maps(ops, _idx(ops, "sm"))["sm"]
    o0, o1 = am.out_vars
    accesses = am.accesses["m"]
    assert len(accesses) == 3          # max block, exp block, exp inside the sum block
    direct = [a for a in accesses if all(e.same_as(v) for e, v in zip(a.indices, (o0, o1)))]
    assert len(direct) == 1
    reduced = [a for a in accesses if a.indices[1] in am.free_vars]
    assert len(reduced) == 2 and all(am.free_vars[a.indices[1]] == (0, 6) for a in reduced)
    scratch = am.scratch_regions(Region(((1, 2), (0, 3))))
    assert scratch["T_softmax_exp"].ranges == ((1, 2), (0, 6))
    assert scratch["T_softmax_maxelem"].ranges == ((1, 2),)


def test_func_access_maps_defaults_to_param_names(ops):
    maps = func_access_maps(ops.node("tr").func)
    (out,) = maps
    assert maps[out].kinds() == {"m": DependencyKind.INJECTIVE_REMAP}
    with pytest.raises(AnalysisError):
        func_access_maps(ops.node("tr").func, names=["only_one"])


# ---------------------------------------------------------------- groups, tiles, errors
def test_group_conv_maxpool_regions(ops):
    group = [_idx(ops, "conv"), _idx(ops, "maxpool")]
    got = propagate(ops, group, {"maxpool": (1, 4, 1, 1)})
    assert got["conv"].ranges == ((0, 1), (0, 4), (0, 2), (0, 2))       # Welder Fig. 4: [2x2xF] reuse tile
    assert got["x"].ranges == ((0, 1), (0, 3), (0, 4), (0, 4))
    # conv also escapes (read by avgpool): a bare tile applies to both outputs, a mapping must name it
    both = propagate(ops, group, {"maxpool": (1, 4, 1, 1), "conv": (1, 4, 4, 4)})
    assert both["conv"].ranges == ((0, 1), (0, 4), (0, 4), (0, 4))
    with pytest.raises(AnalysisError, match="no tile"):
        propagate(ops, group + [_idx(ops, "avgpool")], {"maxpool": (1, 4, 1, 1)})


def test_tile_errors(ops):
    mm = _idx(ops, "mm")
    assert propagate(ops, mm, np.array([2, 8]))["a"].ranges == ((0, 2), (0, 8))   # numpy ints are fine
    with pytest.raises(AnalysisError):
        propagate(ops, mm, (2, 2, 2))                    # wrong rank
    with pytest.raises(AnalysisError):
        propagate(ops, mm, (2.5, 8))
    with pytest.raises(AnalysisError):
        propagate(ops, mm, {"m": (2, 2)})                # not produced by the group
    with pytest.raises(AnalysisError):
        propagate(ops, [mm, 999], (2, 2))
    with pytest.raises(AnalysisError):
        propagate(ops, mm, Region(((0, 8), (0, 8))))     # outside the tensor
    group = [_idx(ops, "conv"), _idx(ops, "maxpool"), _idx(ops, "avgpool")]
    with pytest.raises(AnalysisError, match="different tile counts"):
        traffic(ops, group, {"maxpool": (1, 4, 1, 1), "avgpool": (1, 4, 1, 1)})


def test_tile_grid_helpers():
    assert tile_grid((10, 10), (4, 10)) == (3, 1) and num_tiles((10, 10), (4, 10)) == 3
    assert tile_region((10, 10), (4, 4), (2, 2)).ranges == ((8, 2), (8, 2))
    tiles = list(iter_tiles((5, 3), (2, 2)))
    assert len(tiles) == 6 and sum(t.num_elements for t in tiles) == 15
    with pytest.raises(AnalysisError):
        tile_region((10,), (4,), (3,))
    assert Region.from_bounds([(-2, 1)], (8,)).ranges == ((0, 2),)
    assert Region.from_bounds([(-2, 1)], (8,), interior=True).ranges == ((0, 4),)
    assert Region.from_bounds([(9, 12)], (8,)).is_empty


# ---------------------------------------------------------------- footprint
def test_best_fit_prefers_the_tightest_hole():
    alloc = BestFitAllocator()
    a, b, c, d = (alloc.malloc(s) for s in (100, 10, 50, 10))
    assert (a, b, c, d) == (0, 100, 110, 160)
    alloc.free(a)
    alloc.free(c)                    # holes of 100 at 0 and 50 at 110
    assert alloc.malloc(40) == 110   # best fit; first fit would take offset 0 ...
    assert alloc.malloc(100) == 0    # ... and this would then not fit below the top
    assert alloc.peak == 170
    alloc.free(d)                    # merges with the 10 B left of c's hole; the top shrinks
    assert alloc.top == 150 and alloc.peak == 170
    with pytest.raises(AnalysisError):
        alloc.free(12345)


def test_plan_best_fit_alignment_and_lifetimes():
    plan = plan_best_fit([Buffer("a", 10, 0, 0), Buffer("b", 5, 0, 1), Buffer("c", 20, 1, 1)], alignment=16)
    assert [(p.name, p.offset, p.size) for p in plan.placements] == [("a", 0, 16), ("b", 16, 16), ("c", 32, 32)]
    assert plan.peak_bytes == 64 and plan.total_bytes == 64


@pytest.fixture(scope="module")
def chain() -> OpGraph:
    bb = relax.BlockBuilder()
    x = relax.Var("x", _t((8, 64)))
    with bb.function("main", [x]):
        with bb.dataflow():
            e = bb.emit(relax.op.exp(x), "e")
            s = bb.emit(relax.op.sum(e, axis=[1], keepdims=True), "s")
            y = bb.emit(relax.op.divide(e, s), "y")
            z = bb.emit_output(relax.op.nn.relu(y))
        bb.emit_func_output(z)
    return OpGraph.from_module(_legalize(bb.get()))


def test_footprint_chain_reuses_freed_tiles(chain):
    # tile [2x64] fp32 = 512 B; s tile [2x1] = 8 B.  Steps (best fit):
    # exp: x@0, e@512, free x | sum: s@0 (into x's hole) | divide: y@1024 (hole [8,512) too small),
    # free e and s -> hole [0,1024) | relu: z@0 (reuses the hole), free y.
    report = footprint(chain, range(4), (2, 64))
    offsets = {p.name: p.offset for p in report.placements}
    z = chain.nodes[3].outputs[0]
    assert offsets == {"x": 0, "e": 512, "s": 0, "y": 1024, z: 0}
    assert report.peak_bytes == 1536 and report.total_bytes == 4 * 512 + 8
    # whole fused chain: 16 B of the row sum stay on chip; traffic is x in, z out
    r = traffic(chain, range(4), (2, 64))
    assert r.global_bytes == 4 * (512 + 512) and r.shared_bytes == 1536


# ---------------------------------------------------------------- soundness against execution
def test_regions_are_sound_and_tight_by_execution(ops):
    """Perturb the input inside / outside the propagated region of a conv->maxpool tile."""
    bb = relax.BlockBuilder()
    x, w = relax.Var("x", _t((1, 2, 8, 8))), relax.Var("w", _t((2, 2, 3, 3)))
    with bb.function("main", [x, w]):
        with bb.dataflow():
            c = bb.emit(relax.op.nn.conv2d(x, w, strides=2, padding=1))
            p = bb.emit_output(relax.op.nn.max_pool2d(c, pool_size=2, strides=2))
        bb.emit_func_output(p)
    mod = _legalize(bb.get())
    graph = OpGraph.from_module(mod)
    vm = relax.VirtualMachine(tvm.compile(mod, tvm.target.Target({"kind": "llvm"})), tvm.cpu())
    rng = np.random.default_rng(0)
    xv, wv = rng.standard_normal((1, 2, 8, 8)).astype("float32"), rng.standard_normal((2, 2, 3, 3)).astype("float32")
    run = lambda xs: vm["main"](tvm.runtime.tensor(xs), tvm.runtime.tensor(wv)).numpy()
    ref = run(xv)
    for index in [(0, 0, 0, 0), (0, 0, 1, 1), (0, 1, 1, 0)]:
        tile = tile_region((1, 2, 2, 2), (1, 1, 1, 1), index)
        region = propagate(graph, [0, 1], tile)["x"]
        sl = tuple(slice(s, s + e) for s, e in region.ranges)
        outside = xv + 1000.0
        outside[sl] = xv[sl]
        got = run(outside)
        tsl = tuple(slice(s, s + e) for s, e in tile.ranges)
        np.testing.assert_allclose(got[tsl], ref[tsl], rtol=1e-5)     # nothing outside is read
        for dim in (2, 3):                                            # every face of the box is read
            for edge in (region.starts[dim], region.starts[dim] + region.extents[dim] - 1):
                idx = list(sl)
                idx[dim] = slice(edge, edge + 1)
                changed = []
                for delta in (1000.0, -1000.0):   # max pooling may hide a decrease: try both signs
                    face = xv.copy()
                    face[tuple(idx)] += delta
                    changed.append(not np.allclose(run(face)[tsl], ref[tsl]))
                assert any(changed), (index, dim, edge)
