"""The canonical form of an imported model: target-independent cleanups and the fp16 switch."""
from __future__ import annotations

import tvm

from .fp16 import ConvertToFloat16


def canonicalize_passes() -> tvm.transform.Sequential:
    """Target-independent cleanups run after import (no legalization, no fusion).

    In order:

    1. ``ConvertToDataflow`` - put pure bindings in dataflow blocks (FoldConstant and the
       later fusion passes only look inside them).
    2. ``FoldBatchnormToConv2D`` - fold an inference BatchNormalization that follows a
       convolution with constant weights into the convolution's weights and a bias add.
    3. ``DecomposeOpsForInference`` - rewrite the remaining ``batch_norm`` (and other
       training-style composites such as ``tensor_to_shape``) into elementwise ops.
    4. ``FoldConstant`` - evaluate every all-constant subexpression (transposed Gemm
       weights, BN scale/shift, shape arithmetic of the importer).
    5. ``RemoveRedundantReshape`` - drop no-op reshapes and collapse reshape chains.
    6. ``CanonicalizeBindings`` - remove trivial ``y = x`` bindings (ONNX Identity,
       Dropout) and tuple round trips.
    7. ``EliminateCommonSubexpr`` - share identical computations.
    8. ``DeadCodeElimination(["main"])`` - drop unused bindings and functions.
    """
    from tvm.relax.transform import (  # local names keep the list readable
        CanonicalizeBindings, ConvertToDataflow, DeadCodeElimination,
        DecomposeOpsForInference, EliminateCommonSubexpr, FoldBatchnormToConv2D,
        FoldConstant, RemoveRedundantReshape,
    )

    return tvm.transform.Sequential(
        [
            ConvertToDataflow(min_size=1),
            FoldBatchnormToConv2D(),
            DecomposeOpsForInference(),
            FoldConstant(),
            RemoveRedundantReshape(),
            CanonicalizeBindings(),
            EliminateCommonSubexpr(),
            DeadCodeElimination(["main"]),
        ],
        name="tvm_ext.Canonicalize",
    )


def finalize_module(mod: tvm.IRModule, *, fp16: bool = False, canonicalize: bool = True) -> tvm.IRModule:
    """Apply the post-import steps shared by every frontend (canonicalize, fp16)."""
    if canonicalize:
        mod = canonicalize_passes()(mod)
    if fp16:
        mod = ConvertToFloat16()(mod)
        if canonicalize:
            mod = canonicalize_passes()(mod)
    return mod
