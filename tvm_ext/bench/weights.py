"""Model weights that travel as a recipe instead of bytes.

A benchmark bundle must stay small, so the compiled libraries take the large weights as
parameters, and the GPU machine regenerates them. The recipe is the skeleton refill record
of :mod:`tvm_ext.models.skeleton` (name, shape, mean, std per dropped tensor) plus the seed;
:func:`regenerate` draws exactly what :func:`tvm_ext.models.skeleton.fill_skeleton` draws
(``N(mean, std)`` from a numpy generator seeded with ``(seed, sha256(name)[:8])``; the
constant ``mean`` when ``std`` is 0), with numpy alone. The build host records a digest of
the weights that ``fill_skeleton`` produced; :func:`check_digest` compares it with the
regenerated ones, so a numpy whose random streams differ is caught before any timing.

:func:`checked_weights` regenerates and checks them once per machine where
``$TVM_EXT_WEIGHT_CACHE`` names a directory (the prepared GPU run sets it, so the seven
processes of one model do not draw the same 100 million numbers seven times); a cached file
is checked against the digest again when it is read.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BenchError


@dataclass(frozen=True)
class WeightTensor:
    """One weight to regenerate.

    Attributes
    ----------
    name : str
        Initializer name in the ONNX graph (the seed of its generator).
    shape : tuple of int
        Its shape.
    dtype : str
        dtype it is drawn in (the skeleton's, ``float32``).
    param_dtype : str
        dtype the compiled model takes (``float16`` in fp16 builds).
    mean, std : float
        Statistics of the original values.
    param : str
        Name of the graph input that feeds it (a C identifier; ``name`` when empty).
    """

    name: str
    shape: tuple[int, ...]
    dtype: str
    param_dtype: str
    mean: float
    std: float
    param: str = ""

    @property
    def input_name(self) -> str:
        """The graph input name of this weight."""
        return self.param or self.name

    def to_json(self) -> dict:
        """JSON form."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                "param_dtype": self.param_dtype, "mean": self.mean, "std": self.std, "param": self.param}

    @classmethod
    def from_json(cls, data: Mapping) -> WeightTensor:
        """Inverse of :meth:`to_json`."""
        try:
            return cls(name=str(data["name"]), shape=tuple(int(d) for d in data["shape"]),
                       dtype=str(data["dtype"]), param_dtype=str(data["param_dtype"]),
                       mean=float(data["mean"]), std=float(data["std"]), param=str(data.get("param", "")))
        except (KeyError, TypeError, ValueError) as err:
            raise BenchError(f"malformed weight entry {dict(data)!r}: {err}") from None

    @property
    def nbytes(self) -> int:
        """Bytes as the compiled model takes it."""
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.param_dtype).itemsize


def _name_seed(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def draw(tensor: WeightTensor, seed: int) -> np.ndarray:
    """The values of one weight, in its drawn dtype (``float32``)."""
    rng = np.random.default_rng([int(seed), _name_seed(tensor.name)])
    if tensor.std > 0:
        values = rng.standard_normal(tensor.shape) * tensor.std + tensor.mean
    else:
        values = np.full(tensor.shape, tensor.mean)
    return values.astype(tensor.dtype)


def regenerate(tensors: Sequence[WeightTensor], seed: int) -> Iterator[np.ndarray]:
    """Yield every weight, cast to the dtype the compiled model takes, in order."""
    for tensor in tensors:
        yield draw(tensor, seed).astype(tensor.param_dtype, copy=False)


class WeightDigest:
    """Running SHA-256 over weights in parameter order (dtype, shape and bytes of each)."""

    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def update(self, array: np.ndarray) -> None:
        """Add the next weight."""
        array = np.ascontiguousarray(array)
        self._hash.update(f"{array.dtype.str}{array.shape}".encode())
        self._hash.update(array.tobytes())

    def hexdigest(self) -> str:
        """The digest so far."""
        return self._hash.hexdigest()


def check_digest(expected: str, actual: str, model: str) -> None:
    """Raise if the regenerated weights differ from the build host's.

    Raises
    ------
    BenchError
        The digests differ (numpy's random streams changed between the two machines).
    """
    if expected != actual:
        raise BenchError(
            f"{model}: regenerated weights differ from the build host's (digest {actual[:12]} != "
            f"{expected[:12]}); numpy's random streams differ between the machines, so the "
            "reference outputs do not apply")


#: Directory of regenerated weights shared by the processes of one run (unset: no cache).
CACHE_ENV = "TVM_EXT_WEIGHT_CACHE"


def checked_weights(tensors: Sequence[WeightTensor], seed: int, digest: str | None, model: str) -> list[np.ndarray]:
    """The weights of ``model`` in parameter order, checked against ``digest`` (see the module docstring).

    Raises
    ------
    BenchError
        The weights (regenerated or cached) differ from the build host's.
    """
    cache = os.environ.get(CACHE_ENV)
    path = Path(cache) / f"{model}_{digest[:24]}.npz" if cache and digest else None
    if path is not None and path.is_file():
        with np.load(path, allow_pickle=False) as npz:
            arrays = [npz[f"w{i}"] for i in range(len(tensors))]
    else:
        arrays = list(regenerate(tensors, seed))
    check = WeightDigest()
    for array in arrays:
        check.update(array)
    if digest:
        check_digest(digest, check.hexdigest(), model)
    if path is not None and not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.npz")
        np.savez(partial, **{f"w{i}": a for i, a in enumerate(arrays)})
        partial.replace(path)  # atomic: another process never reads half a file
    return arrays


__all__ = ["CACHE_ENV", "WeightDigest", "WeightTensor", "check_digest", "checked_weights", "draw", "regenerate"]
