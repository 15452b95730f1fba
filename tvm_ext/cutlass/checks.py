"""What CUTLASS can run: the checks behind every offload pattern.

A match that fails a check stays in the graph and goes through the rest of the pipeline
(legalization, fusion, dlight); :func:`reject_reason` says why, for logs and reports.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import tvm
from tvm import relax

from .precision import input_dtype_reason

#: Output (epilogue) dtypes. Input dtypes: :func:`~tvm_ext.cutlass.precision.input_dtypes`.
OUTPUT_DTYPES = ("float16", "bfloat16", "float32")
#: Minimum bytes of one vector access along every leading dimension: the cp.async main loops copy
#: at least 4 bytes (two 16-bit elements, one float32).
MIN_ACCESS_BYTES = 4


def min_alignment(dtype: str) -> int:
    """Minimum alignment (elements) of every leading dimension for operands of ``dtype``."""
    return max(1, MIN_ACCESS_BYTES * 8 // tvm.DataType(dtype).bits)


def static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    """The shape of a tensor expression as ints, or None if unknown or symbolic."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None or not hasattr(ty.shape, "values"):
        return None
    dims = []
    for dim in ty.shape.values:
        if not isinstance(dim, tvm.tirx.IntImm):
            return None
        dims.append(int(dim))
    return tuple(dims)


def is_op_call(expr: relax.Expr | None, name: str) -> bool:
    """Whether ``expr`` is a call of the Relax operator ``name`` (``"relax.add"``)."""
    return isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == name


def dtype_of(expr: relax.Expr) -> str:
    """The dtype of a tensor expression ('' if unknown)."""
    ty = expr.ty
    return str(ty.dtype) if isinstance(ty, relax.TensorType) else ""


def leaking_intermediates(matched_expr: relax.Expr, matched_bindings: Mapping, var_usages: Mapping) -> list[str]:
    """Names of fused intermediate values that are also used outside the match."""
    inside = set(matched_bindings.keys())
    leaks = []
    for var, value in matched_bindings.items():
        if value.same_as(matched_expr):
            continue
        if any(user not in inside for user in var_usages.get(var, ())):
            leaks.append(var.name)
    return leaks


def _prod(values: Sequence[int]) -> int:
    out = 1
    for v in values:
        out *= v
    return out


def gemm_reject_reason(kind: str, lhs: relax.Expr, rhs: relax.Expr, op_call: relax.Call,
                       transpose: relax.Call | None = None) -> str | None:
    """Why a matmul-like call cannot be a CUTLASS GEMM of ``kind`` (None if it can).

    ``kind`` is ``"matmul"`` (2-D weight; leading lhs axes fold into M), ``"batch_matmul"``
    (both operands batched with equal batch axes) or ``"dense"`` (``rhs`` is the ``[N, K]``
    weight that the matched ``permute_dims`` call ``transpose`` transposes).
    """
    a_shape, b_shape, out_shape = static_shape(lhs), static_shape(rhs), static_shape(op_call)
    if a_shape is None or b_shape is None or out_shape is None:
        return "dynamic or unknown shape"
    reason = _dtype_reason(lhs, rhs, op_call)
    if reason:
        return reason
    if len(a_shape) < 2 or len(b_shape) < 2:
        return "operands must have rank >= 2"
    if kind == "dense":
        if len(b_shape) != 2:
            return "dense weight must be 2-D"
        axes = transpose.attrs.axes if transpose is not None else None
        if axes is not None and [int(a) for a in axes] != [1, 0]:
            return "dense weight transpose must swap the two axes"
        n, k = b_shape
    elif kind == "matmul":
        if len(b_shape) != 2:
            return "matmul weight must be 2-D (batched weights are batch_matmul)"
        k, n = b_shape
    elif kind == "batch_matmul":
        if len(b_shape) < 3:
            return "batch_matmul needs a batched right operand"
        if a_shape[:-2] != b_shape[:-2]:
            return "batch_matmul needs equal batch axes (no broadcasting)"
        k, n = b_shape[-2:]
    else:
        raise ValueError(f"unknown GEMM kind {kind!r}")
    if a_shape[-1] != k:
        return "reduction axes differ"
    if _prod(a_shape) == 0 or n == 0:
        return "empty tensor"
    align = min_alignment(dtype_of(lhs))
    if k % align:
        return f"K={k} must be a multiple of {align}"
    if n % align and kind != "dense":   # a dense weight's rows are K long: only C and D have N
        return f"N={n} must be a multiple of {align} (B is read along N)"
    return None


def conv2d_reject_reason(data: relax.Expr, weight: relax.Expr, op_call: relax.Call) -> str | None:
    """Why a ``relax.nn.conv2d`` call cannot be a CUTLASS implicit-GEMM fprop (None if it can)."""
    attrs = op_call.attrs
    if str(attrs.data_layout) != "NHWC" or str(attrs.kernel_layout) != "OHWI" or str(attrs.out_layout) != "NHWC":
        return (f"layouts {attrs.data_layout}/{attrs.kernel_layout}/{attrs.out_layout} "
                "(CUTLASS needs NHWC/OHWI/NHWC; run the NHWC conversion first)")
    if int(attrs.groups) != 1:
        return f"grouped or depthwise convolution (groups={int(attrs.groups)})"
    pad = [int(v) for v in attrs.padding]
    if len(pad) != 4 or pad[0] != pad[2] or pad[1] != pad[3]:
        return f"asymmetric padding {pad}"
    d_shape, w_shape, o_shape = static_shape(data), static_shape(weight), static_shape(op_call)
    if d_shape is None or w_shape is None or o_shape is None:
        return "dynamic or unknown shape"
    reason = _dtype_reason(data, weight, op_call)
    if reason:
        return reason
    c, k = d_shape[3], w_shape[0]
    align = min_alignment(dtype_of(data))
    if c % align or k % align:
        return f"channels C={c} and K={k} must be multiples of {align}"
    return None


def _dtype_reason(a: relax.Expr, b: relax.Expr, out: relax.Expr) -> str | None:
    da, db, do = dtype_of(a), dtype_of(b), dtype_of(out)
    if db != da:
        return f"input dtypes {da}/{db} differ"
    reason = input_dtype_reason(da)
    if reason:
        return reason
    if do not in OUTPUT_DTYPES:
        return f"output dtype {do} (supported: {OUTPUT_DTYPES})"
    return None


def is_bias_vector(expr: relax.Expr, out_shape: Sequence[int]) -> bool:
    """Whether ``expr`` is a vector over the output's last axis (leading axes of extent 1)."""
    shape = static_shape(expr)
    return bool(shape) and shape[-1] == out_shape[-1] and all(d == 1 for d in shape[:-1])


def split_bias_residual(a: relax.Expr, b: relax.Expr, out_shape: Sequence[int]) -> tuple[relax.Expr, relax.Expr]:
    """``(bias, residual)`` from the two operands of a bias+residual epilogue, in either order."""
    if not (is_bias_vector(a, out_shape) and static_shape(b) == tuple(out_shape)) \
            and is_bias_vector(b, out_shape) and static_shape(a) == tuple(out_shape):
        return b, a
    return a, b


def epilogue_reject_reason(annotated: Mapping[str, relax.Expr], op_call: relax.Call, root: relax.Expr,
                           ordered: bool = False) -> str | None:
    """Checks on the epilogue operands: bias/residual shape and dtype, hardswish constants.

    ``ordered``: the pattern fixes which add holds the bias (a residual after the activation:
    the inner add's operand is the bias, the outer add's the residual), so the two are not
    reordered by shape."""
    out_shape = static_shape(op_call)
    out_dtype = dtype_of(op_call)
    bias, residual = annotated.get("bias"), annotated.get("residual")
    if bias is not None and residual is not None and not ordered:
        bias, residual = split_bias_residual(bias, residual, out_shape)
    if bias is not None:
        shape = static_shape(bias)
        if not is_bias_vector(bias, out_shape):
            return f"bias shape {shape} is not a vector over the last axis ({out_shape[-1]})"
        if dtype_of(bias) != out_dtype:
            return f"bias dtype {dtype_of(bias)} differs from the output dtype {out_dtype}"
    if residual is not None:
        if static_shape(residual) != out_shape or dtype_of(residual) != out_dtype:
            return (f"residual {static_shape(residual)} {dtype_of(residual)} does not match the output "
                    f"{out_shape} {out_dtype}")
    for add in ("source_add", "residual_add"):
        if add in annotated and static_shape(annotated[add]) != out_shape:
            return "bias add broadcasts the output"
    if "hs_three" in annotated:
        values = [scalar_value(annotated[k]) for k in ("hs_three", "hs_lo", "hs_hi", "hs_six")]
        if values != [3.0, 0.0, 6.0, 6.0]:
            return f"not a hardswish (constants {values})"
    root_dtype = dtype_of(root)
    if root_dtype not in OUTPUT_DTYPES:
        return f"cast to {root_dtype} (supported: {OUTPUT_DTYPES})"
    if static_shape(root) != out_shape:
        return "epilogue changes the output shape"
    return None


def scalar_value(expr: relax.Expr) -> float | None:
    """The value of a one-element constant (a relax constant or a TIR immediate), else None."""
    # IntImm/FloatImm derive from tvm.ir.Constant in 0.27: test them first.
    if isinstance(expr, (tvm.tirx.IntImm, tvm.tirx.FloatImm)):
        return float(expr.value)
    if isinstance(expr, tvm.ir.Constant) and hasattr(expr, "value"):  # relax constants (GenericConst)
        data = expr.value.numpy()
        return float(data.reshape(-1)[0]) if data.size == 1 else None
    return None
