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


def test_a_half_precision_result_may_be_as_far_from_fp32_as_its_function():
    """The emulator's comparison (tvm_ext.testing.tolerance.within_own_rounding): a kernel that sums
    1536 fp16 products in fp16 is judged against the fp32 value with the unscheduled function's own
    fp16 distance from it as slack; a kernel missing half its sum is still far outside."""
    from tvm_ext.testing.tolerance import tolerance_for, within_own_rounding

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((64, 1536)).astype(np.float16), rng.standard_normal(1536).astype(np.float16)
    exact = a.astype(np.float64) @ b.astype(np.float64)

    def summed_in_half(order) -> np.ndarray:
        out = np.zeros(64, np.float16)
        for k in order:
            out = (out + a[:, k] * b[k]).astype(np.float16)
        return out

    own, kernel = summed_in_half(range(1536)), summed_in_half(range(1535, -1, -1))   # another order
    rtol, atol = tolerance_for("float16")
    assert not np.allclose(kernel, exact, rtol=rtol, atol=atol)                      # the plain test fails it
    assert within_own_rounding(kernel, exact, own, rtol, atol)
    assert not within_own_rounding(summed_in_half(range(768)), exact, own, rtol, atol)    # half the sum lost
