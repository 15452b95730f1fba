"""Weight-free "skeleton" ONNX models: the graph without its large weights.

A skeleton keeps every node, every graph input/output and every small or integer
initializer (shape constants, gather indices, masks), but stores large float
initializers with their dims and data type only. For each dropped tensor it records
the mean and standard deviation of the original values in the model's
``metadata_props`` (JSON under :data:`METADATA_KEY`). :func:`fill_skeleton` refills
them deterministically with ``N(mean, std)`` draws, so tests and CI can run real
architectures from files of a few hundred kilobytes, without torch or the full
weights. Refilled weights have the statistics of the originals (fan-in-scaled random
weights stay fan-in-scaled), not their values.

Only top-level graph initializers are dropped; ``Constant`` nodes and subgraph
initializers are kept verbatim.
"""
from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import TensorProto, numpy_helper

from ..errors import ModelLoadError, SkeletonError

log = logging.getLogger(__name__)

#: Committed skeletons of the model corpus (``scripts/corpus``), fp32 batch 1.
SKELETON_DIR = Path(__file__).with_name("skeletons")
#: ``metadata_props`` key holding the refill record of a skeleton.
METADATA_KEY = "tvm_ext.skeleton"
#: Version of the refill record format.
FORMAT_VERSION = 1
#: Element types that may be dropped, with the numpy type they are refilled in.
_DROPPABLE = {
    TensorProto.FLOAT: np.float32,
    TensorProto.FLOAT16: np.float16,
    TensorProto.DOUBLE: np.float64,
}
#: Tensors with 2 to this many distinct values are structural (masks, one-hot tables)
#: rather than weights, and are kept verbatim. Constant tensors are dropped: their
#: record (std 0) restores them exactly.
_MAX_STRUCTURAL_DISTINCT = 16


def _metadata(model: onnx.ModelProto) -> dict[str, str]:
    return {p.key: p.value for p in model.metadata_props}


def is_skeleton(model: onnx.ModelProto) -> bool:
    """True if ``model`` carries a skeleton refill record (it was made by :func:`make_skeleton`
    and not yet filled)."""
    return METADATA_KEY in _metadata(model)


def _droppable(tensor: TensorProto, min_elements: int) -> np.ndarray | None:
    """The tensor's values if it is a large, finite, non-structural float tensor."""
    if tensor.data_type not in _DROPPABLE or tensor.data_location == TensorProto.EXTERNAL:
        return None
    if int(np.prod(tensor.dims, dtype=np.int64)) < min_elements:
        return None
    values = numpy_helper.to_array(tensor)
    if not np.all(np.isfinite(values)):
        return None
    distinct = np.unique(values).size
    if 1 < distinct <= _MAX_STRUCTURAL_DISTINCT:
        return None
    return values


def make_skeleton(model: onnx.ModelProto, min_elements: int = 1024) -> onnx.ModelProto:
    """Return a copy of ``model`` with its large float initializers emptied.

    Parameters
    ----------
    model : onnx.ModelProto
        A model whose weights are stored inline (not as external data).
    min_elements : int
        Float initializers with at least this many elements are dropped, unless they hold
        non-finite values or 2 to 16 distinct values (masks), which are kept verbatim.
        Constant tensors are dropped with ``std`` 0, so filling restores them exactly.

    Returns
    -------
    onnx.ModelProto
        The skeleton: same graph, dropped tensors keep ``dims`` and ``data_type`` with no
        data, and ``metadata_props[METADATA_KEY]`` records ``mean``/``std`` per tensor.

    Raises
    ------
    SkeletonError
        If ``model`` is already a skeleton or ``min_elements`` is not positive.
    """
    if is_skeleton(model):
        raise SkeletonError("model is already a skeleton; fill it before re-skeletonising")
    if min_elements < 1:
        raise SkeletonError(f"min_elements must be positive, got {min_elements}")
    out = onnx.ModelProto()
    out.CopyFrom(model)
    record: dict[str, dict[str, float | str]] = {}
    for tensor in out.graph.initializer:
        values = _droppable(tensor, min_elements)
        if values is None:
            continue
        wide = values.astype(np.float64)
        record[tensor.name] = {"mean": float(wide.mean()), "std": float(wide.std()),
                               "dtype": np.dtype(_DROPPABLE[tensor.data_type]).name}
        dims, dtype, name = list(tensor.dims), tensor.data_type, tensor.name
        tensor.Clear()
        tensor.name, tensor.data_type = name, dtype
        tensor.dims.extend(dims)
    payload = {"version": FORMAT_VERSION, "min_elements": min_elements, "tensors": record}
    out.metadata_props.add(key=METADATA_KEY, value=json.dumps(payload, sort_keys=True))
    log.debug("skeleton: dropped %d of %d initializers", len(record), len(out.graph.initializer))
    return out


def _stable_hash(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "little")


def _read_record(model: onnx.ModelProto) -> dict[str, dict[str, float | str]]:
    try:
        payload = json.loads(_metadata(model)[METADATA_KEY])
        version, tensors = payload["version"], payload["tensors"]
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise SkeletonError(f"malformed skeleton record under {METADATA_KEY!r}: {err}") from None
    if version != FORMAT_VERSION:
        raise SkeletonError(f"skeleton record version {version} is not {FORMAT_VERSION}")
    return tensors


def fill_skeleton(model: onnx.ModelProto, seed: int = 0) -> onnx.ModelProto:
    """Return a copy of the skeleton ``model`` with every dropped tensor refilled.

    Each tensor gets ``N(mean, std)`` values (the constant ``mean`` when ``std`` is 0)
    from a numpy generator seeded with ``(seed, sha256(tensor name))``, so the result
    depends only on the skeleton and ``seed``.

    Raises
    ------
    SkeletonError
        If ``model`` is not a skeleton, or its record names a tensor that is not an
        empty initializer of the recorded data type.
    """
    if not is_skeleton(model):
        raise SkeletonError("model is not a skeleton (no refill record); use it as it is")
    record = _read_record(model)
    out = onnx.ModelProto()
    out.CopyFrom(model)
    by_name = {t.name: t for t in out.graph.initializer}
    for name, stats in record.items():
        tensor = by_name.get(name)
        if tensor is None:
            raise SkeletonError(f"skeleton records {name!r} but the graph has no such initializer")
        dtype = np.dtype(str(stats["dtype"]))
        if _DROPPABLE.get(tensor.data_type) is not dtype.type:
            raise SkeletonError(f"initializer {name!r} has data type {tensor.data_type}, "
                                f"record says {dtype.name}")
        shape = tuple(int(d) for d in tensor.dims)
        rng = np.random.default_rng([seed, _stable_hash(name)])
        mean, std = float(stats["mean"]), float(stats["std"])
        values = (rng.standard_normal(shape) * std + mean) if std > 0 else np.full(shape, mean)
        tensor.CopyFrom(numpy_helper.from_array(values.astype(dtype), name))
    kept = [p for p in out.metadata_props if p.key != METADATA_KEY]
    del out.metadata_props[:]
    out.metadata_props.extend(kept)
    return out


def load_model(path: str | Path, seed: int = 0) -> onnx.ModelProto:
    """Load an ONNX file; a skeleton is filled with :func:`fill_skeleton` (``seed``).

    Raises
    ------
    ModelLoadError
        If the file is missing or not an ONNX model.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelLoadError(f"no such model file: {path}")
    try:
        model = onnx.load(str(path))
    except (DecodeError, ValueError, OSError) as err:
        raise ModelLoadError(f"cannot read ONNX model {path}: {err}") from None
    if not model.HasField("graph") or not model.graph.node:
        raise ModelLoadError(f"{path} holds no ONNX graph")
    return fill_skeleton(model, seed=seed) if is_skeleton(model) else model


def resolve_models(names: list[str]) -> list[Path]:
    """Model files for command-line names: an ONNX path as given, otherwise a skeleton name
    (``resnet50_b1_fp32``); no names means every committed skeleton.

    Raises
    ------
    ModelLoadError
        Naming every file that does not exist.
    """
    paths = [Path(n) if n.endswith(".onnx") else SKELETON_DIR / f"{n}.onnx" for n in names] \
        or sorted(SKELETON_DIR.glob("*.onnx"))
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise ModelLoadError(f"no such model: {', '.join(missing)}")
    return paths


__all__ = ["METADATA_KEY", "SKELETON_DIR", "SkeletonError", "fill_skeleton", "is_skeleton", "load_model",
           "make_skeleton", "resolve_models"]
