"""The attention core as one CUTLASS kernel (example 41): pattern, workload, reference, contract, price.

The contract tests compile one contract program (sm_80, about half a minute cold on two cores).
"""
from __future__ import annotations

import dataclasses
import os
import sys

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import ir as I, relax as R

sys.path.insert(0, os.path.dirname(__file__))

from test_cutlass_contract import edited          # sibling test module: a launcher with one seeded fault
from tvm_ext.cutlass.attention import AttentionWorkload, Operand, attention_products, partition_attention
from tvm_ext.cutlass.config import KernelConfig
from tvm_ext.cutlass.contract import ContractCall, check_calls
from tvm_ext.cutlass.contract_data import filled, reference_at
from tvm_ext.cutlass.gemm_padding import pad_gemm_extents
from tvm_ext.cutlass.instance import kernel_for
from tvm_ext.cutlass.pricing import describe
from tvm_ext.cutlass.workload import Offload, workload_from_function
from tvm_ext.hardware import load_device


def bert_like(seq: int = 128, heads: int = 2, dim: int = 64, bias_shape=(1, 1, 128, 128)):
    """BERT's export: Q, K, V [1, S, H, D] permuted, scaled, a mask added, softmax, a no-op cast."""
    hd = (1, seq, heads, dim)

    @I.ir_module
    class Module:
        @R.function
        def main(q4: R.Tensor(hd, "float16"), k4: R.Tensor(hd, "float16"), v4: R.Tensor(hd, "float16"),
                 mask: R.Tensor(bias_shape, "float16")):
            with R.dataflow():
                q = R.permute_dims(q4, axes=[0, 2, 1, 3])
                kt = R.permute_dims(k4, axes=[0, 2, 3, 1])
                s = R.matmul(q, kt)
                s2 = R.multiply(s, R.const(0.125, "float16"))
                s3 = R.add(s2, mask)
                p = R.nn.softmax(s3, axis=-1)
                p2 = R.astype(p, "float16")
                v = R.permute_dims(v4, axes=[0, 2, 1, 3])
                o = R.matmul(p2, v)
                out = R.permute_dims(o, axes=[0, 2, 1, 3])
                R.output(out)
            return out

    return Module


def llama_like(seq: int = 64, heads: int = 2, dim: int = 64, mask: np.ndarray | None = None):
    """Llama's export: Q, K, V already [1, H, S, D], K transposed by [0, 1, 3, 2], a constant mask."""
    hd = (1, heads, seq, dim)
    if mask is None:
        mask = np.triu(np.full((seq, seq), -65504.0), k=1).reshape(1, 1, seq, seq)
    const = relax.const(mask.astype("float16"))

    @I.ir_module
    class Module:
        @R.function
        def main(q: R.Tensor(hd, "float16"), k: R.Tensor(hd, "float16"), v: R.Tensor(hd, "float16")):
            with R.dataflow():
                kt = R.permute_dims(k, axes=[0, 1, 3, 2])
                s = R.matmul(q, kt)
                s2 = R.divide(s, R.const(8.0, "float16"))
                s3 = R.add(s2, const)
                p = R.nn.softmax(s3, axis=-1)
                o = R.matmul(p, v)
                out = R.permute_dims(o, axes=[0, 2, 1, 3])
                R.output(out)
            return out

    return Module


def constant_queries(seq: int = 64, heads: int = 2, dim: int = 64):
    """DETR's first decoder layer after import: its queries are constants (zeros plus the learned
    query embedding, projected and folded), the keys and values are not."""
    hd = (1, heads, seq, dim)
    const = relax.const(np.random.default_rng(0).standard_normal(hd).astype("float16"))

    @I.ir_module
    class Module:
        @R.function
        def main(k: R.Tensor(hd, "float16"), v: R.Tensor(hd, "float16")):
            with R.dataflow():
                kt = R.permute_dims(k, axes=[0, 1, 3, 2])
                s = R.matmul(const, kt)
                p = R.nn.softmax(s, axis=-1)
                o = R.matmul(p, v)
                out = R.permute_dims(o, axes=[0, 2, 1, 3])
                R.output(out)
            return out

    return Module


def _offloads(mod: tvm.IRModule) -> list[Offload]:
    part = partition_attention(mod)
    return [workload_from_function(f) for _, f in part.functions_items()
            if f.attrs is not None and f.attrs.get("Codegen") == "tvm_ext_cutlass"]


def test_bert_core_is_one_call_reading_the_projections_in_place():
    (off,) = _offloads(bert_like())
    wl = off.workload
    assert off.composite == "tvm_ext_cutlass.attention"
    assert sorted(off.roles) == ["bias", "k", "q", "v"]
    assert (wl.batch_heads, wl.m, wl.n, wl.d, wl.dv) == ((1, 2), 128, 128, 64, 64)
    assert wl.scale == 0.125 and not wl.causal and wl.bias_shape == (1, 1, 128, 128)
    # [1, S, H, D] read as [B, H, S, D]: batch, head and row strides
    assert wl.q.strides() == (128 * 2 * 64, 64, 2 * 64) and wl.k.strides() == wl.q.strides()
    assert wl.bias_strides() == (0, 0, 128)


def test_causal_constant_becomes_the_kernels_causal_mask():
    (off,) = _offloads(llama_like())
    wl = off.workload
    assert wl.causal and wl.bias_shape == () and "bias" not in off.roles
    assert wl.scale == 0.125
    assert wl.q.strides() == (2 * 64 * 64, 64 * 64, 64) and wl.k.axes == (0, 1, 2, 3)


def test_zero_constant_bias_adds_nothing():
    """DETR's export adds an all-zero key-padding mask: the core fuses without a bias."""
    (off,) = _offloads(llama_like(mask=np.zeros((1, 1, 64, 64))))
    assert not off.workload.causal and off.workload.bias_shape == () and "bias" not in off.roles


@pytest.mark.parametrize("why, module", [
    ("constant bias that is not a causal mask", llama_like(mask=np.full((1, 1, 64, 64), -1.0))),
    ("head dims", bert_like(dim=160, heads=1)),
    ("broadcastable", bert_like(bias_shape=(1, 1, 128, 1))),
    ("not 8-element aligned", bert_like(seq=77, bias_shape=(1, 1, 1, 77))),
    ("q operands are constants", constant_queries()),
])
def test_cores_the_kernel_cannot_take_stay_with_tvm_and_say_why(why, module):
    reasons: list = []
    part = partition_attention(module, reasons)
    assert not any(f.attrs is not None and f.attrs.get("Codegen") for _, f in part.functions_items())
    assert any(why in reason for _, reason in reasons), reasons


def test_reference_is_relax_on_the_filled_tensors():
    """The contract's reference reads Q, K, V through the workload's layouts; Relax on the CPU
    (the composite function itself, float32) must give the same outputs."""
    for module in (bert_like(seq=32, bias_shape=(1, 1, 32, 32)), llama_like(seq=32)):
        (off,) = _offloads(module)
        params = [filled(shape, i + 1) for i, shape in enumerate(off.param_shapes)]
        tensors = dict(zip(off.roles, params))
        main = module["main"]
        args = [tensors[r] for r in ("q", "k", "v")] + ([tensors["bias"]] if "bias" in tensors else [])
        ex = tvm.compile(module, target="llvm")
        vm = relax.VirtualMachine(ex, tvm.cpu())
        got = vm["main"](*[tvm.runtime.tensor(a.astype("float16")) for a in args]).numpy().astype(np.float64)
        assert len(main.params) == len(args)
        idx = np.arange(0, got.size, 7)
        ref = reference_at(off, tensors, idx)
        np.testing.assert_allclose(ref, got.reshape(-1)[idx], rtol=2e-2, atol=2e-2)


def test_gemm_padding_leaves_a_fusable_197_token_core_alone():
    mod = bert_like(seq=197, bias_shape=(1, 1, 197, 197))
    assert len(attention_products(mod["main"])) == 0      # bias rows of 197: not 8-element aligned
    assert "R.nn.pad" in pad_gemm_extents(mod)["main"].script()   # so its products are padded
    vit = _vit_like()
    assert len(attention_products(vit["main"])) == 2
    assert "R.nn.pad" not in pad_gemm_extents(vit)["main"].script()


def _vit_like():
    hd = (1, 197, 2, 64)

    @I.ir_module
    class Module:
        @R.function
        def main(q4: R.Tensor(hd, "float16"), k4: R.Tensor(hd, "float16"), v4: R.Tensor(hd, "float16")):
            with R.dataflow():
                q = R.permute_dims(q4, axes=[0, 2, 1, 3])
                kt = R.permute_dims(k4, axes=[0, 2, 3, 1])
                s = R.multiply(R.matmul(q, kt), R.const(0.125, "float16"))
                p = R.nn.softmax(s, axis=-1)
                o = R.matmul(p, R.permute_dims(v4, axes=[0, 2, 1, 3]))
                out = R.permute_dims(o, axes=[0, 2, 1, 3])
                R.output(out)
            return out

    return Module


def test_price_counts_both_products_and_streams_kv_per_query_block():
    op = Operand((1, 128, 12, 64), (0, 2, 1, 3))
    wl = AttentionWorkload(op, op, op, "float16", 0.125)
    cfg = KernelConfig("2x", (64, 64, 64), (4, 1, 1), (16, 8, 16), 2, swizzle=1)
    kd = describe(wl, cfg, load_device("h100"))
    assert kd.flops == 2 * 12 * 128 * 128 * 128
    assert kd.launch.grid == 2 * 12 and kd.launch.threads == 128
    tensor = 128 * 12 * 64 * 2
    assert kd.global_bytes == 2 * tensor + 2 * 2 * tensor     # Q and O once, K and V per query block
    causal = describe(dataclasses.replace(wl, causal=True), cfg, load_device("h100"))
    assert causal.flops == 2 * 12 * (64 + 128) * 64 * 128    # block 0 reads 64 keys, block 1 all 128


ARCH = "sm_80"


def _call(module, tag: str = "") -> ContractCall:
    (off,) = _offloads(module)
    off = dataclasses.replace(off, symbol=f"attention_{tag or id(module)}")
    cfg = KernelConfig("2x", (64, 64, 64), (4, 1, 1), (16, 8, 16), 2, swizzle=1)
    return ContractCall(off, kernel_for(off, cfg, ARCH))


def _row_bias_call(keys: int) -> ContractCall:
    """A [1, 1, 1, keys] bias whose rows the kernel reads in 8-element vectors, past their end."""
    op = Operand((1, keys, 2, 64), (0, 2, 1, 3))
    wl = AttentionWorkload(op, op, op, "float16", 0.125, bias_shape=(1, 1, 1, keys))
    off = Offload("attention_row_bias", "tvm_ext_cutlass.attention", wl, ("q", "k", "bias", "v"),
                  (op.shape, op.shape, wl.bias_shape, op.shape), op.shape)
    cfg = KernelConfig("2x", (64, 64, 64), (4, 1, 1), (16, 8, 16), 2, swizzle=1)
    return ContractCall(off, kernel_for(off, cfg, ARCH))


@pytest.fixture(scope="module")
def verdicts():
    right = {"bert": _call(bert_like(), "bert"), "causal": _call(llama_like(), "causal"),
             "vit": _call(_vit_like(), "vit")}
    faults = {
        "strides_swapped": edited(right["bert"], "swap", "arguments.q_strideH = int32_t(args->q_stride_h);",
                                   "arguments.q_strideH = int32_t(args->q_stride_m);"),
        "mask_ignored": edited(right["causal"], "nomask", "args->causal ? Op::Kernel::CausalFromTopLeft",
                                "false ? Op::Kernel::CausalFromTopLeft"),
        "misaligned_q": dataclasses.replace(right["vit"], misalign=(("p0", 2),)),
        "bias_row_overread": _row_bias_call(77),     # analyze() refuses it; the contract must too
    }
    calls = {**right, **faults}
    return dict(zip(calls, check_calls(list(calls.values()))))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert", "causal", "vit"])
def test_contract_accepts_the_seed_models_cores(verdicts, name):
    result = verdicts[name]
    assert result.ok and result.family == "attention", result.line()
    assert result.samples > 16


@pytest.mark.slow
@pytest.mark.parametrize("name, finding", [
    ("strides_swapped", "differ from the Relax reference"),
    ("mask_ignored", "differ from the Relax reference"),
    ("misaligned_q", "starts at address"),
    ("bias_row_overread", "bias is read up to element 79"),
])
def test_contract_catches_seeded_faults(verdicts, name, finding):
    result = verdicts[name]
    assert not result.ok and any(finding in f for f in result.findings), result.line()


@pytest.mark.slow
def test_offload_passes_export_one_library_call_per_core(tmp_path):
    """The pass list alone (partition, then RunCodegen): the core is one call in the exported library."""
    import os
    import subprocess
    import sys

    import tvm_ext.cutlass as tc
    from tvm_ext.toolchain import export_library

    target = tvm.target.Target({"kind": "cuda", "arch": "sm_80"})
    offloaded = tvm.transform.Sequential(tc.offload_passes(target))(bert_like())
    main = offloaded["main"].script()
    assert main.count("R.call_dps_packed") == 1 and "R.nn.softmax" not in main
    with target:
        ex = tvm.compile(offloaded, target, relax_pipeline=relax.get_pipeline("default_build"))
    path = tmp_path / "attention.so"
    export_library(ex, str(path))
    nm = subprocess.run(["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True).stdout
    symbol = "__tvm_ffi_fused_relax_permute_dims_relax_permute_dims_relax_matmul"
    assert symbol in nm and "tvm_ext_cutlass" in nm
    code = f"import tvm; m = tvm.runtime.load_module({str(path)!r}); print(m.kind)"
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "TVM_USE_RUNTIME_LIB": "1"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0 and result.stdout.split()[0] == "relax.VMExecutable", result.stderr[-2000:]


@pytest.mark.slow
def test_selection_takes_the_fused_core_where_it_prices_lower():
    """The cutlass generator offers the core beside the single GEMMs; the selection picks it."""
    from tvm_ext.inspect import inspect

    report = inspect(bert_like(seq=128, heads=12), "tvm_ext/h100", "cutlass")
    plans = [k.plan for k in report.launches if k.generator == "cutlass"]
    assert any("tvm_ext_cutlass.attention" in p for p in plans), plans
    assert not any("batch_matmul" in p for p in plans)


@pytest.mark.gpu
@pytest.mark.parametrize("module", ["bert", "causal"])
def test_numerics_on_gpu(module, tmp_path):
    """The built kernel against numpy (not run here: no GPU was lent when this was written)."""
    import tvm_ext.cutlass as tc

    mod = bert_like(seq=128, heads=4) if module == "bert" else llama_like(seq=128, heads=4)
    major, minor = tvm.cuda(0).compute_version.split(".")
    target = tvm.target.Target({"kind": "cuda", "arch": f"sm_{major}{minor}" + ("a" if major == "9" else "")})
    offloaded = tvm.transform.Sequential(tc.offload_passes(target))(mod)
    with target:
        ex = tvm.compile(offloaded, target, relax_pipeline=relax.get_pipeline("default_build"))
    dev = tvm.cuda(0)
    vm = relax.VirtualMachine(ex, dev)
    rng = np.random.default_rng(0)
    args = [(rng.standard_normal([int(d) for d in p.ty.shape.values]) * 0.5).astype("float16")
            for p in mod["main"].params]
    got = vm["main"](*(tvm.runtime.tensor(a, dev) for a in args)).numpy().astype(np.float64)
    ref_ex = tvm.compile(mod, target="llvm")
    ref = relax.VirtualMachine(ref_ex, tvm.cpu())["main"](*(tvm.runtime.tensor(a) for a in args)).numpy()
    np.testing.assert_allclose(got, ref.astype(np.float64), rtol=2e-2, atol=2e-2)
