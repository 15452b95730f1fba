"""Numerics checks of a benchmarked model against reference outputs.

* The error measure is the norm-wise relative error ``||out - ref||_2 / ||ref||_2``,
  computed in float64 (METHOD.md); ``max_rel_err`` of a run is its maximum over outputs and
  check sets, and the limit is :func:`tvm_ext.testing.tolerance.normwise_tolerance_for`.
* Large outputs (a GPT-2 logits tensor is 25 MB in fp32) are compared on a fixed sample of
  :data:`DEFAULT_SAMPLE` elements, so the bundle stays small. The flattened tensor of ``n``
  elements is cut into ``count`` equal bins; the sample takes one element of each bin, at an
  offset ``(i * 7919) mod width`` that varies from bin to bin (so a row-periodic pattern does
  not always land on the same column). Spread over the whole tensor, distinct, and
  reproducible without storing indices or random streams.
* Every element is still checked for being finite, and outputs are poisoned (filled with
  NaN) before a check run, so an element the model never writes shows up as NaN.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..testing.tolerance import normwise_tolerance_for

#: Elements kept of each reference output.
DEFAULT_SAMPLE = 65536
_JITTER = 7919  # prime


@dataclass(frozen=True)
class Sample:
    """Which elements of a flattened output of ``size`` elements are compared (``count`` of them)."""

    size: int
    count: int

    def indices(self) -> np.ndarray:
        """The compared flat indices (all of them when ``count >= size``), increasing."""
        if self.count >= self.size:
            return np.arange(self.size, dtype=np.int64)
        i = np.arange(self.count + 1, dtype=np.int64)
        edges = (i * self.size) // self.count        # bin i is [edges[i], edges[i + 1])
        width = edges[1:] - edges[:-1]               # >= 1 because count < size
        return edges[:-1] + (i[:-1] * _JITTER) % width

    def to_json(self) -> dict:
        """JSON form."""
        return {"size": self.size, "count": self.count}

    @classmethod
    def from_json(cls, data: dict) -> "Sample":
        """Inverse of :meth:`to_json`."""
        return cls(int(data["size"]), int(data["count"]))


def sample_for(size: int, limit: int = DEFAULT_SAMPLE) -> Sample:
    """The sample of a tensor of ``size`` elements (everything up to ``limit``)."""
    return Sample(int(size), min(int(size), int(limit)))


def take_sample(array: np.ndarray, sample: Sample) -> np.ndarray:
    """The sampled elements of ``array`` (flattened)."""
    flat = np.asarray(array).reshape(-1)
    if flat.size != sample.size:
        raise ValueError(f"output has {flat.size} elements, the sample was made for {sample.size}")
    return flat[sample.indices()]


@dataclass
class OutputCheck:
    """One output of one check run compared with its reference."""

    name: str
    rel_err: float
    max_abs_err: float
    nonfinite: int
    ref_nonfinite: int
    compared: int
    size: int

    @property
    def ok_values(self) -> bool:
        """No more non-finite elements than the (whole) reference has."""
        return self.nonfinite <= self.ref_nonfinite


def compare(name: str, out: np.ndarray, ref_sample: np.ndarray, sample: Sample,
            ref_nonfinite: int = 0) -> OutputCheck:
    """Compare a whole output with the sampled reference.

    Non-finite elements are counted over the whole output (``ref_nonfinite`` is the count
    in the whole reference); the errors are taken over the sampled positions where the
    reference is finite.
    """
    out = np.asarray(out)
    if out.dtype.kind in "biu":
        got = take_sample(out, sample).astype(np.float64)
        want = np.asarray(ref_sample, dtype=np.float64)
        diff = np.abs(got - want)
        rel = float(np.count_nonzero(diff)) / max(diff.size, 1)  # share of wrong integers
        return OutputCheck(name, rel, float(diff.max(initial=0.0)), 0, 0, int(diff.size), int(out.size))
    nonfinite = int(out.size - np.count_nonzero(np.isfinite(out)))
    got = take_sample(out, sample).astype(np.float64)
    want = np.asarray(ref_sample, dtype=np.float64)
    finite = np.isfinite(want)
    diff = got[finite] - want[finite]
    if diff.size and not np.all(np.isfinite(diff)):
        rel, max_abs = math.inf, math.inf
    else:
        norm = float(np.linalg.norm(want[finite]))
        err = float(np.linalg.norm(diff))
        rel = err / norm if norm > 0 else (0.0 if err == 0 else math.inf)
        max_abs = float(np.abs(diff).max(initial=0.0))
    return OutputCheck(name, rel, max_abs, nonfinite, int(ref_nonfinite), int(want.size), int(out.size))


def summarize(checks: Sequence[OutputCheck], dtype: str) -> dict:
    """``max_rel_err``, ``max_abs_err``, ``nonfinite``, ``rel_tol`` and ``numerics_ok`` of a run."""
    tol = normwise_tolerance_for(dtype)
    max_rel = max((c.rel_err for c in checks), default=math.nan)
    return {
        "max_rel_err": max_rel,
        "max_abs_err": max((c.max_abs_err for c in checks), default=math.nan),
        "nonfinite": int(sum(c.nonfinite for c in checks)),
        "rel_tol": tol,
        "numerics_ok": bool(checks) and all(c.ok_values for c in checks) and max_rel <= tol,
    }


def poison_value(dtype: np.dtype) -> float | int | bool:
    """What an output buffer is filled with before a check run (NaN for floats)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return float("nan")
    if dtype.kind == "b":
        return True
    return int(np.iinfo(dtype).max)


__all__ = ["DEFAULT_SAMPLE", "Sample", "sample_for", "take_sample", "OutputCheck", "compare",
           "summarize", "poison_value"]
