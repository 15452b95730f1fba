"""The emulator's expression semantics (tvm_ext.checks.tir_expr)."""
from __future__ import annotations

import numpy as np

from tvm_ext.checks.tir_expr import binary_op


def test_integer_division_by_a_per_lane_divisor():
    """The emulator's integer floor division and modulo with a divisor that differs per lane (a
    dlight convolution of ConvNeXt-T under `subprogram` divided by a thread-dependent extent: the
    emulation raised instead of running)."""
    a, b = np.array([7, -7, 9, 5]), np.array([2, 3, 0, 5])
    dt = np.dtype("int64")
    assert binary_op("FloorDiv", dt)(a, b).tolist() == [3, -3, 9, 1]
    assert binary_op("FloorMod", dt)(a, b).tolist() == [1, 2, 0, 0]
    assert binary_op("FloorMod", dt)(a, 3).tolist() == [1, 2, 0, 2]
