#!/usr/bin/env python3
"""Regenerate the ONNX backend node test cases from the installed onnx package.

The onnx wheel ships the case definitions but not ``onnx/backend/test/data/node``; this
writes ``model.onnx`` + ``test_data_set_0/{input,output}_<i>.pb`` (+ ``meta.json``) per case.

Examples
--------
    python3 scripts/gen_node_tests.py                       # all cases -> data/onnx_node_tests
    python3 scripts/gen_node_tests.py --out /tmp/n -p 'test_add*' -p test_relu
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tvm_ext.testing.node_cases import generate_node_tests  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="data/onnx_node_tests",
                        help="output directory (default: %(default)s; git-ignored)")
    parser.add_argument("-p", "--pattern", action="append", default=None,
                        help="fnmatch pattern on case names; repeatable (default: all)")
    parser.add_argument("-m", "--module", action="append", default=None,
                        help="only run this onnx case module (onnx.backend.test.case.node.<m>); repeatable")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    names = generate_node_tests(args.out, args.pattern, args.module)
    if not names:
        logging.error("no case matches %s", args.pattern)
    return 0 if names else 1


if __name__ == "__main__":
    sys.exit(main())
