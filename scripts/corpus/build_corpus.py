#!/usr/bin/env python3
"""Build the tvm_ext model corpus as ONNX files (random weights, real architectures).

Run with the corpus virtual environment (see README.md), from anywhere::

    /work/.venvs/corpus/bin/python scripts/corpus/build_corpus.py --list
    /work/.venvs/corpus/bin/python scripts/corpus/build_corpus.py \
        --models resnet50,lstm --dtypes fp32 --skeleton-dir tvm_ext/models/skeletons
"""
from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))  # tvm_ext.models.skeleton for --skeleton-dir

import torch  # noqa: E402
from tqdm import tqdm  # noqa: E402

from export import export_variant  # noqa: E402
from registry import REGISTRY  # noqa: E402

DTYPES = ("fp32", "fp16")


def _parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "data" / "corpus",
                   help="output directory (default: data/corpus in the repository)")
    p.add_argument("--models", default="", help="comma-separated model names (default: all)")
    p.add_argument("--dtypes", default=",".join(DTYPES), help="comma-separated: fp32,fp16")
    p.add_argument("--skeleton-dir", type=Path, default=None,
                   help="also write fp32 batch-1 skeletons (weights dropped) here")
    p.add_argument("--skeleton-min-elements", type=int, default=256,
                   help="float initializers this large or larger are dropped (default 256)")
    p.add_argument("--no-verify", action="store_true",
                   help="skip the onnxruntime-vs-torch check of every written file")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: all cores)")
    p.add_argument("--list", action="store_true", help="list the models and variants, then exit")
    return p.parse_args(argv)


def _select(names: str) -> list[str]:
    if not names:
        return list(REGISTRY)
    chosen = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in chosen if n not in REGISTRY]
    if unknown:
        raise SystemExit(f"unknown models {unknown}; known: {', '.join(REGISTRY)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.list:
        for spec in REGISTRY.values():
            tags = ", ".join(v.tag for v in spec.variants)
            print(f"{spec.name:16s} {spec.family:13s} [{tags}]  {spec.description}")
        return 0
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if not dtypes or any(d not in DTYPES for d in dtypes) or dtypes[0] != "fp32" and "fp32" in dtypes:
        raise SystemExit(f"--dtypes must be a subset of {DTYPES}, fp32 first")
    if args.threads:
        torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.skeleton_dir is not None:
        args.skeleton_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {"models": []}
    by_path = {e["path"]: e for e in manifest["models"]}
    jobs = [(REGISTRY[n], v) for n in _select(args.models) for v in REGISTRY[n].variants]
    t0 = time.perf_counter()
    for spec, variant in tqdm(jobs, desc="corpus", unit="variant"):
        tqdm.write(f"-> {spec.name} {variant.tag}")
        for entry in export_variant(spec, variant, args.out, dtypes, args.skeleton_dir,
                                    verify=not args.no_verify,
                                    skeleton_min_elements=args.skeleton_min_elements):
            by_path[entry["path"]] = entry
        manifest = {"opset": 17, "torch": torch.__version__,
                    "models": sorted(by_path.values(), key=lambda e: e["path"])}
        manifest_path.write_text(json.dumps(manifest, indent=1))
    total = sum(e["file_bytes"] for e in by_path.values())
    print(f"{len(jobs)} variants in {time.perf_counter() - t0:.0f} s; "
          f"corpus {total / 2 ** 30:.2f} GiB in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
