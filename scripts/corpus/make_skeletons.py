#!/usr/bin/env python3
"""Write skeletons of the fp32 batch-1 files of a built corpus (no torch needed).

    python3 scripts/corpus/make_skeletons.py --corpus data/corpus \
        --out tvm_ext/models/skeletons --min-elements 256

The committed skeletons under ``tvm_ext/models/skeletons`` are made this way; 256 (not
the library default of 1024) also drops mid-sized biases and norm scales, which keeps
the whole suite near 5 MB.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import onnx  # noqa: E402

from tvm_ext.models.skeleton import make_skeleton  # noqa: E402

#: Default threshold for the committed suite.
SUITE_MIN_ELEMENTS = 256


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--corpus", type=Path, default=REPO / "data" / "corpus")
    p.add_argument("--out", type=Path, default=REPO / "tvm_ext" / "models" / "skeletons")
    p.add_argument("--min-elements", type=int, default=SUITE_MIN_ELEMENTS)
    p.add_argument("--models", default="", help="comma-separated model names (default: all)")
    args = p.parse_args(argv)
    manifest = json.loads((args.corpus / "manifest.json").read_text())
    wanted = {m.strip() for m in args.models.split(",") if m.strip()}
    args.out.mkdir(parents=True, exist_ok=True)
    total = 0
    for entry in manifest["models"]:
        if entry["dtype"] != "fp32" or entry["batch"] != 1:
            continue
        if wanted and entry["model"] not in wanted:
            continue
        skeleton = make_skeleton(onnx.load(str(args.corpus / entry["path"])), args.min_elements)
        target = args.out / entry["path"]
        target.write_bytes(skeleton.SerializeToString(deterministic=True))
        total += target.stat().st_size
        print(f"{entry['path']:36s} {target.stat().st_size / 1024:8.1f} KiB")
    print(f"total {total / 2 ** 20:.2f} MiB in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
