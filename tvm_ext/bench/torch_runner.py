"""PyTorch baselines of a bundled corpus model, built from the same model definitions.

The torch systems build the model with the corpus builders of ``scripts/corpus`` (copied
into ``DIR/corpus``; they need torch and, for most models, ``transformers``), never with
TVM. Systems:

* ``torch-eager`` — the module in the bundle's dtype (fp16 bundles: ``module.half()``);
* ``torch-compile`` — ``torch.compile(module)`` (default mode);
* ``torch-compile-reduce-overhead`` — ``torch.compile(module, mode="reduce-overhead")`` (CUDA
  graphs, without max-autotune's kernel search);
* ``torch-compile-max-autotune`` — ``torch.compile(module, mode="max-autotune")``
  (which uses CUDA graphs on GPUs);
* ``torch-eager+cudagraph`` — the eager module captured into one CUDA graph (with
  ``--cuda-graph``); each run first copies its input set into the static inputs, untimed.

The torch models carry the corpus builder's own weights, not the regenerated skeleton
weights of the TVM builds, so their reference is the same torch model in float32 with
TF32 off, run on the same check inputs. Kernel counts come from ``torch.profiler``.
"""
from __future__ import annotations

import copy
import importlib
import logging
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import BenchError
from .manifest import ModelEntry
from .model_data import ModelData
from .numerics import compare, poison_value, sample_for, summarize
from .timing import HostTimer, measure
from .tvm_runner import Measurement

log = logging.getLogger(__name__)

SYSTEMS = ("torch-eager", "torch-compile", "torch-compile-reduce-overhead", "torch-compile-max-autotune")
CUDA_GRAPH_SYSTEM = "torch-eager+cudagraph"
_COMPILE_MODES = {"torch-compile": "default", "torch-compile-reduce-overhead": "reduce-overhead",
                  "torch-compile-max-autotune": "max-autotune"}


class TorchEventTimer:
    """``torch.cuda.Event`` pairs around each run on torch's current stream."""

    name = "cuda-events"

    def __init__(self, torch: Any, runs: int):
        self.torch = torch
        self.starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
        self.ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]

    def before(self) -> None:
        """Called once before the timed runs."""
        self.torch.cuda.synchronize()

    def start(self, i: int) -> None:
        """Mark the start of run ``i``."""
        self.starts[i].record()

    def stop(self, i: int) -> None:
        """Mark the end of run ``i``."""
        self.ends[i].record()

    def results(self) -> list[float]:
        """Milliseconds per run."""
        self.torch.cuda.synchronize()
        return [s.elapsed_time(e) for s, e in zip(self.starts, self.ends)]


def build_corpus_model(corpus_dir: str | Path, corpus: dict) -> Any:
    """Build ``corpus["model"]`` at its variant with the corpus builders in ``corpus_dir``.

    Raises
    ------
    BenchError
        The corpus definitions are missing or do not know the model.
    """
    corpus_dir = Path(corpus_dir)
    if not (corpus_dir / "registry.py").is_file():
        raise BenchError(f"no corpus model definitions in {corpus_dir} (registry.py missing)")
    if str(corpus_dir) not in sys.path:
        sys.path.insert(0, str(corpus_dir))  # the corpus modules import each other by bare name
    registry = importlib.import_module("registry")
    spec_mod = importlib.import_module("spec")
    if corpus["model"] not in registry.REGISTRY:
        raise BenchError(f"corpus has no model '{corpus['model']}'")
    variant = spec_mod.Variant(batch=int(corpus["batch"]), seq=corpus.get("seq"))
    return registry.REGISTRY[corpus["model"]].builder(variant)


def _flatten(value: Any) -> list:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flatten(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _flatten(v)]
    return [value]


def _tensors(torch: Any, arrays: dict[str, np.ndarray], names: Sequence[str], dev: Any, dtype: Any) -> list:
    out = []
    for name in names:
        t = torch.from_numpy(np.ascontiguousarray(arrays[name])).to(dev)
        out.append(t.to(dtype) if t.is_floating_point() else t)
    return out


def _count_kernels(torch: Any, fn: Any) -> int | None:
    try:
        from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events()
                   if str(e.device_type).endswith("CUDA") and "memcpy" not in e.name.lower()
                   and "memset" not in e.name.lower())
    except (RuntimeError, AssertionError) as err:
        log.info("kernel count unavailable: %s", err)
        return None


def measure_torch(entry: ModelEntry, data: ModelData, corpus_dir: str | Path, systems: Sequence[str], *,
                  warmup: int, runs: int, repeat: bool = True, device: str = "cuda") -> list[Measurement]:
    """Check and time the torch ``systems`` of a corpus model (see the module docstring).

    Raises
    ------
    BenchError
        torch is missing, the device is not available, or the model is not a corpus model.
    """
    try:
        import torch  # noqa: PLC0415 - optional on the measuring machine
    except ImportError:
        raise BenchError("torch is not installed: the torch baselines need it") from None
    if entry.corpus is None:
        raise BenchError(f"{entry.name} is not a corpus model: no torch definition to build")
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("torch sees no CUDA GPU")
    dev = torch.device(device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    built = build_corpus_model(corpus_dir, entry.corpus)
    names = [s.name for s in entry.inputs]
    dtype = torch.float16 if entry.dtype == "float16" else torch.float32
    ref_model = built.module.eval().float().to(dev)
    with torch.no_grad():
        refs = [[t.float().cpu().numpy() for t in _flatten(ref_model(*_tensors(torch, a, names, dev, torch.float32)))]
                for a in data.check_inputs]
    model = copy.deepcopy(ref_model).to(dtype)
    del ref_model
    results = []
    for system in systems:
        m = Measurement(system)
        results.append(m)
        try:
            fn, prepare, m.extra = _system(torch, system, model, data, names, dev, dtype)
            with torch.no_grad():
                m.numerics = _check(torch, fn, prepare, data, refs, entry.dtype)
                m.kernels = _count_kernels(torch, lambda: (prepare(0), fn(0))) if device == "cuda" else None
                timer = (lambda n: TorchEventTimer(torch, n)) if device == "cuda" else _host_timer(torch, dev)
                m.samples_ms = measure(fn, len(data.timing_inputs), warmup, runs, timer, prepare)
                if repeat:
                    m.repeat_samples_ms = measure(fn, len(data.timing_inputs), warmup, runs, timer, prepare)
        except (BenchError, RuntimeError, ValueError, TypeError, AssertionError) as err:
            m.error = f"{type(err).__name__}: {' '.join(str(err).split())[:500]}"
            log.warning("%s/%s failed: %s", entry.name, system, m.error)
        m.extra.update({"framework": "torch", "framework_version": torch.__version__})
    return results


def _host_timer(torch: Any, dev: Any):
    return lambda n: HostTimer(lambda: torch.cuda.synchronize() if dev.type == "cuda" else None, n)


def _system(torch: Any, system: str, model: Any, data: ModelData, names: Sequence[str], dev: Any, dtype: Any):
    """``(call(k), prepare(k), extra)`` of a torch system."""
    sets = [_tensors(torch, a, names, dev, dtype) for a in data.timing_inputs]
    check = [_tensors(torch, a, names, dev, dtype) for a in data.check_inputs]
    all_sets = sets + check  # check set j is index len(sets) + j (see _check)
    noop = lambda k: None  # noqa: E731
    if system == "torch-eager":
        return (lambda k: model(*all_sets[k])), noop, {}
    if system in _COMPILE_MODES:
        start = time.perf_counter()
        compiled = torch.compile(model, mode=_COMPILE_MODES[system])
        with torch.no_grad():
            compiled(*all_sets[0])  # compile now, outside the timings
        extra = {"compile_s": round(time.perf_counter() - start, 2)}
        return (lambda k: compiled(*all_sets[k])), noop, extra
    if system == CUDA_GRAPH_SYSTEM:
        static = [t.clone() for t in all_sets[0]]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(3):
                model(*static)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            static_out = model(*static)

        def prepare(k: int) -> None:
            for dst, src in zip(static, all_sets[k]):
                dst.copy_(src)

        def call(k: int) -> Any:
            graph.replay()
            return static_out

        return call, prepare, {"cuda_graph": True}
    raise BenchError(f"unknown torch system '{system}'; known: {', '.join(SYSTEMS + (CUDA_GRAPH_SYSTEM,))}")


def _check(torch: Any, fn: Any, prepare: Any, data: ModelData, refs: list, dtype: str) -> dict:
    offset = len(data.timing_inputs)
    checks, previous = [], []
    for pos, ref in enumerate(refs):
        for t in previous:
            t.fill_(poison_value(np.float32) if t.is_floating_point() else poison_value(np.int64))
        prepare(offset + pos)
        outs = [t for t in _flatten(fn(offset + pos)) if hasattr(t, "shape")]
        if len(outs) != len(ref):
            raise BenchError(f"torch model returned {len(outs)} outputs, its fp32 reference {len(ref)}")
        for j, (out, want) in enumerate(zip(outs, ref)):
            sample = sample_for(want.size, want.size)
            checks.append(compare(f"output{j}", out.float().cpu().numpy(), want.reshape(-1), sample,
                                  int(want.size - np.count_nonzero(np.isfinite(want)))))
        previous = outs
    return summarize(checks, dtype)


__all__ = ["SYSTEMS", "CUDA_GRAPH_SYSTEM", "TorchEventTimer", "build_corpus_model", "measure_torch"]
