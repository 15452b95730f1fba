"""Reference outputs of the check input sets, computed on the build host with onnxruntime.

The reference runs the fp32 ONNX graph (weights fed as inputs, drawn from the same recipe
and seed the GPU machine uses) on CPU in float32, whatever dtype the compiled model uses:
an fp16 build is compared with a higher-precision reference. Only a sample of each large
output is kept (:mod:`tvm_ext.bench.numerics`); the number of non-finite elements of each
full output is kept too.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BenchError
from .inputs import CHECK_SETS, digest, generate
from .numerics import take_sample
from .prepare import PreparedModel
from .weights import WeightDigest, draw

log = logging.getLogger(__name__)

SOURCE = "onnxruntime CPU, float32"


def _ort_errors(ort) -> tuple[type[BaseException], ...]:
    """onnxruntime's exception types (they derive from ``Exception`` directly)."""
    state = ort.capi.onnxruntime_pybind11_state
    names = ("Fail", "InvalidArgument", "NoSuchFile", "NoModel", "EngineError", "RuntimeException",
             "InvalidProtobuf", "NotImplemented", "InvalidGraph", "EPFail")
    return tuple(getattr(state, n) for n in names if hasattr(state, n)) + (RuntimeError, ValueError)


@dataclass
class Reference:
    """What :func:`compute_reference` produced (``path`` is the written ``.npz``)."""

    path: Path
    check_sets: list[int]
    check_digests: list[str]
    weights_digest: str
    ref_nonfinite: list[list[int]]
    seconds: float


def compute_reference(prepared: PreparedModel, path: str | Path, *, weights_seed: int, input_seed: int,
                      check_sets: tuple[int, ...] = CHECK_SETS) -> Reference:
    """Run the fp32 graph on every check set and write the sampled outputs to ``path``.

    Raises
    ------
    BenchError
        onnxruntime is missing or fails on the model.
    """
    try:
        import onnxruntime as ort  # noqa: PLC0415 - build-host only
    except ImportError:
        raise BenchError("onnxruntime is needed on the build host for the reference outputs") from None
    start = time.perf_counter()
    fed: dict[str, np.ndarray] = {}
    weight_digest = WeightDigest()
    for w in prepared.weights:
        values = draw(w, weights_seed)
        weight_digest.update(values.astype(w.param_dtype, copy=False))
        fed[w.input_name] = values
    errors = _ort_errors(ort)
    try:
        session = ort.InferenceSession(prepared.onnx_inputs.SerializeToString(), providers=["CPUExecutionProvider"])
    except errors as err:
        raise BenchError(f"onnxruntime cannot load {prepared.source.name}: {' '.join(str(err).split())[:300]}") \
            from None
    arrays: dict[str, np.ndarray] = {}
    digests, nonfinite = [], []
    for pos, set_id in enumerate(check_sets):
        inputs = generate(prepared.inputs, input_seed, set_id)
        digests.append(digest(inputs))
        feed = {k: (v.astype(np.float32) if v.dtype.kind == "f" else v) for k, v in inputs.items()}
        try:
            outs = session.run(None, {**feed, **fed})
        except errors as err:
            raise BenchError(f"onnxruntime failed on {prepared.source.name}: "
                             f"{' '.join(str(err).split())[:300]}") from None
        counts = []
        for j, (out, spec) in enumerate(zip(outs, prepared.outputs)):
            out = np.asarray(out)
            if tuple(out.shape) != spec.shape:
                raise BenchError(f"{prepared.source.name}: onnxruntime output {spec.name} has shape "
                                 f"{tuple(out.shape)}, the compiled model {spec.shape}")
            kept = take_sample(out, spec.sample)
            arrays[f"s{pos}_o{j}"] = kept.astype(np.float32) if kept.dtype.kind == "f" else kept
            counts.append(int(out.size - np.count_nonzero(np.isfinite(out))) if out.dtype.kind == "f" else 0)
        nonfinite.append(counts)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(path, **arrays)
    seconds = time.perf_counter() - start
    log.info("%s: reference in %.1f s", prepared.source.name, seconds)
    return Reference(path, list(check_sets), digests, weight_digest.hexdigest(), nonfinite, seconds)


__all__ = ["SOURCE", "Reference", "compute_reference"]
