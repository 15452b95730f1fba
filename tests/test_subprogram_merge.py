"""SOUFFLE's merged multi-stage kernels (issue 14, item 5): stages of a fused function, memory
stages scheduled to the GEMMs' threads, virtual blocks, grid barriers, cooperative launch."""
from __future__ import annotations

import re

import pytest
import tvm
from tvm import relax
from tvm.script import ir as I
from tvm.script import relax as R

from tvm_ext.graph import OpGraph
from tvm_ext.hardware import load_device
from tvm_ext.select.analytic import AnalyticCostModel
from tvm_ext.select.candidate import CodePath, LaunchShape, StageWork
from tvm_ext.select.context import SelectionContext, fuse_nodes
from tvm_ext.select.launch import launch_shape
from tvm_ext.subprogram import (SubprogramGenerator, SubprogramPlan, ThreadShape, build, default_stages, design, pieces,
                                schedule_to_shape, stage_function, thread_shape)
from tvm_ext.subprogram.stages import StageError, StageSpec
from tvm_ext.checks.thread_serial import compare_scheduled, compare_stages
from tvm_ext.checks.lowered import device_kernels
from tvm_ext.tir import COOPERATIVE_TAG, has_grid_sync, launch_params
from tvm_ext.toolchain import compile_cuda_source, nvcc_available
from relax_examples import Attention

H100 = tvm.target.Target("tvm_ext/h100")
DEVICE = load_device("h100")


@I.ir_module
class ProjSoftmaxProj:
    @R.function
    def main(x: R.Tensor((32, 64), "float32"), w1: R.Tensor((64, 64), "float32"), w2: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a = R.matmul(x, w1)
            s = R.nn.softmax(a)
            n = R.nn.layer_norm(s, R.const(1.0, "float32") * R.ones((64,), "float32"),
                                R.zeros((64,), "float32"), axes=[-1])
            o = R.matmul(n, w2)
            R.output(o)
        return o


@I.ir_module
class RowChainBeforeGemm:
    """Bindings: exp, exp, matmul, add. Kahn's order (exp, matmul, exp, add) is not the binding
    order, in which FuseTIR writes the fused function's statements."""

    @R.function
    def main(x: R.Tensor((64, 64), "float32"), y: R.Tensor((64, 64), "float32"), w: R.Tensor((64, 64), "float32")):
        with R.dataflow():
            a0 = R.exp(x)
            a1 = R.exp(a0)
            m = R.matmul(y, w)
            o = R.add(m, a1)
            R.output(o)
        return o


@I.ir_module
class GemvThenGemm:
    """A recurrent step's shape: a one-row product (dlight's GEMV rule) beside a 64-row GEMM."""

    @R.function
    def main(h: R.Tensor((1, 256), "float32"), wh: R.Tensor((256, 512), "float32"),
             x: R.Tensor((64, 256), "float32"), wx: R.Tensor((256, 512), "float32")):
        with R.dataflow():
            g = R.sigmoid(R.matmul(h, wh))
            o = R.add(R.matmul(x, wx), g)
            R.output(o)
        return o


@I.ir_module
class OddRows:
    """37 rows: no thread shape's threadIdx.y divides them."""

    @R.function
    def main(x: R.Tensor((37, 53), "float32"), w1: R.Tensor((53, 256), "float32"), w2: R.Tensor((256, 53), "float32")):
        with R.dataflow():
            s = R.nn.softmax(R.matmul(x, w1))
            o = R.add(R.matmul(s, w2), x)
            R.output(o)
        return o


@I.ir_module
class Rows:
    @R.function
    def main(x: R.Tensor((64, 100), "float32"), g: R.Tensor((100,), "float32"), b: R.Tensor((100,), "float32")):
        with R.dataflow():
            y = R.nn.softmax(x)
            z = R.nn.layer_norm(x, g, b, axes=[-1])
            R.output(y, z)
        return (y, z)


def _legal(mod):
    return relax.transform.AnnotateTIROpPattern()(relax.transform.LegalizeOps()(mod))


def _fused(mod) -> tvm.tirx.PrimFunc:
    legal = _legal(mod)
    return fuse_nodes(legal, "main", OpGraph.from_module(legal).topological_order(), ())


def test_stages_are_gemms_with_epilogues_and_memory_runs():
    func = _fused(Attention)
    specs = default_stages(func)
    # q, k, v GEMMs; k's transpose (memory); s = q k^T; o = s v with the residual add as its epilogue
    assert [(s.kind, s.statements) for s in specs] == [
        ("compute", (0,)), ("compute", (1,)), ("compute", (2,)), ("memory", (3,)), ("compute", (4,)),
        ("compute", (5, 6))]
    last = stage_function(func, specs[-1])
    assert len(last.params) == 4       # x, v, s (from earlier stages) and the output
    with pytest.raises(StageError, match="stage kind"):
        StageSpec((0,), "bogus")


@pytest.mark.parametrize("shape", [ThreadShape(32, 4), ThreadShape(8, 16), ThreadShape(128)])
@pytest.mark.parametrize("name", ["softmax", "layer_norm"])
def test_row_chains_are_one_kernel_at_any_thread_shape(name, shape):
    func = _legal(Rows)[name]
    scheduled = schedule_to_shape(func, shape)
    launch = launch_shape(scheduled)
    assert launch.kernels == 1 and launch.threads == shape.threads
    assert launch.grid == -(-64 // shape.y)                    # 64 rows, one per threadIdx.y
    assert thread_shape(scheduled) == shape
    check = compare_scheduled(func, scheduled)
    assert check.ok, check


def test_merged_kernel_is_one_cooperative_kernel_with_barriers():
    func = _fused(Attention)
    made = design(func, DEVICE, H100)
    plan = made.plan
    # q, k, v are independent (no barrier between them); k^T, s and o each read an earlier stage
    assert len(plan.stages) == 6 and plan.grid_syncs == made.merged.grid_syncs == 3
    merged = made.merged.func
    assert launch_shape(merged).kernels == 1 and has_grid_sync(merged)
    assert [w.name for w in made.merged.workspaces]          # values between stages are workspaces
    check = compare_scheduled(func, merged)
    assert check.ok, check
    # the plan round-trips and rebuilds the same kernel
    again = SubprogramPlan.from_json(plan.to_json())
    assert again == plan
    tvm.ir.assert_structural_equal(build(func, again, H100).func, merged)
    lib = tvm.compile(tvm.IRModule({"main": merged.with_attr("global_symbol", "main")}), H100, tir_pipeline="tvm_ext")
    source = lib.mod.imports[0].inspect_source()
    assert len(set(re.findall(r"__global__ void __launch_bounds__\(\d+, \d+\) (\w+)\(", source))) == 1
    assert "tvm_builtin_cuda_grid_sync();" in source


def test_merged_kernel_virtual_blocks_and_memory_stages():
    """Row chains run between GEMMs; a grid smaller than a stage's runs it as virtual blocks."""
    func = _fused(ProjSoftmaxProj)
    made = design(func, DEVICE, H100)
    kinds = [s.kind for s in made.plan.stages]
    assert kinds.count("compute") == 2 and "memory" in kinds
    small = SubprogramPlan(made.plan.stages, made.plan.rules, made.plan.threads, 1, 1)
    merged = build(func, small, H100)
    assert merged.grid == 1 and max(merged.stage_grids) > 1
    check = compare_scheduled(func, merged.func)
    assert check.ok, check


def _emulated_work(func, made, grid: int):
    """The executed work of ``made``'s kernel rebuilt at ``grid`` blocks, after checking it as
    lowered (blocks in adversarial orders, races, poisoned memory)."""
    from tvm_ext.analysis.work import executed_work
    from tvm_ext.checks.kernel import emulate_function

    merged = build(func, SubprogramPlan(made.plan.stages, made.plan.rules, made.plan.threads, grid, 1), H100)
    verdict = emulate_function(func, merged.func, H100)
    assert verdict.ok, verdict.findings
    return merged, executed_work(merged.func)


def test_blocks_past_a_stage_grid_do_no_work():
    """A stage of fewer blocks than the launch, its reductions over threads kept in shared memory
    (softmax, layer norm): the blocks past its end are predicated off, so the kernel executes the
    same work at any grid (they used to redo block ``linear mod own``: MobileNet-V2's first
    convolution, 392 blocks in a 2112-block grid, ran 5.4 times over)."""
    func = _fused(ProjSoftmaxProj)
    made = design(func, DEVICE, H100)
    works = []
    for grid in (2, 40, 64):
        merged, work = _emulated_work(func, made, grid)
        assert max(merged.stage_grids) < 40
        works.append(work)
    for work in works[1:]:
        assert work.transcendentals == pytest.approx(works[0].transcendentals, rel=1e-9)
        assert work.global_loads == pytest.approx(works[0].global_loads, rel=1e-9)


def test_a_stage_reducing_into_global_memory_redoes_its_blocks():
    """A GEMV whose allreduce writes its result to global memory: TVM's write-back does not carry
    the block predicate, so predicated-off blocks would write their identity-valued results over
    another block's (the race ``tvm-ext verify`` found on ViT-B/16's patch embedding). The blocks
    past its end redo a block's work instead, and the kernel stays right."""
    func = _fused(GemvThenGemm)
    made = design(func, DEVICE, H100)
    merged, _ = _emulated_work(func, made, 40)
    assert min(merged.stage_grids) < 40


def test_virtual_block_loops_are_not_unrolled():
    """A GEMV stage of 32 blocks at 8 blocks runs 4 virtual blocks per block. TVM lifted a stage's
    unroll pragma over the whole kernel, unrolled the loop, allreduce included, and
    ``LowerThreadAllreduce`` failed on the repeated reduction buffer; everything small was unrolled
    too (the CUDA of a merged kernel ran to hundreds of KB)."""
    func = _fused(GemvThenGemm)
    made = design(func, DEVICE, H100)
    merged, _ = _emulated_work(func, made, 8)
    assert max(merged.stage_grids) > 8
    lib = tvm.compile(tvm.IRModule({"main": merged.func.with_attr("global_symbol", "main")}), H100,
                      tir_pipeline="tvm_ext")
    source = lib.mod.imports[0].inspect_source()
    assert source.count("tvm_builtin_cuda_grid_sync();") == 2 and len(source) < 40_000


def test_gemv_stage_runs_at_the_gemm_threads():
    """A compute stage dlight schedules with other threads (a GEMV) becomes a memory stage at the
    thread shape of the stage doing the most work, and the merged kernel still computes the function."""
    func = _fused(GemvThenGemm)
    made = design(func, DEVICE, H100)
    kinds = [s.kind for s in made.plan.stages]
    assert kinds.count("compute") == 1 and len(made.plan.rules) == 1 and "memory" in kinds
    gemm = next(s for s in made.stages if s.spec.kind == "compute")
    assert thread_shape(gemm.scheduled) == made.plan.threads
    check = compare_scheduled(func, build(func, made.plan, H100).func)
    assert check.ok, check


def _recurrent_cell(steps: int, hidden: int, inputs: int) -> tvm.IRModule:
    """The seed LSTM's structure: per step concat(x_t, h) x W^T + b, gates by slices, c and h."""
    def ty(shape):
        return relax.TensorType(shape, "float32")

    bb = relax.BlockBuilder()
    x, w, b = relax.Var("x", ty((1, steps, inputs))), relax.Var("w", ty((4 * hidden, inputs + hidden))), \
        relax.Var("b", ty((4 * hidden,)))
    op = relax.op
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            h, c = bb.emit(op.zeros((1, hidden), "float32")), bb.emit(op.zeros((1, hidden), "float32"))
            for s in range(steps):
                xt = bb.emit(op.squeeze(op.strided_slice(x, [1], [s], [s + 1]), [1]))
                g = bb.emit(op.add(op.matmul(op.concat([xt, h], axis=1), op.permute_dims(w, [1, 0])), b))
                i, f, z, o = (op.strided_slice(g, [1], [k * hidden], [(k + 1) * hidden]) for k in range(4))
                c = bb.emit(op.add(op.multiply(op.sigmoid(f), c), op.multiply(op.sigmoid(i), op.tanh(z))))
                h = bb.emit(op.multiply(op.sigmoid(o), op.tanh(c)))
            out = bb.emit_output(h)
        bb.emit_func_output(out)
    return bb.get()


def test_recurrent_steps_are_one_merged_kernel():
    """Three LSTM steps: one-row products beside gate chains, all in one merged kernel with grid
    barriers between the steps, equal to the unscheduled function (few steps: with N(0, 1) weights
    a long recurrence amplifies rounding in the reference itself)."""
    func = _fused(_recurrent_cell(3, 128, 64))
    made = design(func, DEVICE, H100)
    assert made.plan.grid_syncs >= 3 and made.merged.grid_syncs == made.plan.grid_syncs
    merged = build(func, made.plan, H100).func
    check = compare_scheduled(func, merged)
    assert check.ok, check
    by_stage = compare_stages(func, merged, SubprogramGenerator().stage_functions(func, made.plan))
    assert by_stage.ok and by_stage.outputs >= len(made.plan.stages), by_stage


def test_stage_by_stage_check_finds_a_wrong_stage():
    """Each stage recomputed from the merged kernel's own intermediates: a kernel whose first
    computed (non-constant) store writes twice the value fails at that stage."""
    import tvm_ffi
    from tvm import tirx

    func = _fused(ProjSoftmaxProj)
    made = design(func, DEVICE, H100)
    merged = build(func, made.plan, H100).func
    stages = SubprogramGenerator().stage_functions(func, made.plan)
    assert compare_stages(func, merged, stages).ok
    done = []

    def double_first(store):
        if done or isinstance(store.value, tirx.FloatImm):
            return store
        done.append(store)
        return tirx.BufferStore(store.buffer, store.value * tirx.const(2.0, store.value.ty.dtype), store.indices)

    wrong = merged.with_body(tvm_ffi.structural_map(merged.body, (tirx.BufferStore, double_first)))
    assert done and not compare_stages(func, wrong, stages).ok


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not installed")
def test_launch_bound_asks_only_the_blocks_the_grid_needs():
    """Attention's merged kernel runs on one block: its launch bound asks one block per SM, and
    ptxas keeps its 100+ registers (asking the 16 blocks that fit at 32 registers spilled 1.5 KB
    per thread)."""
    from tvm_ext.toolchain import resource_usage

    made = design(_fused(Attention), DEVICE, H100)
    assert made.plan.grid <= DEVICE.sm_count and made.plan.blocks_per_sm == 1
    merged = made.merged.func.with_attr("global_symbol", "main")
    lib = tvm.tirx.build(tvm.IRModule({"main": merged}), target=H100, pipeline="tvm_ext")
    (usage,) = resource_usage(lib.imports[0].inspect_source(), H100).values()
    assert usage.spill_stores == 0 and usage.registers > 32


def test_cooperative_tag_on_device_kernel():
    merged = design(_fused(ProjSoftmaxProj), DEVICE, H100).merged.func.with_attr("global_symbol", "main")
    (kernel,) = device_kernels(tvm.IRModule({"main": merged}), H100).values()
    assert COOPERATIVE_TAG in launch_params(kernel)


@pytest.mark.skipif(not nvcc_available(), reason="nvcc not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_merged_kernel_compiles_with_nvcc(arch):
    target = tvm.target.Target({"kind": "cuda", "arch": arch, "max_num_threads": 1024})
    func = _fused(ProjSoftmaxProj)
    merged = design(func, DEVICE, H100).merged.func.with_attr("global_symbol", "main")
    lib = tvm.compile(tvm.IRModule({"main": merged}), target, tir_pipeline="tvm_ext")
    compile_cuda_source(lib.mod.imports[0].inspect_source(), target)


def test_stages_are_priced_one_after_another():
    model = AnalyticCostModel()
    a = StageWork(flops=10 ** 9, global_bytes=10 ** 5, launch=LaunchShape(grid=132, threads=256),
                  code_path=CodePath.MMA_SYNC, dtype="float16")
    b = StageWork(flops=10 ** 3, global_bytes=10 ** 8, launch=LaunchShape(grid=132, threads=256))
    ca, ma = model._work(a, DEVICE)
    cb, mb = model._work(b, DEVICE)
    assert ca > ma and mb > cb                             # one compute-bound, one memory-bound stage

    class Merged:
        flops, global_bytes, unique_bytes, code_path, dtype = a.flops + b.flops, 0, 0, CodePath.MMA_SYNC, "float16"
        launch = LaunchShape(grid=132, threads=256, grid_syncs=1)
        stages = (a, b)

    est = model.cost(Merged(), DEVICE)
    expected = DEVICE.cost.launch_overhead_s + ca + mb + DEVICE.cost.grid_sync_s
    assert est.seconds == pytest.approx(expected)
    assert est.seconds > DEVICE.cost.launch_overhead_s + max(ca + cb, ma + mb)   # not overlapped across stages


def test_generator_proposes_priced_merged_kernels():
    legal = _legal(ProjSoftmaxProj)
    ctx = SelectionContext(legal, "main", OpGraph.from_module(legal), DEVICE, H100)
    cands = SubprogramGenerator().candidates(ctx)
    assert len(cands) == 1 and not ctx.dropped
    (cand,) = cands
    assert set(cand.nodes) == set(ctx.call_nodes()) and cand.launch.kernels == 1
    assert len(cand.stages) == len(cand.plan.stages) and cand.launch.grid_syncs == cand.plan.grid_syncs
    assert sum(s.flops for s in cand.stages) == cand.flops


def test_report_prices_a_merged_kernel_as_the_selection_did():
    """The plan carries each stage's planned work: the built kernel's description is priced stage by
    stage with it, scaled by what the kernel executes (this one's softmax evaluates its exp twice),
    equal to the candidate's price; and the plan survives its JSON round trip."""
    from tvm_ext.select.describe import describe_scheduled
    from tvm_ext.select.plan import plan_from_text, plan_to_text, with_plan

    legal = _legal(ProjSoftmaxProj)
    ctx = SelectionContext(legal, "main", OpGraph.from_module(legal), DEVICE, H100)
    (cand,) = SubprogramGenerator().candidates(ctx)
    plan = cand.plan
    assert plan_from_text(plan_to_text(plan)) == plan
    assert [s.launch for s in plan.work] == [s.launch for s in cand.stages]
    assert sum(s.flops for s in cand.stages) > sum(s.flops for s in plan.work)      # priced as built
    func = with_plan(ctx.fused_function(cand.nodes), plan)
    kernel = describe_scheduled(func, build(func, plan, H100).func)
    model = AnalyticCostModel()
    built, proposed = model.cost(kernel, DEVICE), model.cost(cand, DEVICE)
    assert built.parts["stages_s"] == pytest.approx(proposed.parts["stages_s"])
    assert built.seconds == pytest.approx(proposed.seconds)


def test_stage_work_follows_the_fused_statement_order():
    """Each stage is priced with its own members' flops and bytes (found by binding order, not by
    topological order): the GEMM's flops go with the GEMM stage's launch."""
    legal = _legal(RowChainBeforeGemm)
    graph = OpGraph.from_module(legal)
    ctx = SelectionContext(legal, "main", graph, DEVICE, H100)
    assert ctx.ordered(ctx.call_nodes()) != ctx.in_binding_order(ctx.call_nodes())
    (cand,) = SubprogramGenerator().candidates(ctx)
    gemm_flops = graph.node("m").flops
    for spec, work in zip(cand.plan.stages, cand.stages):
        assert (work.flops >= gemm_flops) == (spec.kind == "compute"), (spec, work)
    assert sum(s.flops for s in cand.stages) == cand.flops


def test_pieces_cut_where_the_gemm_thread_shape_changes():
    from tvm_ext.subprogram.partition import Subprogram

    part = Subprogram(nodes=tuple(range(8)), compute=(0, 2, 5, 7), grid=8, resident=264, cooperative=True)
    wide, narrow = ThreadShape(32, 16), ThreadShape(8, 16)
    # 0: GEMM (wide), 1: memory, 2: GEMM (wide), 3-4: memory, 5: GEMM (narrow), 6: memory, 7: no one shape
    threads = {0: wide, 2: wide, 5: narrow, 7: None}
    assert pieces(part, threads) == [(0, 1, 2, 3, 4), (5, 6), (7,)]
