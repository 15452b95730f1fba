"""TIR passes of tvm_ext.tir: grid-barrier insertion, cooperative launch, launch bounds (no GPU needed)."""
from __future__ import annotations

import pytest
import tvm
import tvm_ffi
from tvm import te, tirx

import tvm_ext.tir as ttir
from tvm_ext.tir import (
    COOPERATIVE_TAG,
    GRID_SYNC_OP,
    MIN_BLOCKS_ATTR,
    has_grid_sync,
    insert_grid_sync,
    with_cooperative_launch,
)

M, N, GRID, THREADS = 512, 256, 64, 256


def _two_stage(dependent: bool) -> tirx.PrimFunc:
    """Column sum R[j] = sum_i A[i, j], then C = A * R[j] (dependent) or C = A * 2 (independent);
    both stages merged under one blockIdx.x loop."""
    a = te.placeholder((M, N), name="A")
    k = te.reduce_axis((0, M), name="k")
    r = te.compute((N,), lambda j: te.sum(a[k, j], axis=k), name="R")
    if dependent:
        c = te.compute((M, N), lambda i, j: a[i, j] * r[j], name="C")
    else:
        c = te.compute((M, N), lambda i, j: a[i, j] * 2.0, name="C")
    sch = tvm.s_tir.Schedule(te.create_prim_func([a, c, r]))
    j, _ = sch.get_loops(sch.get_sblock("R"))
    jo, jt = sch.split(j, [GRID, None])
    _, jtx = sch.split(jt, [None, THREADS])
    i, jc = sch.get_loops(sch.get_sblock("C"))
    co, _, ctx = sch.split(sch.fuse(i, jc), [GRID, None, THREADS])
    bx = sch.merge(jo, co)
    sch.bind(bx, "blockIdx.x")
    sch.bind(jtx, "threadIdx.x")
    sch.bind(ctx, "threadIdx.x")
    return sch.mod["main"]


def _kernel_stmts(func: tirx.PrimFunc) -> list[tirx.Stmt]:
    """The statements directly under the (single) blockIdx.x loop of ``func``."""
    loops: list = []
    tvm_ffi.structural_walk(func.body, (tirx.For, loops.append))
    (bx,) = [lp for lp in loops if lp.thread_binding is not None and str(lp.thread_binding.thread_tag) == "blockIdx.x"]
    return list(bx.body.seq) if isinstance(bx.body, tirx.SeqStmt) else [bx.body]


def _is_grid_sync(stmt: tirx.Stmt) -> bool:
    """Whether ``stmt`` is exactly ``T.cuda.grid_sync()``."""
    return (isinstance(stmt, tirx.Evaluate) and isinstance(stmt.value, tvm.ir.Call)
            and isinstance(stmt.value.op, tvm.ir.Op) and stmt.value.op.name == GRID_SYNC_OP)


def _without_grid_syncs(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every ``T.cuda.grid_sync()`` statement removed."""
    def on_seq(seq, mutator):
        kept = [s for s in mutator.default_mutate(seq).seq if not _is_grid_sync(s)]
        return kept[0] if len(kept) == 1 else tirx.SeqStmt(kept)

    return func.with_body(tvm_ffi.structural_mutate(func.body, (tirx.SeqStmt, on_seq)))


def test_barrier_between_dependent_stages():
    before = _kernel_stmts(_two_stage(dependent=True))
    func, count = insert_grid_sync(_two_stage(dependent=True))
    assert count == 1 and has_grid_sync(func)
    # the kernel body was [R stage, C stage]: the barrier sits between the reduction and its
    # consumer, and it is the only change to the function
    after = _kernel_stmts(func)
    assert len(before) == 2 and len(after) == 3 and _is_grid_sync(after[1])
    tvm.ir.assert_structural_equal(_without_grid_syncs(func), _two_stage(dependent=True))


def test_no_barrier_between_independent_stages():
    func, count = insert_grid_sync(_two_stage(dependent=False))
    assert count == 0 and not has_grid_sync(func)
    tvm.ir.assert_structural_equal(func, _two_stage(dependent=False))


def test_insertion_is_idempotent():
    once, _ = insert_grid_sync(_two_stage(dependent=True))
    twice, count = insert_grid_sync(once)
    assert count == 0
    tvm.ir.assert_structural_equal(twice, once)


def test_pass_form():
    mod = tvm.IRModule({"main": _two_stage(dependent=True)})
    out = ttir.InsertGridSync()(mod)
    tvm.ir.assert_structural_equal(out["main"], insert_grid_sync(_two_stage(dependent=True))[0])
    independent = tvm.IRModule({"main": _two_stage(dependent=False)})
    tvm.ir.assert_structural_equal(ttir.InsertGridSync()(independent), independent)


_CAPTURED: list = []


def _capture_factory():
    """The tvm_ext TIR pipeline, recording the module it produces (device kernels included)."""
    passes, fin_host, fin_dev = tvm.tirx.get_tir_pipeline(ttir.PIPELINE_NAME)

    @tvm.transform.module_pass(opt_level=0, name="CaptureForTest")
    def capture(mod, _ctx):
        _CAPTURED.append(mod)
        return mod

    return tvm.transform.Sequential([passes, capture]), fin_host, fin_dev


def _lowered_kernels(func: tirx.PrimFunc) -> dict:
    from tvm.tirx import compilation_pipeline

    if "tvm_ext_test_capture" not in compilation_pipeline.PIPELINE_MAP:
        compilation_pipeline.register_tir_pipeline("tvm_ext_test_capture", _capture_factory)
    _CAPTURED.clear()
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    tvm.compile(tvm.IRModule({"k": func.with_attr("global_symbol", "k")}), target,
                tir_pipeline="tvm_ext_test_capture")
    return {gv.name_hint: f for gv, f in _CAPTURED[-1].functions_items() if ttir.is_device_kernel(f)}


def test_cooperative_tag_and_launch_bounds():
    func, _ = insert_grid_sync(_two_stage(dependent=True))
    kernels = _lowered_kernels(func.with_attr(MIN_BLOCKS_ATTR, 3))
    assert list(kernels) == ["k_kernel"]
    kernel = kernels["k_kernel"]
    params = ttir.launch_params(kernel)
    assert params[-1] == COOPERATIVE_TAG and params[:2] == ["blockIdx.x", "threadIdx.x"]
    assert int(kernel.attrs["tirx.launch_bounds_min_blocks_per_sm"]) == 3


def test_no_tag_without_barrier():
    kernels = _lowered_kernels(_two_stage(dependent=False))
    assert COOPERATIVE_TAG not in ttir.launch_params(kernels["k_kernel"])
    assert "tirx.launch_bounds_min_blocks_per_sm" not in kernels["k_kernel"].attrs


def test_cooperative_tag_stays_before_dynamic_shared_memory():
    a = te.placeholder((4,), name="A")
    func = te.create_prim_func([a, te.compute((4,), lambda i: a[i], name="B")])
    func = func.with_attr("tirx.kernel_launch_params", ["blockIdx.x", "tirx.use_dyn_shared_memory"])
    tagged = with_cooperative_launch(func)
    assert ttir.launch_params(tagged) == ["blockIdx.x", COOPERATIVE_TAG, "tirx.use_dyn_shared_memory"]
    assert ttir.launch_params(with_cooperative_launch(tagged)) == ttir.launch_params(tagged)


def test_registered_pipeline_emits_barrier_and_bounds():
    target = tvm.target.Target({"kind": "cuda", "arch": "sm_90"})
    func, _ = insert_grid_sync(_two_stage(dependent=True))
    func = func.with_attr(MIN_BLOCKS_ATTR, 4).with_attr("global_symbol", "stage2")
    lib = tvm.compile(tvm.IRModule({"stage2": func}), target, tir_pipeline=ttir.PIPELINE_NAME)
    src = lib.mod.imports[0].inspect_source()
    assert "cg::this_grid().sync()" in src and "tvm_builtin_cuda_grid_sync();" in src
    assert f"__launch_bounds__({THREADS}, 4) stage2_kernel" in src


@pytest.mark.parametrize("name", ["tvm_ext"])
def test_pipeline_is_registered(name):
    from tvm.tirx import compilation_pipeline

    assert name in compilation_pipeline.PIPELINE_MAP
