"""Connected groups less the epilogues of GEMMs outside them (tvm_ext.tilegraph.epilogues)."""
from __future__ import annotations

import numpy as np
from tvm import relax

from tvm_ext.inspect import inspect
from tvm_ext.testing.oracle import run_cpu

LAYER_NORM = ("cast", "mean", "cast1", "subtract", "power", "cast", "mean", "cast1", "add1", "tir_sqrt", "divide")


def gemm_layer_norm_gemm(rows: int = 128, width: int = 256) -> relax.Function:
    """``h = x @ w + b``; a layer norm of ``h`` in pieces (NAFNet's LayerNorm2d, float32 means);
    ``out = norm(h) @ w + h``: the biased GEMM output is read again as a residual."""
    bb = relax.BlockBuilder()
    t = relax.TensorType
    x = relax.Var("x", t((rows, width), "float32"))
    w, b = relax.Var("w", t((width, width), "float32")), relax.Var("b", t((width,), "float32"))
    op = relax.op
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            h = bb.emit(op.add(op.matmul(x, w), b))
            mean = bb.emit(op.astype(op.mean(op.astype(h, "float32"), axis=[1], keepdims=True), "float32"))
            d = bb.emit(op.subtract(h, mean))
            var = bb.emit(op.astype(op.mean(op.astype(op.power(d, relax.const(2.0, "float32")), "float32"),
                                            axis=[1], keepdims=True), "float32"))
            norm = bb.emit(op.divide(d, op.sqrt(op.add(var, relax.const(1e-6, "float32")))))
            out = bb.emit_output(op.add(op.matmul(norm, w), h))
        bb.emit_func_output(out)
    return bb.get()


def test_the_calibrated_model_fuses_the_small_float32_gemms_with_their_neighbours():
    """With the constants fitted on the H200's measurements (bench/modelled/validation.md), dlight's
    small float32 GEMMs are priced above tile kernels that connect them: the first GEMM, its bias
    and the layer norm become one kernel, the second GEMM with its residual another. (Before the
    fit the GEMMs stayed dlight's and the layer norm was taken less the GEMM's bias add.)"""
    mod = gemm_layer_norm_gemm()
    tile = inspect(mod, preset="tilegraph")
    chosen = {g.ops: k.generator for g in tile.groups for k in tile.launches if k.func == g.func}
    assert chosen == {("matmul", "add", *LAYER_NORM): "tilegraph", ("matmul", "add2"): "tilegraph"}


def test_the_cover_computes_what_the_graph_computes():
    mod = gemm_layer_norm_gemm(rows=32, width=64)
    rng = np.random.default_rng(0)
    inputs = {p.name: rng.standard_normal([int(d) for d in p.ty.shape]).astype("float32")
              for p in mod["main"].params}
    np.testing.assert_allclose(run_cpu(mod, inputs, preset="tilegraph")[0], run_cpu(mod, inputs, preset="baseline")[0],
                               rtol=1e-4, atol=1e-4)
