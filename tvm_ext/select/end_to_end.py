"""End-to-end validation: a measured build's kernels priced and summed against its whole-model median.

A run whose every kernel was profiled (``bench/results/<run>_kernels.jsonl``) can be priced as
built: the per-inference modelled time is the sum over its functions of calls x the modelled
seconds per call (each kernel priced by the fold that left its model out,
:func:`~tvm_ext.select.calibration.leave_one_out`), and the measured time is the run's median
(``bench/results/<run>.jsonl``, else another file of the same commit; where none has the row,
the kernels' own measured sum, which matches medians within a few percent where both exist). Only builds that computed right
count (``numerics_ok``); a pair of them on one model in one run whose medians differ by more than
:data:`ORDER_MARGIN` must be ordered the same way by the model.

Example
-------
>>> rows = end_to_end(after, Path("bench/results"))
>>> end_to_end_targets(rows)["met"]
True
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from itertools import combinations
from pathlib import Path
from typing import Any

from .calibration import Priced

#: The issue's target: modelled within this factor of measured, end to end.
END_TO_END_FACTOR = 1.5
#: Two presets' medians closer than this are not required to be ordered.
ORDER_MARGIN = 0.10


def _medians(results: Path, run: str) -> dict[tuple[str, str], Mapping[str, Any]]:
    """The whole-model rows of ``run``: its own file's, else those of other files of the same
    build (same commit: a model re-run in its own processes, ``*_<commit>_bert-per-process``)."""
    commit = run.rsplit("_", 1)[-1]
    paths = [results / f"{run}.jsonl"] + sorted(p for p in results.glob(f"*_{commit}*.jsonl")
                                                 if p.name != f"{run}.jsonl"
                                                 and not p.name.endswith(("_kernels.jsonl", "_steps.jsonl")))
    out: dict[tuple[str, str], Mapping[str, Any]] = {}
    for path in paths:
        if not path.is_file():
            continue
        for line in path.read_text().splitlines():
            r = json.loads(line) if line.strip() else {}
            if r.get("median_ms") is not None:
                out.setdefault((r["model"], r["system"]), r)
    return out


def end_to_end(priced: Sequence[Priced], results: Path,
               others: Mapping[str, Sequence[Priced]] | None = None) -> list[dict[str, Any]]:
    """One row per (run, model, system) of ``priced`` (kernels with their ``run``).

    ``others`` adds columns: the same kernels priced otherwise (``{"before": [...]}``, in the
    order of ``priced``). ``median_ms`` is the run's, ``kernels_ms`` the measured kernels' sum.
    """
    others = others or {}
    groups: dict[tuple[str, str, str], list[int]] = {}
    for i, p in enumerate(priced):
        if p.kernel.run:
            groups.setdefault((p.kernel.run, p.kernel.model, p.kernel.system), []).append(i)
    rows = []
    for (run, model, system), members in sorted(groups.items()):
        row_of = _medians(results, run).get((model, system), {})
        kernels_ms = sum(priced[i].kernel.calls * priced[i].kernel.measured_s for i in members) * 1e3
        modelled_ms = sum(priced[i].kernel.calls * priced[i].modelled_s for i in members) * 1e3
        median = row_of.get("median_ms")
        measured = float(median) if median is not None else kernels_ms
        row = {"run": run, "model": model, "system": system, "launches": sum(priced[i].kernel.calls for i in members),
               "kernels_ms": kernels_ms, "median_ms": median, "measured_ms": measured, "modelled_ms": modelled_ms,
               "ratio": modelled_ms / measured, "numerics_ok": row_of.get("numerics_ok"),
               "commit": row_of.get("commit", "")}
        for name, other in others.items():
            row[f"{name}_ms"] = sum(other[i].kernel.calls * other[i].modelled_s for i in members) * 1e3
        rows.append(row)
    return rows


def _ran_right(row: Mapping[str, Any]) -> bool:
    # a row without its run's median (the run's results were filed elsewhere) counts when its
    # kernels were measured; numerics_ok False marks a build that computed wrong
    return row["numerics_ok"] is not False


def order_checks(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Pairs of right builds of one model in one run whose measured times differ by more than
    :data:`ORDER_MARGIN`, with whether the model orders them the same way."""
    out = []
    right = [r for r in rows if _ran_right(r)]
    for a, b in combinations(right, 2):
        if (a["run"], a["model"]) != (b["run"], b["model"]):
            continue
        if abs(a["measured_ms"] - b["measured_ms"]) <= ORDER_MARGIN * min(a["measured_ms"], b["measured_ms"]):
            continue
        same = (a["measured_ms"] < b["measured_ms"]) == (a["modelled_ms"] < b["modelled_ms"])
        out.append({"run": a["run"], "model": a["model"], "faster": a["system"] if a["measured_ms"] < b["measured_ms"]
                    else b["system"], "systems": [a["system"], b["system"]], "ordered": same})
    return out


def end_to_end_targets(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Whether every right build is within :data:`END_TO_END_FACTOR` and every order check holds."""
    right = [r for r in rows if _ran_right(r)]
    outside = [f"{r['model']} {r['system']} ({r['run']})" for r in right
               if not 1 / END_TO_END_FACTOR <= r["ratio"] <= END_TO_END_FACTOR]
    orders = order_checks(rows)
    wrong = [f"{o['model']}: {' vs '.join(o['systems'])} ({o['run']})" for o in orders if not o["ordered"]]
    return {"builds": len(right), "within": len(right) - len(outside), "outside": outside,
            "order_pairs": len(orders), "misordered": wrong, "met": not outside and not wrong}


def end_to_end_markdown(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The end-to-end section of the validation report."""
    t = end_to_end_targets(rows)
    lines = ["## End to end: each profiled build's kernels priced and summed", "",
             ("Per-inference time of every build whose kernels were all profiled: modelled = sum over its functions "
             "of calls x the price of the fold that left its model out (AFTER) or the prior constants (BEFORE); "
             "measured = the run's median (or, where the run's file lacks the row, its kernels' measured sum, "
             "`kernels ms`). Builds that computed wrong (`numerics_ok` false) are listed but not judged."), "",
             ("| run | model | system | launches | measured ms | kernels ms | BEFORE ms | AFTER ms | AFTER / measured "
             "| numerics |"), "|---|---|---|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        ok = {True: "ok", False: "WRONG", None: "-"}[r["numerics_ok"]]
        lines.append(f"| {r['run']} | {r['model']} | {r['system']} | {r['launches']} | {r['measured_ms']:.3f} | "
                     f"{r['kernels_ms']:.3f} | {r.get('before_ms', float('nan')):.3f} | {r['modelled_ms']:.3f} | "
                     f"{r['ratio']:.2f} | {ok} |")
    orders = order_checks(rows)
    lines += ["", f"Within {END_TO_END_FACTOR}x: {t['within']} of {t['builds']} right builds"
              + (f" (outside: {', '.join(t['outside'])})" if t["outside"] else "") + ". "
              f"Pairs of right builds of one model in one run more than {ORDER_MARGIN:.0%} apart: {t['order_pairs']}"
              + (f", misordered: {', '.join(t['misordered'])}" if t["misordered"] else ", all ordered as measured")
              + ". " + ("Target met." if t["met"] else "Target NOT met."), ""]
    if not orders:
        lines += [("(No run measured two right builds of one model more than "
                  f"{ORDER_MARGIN:.0%} apart with every kernel profiled: the ordering check has no pair yet.)"), ""]
    return lines


__all__ = ["END_TO_END_FACTOR", "ORDER_MARGIN", "end_to_end", "end_to_end_markdown", "end_to_end_targets",
           "order_checks"]
