"""Static checks of built kernels: unlowered thread reductions, ptxas spills, co-residency."""
from __future__ import annotations

from pathlib import Path

import pytest
import tvm
from tvm.script import tirx as T

from tvm_ext.checks.lints import unlowered_thread_reductions, usage_findings
from tvm_ext.toolchain import KernelUsage, nvcc_available, resource_usage
from tvm_ext.toolchain.resource_usage import parse_ptxas

TARGET = tvm.target.Target("tvm_ext/h100")
FIXTURES = Path(__file__).parent / "fixtures"

PTXAS = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'small_kernel' for 'sm_90'
ptxas info    : Function properties for small_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 19 registers, used 1 barriers, 384 bytes smem
ptxas info    : Compiling entry function 'big_kernel' for 'sm_90'
ptxas info    : Function properties for big_kernel
    18432 bytes stack frame, 18400 bytes spill stores, 18400 bytes spill loads
ptxas info    : Used 255 registers
"""


def test_ptxas_report_is_parsed_per_kernel():
    usage = parse_ptxas(PTXAS)
    assert usage["small_kernel"] == KernelUsage(19, 0, 0, 0, 384)
    assert usage["big_kernel"].spill_bytes == 18400 and usage["big_kernel"].shared_bytes == 0


@pytest.mark.skipif(not nvcc_available(), reason="nvcc / CUDA toolkit not found")
def test_resource_usage_compiles_and_reads_every_kernel():
    source = ('extern "C" __global__ void __launch_bounds__(64) add_kernel(float* __restrict__ y, float* __restrict__ x)'
              ' { __shared__ float s[64]; s[threadIdx.x] = x[threadIdx.x]; __syncthreads();'
              ' y[threadIdx.x] = s[63 - threadIdx.x]; }\n')
    usage = resource_usage(source, TARGET)
    assert set(usage) == {"add_kernel"}
    assert usage["add_kernel"].shared_bytes == 256 and usage["add_kernel"].spill_bytes == 0


def test_the_mmoe_kernel_of_6f8d79c_left_its_thread_reductions_unlowered():
    mod = tvm.script.from_source((FIXTURES / "mmoe_merged_6f8d79c.tvmscript").read_text())
    assert unlowered_thread_reductions(mod["scheduled"], TARGET) == ["matmul", "matmul1"]


@T.prim_func(s_tir=True)
def _grid_synced(x_ptr: T.handle("float32", "global"), y_ptr: T.handle("float32", "global")):
    x = T.decl_buffer((1048576,), data=x_ptr)
    y = T.decl_buffer((1048576,), data=y_ptr)
    with T.launch_thread("blockIdx.x", 8192) as blockIdx_x:
        with T.launch_thread("threadIdx.x", 128) as threadIdx_x:  # noqa: SIM117 (TVMScript)
            x[blockIdx_x * 128 + threadIdx_x] = x[blockIdx_x * 128 + threadIdx_x] * T.float32(2)
            T.cuda.grid_sync()
            y[blockIdx_x * 128 + threadIdx_x] = x[(blockIdx_x * 128 + threadIdx_x + 128) % 1048576]


def test_spills_and_a_grid_over_the_co_resident_limit_are_findings():
    quiet = KernelUsage(registers=32, stack_bytes=0, spill_stores=0, spill_loads=0, shared_bytes=0)
    assert usage_findings(_grid_synced, quiet, TARGET, cooperative=False) == []
    spilling = KernelUsage(registers=255, stack_bytes=18432, spill_stores=18400, spill_loads=18400, shared_bytes=0)
    assert [f.kind for f in usage_findings(_grid_synced, spilling, TARGET, cooperative=False)] == ["spill"]
    (finding,) = usage_findings(_grid_synced, quiet, TARGET, cooperative=True)
    assert finding.kind == "co_residency" and "8192 blocks" in finding.message


def test_a_kernel_whose_thread_reductions_would_not_be_lowered_falls_back(monkeypatch):
    """ApplyPlans refuses such a kernel (dlight schedules the function) and says why."""
    import sys

    import tvm_ext.driver.apply_plans as apply_plans
    from tvm_ext.driver import Preset
    from tvm_ext.driver.stages import build
    from tvm_ext.select.attrs import FALLBACK_ATTR
    from tvm_ext.select.generator import register_generator, unregister_generator

    sys.path.insert(0, str(Path(__file__).parent))
    from test_select import Singletons, Small

    monkeypatch.setattr(apply_plans, "unlowered_thread_reductions", lambda func, target: ["T_softmax_maxelem"])
    register_generator(Singletons())
    try:
        staged = build(Small, TARGET, Preset("test_singletons", "test", generators=("test_singletons", "dlight")),
                       link=False)
    finally:
        unregister_generator("test_singletons")
    reasons = [str(f.attrs[FALLBACK_ATTR]) for _, f in staged.scheduled.functions_items()
               if isinstance(f, tvm.tirx.PrimFunc) and f.attrs is not None and FALLBACK_ATTR in f.attrs]
    assert reasons and all("would not be lowered to allreduces (T_softmax_maxelem)" in r for r in reasons)


def test_a_kernel_computing_wrong_values_falls_back_when_kernels_are_checked(monkeypatch):
    """With the preset's ``check_kernels`` the schedule stage emulates every generator kernel: one whose
    outputs differ from its function's goes to dlight, and the build goes on. Without it the kernel is
    used (no static check sees a wrong value)."""
    import dataclasses
    import sys

    import tvm_ffi
    from tvm import tirx

    from tvm_ext.driver import Preset
    from tvm_ext.driver.stages import build
    from tvm_ext.select.attrs import FALLBACK_ATTR, GENERATOR_ATTR
    from tvm_ext.select.generator import register_generator, unregister_generator

    sys.path.insert(0, str(Path(__file__).parent))
    from test_select import Singletons, Small

    right = Singletons.schedule

    def doubled(self, func, plan, device):
        kernel = right(self, func, plan, device)
        store = lambda st: tirx.BufferStore(st.buffer, st.value * tirx.const(2, st.value.ty.dtype), st.indices)  # noqa: E731
        return dataclasses.replace(kernel, func=kernel.func.with_body(
            tvm_ffi.structural_map(kernel.func.body, (tirx.BufferStore, store))))

    monkeypatch.setattr(Singletons, "schedule", doubled)
    register_generator(Singletons())
    try:
        preset = Preset("test_singletons", "test", generators=("test_singletons", "dlight"))
        unchecked = build(Small, TARGET, preset, link=False).scheduled
        checked = build(Small, TARGET, dataclasses.replace(preset, check_kernels=True), link=False).scheduled
    finally:
        unregister_generator("test_singletons")

    def funcs(mod):
        return [f for _, f in mod.functions_items() if isinstance(f, tvm.tirx.PrimFunc)]

    assert any(str(f.attrs.get(GENERATOR_ATTR)) == "test_singletons" for f in funcs(unchecked))
    assert not any(str(f.attrs.get(GENERATOR_ATTR)) == "test_singletons" for f in funcs(checked))
    reasons = [str(f.attrs[FALLBACK_ATTR]) for f in funcs(checked) if FALLBACK_ATTR in f.attrs]
    assert reasons and all("the emulated kernel has findings (output" in r and "differs" in r for r in reasons)
