"""The steps of a prepared GPU run and their planned device seconds (build-host side).

Each estimate says where it comes from, most reliable first:

1. **a recorded step** - the wall time of the same step (kind, model, systems) in the newest
   ``bench/results/*_steps.jsonl`` that the ingest of an earlier run wrote;
2. **recorded medians** - for measurement steps: an assumed process start, the weights
   regenerated at the rate measured on this machine, and the timed runs at the newest measured
   median of that (model, system) in ``bench/results/*.jsonl`` (else its modelled time: the
   calibrated model's leave-one-model-out geometric mean is 1.06, ``bench/modelled/validation.md``);
3. **assumed** - a stated constant (:data:`ASSUMED_S`), for steps never recorded.
"""
from __future__ import annotations

import json
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .gpu_steps import Step
from .manifest import BuildEntry, Manifest, ModelEntry

#: Assumed seconds where nothing was recorded yet; replaced by recorded step times after a run.
#: ``process``: start of a harness process (Python, runtime-only TVM, CUDA context, libraries);
#: ``torch_process``: the same with torch imported; ``sanitize_process`` + ``sanitize_build`` per
#: (model, preset): a compute-sanitizer process (25 s for the three tiny models under one preset,
#: the figure these steps were planned at before they were split by build);
#: ``ncu_start`` + ``ncu_per_kernel`` per launch: an Nsight Compute process replaying each launch.
ASSUMED_S = {"process": 4.0, "torch_process": 10.0, "torch-compile": 60.0, "sanitize_process": 13.0,
             "sanitize_build": 4.0, "ncu_start": 15.0, "ncu_per_kernel": 0.5}
#: Timed-run fallback of a (model, system) never measured nor modelled.
UNKNOWN_MS = 10.0
#: Measured / modelled time of the calibrated model (leave-one-model-out over the H200's kernels,
#: geometric mean of modelled/measured 1.06: ``bench/modelled/validation.md``); a modelled time is
#: scaled by it when nothing was measured.
MODEL_OPTIMISM = 1 / 1.06
#: A step is killed after this many times its plan (and never before :data:`MIN_TIMEOUT_S`).
TIMEOUT_FACTOR, MIN_TIMEOUT_S = 3.0, 30.0
SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")


@dataclass
class History:
    """What earlier GPU runs recorded: step wall times and measured medians."""

    step_s: dict[tuple[str, str | None, tuple[str, ...]], tuple[float, str]]
    median_ms: dict[tuple[str, str], tuple[float, str]]

    @classmethod
    def load(cls, results: Path) -> History:
        """Read ``results/*.jsonl`` (newest file wins per key); empty when there is no such directory."""
        steps: dict = {}
        medians: dict = {}
        for path in sorted(results.glob("*.jsonl")) if results.is_dir() else []:
            for line in path.read_text().splitlines():
                r = json.loads(line)
                if r.get("dry_run"):
                    continue
                if path.name.endswith("_steps.jsonl") and r.get("wall_s") and r.get("status") == "ok":
                    steps[(r["kind"], r.get("model"), tuple(r.get("systems") or ()))] = (float(r["wall_s"]), path.name)
                elif r.get("median_ms") and "model" in r and "system" in r:
                    medians[(r["model"], r["system"])] = (float(r["median_ms"]), path.name)
        return cls(steps, medians)


def weight_rate_per_s(elements: int = 4_000_000) -> float:
    """Weight elements this machine regenerates per second (numpy normal draws, cast to float16)."""
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    rng.standard_normal(elements).astype(np.float32).astype(np.float16)
    return elements / max(time.perf_counter() - start, 1e-6)


def cache_rate_per_s(elements: int = 8_000_000) -> float:
    """Float16 weight elements this machine writes to and reads back from the weight cache per second."""
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        np.savez(Path(tmp) / "w.npz", w0=np.zeros(elements, dtype=np.float16))
        with np.load(Path(tmp) / "w.npz") as npz:
            npz["w0"].sum()
        return elements / max(time.perf_counter() - start, 1e-6)


class Estimator:
    """Planned seconds of steps, with their source (see the module docstring)."""

    def __init__(self, history: History, weight_rate: float, cache_rate: float, *, runs: int, warmup: int,
                 repeat: bool):
        self.history, self.weight_rate, self.cache_rate = history, weight_rate, cache_rate
        self.runs, self.warmup, self.repeat = runs, warmup, repeat
        self._drawn: set[str] = set()  # models whose weights an earlier step regenerated into the cache

    def recorded(self, kind: str, model: str | None, systems: Sequence[str]) -> tuple[float, str] | None:
        """The recorded wall time of this step, if any."""
        hit = self.history.step_s.get((kind, model, tuple(systems)))
        return (hit[0], f"recorded step ({hit[1]})") if hit else None

    def _weights(self, entry: ModelEntry) -> float:
        """Seconds to regenerate ``entry``'s weights (first time) or read them from the cache."""
        elements = entry.weight_bytes / 2
        if entry.name in self._drawn:
            return elements / self.cache_rate
        self._drawn.add(entry.name)
        return elements / self.weight_rate + elements / self.cache_rate

    def _timed(self, entry: ModelEntry, system: str, modelled_s: float | None, repeat: bool) -> tuple[float, str]:
        """Seconds of the warm-up and timed runs of one system, and where its per-run time comes from."""
        got = self.history.median_ms.get((entry.name, system))
        if got:
            ms, src = got[0], f"median of {got[1]}"
        elif modelled_s:
            ms, src = modelled_s * 1e3 * MODEL_OPTIMISM, f"modelled x {MODEL_OPTIMISM:.2f}"
        else:
            ms, src = UNKNOWN_MS, f"{UNKNOWN_MS:.0f} ms assumed"
        runs = 2 + (self.warmup + self.runs) * (2 if repeat else 1)
        return runs * ms / 1e3, src

    def measure(self, entry: ModelEntry, builds: Sequence[BuildEntry], kind: str = "measure") -> tuple[float, str]:
        """One process checking and timing ``builds`` of ``entry``."""
        hit = self.recorded(kind, entry.name, [b.system for b in builds])
        if hit:
            return hit
        seconds = ASSUMED_S["process"] + self._weights(entry)
        sources = {"process start assumed", "weights drawn or cached at the rates measured here"}
        for b in builds:
            timed, src = self._timed(entry, b.system, b.modelled_time_s, self.repeat)
            seconds += timed
            sources.add(src)
        return seconds, "; ".join(sorted(sources))

    def torch(self, entries: Sequence[ModelEntry], system: str) -> tuple[float, str]:
        """One torch process timing ``system`` (``torch-eager``) on every model of ``entries``."""
        hit = self.recorded("torch", ",".join(e.name for e in entries), [system])
        if hit:
            return hit
        seconds, sources = ASSUMED_S["torch_process"], {"torch process start assumed",
                                                        "weights drawn or cached at the rates measured here"}
        for e in entries:
            timed, src = self._timed(e, system, None, False)
            seconds += self._weights(e) + timed
            sources.add(src)
        return seconds, "; ".join(sorted(sources))

    def fixed(self, kind: str, model: str | None, systems: Sequence[str], assumed: float) -> tuple[float, str]:
        """A step priced by its record or, never recorded, by an assumed constant."""
        return self.recorded(kind, model, systems) or (assumed, "assumed")


def timeout_for(estimate_s: float) -> float:
    """The time limit of a step planned at ``estimate_s``."""
    return round(max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * estimate_s), 1)


def _step(id: str, kind: str, argv: list[str], est: tuple[float, str], **kw) -> Step:
    return Step(id=id, kind=kind, argv=argv, estimate_s=round(est[0], 1), estimate_from=est[1],
                timeout_s=timeout_for(est[0]), **kw)


def _run_argv(bundle: str, model: str, systems: Iterable[str], extra: Sequence[str]) -> list[str]:
    return ["{python}", "-m", "tvm_ext.bench.run", f"{{run_dir}}/{bundle}", "--models", model,
            "--systems", ",".join(systems), "--out", "{out}/results.jsonl", *extra]


def measure_steps(bundle: str, manifest: Manifest, est: Estimator, preset_order: Sequence[str],
                  kind: str = "measure") -> list[Step]:
    """One step per (model, system) of ``manifest``, presets in ``preset_order`` first, then the models."""
    extra = ["--torch", "off", "--runs", str(est.runs), "--warmup", str(est.warmup)]
    extra += [] if est.repeat else ["--no-repeat"]
    order = {p: i for i, p in enumerate(preset_order)}
    pairs = [(m, b) for m in manifest.models for b in m.builds if b.status == "ok"]
    pairs.sort(key=lambda mb: (order.get(mb[1].preset, len(order)), mb[1].system, mb[0].name))
    return [_step(f"{kind}:{m.name}/{b.system}", kind, _run_argv(bundle, m.name, [b.system], extra),
                  est.measure(m, [b], kind), model=m.name, systems=[b.system], bundle=bundle) for m, b in pairs]


def sanitize_steps(bundle: str, manifest: Manifest, est: Estimator, tools: Mapping[str, Sequence[str]],
                   isolated: Iterable[str] = ("memcheck",)) -> list[Step]:
    """compute-sanitizer runs of every tiny model under the presets ``tools`` names for each tool.

    A tool in ``isolated`` gets one process per preset (memcheck ends the CUDA context at its
    first error, which would lose the presets after it); the others one process for all.
    """
    steps = []
    isolated = set(isolated)
    built = sorted({b.system for m in manifest.models for b in m.builds if b.status == "ok"})
    ok = [m.name for m in manifest.models if m.status == "ok"]
    models = ",".join(ok)
    for tool, presets in tools.items():
        systems = [s for s in built if s in presets]
        groups = [[s] for s in systems] if tool in isolated else ([systems] if systems else [])
        for group in groups:
            argv = ["{tool}", "--tool", tool, "--error-exitcode", "9", "--print-limit", "50",
                    *_run_argv(bundle, models, group, ["--torch", "off", "--runs", "1", "--warmup", "0",
                                                       "--input-sets", "1", "--no-repeat"])]
            argv[argv.index("{out}/results.jsonl")] = "{out}/sanitizer_results.jsonl"
            assumed = ASSUMED_S["sanitize_process"] + ASSUMED_S["sanitize_build"] * len(ok) * len(group)
            steps.append(_step(f"sanitize:{tool}/{'+'.join(group)}", "sanitize", argv,
                               est.fixed(f"sanitize:{tool}", models, group, assumed),
                               model=models, systems=group, bundle=bundle, tool="compute-sanitizer"))
    return steps


def torch_steps(bundle: str, manifest: Manifest, est: Estimator, compile_models: Sequence[str]) -> list[Step]:
    """PyTorch eager on every corpus model, in one process; ``torch.compile(mode="reduce-overhead")``
    on each of ``compile_models`` in a process of its own (a compile that fails or hangs loses one)."""
    entries = [m for m in manifest.models if m.corpus is not None and m.status == "ok"]
    if not entries:
        return []
    extra = ["--torch", "on", "--runs", str(est.runs), "--warmup", str(est.warmup), "--no-repeat"]
    models = ",".join(m.name for m in entries)
    steps = [_step("torch:eager", "torch", _run_argv(bundle, models, ["torch-eager"], extra),
                   est.torch(entries, "torch-eager"), model=models, systems=["torch-eager"], bundle=bundle)]
    system = "torch-compile-reduce-overhead"
    for m in [m for m in entries if m.name in compile_models]:
        steps.append(_step(f"torch:compile/{m.name}", "torch", _run_argv(bundle, m.name, [system], extra),
                           est.fixed("torch", m.name, [system], ASSUMED_S["torch-compile"]),
                           model=m.name, systems=[system], bundle=bundle))
    return steps


def ncu_planned_s(launches: int) -> float:
    """Assumed seconds of an Nsight Compute process over ``launches`` kernel launches."""
    return ASSUMED_S["ncu_start"] + ASSUMED_S["ncu_per_kernel"] * launches


def ncu_choices(manifest: Manifest, measured: Iterable[Mapping], count: int) -> list[dict]:
    """The ``count`` builds whose profile settles the most unsure modelled time per device second.

    A build's unsure time is its modelled time resting on unmeasured kinds of kernel, divided by
    the planned seconds of profiling it (:func:`ncu_planned_s` of its launches). A kernel counts
    fully when no record of ``measured`` has its generator and code path, half when some do (a
    measured kind, another shape); kernels priced from their own record not at all.
    """
    kinds: dict[tuple[str, str], int] = {}
    for r in measured:
        k = (r.get("generator"), r.get("config", {}).get("kernel", {}).get("code_path"))
        kinds[k] = kinds.get(k, 0) + 1
    scored = []
    for m in manifest.models:
        for b in m.builds:
            if b.status != "ok":
                continue
            unsure, kernels = 0.0, []
            for k in b.kernel_list:
                if k.get("cost_source") == "measured":
                    continue
                path = k.get("measurement", {}).get("config", {}).get("kernel", {}).get("code_path")
                weight = 0.5 if kinds.get((k.get("generator"), path)) else 1.0
                unsure += weight * (k.get("modelled_s") or 0.0) * (k.get("calls") or 1)
                kernels.append({"func": k["func"], "generator": k.get("generator"), "code_path": path,
                                "measured_kind": weight < 1.0})
            if kernels:
                launches = b.kernels or len(kernels)
                scored.append({"model": m.name, "system": b.system, "unsure_modelled_s": unsure,
                               "launches": launches, "unsure_per_planned_s": unsure / ncu_planned_s(launches),
                               "kernels": kernels})
    scored.sort(key=lambda s: -s["unsure_per_planned_s"])
    return scored[:count]


def ncu_steps(bundle: str, choices: Sequence[Mapping], est: Estimator) -> list[Step]:
    """One Nsight Compute process per chosen build (per-kernel time and DRAM bytes)."""
    steps = []
    for c in choices:
        argv = ["{tool}", "--profile-from-start", "off", "--csv", "--page", "raw", "--print-units", "base",
                "--clock-control", "none", "--cache-control", "all", "--metrics",
                "gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum",
                "--log-file", f"{{out}}/ncu/{c['model']}__{c['system']}.csv",
                "{python}", "-m", "tvm_ext.bench.kernel_profile", f"{{run_dir}}/{bundle}", "--model", c["model"],
                "--system", c["system"]]
        steps.append(_step(f"ncu:{c['model']}/{c['system']}", "ncu", argv,
                           est.fixed("ncu", c["model"], [c["system"]], ncu_planned_s(c["launches"])),
                           model=c["model"], systems=[c["system"]], bundle=bundle, tool="ncu"))
    return steps


__all__ = [
    "ASSUMED_S",
    "MODEL_OPTIMISM",
    "SANITIZER_TOOLS",
    "UNKNOWN_MS",
    "Estimator",
    "History",
    "measure_steps",
    "ncu_choices",
    "ncu_planned_s",
    "ncu_steps",
    "sanitize_steps",
    "timeout_for",
    "torch_steps",
    "weight_rate_per_s",
]
