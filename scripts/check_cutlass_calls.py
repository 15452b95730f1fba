#!/usr/bin/env python3
"""Check every CUTLASS call the presets select on the seed suite, on the host (no GPU needed).

For each model (``tvm_ext/models/skeletons/*.onnx`` by default, imported in fp16), target and
preset, the graph stage runs with the library calls left uncompiled, and every call goes through
the contract check (``tvm_ext.cutlass.contract``: the project's own glue and launcher, the
kernel's ``can_implement``, the element range of every operand, emulated outputs against the
Relax reference). Verdicts are cached, so a rerun costs the graph stages. Prints one table per
code path (calls, distinct workloads and instances, calls with findings) and every finding.

    python scripts/check_cutlass_calls.py                                  # cutlass + full, h100 + a100
    python scripts/check_cutlass_calls.py --presets cutlass --targets tvm_ext/a100 --models bert_base_s128
    python scripts/check_cutlass_calls.py --json bench/modelled/cutlass_contract.json [--resume]
    python scripts/check_cutlass_calls.py --matrix          # hand-built calls: every path, odd extents

``--matrix`` checks ``tvm_ext.cutlass.contract_cases.coverage_matrix`` instead of models: each call
with the configuration the codegen would build (the best one the check accepts; on sm_90a the
best CUTLASS 3.x one), and counts calls whose best-ranked configuration was refused.

Exit status 1 if any call has a finding.
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections import defaultdict
from pathlib import Path


def _paths(names: list[str]) -> list[Path]:
    from tvm_ext.models.skeleton import SKELETON_DIR

    if not names:
        return sorted(SKELETON_DIR.glob("*.onnx"))
    return [Path(n) if n.endswith(".onnx") else SKELETON_DIR / f"{n}.onnx" for n in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*", default=[], help="skeleton names or .onnx paths (default: all)")
    parser.add_argument("--presets", default="cutlass,full", help="comma-separated presets (default cutlass,full)")
    parser.add_argument("--targets", default="tvm_ext/h100,tvm_ext/a100", help="comma-separated target tags")
    parser.add_argument("--json", default=None, help="write every verdict and the table here")
    parser.add_argument("--resume", action="store_true",
                        help="skip the builds JSON.partial.jsonl already holds (each build appends there as it ends)")
    parser.add_argument("--matrix", action="store_true", help="check the hand-built coverage matrix instead")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")

    import tvm
    from tqdm import tqdm

    from tvm_ext.cutlass.contract import call_path
    from tvm_ext.cutlass.suite import load_fp16_model
    from tvm_ext.checks.library_calls import library_calls

    presets = [p for p in args.presets.split(",") if p]
    targets = [t for t in args.targets.split(",") if t]
    start = time.perf_counter()
    if args.matrix:
        rows, findings = _matrix_rows()
        return _report(rows, findings, f"coverage matrix in {time.perf_counter() - start:.0f} s", args.json)
    jobs = [(path, target, preset) for path in _paths(args.models) for target in targets for preset in presets]
    partial = Path(f"{args.json}.partial.jsonl") if args.json else None
    done: dict[tuple[str, str, str], list[dict]] = {}
    if partial is not None and args.resume and partial.is_file():
        for line in partial.read_text().splitlines():
            build = json.loads(line)
            done[(build["model"], build["target"], build["preset"])] = build["rows"]
    elif partial is not None:
        partial.unlink(missing_ok=True)
    rows = [r for key in [(p.stem, t, q) for p, t, q in jobs] if key in done for r in done[key]]
    findings = [f"{r['model']} {r['preset']} {r['target']} {r['symbol']}: {'; '.join(r['findings'])}"
                for r in rows if not r["ok"]]
    todo = [(p, t, q) for p, t, q in jobs if (p.stem, t, q) not in done]
    bar = tqdm(todo, desc="graph stage + contract", unit="build")
    module = (None, None)
    for path, target, preset in bar:
        bar.set_postfix_str(f"{path.stem} {preset} {target}")
        if module[0] != path:
            module = (path, load_fp16_model(path))
        built = []
        for call, result in library_calls(module[1], tvm.target.Target(target), preset):
            row = {"model": path.stem, "target": target, "preset": preset, "symbol": result.symbol,
                   "path": call_path(call) if call is not None else "refused", "workload": result.workload,
                   "instance": result.instance, "ok": result.ok, "findings": list(result.findings)}
            built.append(row)
            if not result.ok:
                findings.append(f"{path.stem} {preset} {target} {result.line()}")
        rows += built
        if partial is not None:  # a killed sweep keeps every finished build (--resume goes on from there)
            with partial.open("a") as f:
                f.write(json.dumps({"model": path.stem, "target": target, "preset": preset, "rows": built}) + "\n")
    return _report(rows, findings, f"{len(jobs)} builds ({', '.join(presets)} x {', '.join(targets)}) in "
                   f"{time.perf_counter() - start:.0f} s", args.json)


def _matrix_rows() -> tuple[list[dict], list[str]]:
    from tvm_ext.cutlass.codegen import device_for, ranked_configs
    from tvm_ext.cutlass.contract import ContractCall, call_path, first_accepted
    from tvm_ext.cutlass.contract_cases import coverage_matrix

    rows, findings = [], []
    for arch in ("sm_80", "sm_90a"):
        device = device_for(arch)
        offloads = coverage_matrix(arch)
        ranked = [ranked_configs(off.workload, arch, device, None) for off in offloads]
        if arch == "sm_90a":
            ranked = [[rc for rc in r if rc[0].api == "3x"] for r in ranked]
        print(f"{arch}: {len(offloads)} calls")
        for off, accepted in zip(offloads, first_accepted(offloads, ranked, arch)):
            ok = accepted.kernel is not None
            path = call_path(ContractCall(off, accepted.kernel)) if ok else "refused"
            rows.append({"model": "matrix", "target": arch, "preset": "", "symbol": off.symbol, "path": path,
                         "workload": off.workload.key() + off.workload.epilogue.suffix,
                         "instance": accepted.kernel.key if ok else "", "ok": ok,
                         "first_refused": len(accepted.refused),
                         "findings": [f for r in accepted.refused for f in r.findings]})
            if not ok:
                findings.append(f"{arch} {off.symbol}: {accepted.reason()}")
    return rows, findings


def _report(rows: list[dict], findings: list[str], what: str, json_path: str | None) -> int:
    table: dict[str, dict] = defaultdict(lambda: {"calls": 0, "workloads": set(), "instances": set(), "bad": 0,
                                                  "fallback": 0})
    for row in rows:
        entry = table[row["path"]]
        entry["calls"] += 1
        entry["workloads"].add(row["workload"])
        entry["instances"].add((row["target"], row["instance"]))
        entry["bad"] += not row["ok"]
        entry["fallback"] += bool(row.get("first_refused")) and row["ok"]
    lines = ["| path | calls | workloads | instances | accepted after a refusal | calls with findings |",
             "|---|---|---|---|---|---|"]
    for path, e in sorted(table.items()):
        lines.append(f"| {path} | {e['calls']} | {len(e['workloads'])} | {len(e['instances'])} | {e['fallback']} "
                     f"| {e['bad']} |")
    lines.append(f"| **all** | {len(rows)} | {len({r['workload'] for r in rows})} | "
                 f"{len({(r['target'], r['instance']) for r in rows})} | "
                 f"{sum(bool(r.get('first_refused')) and r['ok'] for r in rows)} | {sum(not r['ok'] for r in rows)} |")
    print("\n".join(lines))
    print(f"\n{what}")
    for line in findings:
        print(line)
    if json_path:
        Path(json_path).write_text(json.dumps({"table": lines, "calls": rows}, indent=1))
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
