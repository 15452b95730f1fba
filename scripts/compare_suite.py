#!/usr/bin/env python3
"""Every seed model under several presets, in the cost model: one JSON line per model x preset.

For each model (the committed skeletons, refilled deterministically, or ONNX paths) the presets
are built for a GPU target (no GPU needed) and the report's *modelled* numbers are kept: launches
per inference, distinct kernels, modelled traffic, modelled time (the cost model's, per launch),
compile time and, for spine presets, the selection's time and notes. Nothing is measured::

    python3 scripts/compare_suite.py --out bench/modelled/h100_fp16.jsonl
    python3 scripts/compare_suite.py bert_base_s128_b1_fp32 --presets baseline full

With ``--check`` the exit status is 1 unless, on every model, ``full``'s modelled time is at
most the best of the other presets and its launches at most ``baseline``'s (the issue's bar).
``--table`` prints the markdown table of a results file (no builds). ``--ablate PRESET:GENERATOR``
also builds the preset without that generator (a row named ``<preset>-without-<generator>``),
e.g. ``full`` with and without ``tilegraph``'s candidates::

    python3 scripts/compare_suite.py --presets stitch tilegraph full --ablate full:tilegraph
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import logging
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tvm_ext.driver.presets import Preset, get_preset  # noqa: E402
from tvm_ext.errors import TVM_ERRORS, PresetError, TvmExtError  # noqa: E402
from tvm_ext.inspect import inspect  # noqa: E402
from tvm_ext.models.skeleton import load_model, resolve_models  # noqa: E402

log = logging.getLogger("compare_suite")
PRESETS = ("baseline", "stitch", "cutlass", "full")


def _commit() -> str:
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True)
    return out.stdout.strip() or "unknown"


def with_ablations(names: list[str], ablate: list[str]) -> list[Preset]:
    """The presets ``names``, then each ``PRESET:GENERATOR`` of ``ablate`` as the preset without it."""
    presets = [get_preset(n) for n in names]
    for spec in ablate:
        name, _, gen = spec.partition(":")
        preset = get_preset(name)
        if gen not in preset.generators:
            raise PresetError(f"--ablate {spec}: preset '{name}' has no generator '{gen}' ({preset.generators})")
        presets.append(dataclasses.replace(preset, name=f"{name}-without-{gen}",
                                           generators=tuple(g for g in preset.generators if g != gen)))
    return presets


def model_rows(path: Path, presets: list[Preset], target: str, fp16: bool) -> list[dict]:
    """One row per preset of ``path`` (a failed build is a row with ``error``)."""
    proto = load_model(path)
    rows = []
    for preset in presets:
        row = {"model": path.stem, "preset": preset.name, "target": target,
               "dtype": "float16" if fp16 else "float32", "modelled": True}
        start = time.perf_counter()
        try:
            rep = inspect(proto, target, preset, fp16=fp16)
        except (TvmExtError, *TVM_ERRORS) as err:  # a failed build is a row, not the end of the suite
            row["error"] = f"{type(err).__name__}: {err}"
            rows.append(row)
            log.error("%s %s: %s", path.stem, preset.name, row["error"])
            continue
        sel = rep.selection.get("main", {})
        row.update(device=rep.device, launches=rep.kernels, distinct_kernels=rep.distinct_kernels,
                   traffic_bytes=rep.traffic_bytes, modelled_time_s=rep.modelled_time_s,
                   roofline_bound_s=rep.roofline_bound_s, compile_s=round(time.perf_counter() - start, 2),
                   selection_s=sel.get("seconds"), selection_notes=sel.get("notes"),
                   # what the selection priced its cover at: far from modelled_time_s (the kernels
                   # as built) when a built kernel is not what the selection priced
                   selection_objective_s=sel.get("objective_s"),
                   chosen=sel.get("chosen"),
                   cost_sources=sorted({k.cost_source for k in rep.launches if k.cost_source}),
                   # the kernels as ptxas built them: how many spill (priced, driver/ptxas_facts.py)
                   ptxas=rep.build.ptxas.summary() if rep.build is not None and rep.build.ptxas else None)
        rows.append(row)
        log.info("%-28s %-9s %5d launches %10.1f us modelled  (%.1f s)", path.stem, preset.name, rep.kernels,
                 rep.modelled_time_s * 1e6, row["compile_s"])
    return rows


def verdicts(rows: list[dict]) -> dict[str, dict]:
    """Per model: full's time against the best other preset (ablations of full included), and its
    launches against baseline's."""
    by_model: dict[str, dict[str, dict]] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["preset"]] = r
    out = {}
    for model, presets in by_model.items():
        full = presets.get("full")
        others = [r for p, r in presets.items() if p != "full" and "error" not in r]
        if full is None or "error" in full or not others:
            out[model] = {"ok": False, "why": "full or every other preset missing / failed"}
            continue
        best = min(others, key=lambda r: r["modelled_time_s"])
        base = presets.get("baseline")
        time_ok = full["modelled_time_s"] <= best["modelled_time_s"] * (1 + 1e-9)
        launches_ok = base is None or "error" in base or full["launches"] <= base["launches"]
        out[model] = {"ok": time_ok and launches_ok, "best_other": best["preset"],
                      "speedup_vs_best": best["modelled_time_s"] / full["modelled_time_s"],
                      "speedup_vs_baseline": (base["modelled_time_s"] / full["modelled_time_s"]) if base else None,
                      "time_ok": time_ok, "launches_ok": launches_ok}
    return out


def markdown(rows: list[dict]) -> str:
    """A markdown table: per model, each preset's modelled time, launches and traffic, and the verdict."""
    presets = list(dict.fromkeys(r["preset"] for r in rows))
    cells: dict[str, dict[str, str]] = {}
    for r in rows:
        text = ("failed" if "error" in r else
                f"{r['modelled_time_s'] * 1e6:.1f} µs / {r['launches']} / {r['traffic_bytes'] / 2**20:.1f} MiB")
        cells.setdefault(r["model"], {})[r["preset"]] = text
    verdict = verdicts(rows) if "full" in presets else {}
    head = "| model | " + " | ".join(presets) + (" | full vs best other | full ≤ best & launches ≤ baseline |"
                                                   if verdict else " |")
    lines = [head, "|" + "---|" * (len(presets) + 1 + 2 * bool(verdict))]
    for model, by in cells.items():
        line = f"| {model} | " + " | ".join(by.get(p, "-") for p in presets) + " |"
        if verdict:
            v = verdict[model]
            speed = f"{v['speedup_vs_best']:.2f}x ({v['best_other']})" if "speedup_vs_best" in v else "-"
            line += f" {speed} | {'yes' if v['ok'] else 'NO'} |"
        lines.append(line)
    return "\n".join(lines)


def selection_gaps(rows: list[dict]) -> str:
    """A markdown table of every row whose selection priced its cover (the BLP presets): what it
    priced (``selection_objective_s``) against what its built kernels are priced at
    (``modelled_time_s``); '' when no row has both."""
    both = [r for r in rows if "error" not in r and r.get("selection_objective_s")]
    if not both:
        return ""
    lines = ["| model | preset | selected µs | built µs | built / selected |", "|---|---|---|---|---|"]
    for r in both:
        sel, built = r["selection_objective_s"], r["modelled_time_s"]
        lines.append(f"| {r['model']} | {r['preset']} | {sel * 1e6:.1f} | {built * 1e6:.1f} | {built / sel:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="skeleton names or ONNX paths (default: every skeleton)")
    parser.add_argument("--presets", nargs="+", default=list(PRESETS))
    parser.add_argument("--ablate", nargs="+", default=[], metavar="PRESET:GENERATOR",
                        help="also build PRESET without GENERATOR")
    parser.add_argument("--target", default="tvm_ext/h100")
    parser.add_argument("--fp32", action="store_true", help="keep fp32 (default: convert to fp16)")
    parser.add_argument("--out", type=Path, default=None, help="append one JSON line per model x preset here")
    parser.add_argument("--check", action="store_true", help="exit 1 unless full is never worse (see above)")
    parser.add_argument("--table", type=Path, default=None, help="print the markdown table of a results file")
    parser.add_argument("--gaps", action="store_true",
                        help="with --table: also print each BLP row's selected against built modelled time")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.table is not None:
        rows = [json.loads(line) for line in args.table.read_text().splitlines() if line.strip()]
        print(markdown(rows))
        if args.gaps:
            print("\n" + selection_gaps(rows))
        return 0 if not args.check or all(v["ok"] for v in verdicts(rows).values()) else 1
    try:
        paths = resolve_models(args.models)
        presets = with_ablations(args.presets, args.ablate)
    except TvmExtError as err:
        parser.error(str(err))
    stamp = {"commit": _commit(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%MZ")}
    rows: list[dict] = []
    for k, path in enumerate(paths, 1):
        log.info("[%d/%d] %s", k, len(paths), path.stem)
        new = [{**r, **stamp} for r in model_rows(path, presets, args.target, not args.fp32)]
        rows.extend(new)
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            with args.out.open("a") as fh:
                fh.writelines(json.dumps(r) + "\n" for r in new)
    print(markdown(rows))
    if args.check and "full" in args.presets:
        return 0 if all(v["ok"] for v in verdicts(rows).values()) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
