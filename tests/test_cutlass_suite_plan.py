"""Suite planning and the compile scheduler without nvcc (the slow check is test_cutlass_suite.py)."""
from __future__ import annotations

import threading
import time

from tvm.script import ir as I, relax as R

from tvm_ext.cutlass import suite
from tvm_ext.cutlass.suite import InstanceCompiler, SuiteInstance, SuitePlan, plan_model


@I.ir_module
class ModelA:
    @R.function
    def main(x: R.Tensor((256, 512), "float16"), w: R.Tensor((512, 1024), "float16"), b: R.Tensor((1024,), "float16"),
             w2: R.Tensor((1024, 512), "float16"), b2: R.Tensor((512,), "float16")):
        with R.dataflow():
            h = R.nn.relu(R.add(R.matmul(x, w), b))
            o = R.add(R.matmul(h, w2), b2)
            R.output(o)
        return o


@I.ir_module
class ModelB:  # other shapes, same kernel configurations as ModelA's bias GEMMs
    @R.function
    def main(x: R.Tensor((256, 1024), "float16"), w: R.Tensor((1024, 512), "float16"), b: R.Tensor((512,), "float16"),
             r: R.Tensor((256, 512), "float16")):
        with R.dataflow():
            o = R.add(R.add(R.matmul(x, w), b), r)
            p = R.add(R.matmul(x, w), b)
            t = (o, p)
            R.output(t)
        return t


def test_plan_shares_instances_across_models():
    plan = SuitePlan(("sm_80", "sm_90a"))
    new, glue = [], []
    plan_model(plan, "a", ModelA, on_new=new.append, on_glue=lambda key, src: glue.append(key))
    plan_model(plan, "b", ModelB, on_new=new.append, on_glue=lambda key, src: glue.append(key))
    assert sorted(glue) == [("a", "sm_80"), ("a", "sm_90a"), ("b", "sm_80"), ("b", "sm_90a")]
    assert plan.offloads == {("a", "sm_80"): 2, ("a", "sm_90a"): 2, ("b", "sm_80"): 2, ("b", "sm_90a"): 2}
    assert len(new) == len(plan.all_instances())
    # Per arch 3 instances, by epilogue: A's bias+relu GEMM, the bias GEMM A and B share (M=256, N=512,
    # K=1024 in both: same priced configuration, so one instance), B's bias+residual GEMM.
    # One 3.x kernel on sm_90a: B's bias+residual GEMM. The analytic model (launch + max(compute,
    # memory)) prices the shared bias GEMM's best 3.x tile (64x128 pingpong, 16 CTAs: compute 3.2 us
    # after wave quantization 132/16) at 6.2 us and a split-K 2.x tile (128x64, 8 slices, 128 CTAs:
    # compute 0.62 us, memory 1.0 us) at 4.0 us; bias+residual may not split K (its bias would be
    # added per slice), and a 3.x stream-K kernel (128x256 tiles, 4 of them, their 16 K steps shared
    # out over the 132 SMs) at 4.3 us beats 2.x 64x64 (32 CTAs, 5.5 us). A 2048^3 GEMM picks 3.x
    # without stream-K (test_cutlass_search.py::test_cheapest_config_follows_the_model).
    assert plan.summary() == {"sm_80": {"offloads": 4, "instances": 3, "instances_3x": 0},
                              "sm_90a": {"offloads": 4, "instances": 3, "instances_3x": 1}}
    bias = "fused_relax_matmul_relax_add_tvm_ext_cutlass"
    for arch in plan.archs:
        users = sorted(sorted(i.users) for i in plan.instances[arch].values())
        assert users == sorted([[f"a/{bias}", f"b/{bias}"],
                                ["a/fused_relax_matmul_relax_add_relax_nn_relu_tvm_ext_cutlass"],
                                ["b/fused_relax_matmul_relax_add_relax_add_tvm_ext_cutlass"]])
    assert [i.key.split("|")[3] for i in plan.all_instances() if i.heavy] == ["bias_residual"]
    for key in plan.glue:
        assert "TVM_FFI_DLL_EXPORT_TYPED_FUNC" in plan.glue[key]


def test_compiler_runs_at_most_one_heavy_job(monkeypatch):
    running = {"heavy": 0, "all": 0, "max_heavy": 0, "max_all": 0}
    lock = threading.Lock()

    def fake_compile(source, arch):
        heavy = "3x" in source
        with lock:
            running["heavy"] += heavy
            running["all"] += 1
            running["max_heavy"] = max(running["max_heavy"], running["heavy"])
            running["max_all"] = max(running["max_all"], running["all"])
        time.sleep(0.02)
        with lock:
            running["heavy"] -= heavy
            running["all"] -= 1

    monkeypatch.setattr(suite, "compile_object", fake_compile)
    monkeypatch.setattr(suite, "cached_object", lambda source, arch: None)
    compiler = InstanceCompiler(jobs=3, heavy_jobs=1)
    for i in range(12):
        api = "3x" if i % 2 else "2x"
        compiler.submit(SuiteInstance("sm_90a", f"e{i}", f"gemm|{api}|{i}|{api}_tile", f"source {api} {i}"))
    results = compiler.finish()
    assert len(results) == 12 and not any(r.error for r in results)
    assert running["max_heavy"] == 1 and running["max_all"] >= 2


def test_compiler_holds_heavy_jobs_until_released(monkeypatch):
    order = []
    monkeypatch.setattr(suite, "compile_object", lambda source, arch: order.append(source))
    monkeypatch.setattr(suite, "cached_object", lambda source, arch: None)
    compiler = InstanceCompiler(jobs=1, heavy_jobs=1, hold_heavy=True)
    compiler.submit(SuiteInstance("sm_90a", "h", "gemm|x|3x_tile", "heavy"))
    for i in range(3):
        compiler.submit(SuiteInstance("sm_90a", f"l{i}", f"gemm|x|2x_tile{i}", f"light{i}"))
    deadline = time.time() + 10
    while len(order) < 3 and time.time() < deadline:
        time.sleep(0.01)
    assert order == ["light0", "light1", "light2"]  # the 3.x compile waits
    compiler.submit_glue(("m", "sm_90a"), "not C++ at all")
    compiler.finish()
    assert order[3:] == ["heavy"]
    assert list(compiler.glue_errors) == [("m", "sm_90a")]
