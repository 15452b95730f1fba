"""Export one corpus variant: trace to ONNX, fold, convert to fp16, verify, skeletonise."""
from __future__ import annotations

import io
import json
import logging
import time
import warnings
from pathlib import Path

import numpy as np
import onnx
import torch

from onnx_fold import fold_constants
from onnx_fp16 import to_float16
from spec import Built, ModelSpec, Variant

log = logging.getLogger(__name__)

OPSET = 17
#: ``metadata_props`` key with the corpus record (model, variant, integer input ranges).
CORPUS_KEY = "tvm_ext.corpus"


def trace_to_onnx(built: Built) -> onnx.ModelProto:
    """Export ``built.module`` with the TorchScript exporter (opset 17, static shapes)
    and fold its shape computations."""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecation and tracer warnings on every model
        torch.onnx.export(built.module, tuple(built.inputs.values()), buf, dynamo=False,
                          opset_version=OPSET, input_names=list(built.inputs),
                          output_names=built.output_names, do_constant_folding=True)
    return fold_constants(onnx.load_from_string(buf.getvalue()))


def _annotate(model: onnx.ModelProto, spec: ModelSpec, variant: Variant, built: Built,
              dtype: str) -> None:
    record = {"model": spec.name, "variant": variant.tag, "dtype": dtype,
              "int_inputs": {k: [r.low, r.high] for k, r in built.int_ranges.items()},
              "notes": built.notes}
    kept = [p for p in model.metadata_props if p.key != CORPUS_KEY]
    del model.metadata_props[:]
    model.metadata_props.extend(kept)
    model.metadata_props.add(key=CORPUS_KEY, value=json.dumps(record, sort_keys=True))
    model.producer_name = "tvm_ext scripts/corpus"
    model.doc_string = spec.description


def _std(arrays: list[np.ndarray]) -> float:
    return float(np.concatenate([a.astype(np.float64).ravel() for a in arrays]).std())


def _ort_check(model: onnx.ModelProto, built: Built, reference: list[np.ndarray],
               dtype: str) -> dict[str, float | str]:
    """Run ``model`` in onnxruntime on the example inputs and compare with torch."""
    import onnxruntime as ort

    feeds = {k: v.numpy() if v.dtype != torch.float32 or dtype == "fp32"
             else v.numpy().astype(np.float16) for k, v in built.inputs.items()}
    try:
        sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
    except (ort.capi.onnxruntime_pybind11_state.Fail,
            ort.capi.onnxruntime_pybind11_state.NotImplemented,
            ort.capi.onnxruntime_pybind11_state.InvalidGraph) as err:
        return {"error": str(err).splitlines()[0][:300]}
    err = max(float(np.abs(o.astype(np.float64) - r).max()) for o, r in zip(outs, reference))
    scale = max(float(np.abs(r).max()) for r in reference)
    return {"max_abs_err": err, "rel_err": err / max(scale, 1e-30), "output_std": _std(outs),
            "finite": bool(all(np.isfinite(o).all() for o in outs))}


def export_variant(spec: ModelSpec, variant: Variant, out_dir: Path, dtypes: list[str],
                   skeleton_dir: Path | None, verify: bool,
                   skeleton_min_elements: int = 256) -> list[dict]:
    """Build, export and save every requested dtype of one variant.

    Returns
    -------
    list of dict
        One manifest entry per written file.
    """
    t0 = time.perf_counter()
    built = spec.builder(variant)
    built.module.eval()
    with torch.no_grad():
        ref = built.module(*built.inputs.values())
    reference = [r.numpy().astype(np.float64) for r in (ref if isinstance(ref, tuple) else (ref,))]
    params = sum(p.numel() for p in built.module.parameters())
    model32 = trace_to_onnx(built)
    export_s = time.perf_counter() - t0
    del built.module
    entries = []
    for dtype in dtypes:
        model = model32 if dtype == "fp32" else to_float16(model32)
        _annotate(model, spec, variant, built, dtype)
        path = out_dir / f"{spec.name}_{variant.tag}_{dtype}.onnx"
        onnx.save(model, str(path))
        g = model.graph
        entry = {
            "model": spec.name, "family": spec.family, "variant": variant.tag, "dtype": dtype,
            "batch": variant.batch, "seq": variant.seq, "path": path.name,
            "inputs": [{"name": i.name, "dtype": onnx.helper.tensor_dtype_to_np_dtype(
                i.type.tensor_type.elem_type).name,
                "shape": [d.dim_value for d in i.type.tensor_type.shape.dim]} for i in g.input],
            "outputs": [{"name": o.name, "shape": [d.dim_value for d in
                                                   o.type.tensor_type.shape.dim]}
                        for o in g.output],
            "params": params, "nodes": len(g.node), "file_bytes": path.stat().st_size,
            "torch_output_std": _std(reference), "export_s": round(export_s, 1),
            "notes": built.notes, "description": spec.description,
        }
        if verify:
            entry["onnxruntime"] = _ort_check(model, built, reference, dtype)
        entries.append(entry)
        log.info("%s: %.1f MB", path.name, entry["file_bytes"] / 2 ** 20)
    if skeleton_dir is not None and variant.batch == 1:
        from tvm_ext.models.skeleton import make_skeleton

        _annotate(model32, spec, variant, built, "fp32")
        skel_path = skeleton_dir / f"{spec.name}_{variant.tag}_fp32.onnx"
        skel_path.write_bytes(make_skeleton(model32, skeleton_min_elements)
                              .SerializeToString(deterministic=True))
        entries[0]["skeleton_bytes"] = skel_path.stat().st_size
    return entries
