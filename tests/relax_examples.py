"""Relax modules several test files share (not a test module: no ``test_`` prefix)."""
from __future__ import annotations

from tvm.script import ir as I
from tvm.script import relax as R


@I.ir_module
class Attention:
    """Q, K, V projections of one input, attention core, residual add."""

    @R.function
    def main(x: R.Tensor((8, 16), "float32"), wq: R.Tensor((16, 16), "float32"), wk: R.Tensor((16, 16), "float32"),
             wv: R.Tensor((16, 16), "float32")):
        with R.dataflow():
            q = R.matmul(x, wq)
            k = R.matmul(x, wk)
            v = R.matmul(x, wv)
            s = R.matmul(q, R.permute_dims(k))
            o = R.matmul(s, v)
            res = R.add(o, x)
            R.output(res)
        return res


@I.ir_module
class WelderExample:
    """Welder §2: A[98304x64] x B[64x128], then softmax over the last axis (float32)."""

    @R.function
    def main(A: R.Tensor((98304, 64), "float32"), B: R.Tensor((64, 128), "float32")) -> R.Tensor((98304, 128), "float32"):
        with R.dataflow():
            C = R.matmul(A, B)
            D = R.nn.softmax(C, axis=-1)
            R.output(D)
        return D
