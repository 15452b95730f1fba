#!/usr/bin/env python3
"""Run the ONNX backend node test cases through tvm_ext presets on the CPU.

Generate the cases first (``python3 scripts/gen_node_tests.py``), then e.g.::

    python3 scripts/node_suite.py                          # baseline, all cases
    python3 scripts/node_suite.py stitch -j 2 --json out/node_suite.json
    python3 scripts/node_suite.py -p 'test_softmax*' --all-ops

Prints a per-preset and per-op table (pass / mismatch / import / build / run / timeout /
crash / skipped) and, for presets other than baseline, the new failures vs baseline.
Exit status: 0 if no preset has a new failure vs baseline, 1 otherwise, 2 on bad arguments.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tvm_ext.errors import TvmExtError  # noqa: E402
from tvm_ext.testing.node_suite import BASELINE, run_node_suite  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="*", default=[BASELINE], help="presets to run (default: baseline)")
    parser.add_argument("--data", default="data/onnx_node_tests", help="case directory (default: %(default)s)")
    parser.add_argument("-p", "--pattern", action="append", default=None,
                        help="fnmatch pattern on case names; repeatable (default: all)")
    parser.add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1,
                        help="worker processes; 0 = in-process, no isolation (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per case (default: %(default)s)")
    parser.add_argument("--json", type=Path, default=None, help="also write all results as JSON")
    parser.add_argument("--all-ops", action="store_true", help="list every op, not only failing ones")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        suite = run_node_suite(args.data, args.presets or [BASELINE], pattern=args.pattern, jobs=args.jobs,
                               timeout_per_case=args.timeout, progress=not args.no_progress)
    except TvmExtError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    sys.stdout.write(suite.format_report(all_ops=args.all_ops) + "\n")
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        suite.write_json(args.json)
    new = sum(len(suite.new_failures(p)) for p in suite.presets if p != BASELINE)
    return 1 if new else 0


if __name__ == "__main__":
    sys.exit(main())
