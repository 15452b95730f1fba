"""tvm_ext.inspect: kernel launch counting, fused groups, traffic, fallbacks, rendering."""
from __future__ import annotations

import dataclasses
import json
import shutil

import pytest
import tvm
from tvm import relax, tirx
from tvm.script import ir as I
from tvm.script import relax as R
from tvm.script import tirx as T

import tvm_ext
from tvm_ext.analysis import group_traffic_default
from tvm_ext.errors import KernelCompileError, PresetError, TvmExtError, UnknownDeviceError
from tvm_ext.graph import OpGraph
from tvm_ext.driver import build
from tvm_ext.inspect.render import summary_lines
from tvm_ext.inspect import (FallbackOp, GroupInfo, cuda_source, global_kernel_names, inspect, kernel_source,
                             report_from_stages)
from tvm_ext.select import FALLBACK_ATTR, launch_regions
from tvm_ext.toolchain import compile_cuda_source, find_cuda_root

F32 = "float32"


@pytest.fixture(scope="session", autouse=True)
def _registered():
    tvm_ext.register_target_tags()
    tvm_ext.driver.register_pipelines()


@I.ir_module
class TwoKernels:
    """``two`` holds two independent loops (two kernels after dlight Fallback) and is called 3 times."""

    @T.prim_func(private=True, s_tir=True)
    def two(a: T.Buffer((64,), "float32"), b: T.Buffer((32,), "float32"),
            c: T.Buffer((64,), "float32"), d: T.Buffer((32,), "float32")):
        T.func_attr({"op_pattern": 8})  # opaque: FuseOps leaves every call alone
        for i in range(64):
            with T.sblock("c"):
                vi = T.axis.spatial(64, i)
                c[vi] = a[vi] * T.float32(2)
        for j in range(32):
            with T.sblock("d"):
                vj = T.axis.spatial(32, j)
                d[vj] = b[vj] + T.float32(1)

    @R.function
    def main(x: R.Tensor((64,), "float32"), y: R.Tensor((32,), "float32")):
        cls = TwoKernels
        pair = [R.Tensor((64,), "float32"), R.Tensor((32,), "float32")]
        with R.dataflow():
            r1 = R.call_tir(cls.two, (x, y), out_ty=pair)
            r2 = R.call_tir(cls.two, (r1[0], r1[1]), out_ty=pair)
            r3 = R.call_tir(cls.two, (r2[0], r2[1]), out_ty=pair)
            o = R.add(r3[0], r3[0])
            R.output(o)
        return o


@I.ir_module
class HostLoop:
    """A pre-scheduled PrimFunc whose one kernel sits in a serial loop: 4 launches per call."""

    @T.prim_func(private=True, s_tir=True)
    def looped(a: T.Buffer((4, 64), "float32"), c: T.Buffer((4, 64), "float32")):
        T.func_attr({"tirx.is_scheduled": True, "op_pattern": 8})
        for i in range(4):
            for bx in T.thread_binding(1, thread="blockIdx.x"):
                for tx in T.thread_binding(64, thread="threadIdx.x"):
                    with T.sblock("c"):
                        vi, vj = T.axis.remap("SS", [i, tx])
                        c[vi, vj] = a[vi, vj] * T.float32(2)

    @R.function
    def main(x: R.Tensor((4, 64), "float32")):
        cls = HostLoop
        with R.dataflow():
            r = R.call_tir(cls.looped, (x,), out_ty=R.Tensor((4, 64), "float32"))
            s = R.call_tir(cls.looped, (r,), out_ty=R.Tensor((4, 64), "float32"))
            R.output(s)
        return s


@I.ir_module
class SmallModel:
    @R.function
    def main(x: R.Tensor((4, 64), "float32"), w: R.Tensor((64, 64), "float32"), b: R.Tensor((64,), "float32")):
        with R.dataflow():
            y = R.nn.gelu(R.add(R.matmul(x, w), b))
            s = R.nn.softmax(y, axis=-1)
            R.output(s)
        return s


@I.ir_module
class WithExternal:
    @R.function
    def main(x: R.Tensor((4, 64), "float32")):
        with R.dataflow():
            y = R.call_dps_packed("my_ext.kernel", (x,), out_ty=R.Tensor((4, 64), "float32"))
            t = R.permute_dims(R.nn.relu(y))
            R.output(t)
        return t


def _mark_transpose(mod: tvm.IRModule) -> tvm.IRModule:
    """What a technique does for a function it leaves to default lowering."""
    out = mod.clone()
    for gv, func in mod.functions_items():
        if isinstance(func, tirx.PrimFunc) and "transpose" in gv.name_hint:
            out[gv] = func.with_attr(FALLBACK_ATTR, "test: <transpose> & friends left alone")
    return out


@pytest.fixture(scope="module")
def two_report():
    return inspect(TwoKernels, "tvm_ext/h100", "baseline", keep_source=True)


@pytest.fixture(scope="module")
def small_report():
    return inspect(SmallModel, "tvm_ext/h100", "baseline", keep_source=True)


# ---------------------------------------------------------------- kernel launches
def test_same_primfunc_called_three_times_with_two_kernels(two_report):
    by_func = {k.func: k for k in two_report.launches}
    assert by_func["two"].calls == 3
    assert by_func["two"].kernels_per_call == 2
    assert by_func["two"].kernel_names == ("two_kernel", "two_kernel_1")
    assert by_func["fused_add"].calls == 1 and by_func["fused_add"].kernels_per_call == 1
    assert two_report.kernels == 3 * 2 + 1
    assert two_report.distinct_kernels == 3
    assert set(global_kernel_names(two_report.cuda_source)) == {"two_kernel", "two_kernel_1", "fused_add_kernel"}


def test_launch_regions_agree_with_host_device_split(two_report, small_report):
    for report in (two_report, small_report):
        scheduled = report.build.scheduled
        for k in report.launches:
            assert len(launch_regions(scheduled[k.func])) == k.kernels_per_call, k.func


def test_a_function_without_shared_buffers_has_the_launch_shape_of_its_compacted_form(two_report, small_report):
    """Launch shapes skip the compaction passes where no shared buffer is to be sized."""
    from tvm_ext.select.launch import _shared_buffers, compacted, launch_shape

    seen_without = 0
    for report in (two_report, small_report):
        scheduled = report.build.scheduled
        for k in report.launches:
            func = scheduled[k.func]
            if not _shared_buffers(func.body):
                seen_without += 1
                assert launch_shape(func) == launch_shape(compacted(func)), k.func
    assert seen_without > 0


def test_kernel_inside_host_loop_counts_per_iteration():
    report = inspect(HostLoop, "tvm_ext/h100", "baseline")
    (k,) = report.launches
    assert (k.func, k.calls, k.kernels_per_call) == ("looped", 2, 4)
    assert len(launch_regions(HostLoop["looped"])) == 4
    assert report.kernels == 8 and report.distinct_kernels == 1


def test_cuda_source_comes_from_the_executable(small_report):
    src = cuda_source(small_report.executable)
    assert src == small_report.cuda_source
    assert len(global_kernel_names(src)) == small_report.distinct_kernels == 2


# ---------------------------------------------------------------- groups and traffic
def test_groups_of_matmul_bias_gelu_softmax(small_report):
    assert [list(g.ops) for g in small_report.groups] == [["matmul", "add", "gelu"], ["softmax"]]
    first, second = small_report.groups
    assert first.name == first.func == "fused_matmul_add_gelu"
    assert first.op_classes == ("compute", "broadcast", "elementwise")
    assert second.op_classes == ("reduce",)
    # matmul 2*M*N*K + bias add (one op per element) + gelu as legalized (x * 1/sqrt2, erf, * 0.5,
    # + 0.5, * x: 5 ops per element); softmax on 4x64: 5 ops per element (see test_graph)
    assert first.flops == 2 * 4 * 64 * 64 + 4 * 64 + 5 * 4 * 64
    assert second.flops == 5 * 4 * 64
    assert [g.kernels for g in small_report.groups] == [1, 1]
    assert small_report.kernels == 2


def test_traffic_equals_analysis_value(small_report):
    fused = relax.transform.FuseOps()(relax.transform.AnnotateTIROpPattern()(
        relax.transform.LegalizeOps()(SmallModel)))
    graph = OpGraph.from_module(fused)
    expected = [group_traffic_default(graph, [0, 1, 2]), group_traffic_default(graph, [3])]
    assert [g.traffic_bytes for g in small_report.groups] == expected
    # by hand: x, w, b read once + y written once; softmax reads y and writes its output
    assert expected == [(4 * 64 + 64 * 64 + 64 + 4 * 64) * 4, 2 * 4 * 64 * 4]
    assert small_report.traffic_bytes == sum(expected)
    assert small_report.min_traffic_bytes == (4 * 64 + 64 * 64 + 64 + 4 * 64) * 4
    # unfused, every op reads its inputs and writes its output: matmul x, w -> y; add y, b -> y;
    # gelu y -> y; softmax y -> y
    assert small_report.unfused_traffic_bytes == ((4 * 64 + 64 * 64 + 4 * 64) + (2 * 4 * 64 + 64)
                                                  + 2 * (2 * 4 * 64)) * 4


def test_roofline_bound(small_report):
    spec = tvm_ext.load_device("h100")
    compute = small_report.flops / spec.peak_flops_for("float32")
    memory = small_report.min_traffic_bytes / spec.dram_bandwidth_bytes_per_s
    assert small_report.roofline_bound_s == pytest.approx(max(compute, memory))
    assert small_report.dtype == F32 and small_report.device == "h100"


# ---------------------------------------------------------------- fallbacks
def test_dlight_rules_and_generic_fallback(small_report, two_report):
    assert small_report.schedule_rules == {"fused_matmul_add_gelu": "Matmul", "softmax": "GeneralReduction"}
    assert small_report.fallback_ops == []
    kinds = {(f.op, f.kind) for f in two_report.fallback_ops}
    assert kinds == {("two", "dlight_fallback"), ("fused_add", "dlight_fallback")}  # no rule for plain loops
    reasons = {f.reason for f in two_report.fallback_ops if f.op == "two"}
    assert reasons == {"no specialized schedule rule matched: generic Fallback"}


def test_fallback_attr_and_external_call():
    target = tvm.target.Target("tvm_ext/h100")
    stages = build(WithExternal, target, "baseline")
    report = report_from_stages(dataclasses.replace(stages, scheduled=_mark_transpose(stages.scheduled)))
    found = {(f.op, f.kind): f for f in report.fallback_ops}
    assert set(found) == {("my_ext.kernel", "not_legalized"), ("fused_relu_transpose", "marked"),
                          ("fused_relu_transpose", "dlight_fallback")}
    assert "external call" in found[("my_ext.kernel", "not_legalized")].reason
    marked = found[("fused_relu_transpose", "marked")]
    assert marked.reason == "test: <transpose> & friends left alone"
    assert marked.ops == ("relu", "transpose")
    assert ("fused_relu_transpose", "dlight_fallback") in found
    # the external call is a group without kernels of ours; the fused PrimFunc launches one
    assert [(g.ops, g.kernels) for g in report.groups] == [(("my_ext.kernel",), 0), (("relu", "transpose"), 1)]
    assert report.kernels == 1


# ---------------------------------------------------------------- rendering
def test_json_keys_and_types(small_report):
    data = json.loads(json.dumps(small_report.to_json()))
    assert isinstance(data["kernels"], int) and data["kernels"] == 2
    assert isinstance(data["distinct_kernels"], int) and data["distinct_kernels"] == 2
    assert data["groups"] == [["matmul", "add", "gelu"], ["softmax"]]
    assert isinstance(data["traffic_bytes"], int) and data["traffic_bytes"] == small_report.traffic_bytes
    assert data["fallback_ops"] == []
    assert data["target"] == "tvm_ext/h100" and data["preset"] == "baseline"
    assert "modelled" in data["modelled_time_label"] and "modelled" in data["roofline_bound_label"]
    assert len(global_kernel_names(data["cuda_source"])) == 2  # one definition per distinct kernel


def test_table_and_html_escape(small_report):
    table = small_report.to_table()
    assert "kernel launches / inference" in table and "fused_matmul_add_gelu" in table
    assert "matmul + add + gelu" in table and "modelled" in table
    evil = dataclasses.replace(
        small_report,
        groups=[GroupInfo(name="<script>x</script>", func=None, ops=("a&b",), op_classes=("compute",),
                          flops=1, traffic_bytes=4, kernels=1)],
        fallback_ops=[FallbackOp(op="<op>", kind="marked", reason='"quoted" <reason>')])
    planned = dataclasses.replace(small_report, selection={
        "main": {"generator_seconds": {"tilegraph": 10.04, "dlight": 2.5, "fuseops": 0.01}},
        "f": {"generator_seconds": {"dlight": 1.0}}})
    line = next(v for k, v in summary_lines(planned) if k == "planning time by generator")
    assert line == "tilegraph 10.0 s, dlight 3.5 s"            # summed over functions, slowest first
    page = evil._repr_html_()
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert "a&amp;b" in page and "&lt;op&gt;" in page and "&lt;reason&gt;" in page
    assert page.startswith("<div") and "<table>" in page


# ---------------------------------------------------------------- errors and nvcc
def test_bad_inputs_raise_tvm_ext_errors():
    with pytest.raises(TvmExtError, match="not a GPU target"):
        inspect(SmallModel, {"kind": "llvm"}, device="h100")
    with pytest.raises(PresetError):
        inspect(SmallModel, "tvm_ext/h100", "no_such_preset")
    with pytest.raises(UnknownDeviceError, match="no device has arch sm_89"):
        inspect(SmallModel, {"kind": "cuda", "arch": "sm_89"})
    with pytest.raises(TvmExtError, match="cannot interpret 'tvm_ext_nope/x' as a TVM target"):
        inspect(SmallModel, "tvm_ext_nope/x")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_compiles_generated_source(small_report):
    root = find_cuda_root()
    assert root is not None and (root / "include" / "cuda_runtime.h").is_file()
    result = compile_cuda_source(small_report.cuda_source, small_report.build.target)
    assert result.arch == "sm_90" and result.binary_bytes > 0
    with pytest.raises(KernelCompileError, match="nvcc failed for sm_90"):
        compile_cuda_source('extern "C" __global__ void k() { undefined_thing(); }', small_report.build.target)


def test_kernel_source_extracts_one_definition(two_report):
    src = two_report.cuda_source
    body = kernel_source(src, "two_kernel_1")
    assert body.lstrip().startswith('extern "C" __global__') and "two_kernel_1(" in body
    assert body.count("{") == body.count("}") and "two_kernel(" not in body
    with pytest.raises(KeyError):
        kernel_source(src, "no_such_kernel")


def test_measure_latency_runs_an_executable_on_a_device():
    import numpy as np

    from tvm_ext.inspect.demo import measure_latency

    target = tvm.target.Target({"kind": "llvm"})
    ex = tvm.compile(SmallModel, target, relax_pipeline=tvm_ext.preset_pipeline("baseline", target))
    rng = np.random.default_rng(0)
    inputs = {"x": rng.standard_normal((4, 64), dtype="float32"), "w": rng.standard_normal((64, 64), dtype="float32"),
              "b": rng.standard_normal((64,), dtype="float32")}
    seconds = measure_latency(ex, inputs, tvm.cpu(), number=2, repeat=2)
    assert 0 < seconds < 1
