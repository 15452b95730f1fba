"""Inputs and reference outputs of one bundled model, regenerated on the measuring machine."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..errors import BenchError
from .inputs import FIRST_TIMING_SET, digest, generate, timing_set_count
from .manifest import ModelEntry
from .numerics import OutputCheck, compare


@dataclass
class ModelData:
    """Numpy data of one model.

    Attributes
    ----------
    check_inputs : list of dict
        The check input sets (``entry.check_sets``), name -> array.
    timing_inputs : list of dict
        The rotating timing sets.
    references : list of list of ndarray
        Per check set, per output: the sampled reference values (empty without a reference).
    """

    entry: ModelEntry
    check_inputs: list[dict[str, np.ndarray]]
    timing_inputs: list[dict[str, np.ndarray]]
    references: list[list[np.ndarray]]

    def check(self, set_pos: int, outputs: list[np.ndarray]) -> list[OutputCheck]:
        """Compare the outputs of check set number ``set_pos`` with the reference.

        Raises
        ------
        BenchError
            The bundle has no reference, or the model returned the wrong number or shape of outputs.
        """
        specs = self.entry.outputs
        if not self.references:
            raise BenchError(f"{self.entry.name}: the bundle has no reference outputs")
        if len(outputs) != len(specs):
            raise BenchError(f"{self.entry.name}: {len(outputs)} outputs, the manifest lists {len(specs)}")
        checks = []
        for j, (out, spec) in enumerate(zip(outputs, specs)):
            if tuple(out.shape) != spec.shape:
                raise BenchError(f"{self.entry.name}: output {spec.name} has shape {tuple(out.shape)}, "
                                 f"expected {spec.shape}")
            nonfinite = self.entry.ref_nonfinite[set_pos][j] if self.entry.ref_nonfinite else 0
            checks.append(compare(spec.name, out, self.references[set_pos][j], spec.sample, nonfinite))
        return checks


def load_model_data(bundle: str | Path, entry: ModelEntry, input_sets: int, verify: bool = True) -> ModelData:
    """Regenerate the check and timing inputs of ``entry`` and read its reference.

    Raises
    ------
    BenchError
        A regenerated check set differs from the one the reference was computed on.
    """
    check = [generate(entry.inputs, entry.input_seed, k) for k in entry.check_sets]
    if verify and entry.check_digests:
        for k, arrays, want in zip(entry.check_sets, check, entry.check_digests):
            if digest(arrays) != want:
                raise BenchError(f"{entry.name}: check input set {k} regenerated differently than on the "
                                 "build host (numpy random streams differ); the reference does not apply")
    count = timing_set_count(entry.inputs, input_sets)
    timing = [generate(entry.inputs, entry.input_seed, FIRST_TIMING_SET + k) for k in range(count)]
    refs: list[list[np.ndarray]] = []
    if entry.reference:
        path = Path(bundle) / entry.reference
        if not path.is_file():
            raise BenchError(f"{entry.name}: reference file {path} is missing")
        with np.load(path) as npz:
            refs = [[npz[f"s{k}_o{j}"] for j in range(len(entry.outputs))] for k in range(len(entry.check_sets))]
    return ModelData(entry, check, timing, refs)


__all__ = ["ModelData", "load_model_data"]
