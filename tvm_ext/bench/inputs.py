"""Model inputs of a benchmark: their description and reproducible random data.

An :class:`InputSpec` says how to draw one graph input (numpy only, so the GPU machine can
regenerate it without TVM's compiler): floats from a standard normal, integers uniformly
from ``[low, high)``, booleans as fair coin flips. Never zeros: zeros hide unwritten
outputs and wrong indexing, and can run faster than real data.

Input *sets* are numbered; set ``k`` of a model is drawn from a generator seeded with
``(seed, k)``, so the build host (which computes reference outputs for the check sets) and
the GPU machine (which runs them) draw the same values. :func:`digest` fingerprints a set so
the GPU machine can prove it did.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np

from ..errors import BenchError

#: Input kinds and what they draw.
KINDS = ("normal", "int", "bool")
#: Set ids of the numerics checks; timing sets start at :data:`FIRST_TIMING_SET`.
CHECK_SETS = (0, 1)
FIRST_TIMING_SET = 100


@dataclass(frozen=True)
class InputSpec:
    """How to draw one model input.

    Attributes
    ----------
    name : str
        Graph input name (the ONNX name; also the torch argument name).
    shape : tuple of int
        Static shape.
    dtype : str
        numpy dtype name of the input as the compiled model takes it (``float16`` in fp16 builds).
    kind : str
        ``"normal"``, ``"int"`` or ``"bool"``.
    low, high : int
        Half-open range of ``int`` inputs (ignored otherwise).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str
    low: int = 0
    high: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise BenchError(f"input '{self.name}': kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "int" and self.high <= self.low:
            raise BenchError(f"input '{self.name}': empty integer range [{self.low}, {self.high})")
        if any(int(d) < 1 for d in self.shape):
            raise BenchError(f"input '{self.name}': shape {self.shape} must be static and positive")

    @property
    def nbytes(self) -> int:
        """Bytes of one drawn array."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    def to_json(self) -> dict:
        """JSON form."""
        out = asdict(self)
        out["shape"] = list(self.shape)
        return out

    @classmethod
    def from_json(cls, data: Mapping) -> "InputSpec":
        """Inverse of :meth:`to_json`."""
        try:
            return cls(name=str(data["name"]), shape=tuple(int(d) for d in data["shape"]),
                       dtype=str(data["dtype"]), kind=str(data["kind"]),
                       low=int(data.get("low", 0)), high=int(data.get("high", 0)))
        except (KeyError, TypeError, ValueError) as err:
            raise BenchError(f"malformed input spec {dict(data)!r}: {err}") from None


def spec_for(name: str, shape: Sequence[int], dtype: str, int_range: tuple[int, int] | None = None) -> InputSpec:
    """The :class:`InputSpec` for an input of ``dtype``.

    Integer inputs need ``int_range`` (token ids: ``(0, vocab)``; an all-ones mask: ``(1, 2)``).
    """
    kind_char = np.dtype(dtype).kind
    if kind_char == "f":
        return InputSpec(name, tuple(int(d) for d in shape), str(np.dtype(dtype)), "normal")
    if kind_char == "b":
        return InputSpec(name, tuple(int(d) for d in shape), "bool", "bool")
    if kind_char in "iu":
        if int_range is None:
            raise BenchError(f"integer input '{name}' needs a value range")
        return InputSpec(name, tuple(int(d) for d in shape), str(np.dtype(dtype)), "int",
                         int(int_range[0]), int(int_range[1]))
    raise BenchError(f"cannot draw input '{name}' of dtype {dtype}")


def generate(specs: Sequence[InputSpec], seed: int, set_id: int) -> dict[str, np.ndarray]:
    """Input set ``set_id`` of a model: name -> array, in ``specs`` order."""
    rng = np.random.default_rng([int(seed), int(set_id)])
    out: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.kind == "normal":
            out[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
        elif spec.kind == "bool":
            out[spec.name] = rng.random(spec.shape) < 0.5
        else:
            out[spec.name] = rng.integers(spec.low, spec.high, size=spec.shape).astype(spec.dtype)
    return out


def digest(arrays: Mapping[str, np.ndarray] | Sequence[np.ndarray]) -> str:
    """SHA-256 over the arrays' dtypes, shapes and bytes (in order)."""
    values = arrays.values() if isinstance(arrays, Mapping) else arrays
    h = hashlib.sha256()
    for a in values:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def timing_set_count(specs: Sequence[InputSpec], requested: int, max_bytes: int = 1 << 30) -> int:
    """How many rotating timing sets to draw: ``requested``, fewer if they would exceed ``max_bytes``."""
    per_set = max(1, sum(s.nbytes for s in specs))
    return max(1, min(int(requested), max_bytes // per_set))


__all__ = ["InputSpec", "KINDS", "CHECK_SETS", "FIRST_TIMING_SET", "spec_for", "generate", "digest",
           "timing_set_count"]
