"""Static shape arithmetic of an ONNX graph folded to constants before import.

Exported models and ONNX's function expansions compute shapes and axes at run time:
``Shape(x) -> Gather -> Unsqueeze -> Concat -> Reshape``, ``Shape -> Size -> Range`` for a
LayerNormalization's axes. TVM's importer carries such values as ``ShapeExpr`` and most ops
refuse them ("cannot handle ShapeExpr inputs"). Once every input shape is static (after
:func:`~tvm_ext.frontend.shapes.bind_input_shapes`), these values are constants:
:func:`fold_shape_arithmetic` replaces ``Shape``/``Size`` of statically shaped values, and
every deterministic node whose inputs are all constants and at least one of them comes from
such a shape, by ``Constant`` nodes (evaluated with ``onnx.reference``). Arithmetic on weights
alone is left to the importer and Relax's ``FoldConstant``.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

logger = logging.getLogger(__name__)

#: Largest folded value (elements): shape arithmetic is small; anything bigger stays a node.
MAX_FOLDED_ELEMENTS = 1 << 16
#: Ops whose result is not a function of their inputs.
_NONDETERMINISTIC = frozenset({"RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
                               "Bernoulli", "Multinomial"})


def fold_shape_arithmetic(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> int:
    """Fold, in place, the shape computations of ``model``'s main graph that static shapes decide.

    Parameters
    ----------
    model : onnx.ModelProto
        Modified in place (pass a copy you own).
    input_shapes : mapping of str to sequence of int
        The static shape of every graph input (initializers excluded).

    Returns
    -------
    int
        How many nodes became constants.
    """
    graph = model.graph
    if not any(n.op_type in ("Shape", "Size") for n in graph.node):
        return 0
    static = _static_shapes(model, input_shapes)
    known: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in graph.initializer
                                    if _elements(t.dims) <= MAX_FOLDED_ELEMENTS}
    from_shape: set[str] = set()  # constants that derive from a static shape
    opset = list(model.opset_import)
    folded = 0
    for index, node in enumerate(graph.node):
        if node.op_type == "Constant" and node.domain in ("", "ai.onnx"):
            value = _constant_value(node)
            if value is not None:
                known[node.output[0]] = value
            continue
        values = _shape_value(node, static)
        if values is None and _foldable(node, known, from_shape):
            values = _evaluate(node, known, opset)
        if values is None:
            continue
        for name, value in zip(node.output, values):
            known[name] = value
            from_shape.add(name)
        constants = _as_constants(node, values)
        graph.node[index].CopyFrom(constants[0])
        graph.node.extend(constants[1:])  # extra outputs: _topological_order moves them first
        folded += 1
    if folded:
        _topological_order(graph)
        logger.debug("folded %d shape computation node(s) of graph '%s' to constants", folded, graph.name)
    return folded


def _static_shapes(model: onnx.ModelProto, input_shapes: Mapping[str, Sequence[int]]) -> dict[str, tuple[int, ...]]:
    """Value name -> static shape, by ONNX shape inference with the bound input shapes."""
    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    for inp in probe.graph.input:
        dims = input_shapes.get(inp.name)
        if dims is None or not inp.type.HasField("tensor_type"):
            continue
        shape = inp.type.tensor_type.shape
        shape.ClearField("dim")
        for d in dims:
            shape.dim.add().dim_value = int(d)
    try:
        probe = onnx.shape_inference.infer_shapes(probe, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as err:
        logger.debug("shape inference failed (%s); folding only input shapes", err)
    out: dict[str, tuple[int, ...]] = {}
    for vi in list(probe.graph.input) + list(probe.graph.value_info) + list(probe.graph.output):
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None or not tt.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
        if all(d is not None for d in dims):
            out[vi.name] = tuple(int(d) for d in dims)
    for t in model.graph.initializer:
        out[t.name] = tuple(int(d) for d in t.dims)
    return out


def _shape_value(node: onnx.NodeProto, static: Mapping[str, tuple[int, ...]]) -> list[np.ndarray] | None:
    if node.domain not in ("", "ai.onnx") or node.op_type not in ("Shape", "Size") or node.input[0] not in static:
        return None
    shape = static[node.input[0]]
    if node.op_type == "Size":
        return [np.array(_elements(shape), dtype=np.int64)]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    start, end = attrs.get("start", 0), attrs.get("end", len(shape))
    return [np.array(shape[slice(start, end)], dtype=np.int64)]


def _foldable(node: onnx.NodeProto, known: Mapping[str, np.ndarray], from_shape: set[str]) -> bool:
    inputs = [name for name in node.input if name]
    return (node.domain in ("", "ai.onnx") and node.op_type not in _NONDETERMINISTIC and bool(inputs)
            and all(name in known for name in inputs) and any(name in from_shape for name in inputs)
            and not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute))


def _evaluate(node: onnx.NodeProto, known: Mapping[str, np.ndarray],
              opset: Sequence[onnx.OperatorSetIdProto]) -> list[np.ndarray] | None:
    inputs = [name for name in node.input if name]
    feeds = {name: known[name] for name in inputs}
    graph = onnx.helper.make_graph(
        [node], "fold",
        [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [onnx.helper.make_tensor_value_info(o, onnx.TensorProto.UNDEFINED, None) for o in node.output if o])
    try:
        results = ReferenceEvaluator(onnx.helper.make_model(graph, opset_imports=opset)).run(None, feeds)
    except (ValueError, TypeError, RuntimeError, NotImplementedError, IndexError, KeyError) as err:
        logger.debug("not folding %s '%s': the reference evaluator failed (%s)", node.op_type, node.name, err)
        return None
    arrays = [np.asarray(r) for r in results]
    if any(a.dtype == object or a.size > MAX_FOLDED_ELEMENTS for a in arrays):
        return None
    return arrays


def _constant_value(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return numpy_helper.to_array(attr.t)
    return None


def _as_constants(node: onnx.NodeProto, values: Sequence[np.ndarray]) -> list[onnx.NodeProto]:
    return [onnx.helper.make_node("Constant", [], [name], name=f"{node.name or name}_folded",
                                  value=numpy_helper.from_array(np.asarray(value), name))
            for name, value in zip(node.output, values) if name]


def _topological_order(graph: onnx.GraphProto) -> None:
    """Constants first (extra folded outputs were appended at the end)."""
    nodes = list(graph.node)
    ordered = [n for n in nodes if n.op_type == "Constant"] + [n for n in nodes if n.op_type != "Constant"]
    del graph.node[:]
    graph.node.extend(ordered)


def _elements(dims: Sequence[int]) -> int:
    return int(np.prod(dims)) if len(dims) else 1
