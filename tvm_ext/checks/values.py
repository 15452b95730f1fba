"""Element types of the emulated device code: TVM dtype strings to numpy, bit patterns of values."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import tvm

_SPECIAL = {"bfloat16": np.dtype(ml_dtypes.bfloat16), "bool": np.dtype(np.bool_)}


def element_dtype(dtype) -> np.dtype:
    """numpy dtype of one lane of TVM dtype ``dtype`` (``"float16x8"`` -> float16)."""
    text = str(tvm.DataType(str(dtype)).with_lanes(1)) if str(dtype) != "handle" else "handle"
    if text in _SPECIAL:
        return _SPECIAL[text]
    if text == "handle":
        raise TypeError("a handle has no element type")
    return np.dtype(text)


def lanes_of(dtype) -> int:
    """Vector lanes of TVM dtype ``dtype`` (1 for a scalar)."""
    return int(tvm.DataType(str(dtype)).lanes)


_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


def bits(values: np.ndarray) -> np.ndarray:
    """Bit patterns of ``values`` as uint64 (NaNs compare equal to themselves)."""
    values = np.ascontiguousarray(values)
    return values.view(_UINT[values.dtype.itemsize]).astype(np.uint64)


__all__ = ["bits", "element_dtype", "lanes_of"]
