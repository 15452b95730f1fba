"""Which precision a CUTLASS kernel computes in, and the one switch that allows TF32.

16-bit inputs (``float16``, ``bfloat16``) run on tensor cores as they are, accumulating in
float32. ``float32`` inputs run on tensor cores only as **TF32**: the operands are read as fp32
and rounded to 10 mantissa bits before the multiply (fp32 range, fp32 accumulation), at about 7x
the fp32 CUDA-core rate on H100 and 8x on A100 (``peak_flops.tfloat32`` of the device files). That
changes results (unit roundoff of the operands 2^-11, about 4.9e-4, instead of 2^-24, about 6e-8),
so it is **off by default**, as in PyTorch
(``torch.backends.cuda.matmul.allow_tf32``): a float32 GEMM or convolution is offloaded only
inside :func:`allow_tf32`::

    with tvm_ext.cutlass.allow_tf32():
        ex = tvm_ext.compile("model.onnx", target="tvm_ext/h100", preset="cutlass")

The scope covers every build path that runs inside it (``tvm_ext.compile``, ``inspect``,
``compare``, ``tvm.compile(..., relax_pipeline="tvm_ext")``, :func:`~tvm_ext.cutlass.offload_passes`);
the CLI's ``--allow-tf32`` enters it around the command. This module is the only reader of the
switch: the partition checks, the layout passes and the reports ask it.

Example
-------
>>> tf32_allowed()
False
>>> with allow_tf32():
...     input_dtypes(), math_dtype("float32"), precision_label("float32")
(('float16', 'bfloat16', 'float32'), 'tfloat32', 'tf32 tensor cores')
"""
from __future__ import annotations

import contextlib
import contextvars
from typing import Iterator

#: Input dtypes that run on tensor cores as they are (fp32 accumulation).
TENSOR_CORE_DTYPES: tuple[str, ...] = ("float16", "bfloat16")
#: The input dtype that runs on tensor cores as TF32 when allowed.
TF32_INPUT = "float32"
#: The dtype the tensor cores compute in for each input dtype (peak-rate key of the device files).
MATH_DTYPES: dict[str, str] = {"float16": "float16", "bfloat16": "bfloat16", "float32": "tfloat32"}
_LABELS = {"float16": "f16", "bfloat16": "bf16", "tfloat32": "tf32"}

_ALLOW_TF32: contextvars.ContextVar[bool] = contextvars.ContextVar("tvm_ext_cutlass_allow_tf32", default=False)


@contextlib.contextmanager
def allow_tf32(enabled: bool = True) -> Iterator[None]:
    """Allow (or, with ``enabled=False``, forbid) TF32 tensor cores for float32 CUTLASS offloads
    inside the ``with`` block (see the module docstring)."""
    token = _ALLOW_TF32.set(bool(enabled))
    try:
        yield
    finally:
        _ALLOW_TF32.reset(token)


def tf32_allowed() -> bool:
    """Whether float32 GEMMs and convolutions may run on TF32 tensor cores now."""
    return _ALLOW_TF32.get()


def input_dtypes() -> tuple[str, ...]:
    """Input dtypes CUTLASS kernels take now (float32 only while TF32 is allowed)."""
    return TENSOR_CORE_DTYPES + ((TF32_INPUT,) if tf32_allowed() else ())


def input_dtype_reason(dtype: str) -> str | None:
    """Why inputs of ``dtype`` cannot be offloaded now (None when they can)."""
    if dtype in input_dtypes():
        return None
    if dtype == TF32_INPUT:
        return ("float32 inputs: TF32 tensor cores not allowed (allow_tf32=False; enable with "
                "tvm_ext.cutlass.allow_tf32() or --allow-tf32)")
    return f"input dtype {dtype} (supported: {TENSOR_CORE_DTYPES}, and float32 as TF32 when allowed)"


def math_dtype(input_dtype: str) -> str:
    """The dtype the tensor cores compute in for ``input_dtype`` (``"tfloat32"`` for float32).

    Raises
    ------
    ValueError
        No tensor-core precision exists for ``input_dtype``.
    """
    if input_dtype not in MATH_DTYPES:
        raise ValueError(f"no tensor-core precision for input dtype {input_dtype!r}")
    return MATH_DTYPES[input_dtype]


def precision_label(input_dtype: str) -> str:
    """How a kernel with ``input_dtype`` inputs computes, for reports: ``"tf32 tensor cores"``."""
    return f"{_LABELS[math_dtype(input_dtype)]} tensor cores"


__all__ = ["MATH_DTYPES", "TENSOR_CORE_DTYPES", "TF32_INPUT", "allow_tf32", "input_dtype_reason", "input_dtypes",
           "math_dtype", "precision_label", "tf32_allowed"]
