#!/usr/bin/env python3
"""Hugging Face exports outside the seed suite, built with the corpus's own code (random weights).

Swin-T as ``transformers.SwinModel`` exports it (patch 4, window 7, 224x224, no classification
head: shifted windows through roll, reshape and transpose chains) and DETR-R50 at 512x512 (the
corpus's ``detr_r50``, full weights): the two models issue 38's compile-time bound names besides
the seed suite. Time them with ``scripts/planning_time.py FILE --fp16 --end-to-end``.

Run with the corpus virtual environment (see README.md)::

    /work/.venvs/corpus/bin/python scripts/corpus/hf_exports.py --out /tmp/hf
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

import transformers as hf  # noqa: E402

import transformers_models as tfm  # noqa: E402
from export import export_variant  # noqa: E402
from spec import Built, ModelSpec, Variant  # noqa: E402


def swin_t_model(v: Variant) -> Built:
    """Swin-T backbone as transformers' SwinModel (patch 4, window 7, 224x224, no head)."""
    model = tfm._init(hf.SwinModel(hf.SwinConfig(**tfm._EAGER)))
    return tfm._image(model, v, 224, "last_hidden_state")


SPECS = (ModelSpec("swin_t_hf_swinmodel", "transformers", swin_t_model, (Variant(1),),
                   "Swin-T backbone (SwinModel)"),
         ModelSpec("detr_r50_hf", "transformers", tfm.detr_r50, (Variant(1),), "DETR-R50 at 512x512"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True, help="directory for the ONNX files")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for spec in SPECS:
        for entry in export_variant(spec, Variant(1), args.out, ["fp32"], None, verify=True):
            print(f"{args.out / entry['path']}: {entry['nodes']} nodes, onnxruntime {entry['onnxruntime']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
