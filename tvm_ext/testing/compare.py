"""Element-wise comparison of computed outputs with reference outputs.

Error measures (per output, reported as maxima over elements):

* ``abs_err = |a - b|`` with ``a`` ours and ``b`` the reference, computed in float64;
* ``rel_err = |a - b| / max(|b|, floor)`` with ``floor = max(atol, 1e-30)``: relative to the
  reference, but near-zero references are measured against ``atol`` instead of exploding
  (a 1e-9 value computed as 2e-9 has rel_err 1e-4 at ``atol=1e-5``, not 1.0);
* the pass test is NumPy's ``|a - b| <= atol + rtol * |b|`` for every element, with ``atol``
  scaled by the output's root-mean-square reference value when that exceeds 1
  (:func:`~tvm_ext.testing.tolerance.scaled_atol`; ``OutputError.atol`` is what was used);
  ``tol_ratio = |a - b| / (atol + rtol * |b|)`` is the share of the tolerance used
  (<= 1 passes), which says how close to the edge a passing output is.

Non-finite values: a NaN must sit where the reference has a NaN (``nan_mismatch`` counts
positions where exactly one side is NaN); infinities must match exactly. Integer, boolean
and string outputs must be equal. Shapes must be equal; dtypes too with ``check_dtype``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import NumericsMismatchError
from .tolerance import scaled_atol, tolerance_for

_REL_FLOOR_MIN = 1e-30


@dataclass
class OutputError:
    """How one output compares with its reference."""

    name: str
    ok: bool
    shape: tuple[int, ...] | None = None
    dtype: str = ""
    max_abs_err: float = 0.0
    max_rel_err: float = 0.0
    tol_ratio: float = 0.0
    mismatched: int = 0
    nan_mismatch: int = 0
    size: int = 0
    message: str = ""
    #: The absolute tolerance this output was checked with (scaled by its magnitude).
    atol: float = 0.0

    def describe(self) -> str:
        """One line: name, verdict and the numbers behind it."""
        if self.message and (self.mismatched == 0 and self.nan_mismatch == 0):
            return f"{self.name}: {self.message}"
        text = (f"{self.name}: max abs err {self.max_abs_err:.3g}, max rel err {self.max_rel_err:.3g}, "
                f"{self.mismatched}/{self.size} elements out of tolerance (atol {self.atol:.3g})")
        if self.nan_mismatch:
            text += f", {self.nan_mismatch} NaN mismatches"
        return text


def _as_numeric(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind == "c":
        return x.astype(np.complex128)
    return x.astype(np.float64)


def _compare_tensor(name: str, a: Any, b: Any, rtol: float, atol: float,
                    check_dtype: bool) -> OutputError:
    a, b = np.asarray(a), np.asarray(b)
    err = OutputError(name=name, ok=False, shape=tuple(b.shape), dtype=str(b.dtype), size=int(b.size))
    if a.shape != b.shape:
        err.message = f"shape {tuple(a.shape)} != expected {tuple(b.shape)}"
        return err
    if check_dtype and a.dtype != b.dtype:
        err.message = f"dtype {a.dtype} != expected {b.dtype}"
        return err
    if b.dtype.kind in "OUS" or a.dtype.kind in "OUS":
        err.mismatched = int(np.sum(a != b)) if a.size else 0
        err.ok = err.mismatched == 0
        return err
    a64, b64 = _as_numeric(a), _as_numeric(b)
    if b.dtype.kind in "biu" and a.dtype.kind in "biu":
        # Exact comparison in the integers themselves (float64 loses int64 precision).
        diff = np.abs(a64 - b64)
        err.mismatched = int(np.sum(a != b))
        err.max_abs_err = float(diff.max()) if diff.size else 0.0
        err.max_rel_err = float((diff / np.maximum(np.abs(b64), 1.0)).max()) if diff.size else 0.0
        err.ok = err.mismatched == 0
        return err
    nan_a, nan_b = np.isnan(a64), np.isnan(b64)
    err.nan_mismatch = int(np.sum(nan_a != nan_b))
    finite = np.isfinite(a64) & np.isfinite(b64)
    inf_bad = ~finite & ~nan_a & ~nan_b & (a64 != b64)  # an inf on one side, or inf vs -inf
    diff = np.abs(a64[finite] - b64[finite])
    ref = np.abs(b64[finite])
    atol = scaled_atol(atol, float(np.sqrt(np.mean(np.square(ref)))) if ref.size else 0.0)
    err.atol = atol
    floor = max(atol, _REL_FLOOR_MIN)
    out_of_tol = diff > atol + rtol * ref
    err.mismatched = int(np.sum(out_of_tol)) + int(np.sum(inf_bad))
    if diff.size:
        err.max_abs_err = float(diff.max())
        err.max_rel_err = float((diff / np.maximum(ref, floor)).max())
        allowed = atol + rtol * ref
        err.tol_ratio = float(np.max(np.where(allowed > 0, diff / np.where(allowed > 0, allowed, 1.0),
                                              np.where(diff > 0, np.inf, 0.0))))
    if np.any(inf_bad):
        err.max_abs_err = err.max_rel_err = err.tol_ratio = float("inf")
    err.ok = err.mismatched == 0 and err.nan_mismatch == 0
    return err


def compare_outputs(actual: Sequence[Any], expected: Sequence[Any], *, rtol: float, atol: float,
                    names: Sequence[str] | None = None, check_dtype: bool = False) -> list[OutputError]:
    """Compare each output with its reference.

    Parameters
    ----------
    actual, expected : sequence
        Arrays (or nested lists of arrays for sequence outputs, ``None`` for an empty
        optional), in the same order.
    rtol, atol : float
        Tolerances of the pass test ``|a - b| <= atol + rtol * |b|``.
    names : sequence of str, optional
        Output names for messages (default ``output_<i>``).
    check_dtype : bool
        Also require equal dtypes.

    Returns
    -------
    list of OutputError
        One entry per output (per element for sequence outputs); a count mismatch gives
        a single failing entry named ``<outputs>``.
    """
    if len(actual) != len(expected):
        return [OutputError(name="<outputs>", ok=False,
                            message=f"{len(actual)} outputs != expected {len(expected)}")]
    names = list(names) if names is not None else [f"output_{i}" for i in range(len(expected))]
    results: list[OutputError] = []
    for name, a, b in zip(names, actual, expected):
        if b is None or a is None:
            same = a is None and b is None
            results.append(OutputError(name=name, ok=same,
                                       message="" if same else "empty optional on one side only"))
        elif isinstance(b, (list, tuple)):
            if not isinstance(a, (list, tuple)) or len(a) != len(b):
                got = f"{len(a)} elements" if isinstance(a, (list, tuple)) else type(a).__name__
                results.append(OutputError(name=name, ok=False,
                                           message=f"sequence of {len(b)} elements expected, got {got}"))
                continue
            results.extend(compare_outputs(list(a), list(b), rtol=rtol, atol=atol,
                                           names=[f"{name}[{j}]" for j in range(len(b))],
                                           check_dtype=check_dtype))
        else:
            results.append(_compare_tensor(name, a, b, rtol, atol, check_dtype))
    return results


def mismatch_message(errors: Sequence[OutputError], rtol: float, atol: float, header: str = "") -> str:
    """A multi-line message naming every failing output."""
    bad = [e for e in errors if not e.ok]
    lines = [header or f"{len(bad)} of {len(errors)} outputs differ beyond rtol={rtol:g}, atol={atol:g}"]
    lines += ["  " + e.describe() for e in bad]
    return "\n".join(lines)


def assert_close(actual: Sequence[Any] | np.ndarray, expected: Sequence[Any] | np.ndarray, *,
                 rtol: float | None = None, atol: float | None = None, names: Sequence[str] | None = None,
                 check_dtype: bool = False) -> list[OutputError]:
    """Like :func:`compare_outputs`, raising if any output fails.

    A single array on both sides is treated as one output. ``rtol``/``atol`` default to the
    float32 tolerance of :func:`~tvm_ext.testing.tolerance.tolerance_for`.

    Raises
    ------
    NumericsMismatchError
        Listing every failing output with its errors.
    """
    default_rtol, default_atol = tolerance_for("float32")
    rtol = default_rtol if rtol is None else rtol
    atol = default_atol if atol is None else atol
    if isinstance(actual, np.ndarray) and isinstance(expected, np.ndarray):
        actual, expected = [actual], [expected]
    errors = compare_outputs(actual, expected, rtol=rtol, atol=atol, names=names, check_dtype=check_dtype)
    if not all(e.ok for e in errors):
        raise NumericsMismatchError(mismatch_message(errors, rtol, atol))
    return errors
