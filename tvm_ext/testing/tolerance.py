"""How far a computed result may be from its reference: the package's one tolerance policy.

Element-wise checks (:func:`tolerance_for`) pass when ``|a - b| <= atol + rtol * |b|`` for
every element (NumPy's ``allclose``). They are used by the CPU oracle (``tvm-ext check``),
the thread-serialized kernel check and :func:`tvm_ext.testing.compare.assert_close`.

* float32: ``rtol=1e-4, atol=1e-5``. Our kernels and onnxruntime's differ only in summation
  order and in vectorized transcendental approximations; a few ulps (1.2e-7 each) per op,
  amplified by reductions of a few hundred terms, stays well below 1e-4 relative.
* float16: ``rtol=2e-2, atol=2e-2`` against the **fp32** reference. fp16's unit roundoff is
  2^-11 = 4.9e-4 and every op, weight and activation is rounded to it: weight rounding
  alone perturbs a K-term dot product of standard-normal data by about
  ``sqrt(K) * 4.9e-4 * |terms|`` (~1e-2 absolute at K=256), and each further op adds
  its own rounding, so 2e-2 (~40 ulps) separates rounding from real bugs (a wrong axis or a
  dropped epilogue gives errors of order 1). The absolute part covers outputs near zero,
  where cancellation makes relative error meaningless.
* bfloat16 takes the float16 numbers. Its rounding is 8x coarser (2^-8), so they are tight
  for a comparison with an fp32 reference; today only kernel-level checks, where both sides
  compute in bfloat16, use them.
* Every other dtype (float64, integers, bool) takes the float32 numbers.

**Per output scale** (:func:`scaled_atol`): the absolute part is for elements near zero, where
cancellation leaves an error of the size of the *terms* that cancelled, not of the result. Those
terms are as large as the output's typical magnitude, so an output whose root-mean-square value
``s`` exceeds 1 gets ``atol * s`` (logits of magnitude 100 computed in fp16: an element near
zero may be off by ~100 x 2^-11 per rounding). Below 1 the base ``atol`` stands: a tolerance
never shrinks under the dtype's. A wrong axis or a dropped epilogue still fails: its errors are
of the order of ``s`` itself.

**The function's own rounding** (:func:`within_own_rounding`): a half-precision function that
accumulates in half precision (TVM's fp16 convolution keeps its sum in fp16) is itself far from
the fp32 reference: ConvNeXt-T's 2x2 downsampling convolution sums 1536 fp16 products and its
unscheduled function differs from fp32 by 1.68. A kernel checked against that function (the
emulator) passes an element that is within the tolerance *plus* the function's largest distance
from the fp32 values on that output: rounding in another order, as large as the function's own
(a summation order changes which elements round worst). A wrong axis or a lost half of the sum
is still off by the size of the sum.

Two places measure differently and keep their own numbers, defined here too:

* The benchmark (:func:`normwise_tolerance_for`) compares a GPU run with a float32 reference by
  the norm-wise relative error ``||out - ref||_2 / ||ref||_2`` (see ``bench/README.md``). A
  norm-wise error is an average, not a worst element, and GPU builds add fast-math
  transcendentals and other reduction orders, so its limits are set by measure, not derived
  from the element-wise ones: 1e-3 for float32 (float32 lands far under it), 3e-2 for float16
  (around 1e-3..1e-2 in practice), 5e-2 for bfloat16.
* ONNX node test cases are checked with the tolerances ONNX's own backend runner uses
  (:data:`ONNX_NODE_TEST_TOLERANCE`, or the case's), so a pass means what it means upstream.

This module imports nothing but numpy, so the runtime-only benchmark bundle can copy it.
"""
from __future__ import annotations

import numpy as np

#: Element-wise ``(rtol, atol)`` by dtype name; :func:`tolerance_for` reads it.
_ELEMENTWISE = {"float32": (1e-4, 1e-5), "float16": (2e-2, 2e-2), "bfloat16": (2e-2, 2e-2)}
#: Norm-wise relative error limits by dtype name; :func:`normwise_tolerance_for` reads it.
_NORMWISE = {"float32": 1e-3, "float16": 3e-2, "bfloat16": 5e-2}
#: ``(rtol, atol)`` ONNX's node test cases are generated with unless a case sets its own
#: (``onnx.backend.test.case.node``).
ONNX_NODE_TEST_TOLERANCE = (1e-3, 1e-7)


def _name(dtype: object) -> str:
    return str(dtype).lower()


def tolerance_for(dtype: object) -> tuple[float, float]:
    """The element-wise ``(rtol, atol)`` for results of ``dtype`` (see the module docstring).

    Parameters
    ----------
    dtype : str or numpy.dtype
        The dtype the compared result is computed in: ``"float16"`` for a pure fp16 model,
        ``"float32"`` otherwise. Dtypes other than float16/bfloat16 get the float32 numbers.

    Returns
    -------
    tuple of float
        ``(rtol, atol)``.
    """
    return _ELEMENTWISE.get(_name(dtype), _ELEMENTWISE["float32"])


def scaled_atol(atol: float, rms: float) -> float:
    """The absolute tolerance of one output whose reference has root-mean-square value ``rms``
    (see the module docstring): ``atol * max(1, rms)``."""
    return atol * max(1.0, float(rms))


def normwise_tolerance_for(dtype: object) -> float:
    """The largest norm-wise relative error a benchmarked run of ``dtype`` may have.

    Dtypes without their own entry get the float32 limit.
    """
    return _NORMWISE.get(_name(dtype), _NORMWISE["float32"])


def within_own_rounding(actual: np.ndarray, exact: np.ndarray, own: np.ndarray, rtol: float, atol: float) -> bool:
    """Whether every element of ``actual`` is within ``atol + rtol * |exact|`` of the fp32
    reference ``exact``, widened by the largest distance of ``own`` (the function computed in its
    own half precision) from it on this output (see the module docstring)."""
    exact = np.asarray(exact, dtype=np.float64)
    if exact.size == 0:
        return True
    slack = float(np.nanmax(np.abs(np.asarray(own, dtype=np.float64) - exact)))
    error = np.abs(np.asarray(actual, dtype=np.float64) - exact)
    with np.errstate(invalid="ignore"):
        return bool(np.all(error <= atol + rtol * np.abs(exact) + slack))


__all__ = ["ONNX_NODE_TEST_TOLERANCE", "normwise_tolerance_for", "scaled_atol", "tolerance_for",
           "within_own_rounding"]
