"""Korch's fission rules (tvm_ext.fission): exact rewrites, numerics against TVM, the umbrella pass."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import tvm
from tvm import relax
from tvm.script import relax as R

import tvm_ext.fission as F
from tvm_ext.errors import TvmExtError

LLVM = tvm.target.Target({"kind": "llvm"})
SQRT_HALF = math.sqrt(0.5)
SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


# -- helpers ----------------------------------------------------------------------------------

def _run(mod: tvm.IRModule, args: list[np.ndarray]) -> np.ndarray:
    """Build ``mod`` for the CPU and run ``main``; a tuple result gives its first item."""
    vm = relax.VirtualMachine(tvm.compile(mod, target=LLVM), tvm.cpu())
    out = vm["main"](*[tvm.runtime.tensor(a) for a in args])
    return (out if isinstance(out, tvm.runtime.Tensor) else out[0]).numpy()


def _module(make, shapes, dtype: str = "float32") -> tvm.IRModule:
    """``main(p0, p1, ...)`` returning ``make(p0, p1, ...)`` (item 0 when it is a tuple)."""
    bb = relax.BlockBuilder()
    params = [relax.Var(f"p{i}", relax.TensorType(shape, dtype)) for i, shape in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit(make(*params))
            if isinstance(out.ty, tvm.ir.TupleType):
                out = bb.emit(relax.TupleGetItem(out, 0))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    return bb.get()


def _ops(mod: tvm.IRModule) -> list[str]:
    """Names of the ops called in ``main``, in binding order."""
    return [b.value.op.name for block in mod["main"].body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op)]


# -- exact rewrites: Before -> Expected per rule ---------------------------------------------------

@tvm.script.ir_module
class SoftmaxBefore:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((2, 3, 4), "float32"):
        with R.dataflow():
            y = R.nn.softmax(x, axis=1)
            R.output(y)
        return y


@tvm.script.ir_module
class SoftmaxExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((2, 3, 4), "float32"):
        with R.dataflow():
            m = R.max(x, axis=[1], keepdims=True)
            d = R.subtract(x, m)
            e = R.exp(d)
            s = R.sum(e, axis=[1], keepdims=True)
            y = R.divide(e, s)
            R.output(y)
        return y


@tvm.script.ir_module
class SoftmaxSymbolicBefore:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32")) -> R.Tensor(("n", 8), "float32"):
        with R.dataflow():
            y = R.nn.softmax(x, axis=-1)
            R.output(y)
        return y


@tvm.script.ir_module
class SoftmaxSymbolicExpected:
    @R.function
    def main(x: R.Tensor(("n", 8), "float32")) -> R.Tensor(("n", 8), "float32"):
        with R.dataflow():
            m = R.max(x, axis=[1], keepdims=True)
            d = R.subtract(x, m)
            e = R.exp(d)
            s = R.sum(e, axis=[1], keepdims=True)
            y = R.divide(e, s)
            R.output(y)
        return y


@tvm.script.ir_module
class LogSoftmaxBefore:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((2, 3, 4), "float32"):
        with R.dataflow():
            y = R.nn.log_softmax(x, axis=-1)
            R.output(y)
        return y


@tvm.script.ir_module
class LogSoftmaxExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((2, 3, 4), "float32"):
        with R.dataflow():
            m = R.max(x, axis=[2], keepdims=True)
            d = R.subtract(x, m)
            e = R.exp(d)
            s = R.sum(e, axis=[2], keepdims=True)
            log_s = R.log(s)
            y = R.subtract(d, log_s)
            R.output(y)
        return y


@tvm.script.ir_module
class LayerNormBefore:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32"), g: R.Tensor((3,), "float32"),
             b: R.Tensor((3,), "float32")) -> R.Tensor((2, 3, 4), "float32"):
        with R.dataflow():
            y = R.nn.layer_norm(x, g, b, axes=[1], epsilon=1e-3)
            R.output(y)
        return y


@tvm.script.ir_module
class LayerNormExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32"), g: R.Tensor((3,), "float32"),
             b: R.Tensor((3,), "float32")) -> R.Tensor((2, 3, 4), "float32"):
        with R.dataflow():
            mean = R.mean(x, axis=[1], keepdims=True)
            c = R.subtract(x, mean)
            sq = R.multiply(c, c)
            var = R.mean(sq, axis=[1], keepdims=True)
            var_eps = R.add(var, R.const(1e-3, "float32"))
            rstd = R.rsqrt(var_eps)
            norm = R.multiply(c, rstd)
            g2 = R.expand_dims(g, axis=[1])
            scaled = R.multiply(norm, g2)
            b2 = R.expand_dims(b, axis=[1])
            y = R.add(scaled, b2)
            R.output(y)
        return y


@tvm.script.ir_module
class LayerNormFp16Before:
    @R.function
    def main(x: R.Tensor((4, 8), "float16"), g: R.Tensor((8,), "float16"),
             b: R.Tensor((8,), "float16")) -> R.Tensor((4, 8), "float16"):
        with R.dataflow():
            y = R.nn.layer_norm(x, g, b, axes=[-1], center=False)
            R.output(y)
        return y


@tvm.script.ir_module
class LayerNormFp16Expected:
    @R.function
    def main(x: R.Tensor((4, 8), "float16"), g: R.Tensor((8,), "float16"),
             b: R.Tensor((8,), "float16")) -> R.Tensor((4, 8), "float16"):
        with R.dataflow():
            x32 = R.astype(x, "float32")
            mean = R.mean(x32, axis=[1], keepdims=True)
            c = R.subtract(x32, mean)
            sq = R.multiply(c, c)
            var = R.mean(sq, axis=[1], keepdims=True)
            var_eps = R.add(var, R.const(1e-5, "float32"))
            rstd = R.rsqrt(var_eps)
            norm32 = R.multiply(c, rstd)
            norm = R.astype(norm32, "float16")
            y = R.multiply(norm, g)
            R.output(y)
        return y


@tvm.script.ir_module
class RmsNormBefore:
    @R.function
    def main(x: R.Tensor((2, 3, 8), "float32"), w: R.Tensor((8,), "float32")) -> R.Tensor((2, 3, 8), "float32"):
        with R.dataflow():
            y = R.nn.rms_norm(x, w, axes=[-1], epsilon=1e-6)
            R.output(y)
        return y


@tvm.script.ir_module
class RmsNormExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 8), "float32"), w: R.Tensor((8,), "float32")) -> R.Tensor((2, 3, 8), "float32"):
        with R.dataflow():
            sq = R.multiply(x, x)
            ms = R.mean(sq, axis=[2], keepdims=True)
            ms_eps = R.add(ms, R.const(1e-6, "float32"))
            rstd = R.rsqrt(ms_eps)
            norm = R.multiply(x, rstd)
            y = R.multiply(norm, w)
            R.output(y)
        return y


@tvm.script.ir_module
class GroupNormBefore:
    @R.function
    def main(x: R.Tensor((2, 4, 5), "float32"), g: R.Tensor((4,), "float32"),
             b: R.Tensor((4,), "float32")) -> R.Tensor((2, 4, 5), "float32"):
        with R.dataflow():
            y = R.nn.group_norm(x, g, b, num_groups=2, channel_axis=1, axes=[2])
            R.output(y)
        return y


@tvm.script.ir_module
class GroupNormExpected:
    @R.function
    def main(x: R.Tensor((2, 4, 5), "float32"), g: R.Tensor((4,), "float32"),
             b: R.Tensor((4,), "float32")) -> R.Tensor((2, 4, 5), "float32"):
        with R.dataflow():
            xg = R.reshape(x, R.shape([2, 2, 2, 5]))
            mean = R.mean(xg, axis=[2, 3], keepdims=True)
            c = R.subtract(xg, mean)
            sq = R.multiply(c, c)
            var = R.mean(sq, axis=[2, 3], keepdims=True)
            var_eps = R.add(var, R.const(1e-5, "float32"))
            rstd = R.rsqrt(var_eps)
            norm_g = R.multiply(c, rstd)
            norm = R.reshape(norm_g, R.shape([2, 4, 5]))
            g2 = R.expand_dims(g, axis=[1])
            scaled = R.multiply(norm, g2)
            b2 = R.expand_dims(b, axis=[1])
            y = R.add(scaled, b2)
            R.output(y)
        return y


@tvm.script.ir_module
class InstanceNormBefore:
    @R.function
    def main(x: R.Tensor((2, 3, 4, 4), "float32"), g: R.Tensor((3,), "float32"),
             b: R.Tensor((3,), "float32")) -> R.Tensor((2, 3, 4, 4), "float32"):
        with R.dataflow():
            y = R.nn.instance_norm(x, g, b, channel_axis=1, axes=[2, 3], scale=False)
            R.output(y)
        return y


@tvm.script.ir_module
class InstanceNormExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 4, 4), "float32"), g: R.Tensor((3,), "float32"),
             b: R.Tensor((3,), "float32")) -> R.Tensor((2, 3, 4, 4), "float32"):
        with R.dataflow():
            mean = R.mean(x, axis=[2, 3], keepdims=True)
            c = R.subtract(x, mean)
            sq = R.multiply(c, c)
            var = R.mean(sq, axis=[2, 3], keepdims=True)
            var_eps = R.add(var, R.const(1e-5, "float32"))
            rstd = R.rsqrt(var_eps)
            norm = R.multiply(c, rstd)
            b2 = R.expand_dims(b, axis=[1, 2])
            y = R.add(norm, b2)
            R.output(y)
        return y


@tvm.script.ir_module
class BatchNormBefore:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32"), g: R.Tensor((3,), "float32"), b: R.Tensor((3,), "float32"),
             m: R.Tensor((3,), "float32"), v: R.Tensor((3,), "float32")) -> R.Tensor((2, 3, 4), "float32"):
        with R.dataflow():
            bn = R.nn.batch_norm(x, g, b, m, v, axis=1, epsilon=1e-3, training=False)
            y = bn[0]
            R.output(y)
        return y


@tvm.script.ir_module
class BatchNormExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32"), g: R.Tensor((3,), "float32"), b: R.Tensor((3,), "float32"),
             m: R.Tensor((3,), "float32"), v: R.Tensor((3,), "float32")) -> R.Tensor((2, 3, 4), "float32"):
        with R.dataflow():
            v_eps = R.add(v, R.const(1e-3, "float32"))
            std = R.sqrt(v_eps)
            scale = R.divide(g, std)
            m_scaled = R.multiply(m, scale)
            shift = R.subtract(b, m_scaled)
            scale2 = R.expand_dims(scale, axis=[1])
            scaled = R.multiply(x, scale2)
            shift2 = R.expand_dims(shift, axis=[1])
            out = R.add(scaled, shift2)
            bn = (out, m, v)
            y = bn[0]
            R.output(y)
        return y


@tvm.script.ir_module
class VarianceBefore:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tuple(R.Tensor((2,), "float32"), R.Tensor((1, 1, 1), "float32")):
        with R.dataflow():
            var = R.variance(x, axis=[1, 2], keepdims=False)
            std = R.std(x, keepdims=True)
            out = (var, std)
            R.output(out)
        return out


@tvm.script.ir_module
class VarianceExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tuple(R.Tensor((2,), "float32"), R.Tensor((1, 1, 1), "float32")):
        with R.dataflow():
            mean = R.mean(x, axis=[1, 2], keepdims=True)
            c = R.subtract(x, mean)
            sq = R.multiply(c, c)
            var = R.mean(sq, axis=[1, 2], keepdims=False)
            mean_all = R.mean(x, axis=[0, 1, 2], keepdims=True)
            c_all = R.subtract(x, mean_all)
            sq_all = R.multiply(c_all, c_all)
            var_all = R.mean(sq_all, axis=[0, 1, 2], keepdims=True)
            std = R.sqrt(var_all)
            out = (var, std)
            R.output(out)
        return out


@tvm.script.ir_module
class ActivationsBefore:
    @R.function
    def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
        with R.dataflow():
            a = R.nn.gelu(x)
            b = R.nn.gelu_tanh(a)
            y = R.nn.silu(b)
            R.output(y)
        return y


@tvm.script.ir_module
class ActivationsExpected:
    @R.function
    def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
        with R.dataflow():
            # gelu: x * (erf(x / sqrt(2)) * 0.5 + 0.5)
            xs = R.multiply(x, R.const(SQRT_HALF, "float32"))
            erf = R.erf(xs)
            half_erf = R.multiply(erf, R.const(0.5, "float32"))
            cdf = R.add(half_erf, R.const(0.5, "float32"))
            a = R.multiply(x, cdf)
            # gelu_tanh: (a * 0.5) * (1 + tanh(a * (1 + 0.044715 a^2) * sqrt(2 / pi)))
            a2 = R.multiply(a, a)
            a2c = R.multiply(a2, R.const(0.044715, "float32"))
            poly = R.add(a2c, R.const(1.0, "float32"))
            inner = R.multiply(a, poly)
            arg = R.multiply(inner, R.const(SQRT_2_OVER_PI, "float32"))
            th = R.tanh(arg)
            one_plus = R.add(th, R.const(1.0, "float32"))
            half_a = R.multiply(a, R.const(0.5, "float32"))
            b = R.multiply(half_a, one_plus)
            # silu: b * sigmoid(b)
            sig = R.sigmoid(b)
            y = R.multiply(b, sig)
            R.output(y)
        return y


@tvm.script.ir_module
class AttentionBefore:
    @R.function
    def main(q: R.Tensor((2, 4, 3, 8), "float32"), k: R.Tensor((2, 6, 3, 8), "float32"),
             v: R.Tensor((2, 6, 3, 5), "float32"), bias: R.Tensor((2, 1, 4, 6), "float32"),
             ) -> R.Tuple(R.Tensor((2, 4, 3, 5), "float32"), R.Tensor((2, 4, 3, 5), "float32")):
        with R.dataflow():
            plain = R.nn.attention(q, k, v)
            masked = R.nn.attention(q, k, v, bias, scale=0.25, causal_mask="TopLeft")
            out = (plain, masked)
            R.output(out)
        return out


@tvm.script.ir_module
class AttentionExpected:
    @R.function
    def main(q: R.Tensor((2, 4, 3, 8), "float32"), k: R.Tensor((2, 6, 3, 8), "float32"),
             v: R.Tensor((2, 6, 3, 5), "float32"), bias: R.Tensor((2, 1, 4, 6), "float32"),
             ) -> R.Tuple(R.Tensor((2, 4, 3, 5), "float32"), R.Tensor((2, 4, 3, 5), "float32")):
        with R.dataflow():
            # default scale 1 / sqrt(8), no mask
            qt = R.permute_dims(q, axes=[0, 2, 1, 3])
            kt = R.permute_dims(k, axes=[0, 2, 3, 1])
            s = R.matmul(qt, kt)
            s_scaled = R.divide(s, R.const(math.sqrt(8), "float32"))
            m = R.max(s_scaled, axis=[3], keepdims=True)
            d = R.subtract(s_scaled, m)
            e = R.exp(d)
            total = R.sum(e, axis=[3], keepdims=True)
            p = R.divide(e, total)
            vt = R.permute_dims(v, axes=[0, 2, 1, 3])
            o = R.matmul(p, vt)
            plain = R.permute_dims(o, axes=[0, 2, 1, 3])
            # explicit scale, bias, TopLeft causal mask
            qt1 = R.permute_dims(q, axes=[0, 2, 1, 3])
            kt1 = R.permute_dims(k, axes=[0, 2, 3, 1])
            s1 = R.matmul(qt1, kt1)
            s1_scaled = R.multiply(s1, R.const(0.25, "float32"))
            s1_bias = R.add(s1_scaled, bias)
            s1_masked = R.tril(s1_bias, 0)
            m1 = R.max(s1_masked, axis=[3], keepdims=True)
            d1 = R.subtract(s1_masked, m1)
            e1 = R.exp(d1)
            e1_masked = R.tril(e1, 0)
            total1 = R.sum(e1_masked, axis=[3], keepdims=True)
            p1 = R.divide(e1_masked, total1)
            vt1 = R.permute_dims(v, axes=[0, 2, 1, 3])
            o1 = R.matmul(p1, vt1)
            masked = R.permute_dims(o1, axes=[0, 2, 1, 3])
            out = (plain, masked)
            R.output(out)
        return out


ONES_4x1 = np.ones((4, 1), "float32")


@tvm.script.ir_module
class SumToMatmulExpected:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((2, 3, 4), "float32"):
        with R.dataflow():
            m = R.max(x, axis=[1], keepdims=True)
            d = R.subtract(x, m)
            e = R.exp(d)
            s = R.sum(e, axis=[1], keepdims=True)  # not the last axis: stays a reduction
            y = R.divide(e, s)
            m2 = R.max(y, axis=[2], keepdims=True)
            d2 = R.subtract(y, m2)
            e2 = R.exp(d2)
            s2 = R.matmul(e2, R.const(ONES_4x1, "float32"))
            z = R.divide(e2, s2)
            R.output(z)
        return z


@tvm.script.ir_module
class TwoSoftmaxes:
    @R.function
    def main(x: R.Tensor((2, 3, 4), "float32")) -> R.Tensor((2, 3, 4), "float32"):
        with R.dataflow():
            y = R.nn.softmax(x, axis=1)
            z = R.nn.softmax(y, axis=-1)
            R.output(z)
        return z


EXACT = {
    "softmax": (F.FissionSoftmax, SoftmaxBefore, SoftmaxExpected),
    "softmax_symbolic": (F.FissionSoftmax, SoftmaxSymbolicBefore, SoftmaxSymbolicExpected),
    "log_softmax": (F.FissionLogSoftmax, LogSoftmaxBefore, LogSoftmaxExpected),
    "layer_norm": (F.FissionLayerNorm, LayerNormBefore, LayerNormExpected),
    "layer_norm_fp16_no_center": (F.FissionLayerNorm, LayerNormFp16Before, LayerNormFp16Expected),
    "rms_norm": (F.FissionRmsNorm, RmsNormBefore, RmsNormExpected),
    "group_norm": (F.FissionGroupNorm, GroupNormBefore, GroupNormExpected),
    "instance_norm_no_scale": (F.FissionInstanceNorm, InstanceNormBefore, InstanceNormExpected),
    "batch_norm": (F.FissionBatchNorm, BatchNormBefore, BatchNormExpected),
    "variance_std": (F.FissionVariance, VarianceBefore, VarianceExpected),
    "gelu_gelu_tanh_silu": (lambda: tvm.transform.Sequential([F.FissionGelu(), F.FissionGeluTanh(), F.FissionSilu()]),
                            ActivationsBefore, ActivationsExpected),
    "attention": (F.FissionAttention, AttentionBefore, AttentionExpected),
    "sum_to_matmul": (lambda: F.Fission(["softmax"], algebraic=True), TwoSoftmaxes, SumToMatmulExpected),
}


@pytest.mark.parametrize("case", list(EXACT))
def test_rule_rewrites_exactly(case):
    make_pass, before, expected = EXACT[case]
    tvm.ir.assert_structural_equal(make_pass()(before), expected)


# -- numerics: the fissioned module against the original, both built by TVM for the CPU ----------

def _layer_norm_ref(x, g, b, axes, eps, center, scale):
    """numpy layer norm honouring center / scale (TVM's legalization applies beta and gamma always)."""
    mean = x.mean(axis=tuple(axes), keepdims=True)
    out = (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=tuple(axes), keepdims=True) + eps)
    shape = [x.shape[a] if a in axes else 1 for a in range(x.ndim)]
    if scale:
        out = out * g.reshape(shape)
    if center:
        out = out + b.reshape(shape)
    return out


#: (id, rule, build the call from params, param shapes, numpy reference or None = TVM's build of the original)
NUMERIC_CASES = [
    ("softmax-axis1", "softmax", lambda x: relax.op.nn.softmax(x, 1), [(2, 5, 7)], None),
    ("softmax-last", "softmax", lambda x: relax.op.nn.softmax(x, -1), [(3, 16)], None),
    ("softmax-axis0", "softmax", lambda x: relax.op.nn.softmax(x, 0), [(4, 3, 2, 5)], None),
    ("log_softmax-last", "log_softmax", lambda x: relax.op.nn.log_softmax(x, -1), [(3, 16)], None),
    ("log_softmax-axis1", "log_softmax", lambda x: relax.op.nn.log_softmax(x, 1), [(2, 5, 7)], None),
    ("layer_norm-last", "layer_norm", lambda x, g, b: relax.op.nn.layer_norm(x, g, b, [-1]),
     [(2, 5, 16), (16,), (16,)], None),
    ("layer_norm-middle", "layer_norm", lambda x, g, b: relax.op.nn.layer_norm(x, g, b, [1], 1e-3),
     [(2, 5, 7), (5,), (5,)], None),
    ("layer_norm-two-axes", "layer_norm", lambda x, g, b: relax.op.nn.layer_norm(x, g, b, [2, 3]),
     [(2, 3, 4, 5), (4, 5), (4, 5)], None),
    ("layer_norm-no-center", "layer_norm",
     lambda x, g, b: relax.op.nn.layer_norm(x, g, b, [-1], 1e-5, center=False),
     [(3, 8), (8,), (8,)], lambda x, g, b: _layer_norm_ref(x, g, b, [1], 1e-5, False, True)),
    ("layer_norm-no-scale", "layer_norm",
     lambda x, g, b: relax.op.nn.layer_norm(x, g, b, [1, 2], 1e-5, scale=False),
     [(2, 3, 4), (3, 4), (3, 4)], lambda x, g, b: _layer_norm_ref(x, g, b, [1, 2], 1e-5, True, False)),
    ("rms_norm-last", "rms_norm", lambda x, w: relax.op.nn.rms_norm(x, w, [-1]), [(2, 5, 16), (16,)], None),
    ("rms_norm-two-axes", "rms_norm", lambda x, w: relax.op.nn.rms_norm(x, w, [1, 2], 1e-3),
     [(2, 4, 6), (4, 6)], None),
    ("group_norm-nchw", "group_norm", lambda x, g, b: relax.op.nn.group_norm(x, g, b, 2, 1, [2, 3]),
     [(2, 4, 3, 5), (4,), (4,)], None),
    ("group_norm-channel-last", "group_norm", lambda x, g, b: relax.op.nn.group_norm(x, g, b, 3, -1, [1]),
     [(2, 5, 6), (6,), (6,)], None),
    ("group_norm-one-per-group", "group_norm", lambda x, g, b: relax.op.nn.group_norm(x, g, b, 6, 1, [2]),
     [(2, 6, 8), (6,), (6,)], None),
    ("instance_norm-nchw", "instance_norm", lambda x, g, b: relax.op.nn.instance_norm(x, g, b, 1, [2, 3]),
     [(2, 4, 3, 5), (4,), (4,)], None),
    # TVM's legalization fails on channel_axis=-1 (IndexError in topi): numpy reference
    ("instance_norm-channel-last", "instance_norm",
     lambda x, g, b: relax.op.nn.instance_norm(x, g, b, -1, [1], 1e-3), [(2, 5, 3), (3,), (3,)],
     lambda x, g, b: _layer_norm_ref(x, np.ones(5, "float32"), np.zeros(5, "float32"), [1], 1e-3, False, False)
     * g + b),
    ("batch_norm-nchw", "batch_norm",
     lambda x, g, b, m, v: relax.op.nn.batch_norm(x, g, b, m, v, 1, training=False),
     [(2, 4, 3, 5), (4,), (4,), (4,), (4,)], None),
    ("batch_norm-2d", "batch_norm",
     lambda x, g, b, m, v: relax.op.nn.batch_norm(x, g, b, m, v, 1, 1e-3, training=False),
     [(3, 6), (6,), (6,), (6,), (6,)], None),
    ("batch_norm-last-no-center-no-scale", "batch_norm",
     lambda x, g, b, m, v: relax.op.nn.batch_norm(x, g, b, m, v, 2, center=False, scale=False, training=False),
     [(2, 3, 4), (4,), (4,), (4,), (4,)], None),
    ("variance", "variance", lambda x: relax.op.variance(x, [1, 2]), [(2, 4, 3, 5)], None),
    ("variance-keepdims", "variance", lambda x: relax.op.variance(x, [-1], keepdims=True), [(3, 16)], None),
    ("std-all", "variance", lambda x: relax.op.std(x, None, keepdims=True), [(2, 4, 3)], None),
    ("gelu", "gelu", relax.op.nn.gelu, [(2, 5, 7)], None),
    ("gelu-1d", "gelu", relax.op.nn.gelu, [(64,)], None),
    ("gelu_tanh", "gelu_tanh", relax.op.nn.gelu_tanh, [(2, 5, 7)], None),
    ("gelu_tanh-1d", "gelu_tanh", relax.op.nn.gelu_tanh, [(64,)], None),
    ("silu", "silu", relax.op.nn.silu, [(2, 5, 7)], None),
    ("silu-1d", "silu", relax.op.nn.silu, [(64,)], None),
    ("attention", "attention", relax.op.nn.attention, [(2, 4, 3, 8), (2, 6, 3, 8), (2, 6, 3, 5)], None),
    ("attention-bias-scale-topleft", "attention",
     lambda q, k, v, b: relax.op.nn.attention(q, k, v, b, scale=0.3, causal_mask="TopLeft"),
     [(2, 4, 3, 8), (2, 6, 3, 8), (2, 6, 3, 5), (2, 1, 4, 6)], None),
    ("attention-bottomright-long-q", "attention",
     lambda q, k, v: relax.op.nn.attention(q, k, v, causal_mask="BottomRight"),
     [(1, 6, 2, 8), (1, 4, 2, 8), (1, 4, 2, 4)], None),
    ("attention-bottomright-long-kv", "attention",
     lambda q, k, v, b: relax.op.nn.attention(q, k, v, b, causal_mask="BottomRight"),
     [(1, 3, 2, 8), (1, 5, 2, 8), (1, 5, 2, 4), (1, 2, 3, 5)], None),
]


@pytest.mark.parametrize("case", NUMERIC_CASES, ids=[c[0] for c in NUMERIC_CASES])
def test_rule_numerics(case):
    _, rule, make, shapes, reference = case
    before = _module(make, shapes)
    after = F.get_fission_rule(rule)()(before)
    assert not set(_ops(before)) & set(_ops(after)), "the rule left its op in place"
    rng = np.random.default_rng(len(case[0]))
    args = [rng.standard_normal(shape).astype("float32") * 2 for shape in shapes]
    if rule == "batch_norm":
        args[4] = np.abs(args[4]) + 0.1  # a variance
    expected = reference(*args) if reference else _run(before, args)
    np.testing.assert_allclose(_run(after, args), expected, rtol=1e-5, atol=1e-5)


def test_sum_to_matmul_numerics(caplog):
    before = _module(lambda x: relax.op.nn.softmax(relax.op.nn.softmax(x, 1), -1), [(3, 5, 16)])
    with caplog.at_level(logging.DEBUG, logger="tvm_ext.fission"):
        after = F.Fission(["softmax"], algebraic=True)(before)
    assert _ops(after).count("relax.sum") == 1 and "relax.matmul" in _ops(after)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # the axis-1 sum is skipped quietly
    assert "sums over axes [1]" in caplog.text
    x = np.random.default_rng(1).standard_normal((3, 5, 16)).astype("float32")
    np.testing.assert_allclose(_run(after, [x]), _run(before, [x]), rtol=1e-5, atol=1e-5)


def test_fp16_norms_follow_tvm():
    """float16 statistics run in float32, as TVM's kernels: the results agree to an fp16 ulp or two."""
    rng = np.random.default_rng(2)
    for make, shapes in [(lambda x, g, b: relax.op.nn.layer_norm(x, g, b, [-1]), [(4, 64), (64,), (64,)]),
                         (lambda x, w: relax.op.nn.rms_norm(x, w, [-1]), [(4, 64), (64,)])]:
        before = _module(make, shapes, "float16")
        args = [rng.standard_normal(shape).astype("float16") for shape in shapes]
        after = F.Fission()(before)
        assert "relax.astype" in _ops(after)
        # |y| < 8 here; an fp16 ulp at 4..8 is 2**-8: allow 2 ulps
        np.testing.assert_allclose(_run(after, args).astype("float32"), _run(before, args).astype("float32"),
                                   rtol=0, atol=2 ** -7)


def test_onnx_instance_norm_is_fissioned():
    """The ONNX importer makes InstanceNormalization mean / variance / elementwise ops; Fission splits the variance."""
    from onnx import TensorProto, helper, numpy_helper

    from tvm_ext.frontend import from_onnx

    rng = np.random.default_rng(3)
    graph = helper.make_graph(
        [helper.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-3)], "inorm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3, 5, 5])],
        initializer=[numpy_helper.from_array(rng.standard_normal(3).astype("float32"), name) for name in "sb"])
    before = from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    assert "relax.variance" in _ops(before)
    after = F.Fission()(before)
    assert "relax.variance" not in _ops(after)
    x = rng.standard_normal((2, 3, 5, 5)).astype("float32")
    np.testing.assert_allclose(_run(after, [x]), _run(before, [x]), rtol=1e-5, atol=1e-5)


# -- what a rule cannot handle is left unchanged and logged ----------------------------------------

def _attention_symbolic_head():
    h = tvm.tirx.Var("h", "int64")
    return _module(relax.op.nn.attention, [(1, 4, 2, h)] * 3)


def _group_norm_symbolic_channels():
    c = tvm.tirx.Var("c", "int64")
    return _module(lambda x, g, b: relax.op.nn.group_norm(x, g, b, 2, 1, [2]), [(2, c, 8), (c,), (c,)])


UNSUPPORTED = {
    "sliding-window attention": (lambda: _module(lambda q, k, v: relax.op.nn.attention(q, k, v, window_size=2),
                                                 [(1, 4, 2, 8)] * 3), "sliding-window"),
    "symbolic head dim": (_attention_symbolic_head, "head dim (no explicit scale) is symbolic"),
    "layer_norm axes out of order": (
        lambda: _module(lambda x, g, b: relax.op.nn.layer_norm(x, g, b, [2, 1]), [(2, 3, 4), (4, 3), (4, 3)]),
        "not in increasing order"),
    "training batch_norm": (
        lambda: _module(lambda x, g, b, m, v: relax.op.nn.batch_norm(x, g, b, m, v, 1, training=True),
                        [(2, 3), (3,), (3,), (3,), (3,)]), "training=True"),
    "symbolic group_norm channels": (_group_norm_symbolic_channels, "channel count is symbolic"),
    "unknown rank": (lambda: _module(relax.op.nn.softmax, [None]), "known rank"),
}


@pytest.mark.parametrize("case", list(UNSUPPORTED))
def test_unsupported_is_left_unchanged_and_logged(case, caplog):
    make_module, reason = UNSUPPORTED[case]
    before = make_module()
    with caplog.at_level(logging.WARNING, logger="tvm_ext.fission"):
        after = F.Fission()(before)
    tvm.ir.assert_structural_equal(after, before)
    assert any(reason in rec.getMessage() for rec in caplog.records), caplog.text


@tvm.script.ir_module
class LibraryOwned:
    @R.function
    def offloaded(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
        R.func_attr({"Codegen": "cutlass", "global_symbol": "offloaded"})
        with R.dataflow():
            y = R.nn.softmax(x)
            R.output(y)
        return y

    @R.function
    def main(x: R.Tensor((2, 8), "float32")) -> R.Tensor((2, 8), "float32"):
        cls = LibraryOwned
        y = cls.offloaded(x)
        return y


def test_library_owned_functions_stay_whole():
    tvm.ir.assert_structural_equal(F.Fission()(LibraryOwned), LibraryOwned)


# -- the umbrella pass and the registry ---------------------------------------------------------------

@tvm.script.ir_module
class Mixed:
    @R.function
    def main(x: R.Tensor((2, 4, 3, 8), "float32"), g: R.Tensor((8,), "float32"), b: R.Tensor((8,), "float32"),
             m: R.Tensor((4,), "float32"), v: R.Tensor((4,), "float32")) -> R.Tensor((2, 4, 3, 8), "float32"):
        with R.dataflow():
            att = R.nn.attention(x, x, x)
            ln = R.nn.layer_norm(att, g, b, axes=[-1])
            act = R.nn.gelu(ln)
            sw = R.nn.silu(act)
            rms = R.nn.rms_norm(sw, g, axes=[-1])
            sm = R.nn.softmax(rms, axis=2)
            bn = R.nn.batch_norm(sm, m, m, m, v, axis=1, training=True)  # unsupported: batch statistics
            y = bn[0]
            R.output(y)
        return y


def test_umbrella_applies_every_rule_and_leaves_the_unsupported_call(caplog):
    with caplog.at_level(logging.WARNING, logger="tvm_ext.fission"):
        after = F.Fission()(Mixed)
    high_level = {"relax.nn.attention", "relax.nn.layer_norm", "relax.nn.gelu", "relax.nn.silu",
                  "relax.nn.rms_norm", "relax.nn.softmax"}
    ops = _ops(after)
    assert not high_level & set(ops)
    assert ops.count("relax.nn.batch_norm") == 1 and "training=True" in caplog.text
    bn_before = Mixed["main"].body.blocks[0].bindings[6].value
    bn_after = next(b.value for b in after["main"].body.blocks[0].bindings if b.var.name == "bn")
    tvm.ir.assert_structural_equal(bn_after.attrs, bn_before.attrs)
    rng = np.random.default_rng(4)
    args = [rng.standard_normal([int(d) for d in p.ty.shape.values]).astype("float32") for p in Mixed["main"].params]
    args[4] = np.abs(args[4]) + 0.1
    np.testing.assert_allclose(_run(after, args), _run(Mixed, args), rtol=1e-5, atol=1e-5)


def test_umbrella_selection_and_the_registry():
    assert F.list_fission_rules() == ["softmax", "log_softmax", "layer_norm", "rms_norm", "group_norm",
                                      "instance_norm", "batch_norm", "variance", "gelu", "gelu_tanh", "silu",
                                      "attention"]
    assert F.get_fission_rule("softmax") is F.FissionSoftmax
    only_gelu = set(_ops(F.Fission(["gelu"])(Mixed)))
    assert "relax.nn.gelu" not in only_gelu and {"relax.nn.softmax", "relax.nn.layer_norm"} <= only_gelu
    tvm.ir.assert_structural_equal(F.Fission("softmax")(SoftmaxBefore), SoftmaxExpected)
    tvm.ir.assert_structural_equal(F.Fission([])(Mixed), Mixed)
    with pytest.raises(F.UnknownFissionRuleError, match="unknown fission rule 'softmx'; known rules: softmax"):
        F.Fission(["softmx"])
    assert issubclass(F.UnknownFissionRuleError, TvmExtError)
    with pytest.raises(ValueError, match="already registered"):
        F.register_fission_rule("softmax", F.FissionGelu)


def test_rule_passes_can_be_disabled_by_name():
    with tvm.transform.PassContext(disabled_pass=["tvm_ext.FissionSoftmax"]):
        after = F.Fission()(SoftmaxBefore)
    tvm.ir.assert_structural_equal(after, SoftmaxBefore)
