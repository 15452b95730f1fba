"""Small ONNX graphs written inline (tests, examples, bug reports)."""
from __future__ import annotations

from collections.abc import Sequence

import onnx
from onnx import TensorProto, helper


def onnx_model(nodes: Sequence[onnx.NodeProto], inputs: Sequence[onnx.ValueInfoProto],
               outputs: Sequence[onnx.ValueInfoProto], initializers: Sequence[onnx.TensorProto] = (),
               opset: int = 17, name: str = "test") -> onnx.ModelProto:
    """A default-domain model of ``nodes`` at ``opset`` (IR version 8, which every onnxruntime reads)."""
    graph = helper.make_graph(list(nodes), name, list(inputs), list(outputs), initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def tensor_info(name: str, shape: Sequence[int | str] | None, elem: int = TensorProto.FLOAT) -> onnx.ValueInfoProto:
    """A tensor value's name, shape (``None``: unknown rank; strings: named dims) and element type."""
    return helper.make_tensor_value_info(name, elem, shape)
