"""Which models a benchmark runs: suites, skeleton names, bundled models and ONNX files.

* ``seed`` — every committed corpus skeleton (``tvm_ext/models/skeletons/*.onnx``), batch 1;
* ``small`` — the bundled ``mlp`` and ``conv_block`` (seconds to build; used by the tests).

A model argument is a skeleton name with or without its ``_fp32`` suffix
(``resnet50_b1``), a bundled model name (``mlp``), or the path of an ``.onnx`` file.
"""
from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from ..errors import BenchError

#: ``metadata_props`` key of the corpus record (written by ``scripts/corpus/export.py``).
CORPUS_KEY = "tvm_ext.corpus"
SMALL = ("mlp", "conv_block")
_VARIANT = re.compile(r"^(?:s(\d+)_)?b(\d+)$")


def _skeleton_dir() -> Path:
    from ..models.skeleton import SKELETON_DIR  # noqa: PLC0415

    return Path(SKELETON_DIR)


@dataclass(frozen=True)
class ModelSource:
    """Where a benchmarked model comes from.

    Attributes
    ----------
    name : str
        Model name in results (``resnet50_b1``, ``mlp``).
    path : Path or None
        ONNX file (skeleton or full weights), or None for a bundled builder.
    builder : str or None
        Name of a :data:`tvm_ext.models.BUNDLED` builder.
    """

    name: str
    path: Path | None = None
    builder: str | None = None

    def load(self) -> onnx.ModelProto:
        """The ONNX model (a skeleton stays a skeleton).

        Raises
        ------
        BenchError
            The file is missing or not ONNX.
        """
        if self.builder is not None:
            from ..models import get_model  # noqa: PLC0415

            return get_model(self.builder)
        assert self.path is not None
        if not self.path.is_file():
            raise BenchError(f"model file not found: {self.path}")
        try:
            return onnx.load(str(self.path))
        except (OSError, ValueError) as err:
            raise BenchError(f"cannot read ONNX model {self.path}: {err}") from None


def skeletons() -> list[ModelSource]:
    """Every committed skeleton, sorted by name."""
    return [ModelSource(_strip(p.stem), path=p) for p in sorted(_skeleton_dir().glob("*.onnx"))]


def _strip(stem: str) -> str:
    return stem[: -len("_fp32")] if stem.endswith("_fp32") else stem


def suite(name: str) -> list[ModelSource]:
    """The models of suite ``name`` (``seed`` or ``small``).

    Raises
    ------
    BenchError
        Unknown suite, or the seed suite has no skeletons.
    """
    if name == "seed":
        found = skeletons()
        if not found:
            raise BenchError(f"no skeletons in {_skeleton_dir()}; build them with scripts/corpus/build_corpus.py")
        return found
    if name == "small":
        return [ModelSource(n, builder=n) for n in SMALL]
    raise BenchError(f"unknown suite '{name}'; suites: seed, small")


def resolve(models: Sequence[str]) -> list[ModelSource]:
    """Model arguments to sources (see the module docstring); names must be unique.

    Raises
    ------
    BenchError
        An argument matches nothing; lists what exists.
    """
    from ..models import BUNDLED  # noqa: PLC0415

    known = {s.name: s for s in skeletons()}
    out: list[ModelSource] = []
    for arg in models:
        path = Path(arg)
        if arg.endswith(".onnx") or path.is_file():
            if not path.is_file():
                raise BenchError(f"model file not found: {arg}")
            out.append(ModelSource(_strip(path.stem), path=path))
        elif _strip(arg) in known:
            out.append(known[_strip(arg)])
        elif arg in BUNDLED:
            out.append(ModelSource(arg, builder=arg))
        else:
            raise BenchError(f"unknown model '{arg}'; skeletons: {', '.join(sorted(known)) or '(none)'}; "
                             f"bundled: {', '.join(sorted(BUNDLED))}; or give an .onnx path")
    names = [s.name for s in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BenchError(f"model names must be unique, repeated: {dupes}")
    return out


def corpus_record(model: onnx.ModelProto) -> dict | None:
    """The corpus record of a model: ``{"model", "batch", "seq", "int_inputs"}``, or None."""
    raw = {p.key: p.value for p in model.metadata_props}.get(CORPUS_KEY)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        match = _VARIANT.match(str(data["variant"]))
        if match is None:
            raise ValueError(f"variant {data['variant']!r}")
        return {"model": str(data["model"]), "batch": int(match.group(2)),
                "seq": int(match.group(1)) if match.group(1) else None,
                "int_inputs": {k: [int(v[0]), int(v[1])] for k, v in data.get("int_inputs", {}).items()}}
    except (KeyError, TypeError, ValueError, json.JSONDecodeError) as err:
        raise BenchError(f"malformed {CORPUS_KEY} record: {err}") from None


__all__ = ["CORPUS_KEY", "SMALL", "ModelSource", "skeletons", "suite", "resolve", "corpus_record"]
