"""Measure a benchmark bundle: ``python -m tvm_ext.bench.run DIR``.

Runs on the GPU machine with the TVM runtime only (``TVM_USE_RUNTIME_LIB=1`` is the
default here; ``DIR/run.sh`` also sets up a packed runtime): for every model of the
bundle, regenerate its weights and inputs, check and time every TVM build, then the
torch baselines when torch and the corpus definitions are there, and write one JSON line
per model and system to ``DIR/results/<date>_<device>_<commit>.jsonl`` (or ``--out``)
plus a markdown table beside it. See ``bench/README.md`` for the method.

::

    python -m tvm_ext.bench.run DIR [--models a,b] [--systems baseline,torch-eager]
        [--torch auto|on|off] [--cuda-graph] [--warmup 10] [--runs 100] [--input-sets 8]
        [--no-repeat] [--out results.jsonl]
"""
from __future__ import annotations

import argparse
import datetime as _dt
import logging
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..errors import BenchError, TvmExtError
from .manifest import Manifest, ModelEntry, read_manifest
from .model_data import load_model_data
from .results import append_jsonl, markdown_table, results_name
from .timing import CudaRuntime, EventTimer, HostTimer, Stats
from .torch_runner import CUDA_GRAPH_SYSTEM, SYSTEMS as TORCH_SYSTEMS
from .tvm_runner import Measurement, measure_builds
from ..deploy.runtime import device_for, device_info, import_tvm, runtime_only

log = logging.getLogger(__name__)


def roofline_ms(manifest: Manifest, entry: ModelEntry, device_name: str) -> tuple[float | None, str | None]:
    """Roofline lower bound of ``entry`` on the device the driver calls ``device_name``.

    ``max(flops / peak FLOP/s of the model's dtype, min bytes / DRAM bandwidth)`` with the
    numbers of the device description (``tvm_ext/hardware/devices``) whose name appears in
    ``device_name`` (``NVIDIA H100 80GB HBM3`` -> ``h100``); ``(None, None)`` for unknown devices.
    """
    key = device_name.lower().replace(" ", "").replace("-", "")
    matches = [n for n in manifest.devices if n.replace("_", "") in key]
    if not matches or entry.flops is None or entry.min_traffic_bytes is None:
        return None, None
    name = max(matches, key=len)
    spec = manifest.devices[name]
    peak = spec["peak_flops"].get(entry.compute_dtype or entry.dtype)
    if not peak:
        return None, None
    seconds = max(entry.flops / peak, entry.min_traffic_bytes / spec["dram_bandwidth_bytes_per_s"])
    return seconds * 1e3, name


def _record(manifest: Manifest, entry: ModelEntry, m: Measurement, base: dict, roof: float | None,
            roof_device: str | None) -> dict:
    build = next((b for b in entry.builds if b.system == m.system), None)
    rec: dict[str, Any] = {"model": entry.name, "system": m.system, **base, "dtype": entry.dtype,
                           "median_ms": None, "min_ms": None, "max_ms": None, "kernels": m.kernels,
                           "max_rel_err": m.numerics.get("max_rel_err")}
    if m.samples_ms:
        s = Stats.of(m.samples_ms)
        rec.update(median_ms=s.median_ms, min_ms=s.min_ms, max_ms=s.max_ms, mean_ms=s.mean_ms, runs=s.runs)
    if m.repeat_samples_ms:
        r = Stats.of(m.repeat_samples_ms)
        rec["repeat_median_ms"] = r.median_ms
        if rec["median_ms"]:
            rec["noise_pct"] = 100 * abs(r.median_ms - rec["median_ms"]) / min(r.median_ms, rec["median_ms"])
    rec.update({k: v for k, v in m.numerics.items() if k != "max_rel_err"})
    rec.update(roofline_ms=roof, roofline_device=roof_device, flops=entry.flops,
               min_traffic_bytes=entry.min_traffic_bytes,
               roofline_fraction=(roof / rec["median_ms"]) if roof and rec["median_ms"] else None)
    if build is not None:
        rec.update(framework="tvm", preset=build.preset, cuda_graph=build.cuda_graph,
                   distinct_kernels=build.distinct_kernels, modelled_traffic_bytes=build.modelled_traffic_bytes,
                   modelled_time_ms=None if build.modelled_time_s is None else build.modelled_time_s * 1e3,
                   target=manifest.target)
    rec.update(m.extra)
    rec["error"] = m.error
    return rec


def run_bundle(directory: str | Path, *, models: Sequence[str] | None = None, systems: Sequence[str] | None = None,
               torch: str = "auto", cuda_graph: bool = False, warmup: int = 10, runs: int = 100,
               input_sets: int = 8, repeat: bool = True, out: str | Path | None = None) -> tuple[list[dict], Path]:
    """Measure the bundle in ``directory``; returns the records and the results file.

    Raises
    ------
    BenchError
        Not a bundle, an unknown model or system, or no device to run on.
    """
    bundle = Path(directory).resolve()
    manifest = read_manifest(bundle)
    tvm = import_tvm()
    dev = device_for(tvm, manifest.target_kind)
    cuda = CudaRuntime() if manifest.target_kind == "cuda" else None
    info = device_info(dev, manifest.target_kind, cuda.driver_version() if cuda else None)
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    base = {"device": info["device"], "driver": info["driver"], "commit": manifest.commit, "date": date,
            "warmup": warmup, "timer": EventTimer.name if cuda else HostTimer.name,
            "tvm_version": manifest.tvm_version, "tvm_runtime_only": runtime_only(tvm)}

    def make_timer(n: int):
        return EventTimer(cuda, n) if cuda is not None else HostTimer(dev.sync, n)

    entries = [manifest.model(n) for n in models] if models else list(manifest.models)
    tvm_systems = {b.system for m in manifest.models for b in m.builds}
    torch_systems = list(TORCH_SYSTEMS) + ([CUDA_GRAPH_SYSTEM] if cuda_graph else [])
    wanted = set(systems) if systems else None
    if wanted:
        unknown = wanted - tvm_systems - set(torch_systems)
        if unknown:
            raise BenchError(f"unknown systems {sorted(unknown)}; this bundle has {sorted(tvm_systems)} "
                             f"and the torch baselines {torch_systems}")
        torch_systems = [s for s in torch_systems if s in wanted]
    use_torch = torch != "off" and bool(torch_systems) and (bundle / "corpus").is_dir()
    path = Path(out) if out else bundle / "results" / f"{results_name(date, info['device'], manifest.commit)}.jsonl"
    records: list[dict] = []
    for entry in entries:
        log.info("model %s", entry.name)
        if not entry.inputs:  # the build failed before the model was imported: say so, once per system
            failed = [Measurement(s, error=f"build failed: {entry.error}") for s in sorted(tvm_systems)
                      if wanted is None or s in wanted]
            new = [_record(manifest, entry, m, base, None, None) for m in failed]
            append_jsonl(path, new)
            records += new
            continue
        data = load_model_data(bundle, entry, input_sets)
        roof, roof_dev = roofline_ms(manifest, entry, info["device"])
        ms = measure_builds(tvm, bundle, entry, dev, data, warmup=warmup, runs=runs, make_timer=make_timer,
                            repeat=repeat, systems=wanted)
        if use_torch and entry.corpus is not None:
            ms += _torch(entry, data, bundle, torch_systems, torch == "on", manifest.target_kind, warmup, runs,
                         repeat)
        new = [_record(manifest, entry, m, {**base, "input_sets": len(data.timing_inputs)}, roof, roof_dev)
               for m in ms]
        append_jsonl(path, new)  # written as we go: a crash keeps what was measured
        records += new
    path.with_suffix(".md").write_text(markdown_table(records))
    return records, path


def _torch(entry: ModelEntry, data: Any, bundle: Path, systems: list[str], required: bool, kind: str,
           warmup: int, runs: int, repeat: bool) -> list[Measurement]:
    from .torch_runner import measure_torch  # noqa: PLC0415

    try:
        return measure_torch(entry, data, bundle / "corpus", systems, warmup=warmup, runs=runs, repeat=repeat,
                             device="cuda" if kind == "cuda" else "cpu")
    except BenchError as err:
        if required:
            return [Measurement(s, error=str(err)) for s in systems]
        log.warning("%s: torch baselines skipped: %s", entry.name, err)
        return []


def build_parser() -> argparse.ArgumentParser:
    """Arguments of ``python -m tvm_ext.bench.run``."""
    p = argparse.ArgumentParser(prog="python -m tvm_ext.bench.run", description=__doc__.splitlines()[0])
    p.add_argument("directory", help="bundle written by `tvm-ext bench --build-only --out DIR`")
    p.add_argument("--models", default="", help="comma-separated model names (default: all that built)")
    p.add_argument("--systems", default="", help="comma-separated systems (default: every build + torch)")
    p.add_argument("--torch", choices=("auto", "on", "off"), default="auto",
                   help="torch baselines: auto (when torch is installed), on (failures recorded), off")
    p.add_argument("--cuda-graph", action="store_true", help="also time the eager torch model as a CUDA graph")
    p.add_argument("--warmup", type=int, default=10, help="untimed runs first (default 10)")
    p.add_argument("--runs", type=int, default=100, help="timed runs per timing (default 100)")
    p.add_argument("--input-sets", type=int, default=8, help="rotating input sets (default 8)")
    p.add_argument("--no-repeat", action="store_true", help="time each system once, not twice")
    p.add_argument("--out", default=None, help="results file (default DIR/results/<date>_<device>_<commit>.jsonl)")
    p.add_argument("-v", "--verbose", action="store_true", help="log progress")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 on bad input, 1 if any numerics check failed)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="%(levelname)s %(name)s: %(message)s")
    split = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
    try:
        records, path = run_bundle(args.directory, models=split(args.models) or None,
                                   systems=split(args.systems) or None, torch=args.torch, cuda_graph=args.cuda_graph,
                                   warmup=args.warmup, runs=args.runs, input_sets=args.input_sets,
                                   repeat=not args.no_repeat, out=args.out)
    except TvmExtError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(markdown_table(records))
    print(f"results: {path}")
    bad = [r for r in records if r.get("error") or r.get("numerics_ok") is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
