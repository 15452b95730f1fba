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
