"""Convert an fp32 ONNX graph to fp16 in place of re-tracing in half precision.

CPU PyTorch runs half precision an order of magnitude slower than fp32, so tracing
BERT at batch 32 in fp16 would take minutes per model. Instead the folded fp32 graph
is rewritten: float initializers, graph inputs/outputs, ``Cast(to=float)`` targets and
float tensor attributes become float16. Values outside the fp16 range (attention-mask
fills such as ``-3.4e38``) are clipped to +-65504 so they stay finite. Inputs that the
ONNX spec requires in float32 whatever the data type (``Resize`` roi/scales) are kept.
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from onnx_fold import infer_value_info

_FP16_MAX = float(np.finfo(np.float16).max)
#: (op_type, input index) pairs that stay float32 in an fp16 graph.
_KEEP_FP32 = {("Resize", 1), ("Resize", 2), ("Upsample", 1)}


def _to_fp16(tensor: TensorProto) -> TensorProto:
    arr = numpy_helper.to_array(tensor)
    return numpy_helper.from_array(np.clip(arr, -_FP16_MAX, _FP16_MAX).astype(np.float16),
                                   tensor.name)


def to_float16(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return an fp16 copy of the fp32 model ``model`` (checked with full shape inference)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    g = out.graph
    keep = {node.input[i] for node in g.node for (op, i) in _KEEP_FP32
            if node.op_type == op and len(node.input) > i}
    for i, t in enumerate(g.initializer):
        if t.data_type == TensorProto.FLOAT and t.name not in keep:
            g.initializer[i].CopyFrom(_to_fp16(t))
    for vi in list(g.input) + list(g.output):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.FLOAT16
    del g.value_info[:]
    for node in g.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == TensorProto.FLOAT:
                attr.i = TensorProto.FLOAT16
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type == TensorProto.FLOAT:
                attr.t.CopyFrom(_to_fp16(attr.t))
    infer_value_info(out, strict=True)  # raises on any float/float16 type clash
    onnx.checker.check_model(out)
    return out
