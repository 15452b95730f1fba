"""The stitching planner on the AStitch paper's examples: Figure 7/9 graph, §3.3 shapes, §4.5 launch."""
from __future__ import annotations

import pytest
import tvm
from tvm import relax, te

from tvm_ext.hardware import load_device
from tvm_ext.stitch import (
    PlanOptions,
    StitchPlanError,
    StitchGraph,
    find_dominants,
    launch_config,
    plan_prim_func,
    row_mapping,
)
from tvm_ext.driver import graph_passes
from tvm_ext.select import plan_of
from tvm_ext.stitch.plans import StitchKernelPlan
from tvm_ext.stitch.locality import reads_same_row, row_split

M, N = 256, 64


def figure7() -> tvm.tirx.PrimFunc:
    """The memory-intensive subgraph of the paper's Figure 7(a), one TE stage per operator.

    The figure itself is not in the paper's text; this topology follows every statement the
    text makes about it: the local path between reduce.1 and power.1 runs through add.1,
    broadcast.1, parameter.2 and divide.1 (§4.3); power.1 is a heavy op feeding a broadcast;
    broadcast.2 is shared by the groups of reduce.2 and multiply.1; parameter.2 and broadcast.2
    are read by two of XLA's four kernels (§3.2.2); multiply.1 is the output.
    """
    p1 = te.placeholder((M, N), name="parameter_1")
    p2 = te.placeholder((M,), name="parameter_2")
    p3 = te.placeholder((M, N), name="parameter_3")
    b1 = te.compute((M, N), lambda i, j: p2[i], name="broadcast_1")
    a1 = te.compute((M, N), lambda i, j: p1[i, j] + b1[i, j], name="add_1")
    k = te.reduce_axis((0, N), name="k")
    r1 = te.compute((M,), lambda i: te.sum(a1[i, k], axis=k), name="reduce_1")          # row reduce
    d1 = te.compute((M,), lambda i: p2[i] / r1[i], name="divide_1")
    pw = te.compute((M,), lambda i: te.power(d1[i], 2.0), name="power_1")
    b2 = te.compute((M, N), lambda i, j: pw[i], name="broadcast_2")
    a2 = te.compute((M, N), lambda i, j: b2[i, j] + p3[i, j], name="add_2")
    m = te.reduce_axis((0, M), name="m")
    r2 = te.compute((N,), lambda j: te.sum(a2[m, j], axis=m), name="reduce_2")          # column reduce
    b3 = te.compute((M, N), lambda i, j: r2[j], name="broadcast_3")
    m1 = te.compute((M, N), lambda i, j: b2[i, j] * b3[i, j], name="multiply_1")
    return te.create_prim_func([p1, p2, p3, m1])


def figure7_relax() -> tvm.IRModule:
    """The same graph as Relax ops (broadcasts become reshapes plus implicit broadcasting)."""
    bb = relax.BlockBuilder()
    t = lambda s: relax.TensorType(s, "float32")  # noqa: E731
    p1, p2, p3 = relax.Var("parameter_1", t((M, N))), relax.Var("parameter_2", t((M,))), relax.Var("parameter_3", t((M, N)))
    with bb.function("main", [p1, p2, p3]):
        with bb.dataflow():
            r1 = bb.emit(relax.op.sum(relax.op.add(p1, relax.op.reshape(p2, (M, 1))), axis=[1]))
            pw = bb.emit(relax.op.power(relax.op.divide(p2, r1), relax.const(2.0, "float32")))
            b2 = bb.emit(relax.op.reshape(pw, (M, 1)))
            r2 = bb.emit(relax.op.sum(relax.op.add(b2, p3), axis=[0]))
            out = bb.emit_output(relax.op.multiply(b2, r2))
        bb.emit_func_output(out)
    return bb.get()


@pytest.fixture(scope="module")
def v100():
    return load_device("v100")


def test_figure9_step1_dominants(v100):
    dom = find_dominants(StitchGraph.from_prim_func(figure7()))
    assert set(dom.candidates) == {"reduce_1", "power_1", "reduce_2", "multiply_1"}
    assert dom.dominants == ("reduce_1", "reduce_2")
    assert dom.sub_dominants == {"power_1": "reduce_1", "multiply_1": "reduce_2"}
    assert set(dom.local) == {"broadcast_1", "add_1", "divide_1", "broadcast_2", "add_2", "broadcast_3"}
    assert set(dom.groups["reduce_1"]) == {"broadcast_1", "add_1", "reduce_1", "divide_1", "power_1"}
    assert set(dom.groups["reduce_2"]) == {"broadcast_2", "add_2", "reduce_2", "broadcast_3", "multiply_1"}


def test_figure9_schemes(v100):
    plan = plan_prim_func(figure7(), v100)
    # §4.3: only reduce.1 passes the locality check; power.1 and reduce.2 are global
    assert plan.schemes == {"reduce_1": "regional", "power_1": "global", "reduce_2": "global",
                            "multiply_1": "output"}
    assert plan.needs_grid_sync
    assert [s.root for s in plan.stages] == ["power_1", "reduce_2", "multiply_1"]
    assert plan.stages[0].members == ("reduce_1",)           # reduce.1 stays on chip inside power.1's stage
    assert plan.grid <= plan.launch.blocks_per_wave          # a grid barrier needs one wave


def test_figure9_through_relax(v100):
    """The Relax form (after legalization and stitching) gives the same plan."""
    target = tvm.target.Target("tvm_ext/a100")
    mod = graph_passes("stitch", target)(figure7_relax())
    fused = [f for gv, f in mod.functions_items() if gv.name_hint.startswith("fused")]
    assert len(fused) == 1                                   # the whole subgraph is one stitch group
    # the plan the kernel carries is the planner's on the final function (made on the candidate's own)
    attached = plan_of(fused[0])
    assert attached.to_json() == StitchKernelPlan("stitch", 1, plan_prim_func(fused[0], load_device("a100"))).to_json()
    plan = plan_prim_func(fused[0], v100)
    assert len(plan.dominants) == 2 and all(plan.graph.op(d).is_reduce for d in plan.dominants)
    by_kind = {plan.graph.op(n).kind + ("/heavy" if plan.graph.op(n).heavy else ""): s
               for n, s in plan.schemes.items()}
    assert sorted(plan.schemes.values()) == ["global", "global", "output", "regional"]
    assert by_kind["elementwise/heavy"] == "global"          # power.1
    row, col = sorted(plan.dominants, key=lambda d: plan.graph.op(d).index)
    assert plan.schemes[row] == "regional" and plan.schemes[col] == "global"


def test_mapping_packs_many_short_rows(v100):
    m = row_mapping(750000, 32, v100)
    assert (m.kind, m.threads_x, m.rows_per_block) == ("pack", 32, 32)   # horizontal packing: 32 rows x 32 threads
    assert m.blocks_per_wave == 160 and m.grid == 160                    # vertical packing: one V100 wave
    assert m.tasks_per_block == 147 and m.grid * m.tasks_per_block * 32 >= 750000


def test_mapping_splits_few_long_rows(v100):
    m = row_mapping(64, 30000, v100)
    assert (m.kind, m.split, m.grid) == ("split", 2, 128)
    assert m.fits_one_wave


@pytest.mark.parametrize("rows,length,kind", [(64, 1024, "pack"), (200, 30000, "pack"), (80, 2048, "split")])
def test_mapping_rule_boundaries(v100, rows, length, kind):
    assert row_mapping(rows, length, v100).kind == kind


def test_launch_assume_relax_apply(v100):
    cfg = launch_config(v100, 1024)
    assert (cfg.blocks_per_sm, cfg.blocks_per_wave, cfg.register_cap, cfg.limiter) == (2, 160, 32, "warps")
    # shared memory limits to 2 blocks of 256 threads: registers relax up to what still fits 2 blocks
    cfg = launch_config(v100, 256, shared_bytes=40000)
    assert (cfg.blocks_per_sm, cfg.limiter, cfg.register_cap) == (2, "shared_memory", 128)


def _layer_norm_func(shape=(4, 128, 256)):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    g = relax.Var("g", relax.TensorType((shape[-1],), "float32"))
    b = relax.Var("b", relax.TensorType((shape[-1],), "float32"))
    with bb.function("main", [x, g, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.layer_norm(x, g, b, axes=[-1]))
        bb.emit_func_output(out)
    return relax.transform.LegalizeOps()(bb.get())["layer_norm"]


def test_layer_norm_plan_is_regional():
    plan = plan_prim_func(_layer_norm_func(), load_device("h100"))
    assert plan.dominants == ("x_sum",)
    assert plan.schemes == {"x_sum": "regional", "x_var_sum": "regional", "T_layer_norm": "output"}
    assert len(plan.stages) == 1 and not plan.needs_grid_sync
    assert plan.stages[0].rows == 4 * 128 and plan.stages[0].members == ("x_sum", "x_var_sum")


def _outer_products(rows=64, length=512):
    """a = tanh(x) per row, y[r, i, j] = a[r, i] * a[r, j]: a heavy op read one-to-many, kept per row."""
    x = te.placeholder((rows, length), name="x")
    a = te.compute((rows, length), lambda r, i: te.tanh(x[r, i]), name="a")
    b = te.compute((rows, length), lambda r, i: te.tanh(x[r, i] * 2.0), name="b")
    y = te.compute((rows, length, length), lambda r, i, j: a[r, i] * a[r, j] + b[r, j] * b[r, i], name="y")
    return te.create_prim_func([x, y])


def test_shared_memory_overflow_demotes_one_at_a_time():
    h100 = load_device("h100")
    full = plan_prim_func(_outer_products(), h100)
    assert full.schemes == {"a": "regional", "b": "regional", "y": "output"} and not full.needs_grid_sync
    per_op = full.rows_per_block * 512 * 4
    assert full.shared_bytes == 2 * per_op
    one = plan_prim_func(_outer_products(), h100, PlanOptions(shared_limit=2 * per_op - 1))
    assert len(one.demoted) == 1 and sorted(one.schemes.values()) == ["global", "output", "regional"]
    assert one.needs_grid_sync and one.shared_bytes == per_op
    both = plan_prim_func(_outer_products(), h100, PlanOptions(shared_limit=per_op - 1))
    assert set(both.demoted) == {"a", "b"} and both.shared_bytes == 0


def test_reductions_that_cannot_fit_are_refused():
    with pytest.raises(StitchPlanError):
        plan_prim_func(_layer_norm_func(), load_device("h100"), PlanOptions(shared_limit=16))


def test_split_reduction_is_factored():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((64, 30000), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.sum(x, axis=[1]))
        bb.emit_func_output(out)
    func = relax.transform.LegalizeOps()(bb.get())["sum"]
    plan = plan_prim_func(func, load_device("a100"))
    (dom,) = plan.dominants
    assert plan.split == {dom: 3}                       # 64 rows < 216 per wave, 30000 > 1024: split
    rf = next(n for n in plan.materialized if n != dom)
    assert plan.graph.op(rf).spatial == (64, 3) and plan.schemes[rf] == "global" and plan.needs_grid_sync


def test_split_of_a_full_reduction_to_a_scalar():
    """One long row reduced to a 0-d result (a loss's mean): the partial results are the new
    buffer's only axis (rfactor's factor_axis must index the written buffer, not the iterators)."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 65536), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.sum(x))
        bb.emit_func_output(out)
    func = relax.transform.LegalizeOps()(bb.get())["sum"]
    plan = plan_prim_func(func, load_device("a100"))
    (dom,) = plan.dominants
    rf = next(n for n in plan.materialized if n != dom)
    assert plan.split[dom] > 1 and plan.graph.op(rf).shape == (plan.split[dom],)


def test_locality_helpers():
    plan = plan_prim_func(_layer_norm_func(), load_device("h100"))
    g = plan.graph
    assert row_split((4, 128, 256), 512) == 2 and row_split((4, 128, 256), 100) is None
    assert reads_same_row(g.op("x_sum"), g.op("T_layer_norm"), 512)
    assert reads_same_row(g.op("x_sum"), g.op("T_layer_norm"), 4)       # coarser rows (whole batches) hold too
    assert not reads_same_row(g.op("x_sum"), g.op("T_layer_norm"), 128)  # not a leading-dims product of x_sum
    f7 = plan_prim_func(figure7(), load_device("v100")).graph
    assert reads_same_row(f7.op("reduce_1"), f7.op("power_1"), M)
    assert not reads_same_row(f7.op("reduce_2"), f7.op("multiply_1"), N)
