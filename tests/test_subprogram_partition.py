"""SOUFFLE's resource-bounded partition into subprograms (§5.4): cuts only at compute-intensive
nodes, when the largest grid no longer fits the blocks resident with the largest block."""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ext.graph import OpGraph
from tvm_ext.hardware import device_from_target
from tvm_ext.select.candidate import LaunchShape
from tvm_ext.subprogram.partition import partition, resident_blocks
from tvm_ext.subprogram.te_graph import TEGraph
from relax_examples import Attention

H100 = device_from_target(tvm.target.Target("tvm_ext/h100"))
SMALL = LaunchShape(grid=8, threads=128)


@I.ir_module
class WithExternal:
    @R.function
    def main(x: R.Tensor((8, 16), "float32"), w: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            a = R.matmul(x, w)
            b = R.call_dps_packed("my_ext", (a,), out_ty=R.Tensor((8, 16), "float32"))
            c = R.matmul(b, w)
            R.output(c)
        return c


def _teg(mod) -> TEGraph:
    return TEGraph(OpGraph.from_module(relax.transform.LegalizeOps()(mod)))


def _index(teg: TEGraph, name: str) -> int:
    return teg.graph.node(name).index


def test_small_grids_make_one_cooperative_subprogram():
    teg = _teg(Attention)
    ci = [i for i in teg.order if teg.compute_intensive(i)]
    assert {teg.graph.nodes[i].outputs[0] for i in ci} == {"q", "k", "v", "s", "o"}
    (part,) = partition(teg, H100, {i: SMALL for i in ci})
    assert part.nodes == tuple(teg.order) and part.cooperative and part.grid == 8
    assert part.resident == resident_blocks(H100, [SMALL]) == 16 * H100.sm_count   # 16 blocks of 4 warps


def test_cut_where_max_grid_times_max_block_no_longer_fits():
    """k (grid 200, no shared memory) fits alone and so does s (grid 100, 120 KiB: one block per
    SM); together the merged kernel's blocks take 120 KiB, 132 are resident < 200: s opens a new
    subprogram."""
    teg = _teg(Attention)
    shapes = {i: SMALL for i in teg.order if teg.compute_intensive(i)}
    k, s = _index(teg, "k"), _index(teg, "s")
    shapes[k] = LaunchShape(grid=200, threads=128)
    shapes[s] = LaunchShape(grid=100, threads=128, shared_bytes=120 * 1024)
    assert resident_blocks(H100, [shapes[s]]) == H100.sm_count < 200
    parts = partition(teg, H100, shapes)
    assert len(parts) == 2 and all(p.cooperative for p in parts)
    assert parts[1].compute[0] == s and k in parts[0].compute
    assert sorted(n for p in parts for n in p.nodes) == sorted(teg.order)


def test_too_large_grid_is_a_kernel_of_its_own():
    teg = _teg(Attention)
    shapes = {i: SMALL for i in teg.order if teg.compute_intensive(i)}
    q = _index(teg, "q")
    shapes[q] = LaunchShape(grid=10**6, threads=256)
    parts = partition(teg, H100, shapes)
    assert parts[0].nodes == (q,) and not parts[0].cooperative
    assert len(parts) == 2 and parts[1].cooperative


def test_external_call_stands_alone():
    teg = _teg(WithExternal)
    ext = _index(teg, "b")
    assert teg.graph.nodes[ext].func is None
    parts = partition(teg, H100, {i: SMALL for i in teg.order if teg.compute_intensive(i)})
    assert [p.external for p in parts] == [False, True, False]
    assert parts[1].nodes == (ext,)
