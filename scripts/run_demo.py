#!/usr/bin/env python3
"""Run the tvm_ext demo (same as ``tvm-ext demo``): bundled BERT layer -> CUDA -> checked -> reported.

Usage: ``python scripts/run_demo.py [--target tvm_ext/h100] [--preset baseline] [--json]``
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from tvm_ext.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["demo", *sys.argv[1:]]))
