"""The manifest of a benchmark bundle (``DIR/manifest.json``).

A bundle is what ``tvm-ext bench --build-only --out DIR`` writes and
``python -m tvm_ext.bench.run DIR`` measures::

    DIR/manifest.json           this file: models, inputs, weights recipes, builds
    DIR/lib/<model>__<system>.so exported Relax VM executables (device code compiled)
    DIR/ref/<model>.npz         sampled reference outputs of the check input sets
    DIR/python/tvm_ext/...      the runtime-side harness (numpy + TVM runtime only)
    DIR/corpus/*.py             model definitions for the torch baselines
    DIR/runtime/                optional: runtime-only TVM and the tvm-ffi wheel
    DIR/run.sh                  sets up the runtime and runs the harness

Everything in the manifest is plain JSON; paths are relative to ``DIR``.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import BenchError
from .inputs import InputSpec
from .numerics import Sample
from .weights import WeightTensor

FORMAT = "tvm_ext.bench/1"
MANIFEST = "manifest.json"


@dataclass
class OutputSpec:
    """One model output: its shape and dtype as the compiled model returns it, and the
    sample of it the reference keeps."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    sample: Sample

    def to_json(self) -> dict:
        """JSON form."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "sample": self.sample.to_json()}

    @classmethod
    def from_json(cls, d: Mapping) -> "OutputSpec":
        """Inverse of :meth:`to_json`."""
        return cls(str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]), Sample.from_json(d["sample"]))


@dataclass
class BuildEntry:
    """One compiled system of a model (a preset, optionally with CUDA graphs)."""

    system: str
    preset: str
    cuda_graph: bool = False
    status: str = "ok"
    error: str | None = None
    library: str | None = None
    library_bytes: int = 0
    device_code: str | None = None
    kernels: int | None = None
    distinct_kernels: int | None = None
    modelled_traffic_bytes: int | None = None
    modelled_time_s: float | None = None
    compile_s: float = 0.0
    stage_s: dict[str, float] = field(default_factory=dict)
    #: One entry per kernel-launching function of a GPU build: ``func``, ``kernel_names``, ``calls``,
    #: ``generator``, ``rule``, ``modelled_s``, ``cost_source`` and ``measurement`` (the fields of its
    #: database record). ``tvm_ext.bench.kernel_report`` joins per-kernel measurements with them.
    kernel_list: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        """JSON form."""
        return dict(self.__dict__)

    @classmethod
    def from_json(cls, d: Mapping) -> "BuildEntry":
        """Inverse of :meth:`to_json`."""
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


@dataclass
class ModelEntry:
    """One model of the bundle (shared by all its builds).

    ``weights`` are the parameters the libraries take after the inputs, regenerated from
    their recipe with ``weights_seed``; ``transform_params`` says whether the libraries
    have a ``main_transform_params`` to run on them first (weight-only computations lifted
    out of ``main``). ``check_digests`` fingerprint the check input sets, ``reference`` is
    the ``.npz`` of the sampled reference outputs (keys ``s<set>_o<output>``) and
    ``ref_nonfinite[set][output]`` counts non-finite elements of each full reference.
    """

    name: str
    source: str
    dtype: str
    status: str = "ok"
    error: str | None = None
    corpus: dict | None = None
    inputs: list[InputSpec] = field(default_factory=list)
    outputs: list[OutputSpec] = field(default_factory=list)
    weights: list[WeightTensor] = field(default_factory=list)
    weights_seed: int = 0
    weights_digest: str | None = None
    transform_params: bool = False
    input_seed: int = 0
    check_sets: list[int] = field(default_factory=list)
    check_digests: list[str] = field(default_factory=list)
    reference: str | None = None
    reference_source: str | None = None
    ref_nonfinite: list[list[int]] = field(default_factory=list)
    flops: int | None = None
    min_traffic_bytes: int | None = None
    compute_dtype: str | None = None
    builds: list[BuildEntry] = field(default_factory=list)

    @property
    def weight_bytes(self) -> int:
        """Bytes of the regenerated weights on the device."""
        return sum(w.nbytes for w in self.weights)

    def to_json(self) -> dict:
        """JSON form."""
        out = {k: v for k, v in self.__dict__.items() if k not in ("inputs", "outputs", "weights", "builds")}
        out["inputs"] = [i.to_json() for i in self.inputs]
        out["outputs"] = [o.to_json() for o in self.outputs]
        out["weights"] = [w.to_json() for w in self.weights]
        out["builds"] = [b.to_json() for b in self.builds]
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> "ModelEntry":
        """Inverse of :meth:`to_json`."""
        plain = {k: d[k] for k in cls.__dataclass_fields__
                 if k in d and k not in ("inputs", "outputs", "weights", "builds")}
        return cls(**plain,
                   inputs=[InputSpec.from_json(x) for x in d.get("inputs", [])],
                   outputs=[OutputSpec.from_json(x) for x in d.get("outputs", [])],
                   weights=[WeightTensor.from_json(x) for x in d.get("weights", [])],
                   builds=[BuildEntry.from_json(x) for x in d.get("builds", [])])


@dataclass
class Manifest:
    """The whole bundle description (see the module docstring)."""

    target: str
    target_kind: str
    dtype: str
    created: str
    commit: str
    tvm_version: str
    arch: str | None = None
    device: str | None = None
    seed: int = 0
    devices: dict[str, dict] = field(default_factory=dict)
    models: list[ModelEntry] = field(default_factory=list)
    runtime: dict | None = None
    format: str = FORMAT

    def model(self, name: str) -> ModelEntry:
        """The entry of model ``name``."""
        for m in self.models:
            if m.name == name:
                return m
        raise BenchError(f"no model '{name}' in the bundle; it has: {', '.join(m.name for m in self.models)}")

    def to_json(self) -> dict:
        """JSON form."""
        out = {k: v for k, v in self.__dict__.items() if k != "models"}
        out["models"] = [m.to_json() for m in self.models]
        return out

    @classmethod
    def from_json(cls, d: Mapping) -> "Manifest":
        """Inverse of :meth:`to_json`.

        Raises
        ------
        BenchError
            Another format, or a required field is missing or malformed.
        """
        if d.get("format") != FORMAT:
            raise BenchError(f"not a {FORMAT} manifest (format {d.get('format')!r})")
        try:
            plain = {k: d[k] for k in cls.__dataclass_fields__ if k in d and k != "models"}
            return cls(**plain, models=[ModelEntry.from_json(m) for m in d.get("models", [])])
        except (KeyError, TypeError, ValueError) as err:
            raise BenchError(f"malformed manifest: {type(err).__name__}: {err}") from None

    def write(self, directory: str | Path) -> Path:
        """Write ``DIR/manifest.json``."""
        path = Path(directory) / MANIFEST
        path.write_text(json.dumps(self.to_json(), indent=1, default=_json_default) + "\n")
        return path


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):  # numpy scalars
        return value.item()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def read_manifest(directory: str | Path) -> Manifest:
    """Read ``DIR/manifest.json``.

    Raises
    ------
    BenchError
        ``DIR`` is not a bundle, or its manifest is malformed.
    """
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise BenchError(f"{directory} is not a benchmark bundle (no {MANIFEST}); "
                         "make one with `tvm-ext bench --build-only --out DIR`")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise BenchError(f"{path} is not valid JSON: {err}") from None
    return Manifest.from_json(data)


__all__ = ["FORMAT", "MANIFEST", "OutputSpec", "BuildEntry", "ModelEntry", "Manifest", "read_manifest"]
