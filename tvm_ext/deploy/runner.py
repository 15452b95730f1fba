"""Run an exported library with the TVM runtime alone: inputs in, outputs and timing out.

:func:`run_library` loads the library into a ``VirtualMachine`` on the device its signature
names (:mod:`.signature`; a library without one runs on the CPU unless it holds CUDA code),
takes the inputs from an ``.npz`` file or draws random ones from the signature, loads the
weights from the params file when they are outside, runs ``main`` once for the outputs and
then times it (CUDA events on a GPU, synchronized host time on the CPU; the benchmark
harness's timers). No compiler is involved: CUDA device code must be compiled into the library.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import DeployError
from .runtime import device_for, device_info, import_tvm
from .signature import TRANSFORM_PARAMS, Signature, read_signature
from .weights import load_params


@dataclass
class RunResult:
    """Outputs and timing of one library run."""

    device: str
    signature: Signature | None
    inputs: dict[str, np.ndarray]
    outputs: list[np.ndarray]
    samples_ms: list[float] = field(default_factory=list)

    @property
    def median_ms(self) -> float | None:
        """Median time of ``main`` (ms), None when not timed."""
        return statistics.median(self.samples_ms) if self.samples_ms else None


def _target_kind(path: Path) -> str:
    from ..toolchain.device_code import library_device_code  # noqa: PLC0415 - reads bytes, no compiler

    return "cuda" if library_device_code(path) is not None else "llvm"


def _read_inputs(path: Path, signature: Signature | None) -> dict[str, np.ndarray]:
    if not path.is_file():
        raise DeployError(f"inputs file not found: {path}")
    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files}
    except (OSError, ValueError) as err:
        raise DeployError(f"cannot read inputs file {path}: {err}") from None
    if signature is None:
        return arrays
    missing = [s.name for s in signature.inputs if s.name not in arrays]
    if missing:
        raise DeployError(f"{path} lacks the inputs {missing} (it has {sorted(arrays)})")
    out = {}
    for spec in signature.inputs:
        array = arrays[spec.name]
        if tuple(array.shape) != tuple(spec.shape) or str(array.dtype) != spec.dtype:
            raise DeployError(f"input '{spec.name}' is {array.shape} {array.dtype}, the library takes "
                              f"{tuple(spec.shape)} {spec.dtype}")
        out[spec.name] = array
    return out


def _flatten(value: Any) -> list:
    from ..bench.tvm_runner import flatten  # noqa: PLC0415

    return flatten(value)


def run_library(path: str | Path, *, inputs: str | Path | None = None, params: str | Path | None = None,
                warmup: int = 10, runs: int = 100, seed: int = 0) -> RunResult:
    """Load ``path``, run ``main`` once for its outputs, then ``runs`` timed times after ``warmup``.

    Parameters
    ----------
    path : path-like
        The library (``tvm-ext compile -o``).
    inputs : path-like, optional
        ``.npz`` with one array per input (by name); default: random inputs from the signature.
    params : path-like, optional
        The params file of a library whose weights are outside (default: the one its signature names,
        next to the library).
    warmup, runs : int
        Untimed and timed runs (``runs=0``: no timing).
    seed : int
        Seed of the random inputs.

    Raises
    ------
    DeployError
        No file, no device of the library's kind here (no GPU), inputs or weights that do not fit.
    """
    from ..bench.inputs import generate  # noqa: PLC0415
    from ..bench.timing import CudaRuntime, EventTimer, HostTimer, measure  # noqa: PLC0415

    path = Path(path)
    if not path.is_file():
        raise DeployError(f"library not found: {path}")
    tvm = import_tvm()
    kind = _target_kind(path)
    dev = device_for(tvm, kind)  # DeployError without a GPU, before the CUDA module is loaded
    vm = tvm.runtime.vm.VirtualMachine(tvm.runtime.load_module(str(path)), dev)
    signature = read_signature(vm)
    if inputs is not None:
        arrays = _read_inputs(Path(inputs), signature)
    elif signature is not None:
        arrays = generate(signature.inputs, seed, 0)
    else:
        raise DeployError(f"{path} carries no input signature (it was not built by tvm_ext.compile or "
                          "tvm-ext compile): give the inputs with --inputs FILE.npz")
    args = [tvm.runtime.tensor(a, dev) for a in arrays.values()]
    if signature is not None and signature.num_params:
        file = Path(params) if params is not None else path.parent / str(signature.params_file)
        weights = [tvm.runtime.tensor(w, dev) for w in load_params(file, signature.num_params)]
        args += list(vm[TRANSFORM_PARAMS](weights)) if signature.transform_params else weights
    main = vm["main"]
    outputs = [t.numpy() for t in _flatten(main(*args))]
    samples: list[float] = []
    if runs > 0:
        cuda = CudaRuntime() if kind == "cuda" else None

        def make_timer(n: int) -> EventTimer | HostTimer:
            return EventTimer(cuda, n) if cuda is not None else HostTimer(dev.sync, n)

        samples = measure(lambda _k: main(*args), 1, warmup, runs, make_timer)
    return RunResult(device_info(dev, kind)["device"], signature, arrays, outputs, samples)


__all__ = ["RunResult", "run_library"]
