"""The canonical form of an imported model: target-independent cleanups and the fp16 switch."""
from __future__ import annotations

import tvm

from .clip import lift_min_max
from .fold_views import FoldConstantViews
from .fp16 import ConvertToFloat16
from .gelu import FuseGelu
from .lifted_constants import WithConstantsAsParams
from .pad import FoldPadIntoConv, lift_pad
from .te_calls import LiftTECalls


def canonicalize_passes() -> tvm.transform.Sequential:
    """Target-independent cleanups run after import (no legalization, no fusion).

    In order:

    1. ``ConvertToDataflow`` - put pure bindings in dataflow blocks (FoldConstant and the
       later fusion passes only look inside them).
    2. ``LiftTECalls`` - the importer's opaque ``call_tir`` Pad and Clip (``emit_te``) become
       ``R.nn.pad`` (zero-width pads dropped) and ``R.maximum``/``R.minimum``
       (:mod:`~tvm_ext.frontend.pad`, :mod:`~tvm_ext.frontend.clip`), so layout conversion,
       fp16 and fusion see through them.
    3. ``FoldBatchnormToConv2D`` - fold an inference BatchNormalization that follows a
       convolution with constant weights into the convolution's weights and a bias add.
    4. ``DecomposeOpsForInference`` - rewrite the remaining ``batch_norm`` (and other
       training-style composites such as ``tensor_to_shape``) into elementwise ops.
    5. ``FoldConstantViews`` then ``FoldConstant`` - evaluate every all-constant subexpression
       (transposed Gemm weights, BN scale/shift, shape arithmetic of the importer); layout calls
       on constants in numpy first, where FoldConstant compiles each with LLVM
       (:mod:`~tvm_ext.frontend.fold_views`).
    6. ``FuseGelu`` - GELU written out in erf or tanh form (exports before opset 20) becomes
       ``R.nn.gelu`` / ``R.nn.gelu_tanh``: an activation GEMM epilogues take
       (:mod:`~tvm_ext.frontend.gelu`).
    7. ``FoldPadIntoConv`` - a zero spatial pad read only by a convolution joins its padding
       when the merged padding is symmetric.
    8. ``RemoveRedundantReshape`` - drop no-op reshapes and collapse reshape chains.
    9. ``CanonicalizeBindings`` - remove trivial ``y = x`` bindings (ONNX Identity,
       Dropout) and tuple round trips.
    10. ``EliminateCommonSubexpr`` - share identical computations.
    11. ``DeadCodeElimination(["main"])`` - drop unused bindings and functions.

    Steps 6-11 never read a weight's values; they run with the weights as parameters
    (:class:`~tvm_ext.frontend.lifted_constants.WithConstantsAsParams`: TVM hashes whole
    functions, weights included, at each rewrite).
    """
    from tvm.relax.transform import (  # local names keep the list readable
        ConvertToDataflow,
        DecomposeOpsForInference,
        FoldBatchnormToConv2D,
        FoldConstant,
    )

    return tvm.transform.Sequential(
        [
            ConvertToDataflow(min_size=1),
            LiftTECalls([lift_pad, lift_min_max]),
            FoldBatchnormToConv2D(),
            DecomposeOpsForInference(),
            FoldConstantViews(),
            FoldConstant(),
            WithConstantsAsParams(structural_cleanups()),
        ],
        name="tvm_ext.Canonicalize",
    )


def structural_cleanups() -> tvm.transform.Sequential:
    """Steps 6-11 of :func:`canonicalize_passes`: rewrites that never read a weight's values."""
    from tvm.relax.transform import (
        CanonicalizeBindings,
        DeadCodeElimination,
        EliminateCommonSubexpr,
        RemoveRedundantReshape,
    )

    return tvm.transform.Sequential(
        [FuseGelu(), FoldPadIntoConv, RemoveRedundantReshape(), CanonicalizeBindings(),
         EliminateCommonSubexpr(), DeadCodeElimination(["main"])],
        name="tvm_ext.StructuralCleanups",
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
