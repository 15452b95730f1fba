"""Small helpers shared by the bundled ONNX model builders.

A :class:`GraphBuilder` collects nodes, initializers and value infos and turns them into a
checked ``onnx.ModelProto``. Weights come from a seeded numpy generator and are scaled by
``1/sqrt(fan_in)`` so activations stay O(1) through deep stacks.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ..errors import TvmExtError

#: Opset every bundled model is written for (LayerNormalization needs >= 17).
OPSET = 17
#: IR version matching :data:`OPSET`; low enough for every onnxruntime that knows opset 17.
IR_VERSION = 8

_ONNX_DTYPES = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
}

Dim = int | str


def onnx_dtype(dtype: str) -> int:
    """Map a numpy dtype name to the ONNX ``TensorProto`` element type."""
    try:
        return _ONNX_DTYPES[dtype]
    except KeyError:
        raise TvmExtError(
            f"unsupported dtype {dtype!r}; expected one of {sorted(_ONNX_DTYPES)}"
        ) from None


class GraphBuilder:
    """Accumulates an ONNX graph; names of intermediate values are made unique automatically.

    Parameters
    ----------
    name : str
        Graph name.
    seed : int
        Seed of the numpy generator used by :meth:`weight` and :meth:`noise`.
    dtype : str
        Floating-point dtype of weights (``"float32"`` or ``"float16"``).
    """

    def __init__(self, name: str, seed: int = 0, dtype: str = "float32"):
        if dtype not in ("float32", "float16"):
            raise TvmExtError(f"model dtype must be 'float32' or 'float16', got {dtype!r}")
        self.name = name
        self.dtype = dtype
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._counts: dict[str, int] = {}

    def fresh(self, hint: str) -> str:
        """Return a value name not used before, derived from ``hint``."""
        n = self._counts.get(hint, 0)
        self._counts[hint] = n + 1
        return hint if n == 0 else f"{hint}_{n}"

    # -- values -------------------------------------------------------------------------
    def input(self, name: str, shape: Sequence[Dim], dtype: str | None = None) -> str:
        """Declare a graph input; string dims become symbolic ``dim_param`` entries."""
        self.inputs.append(
            helper.make_tensor_value_info(name, onnx_dtype(dtype or self.dtype), list(shape))
        )
        return name

    def output(self, value: str, shape: Sequence[Dim], dtype: str | None = None) -> None:
        """Declare ``value`` as a graph output."""
        self.outputs.append(
            helper.make_tensor_value_info(value, onnx_dtype(dtype or self.dtype), list(shape))
        )

    def const(self, hint: str, array: np.ndarray) -> str:
        """Add an initializer holding ``array`` (kept in its own dtype) and return its name."""
        name = self.fresh(hint)
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def float_const(self, hint: str, value: float | np.ndarray) -> str:
        """Add a floating-point initializer in the model dtype."""
        return self.const(hint, np.asarray(value, dtype=self.dtype))

    def weight(self, hint: str, shape: Sequence[int], fan_in: int) -> str:
        """Add a standard-normal weight scaled by ``1/sqrt(fan_in)``."""
        w = self.rng.standard_normal(tuple(shape)) / np.sqrt(fan_in)
        return self.float_const(hint, w)

    def noise(self, hint: str, shape: Sequence[int], scale: float, offset: float = 0.0) -> str:
        """Add ``offset + scale * N(0, 1)`` (biases, norm scales and shifts)."""
        return self.float_const(hint, offset + scale * self.rng.standard_normal(tuple(shape)))

    # -- nodes --------------------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], hint: str | None = None, **attrs) -> str:
        """Append one single-output node and return the name of its output."""
        out = self.fresh(hint or op_type.lower())
        self.nodes.append(
            helper.make_node(op_type, list(inputs), [out], name=self.fresh(f"{op_type}_node"), **attrs)
        )
        return out

    def model(self, doc: str = "") -> onnx.ModelProto:
        """Assemble, check and return the model."""
        graph = helper.make_graph(
            self.nodes, self.name, self.inputs, self.outputs, initializer=self.initializers
        )
        model = helper.make_model(
            graph,
            opset_imports=[helper.make_opsetid("", OPSET)],
            producer_name="tvm_ext.models",
            doc_string=doc,
        )
        model.ir_version = IR_VERSION
        onnx.checker.check_model(model, full_check=True)
        return model
