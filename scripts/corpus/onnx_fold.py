"""Static-shape constant folding of exported ONNX graphs (onnx + numpy only).

The TorchScript exporter records ``x.size()`` calls as ``Shape`` nodes even when every
input shape is fixed, and ``transformers`` builds attention masks and position ids
from them (``Shape -> Gather -> ConstantOfShape -> ...``). TVM's Relax importer trips
on some of these chains (e.g. a ``ConstantOfShape`` fed a rank-0 shape). Folding them
away leaves a graph of compute ops on static shapes, which is what the corpus is for.

:func:`fold_constants` repeats until nothing changes: infer shapes, replace ``Shape`` /
``Size`` of statically shaped tensors and every node whose inputs are all constant by
initializers (each evaluated as a one-node onnxruntime session, optimisations off; the
``onnx.reference`` evaluator mis-handles some of these, e.g. ``GatherElements`` after
``Expand``), then drops dead nodes and unused initializers.
"""
from __future__ import annotations

import logging

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper

log = logging.getLogger(__name__)

#: Ops never folded: random generators (folding would freeze one draw).
_NEVER_FOLD = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
               "Multinomial", "Bernoulli", "Dropout"}


def light_copy(model: onnx.ModelProto, max_elements: int = 1024) -> onnx.ModelProto:
    """Copy of ``model`` whose initializers above ``max_elements`` keep dims and type but
    no data: shape inference and the checker run on it without serialising the weights."""
    light = onnx.ModelProto()
    graph = model.graph
    light.CopyFrom(onnx.ModelProto(
        ir_version=model.ir_version, opset_import=model.opset_import,
        producer_name=model.producer_name, metadata_props=model.metadata_props))
    light.graph.name = graph.name
    for field in ("node", "input", "output", "value_info"):
        getattr(light.graph, field).extend(getattr(graph, field))
    for t in graph.initializer:
        if int(np.prod(t.dims, dtype=np.int64)) <= max_elements:
            light.graph.initializer.append(t)
        else:
            light.graph.initializer.add(name=t.name, data_type=t.data_type, dims=t.dims)
    return light


def infer_value_info(model: onnx.ModelProto, strict: bool = False) -> None:
    """Replace ``model.graph.value_info`` by freshly inferred shapes (on a light copy)."""
    inferred = onnx.shape_inference.infer_shapes(light_copy(model), strict_mode=strict,
                                                 data_prop=True)
    del model.graph.value_info[:]
    model.graph.value_info.extend(inferred.graph.value_info)


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    inferred = onnx.shape_inference.infer_shapes(light_copy(model), data_prop=True)
    shapes: dict[str, list[int]] = {}
    g = inferred.graph
    for vi in list(g.value_info) + list(g.input) + list(g.output):
        t = vi.type.tensor_type
        if not t.HasField("shape"):
            continue
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if all(d >= 0 for d in dims):
            shapes[vi.name] = dims
    return shapes


def _shape_value(node: onnx.NodeProto, dims: list[int]) -> np.ndarray:
    if node.op_type == "Size":
        return np.array(int(np.prod(dims)), dtype=np.int64)
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    rank = len(dims)
    start, end = attrs.get("start", 0), attrs.get("end", rank)
    return np.array(dims[slice(start, end)], dtype=np.int64)


def _evaluate(node: onnx.NodeProto, values: list[np.ndarray], opset: int) -> list[np.ndarray]:
    inits = [numpy_helper.from_array(val, name) for name, val in zip(node.input, values) if name]
    unique = list({t.name: t for t in inits}.values())
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph([node], "fold", [], outputs, initializer=unique)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), options,
                                providers=["CPUExecutionProvider"])
    return [np.asarray(v) for v in sess.run(None, {})]


def _fold_once(model: onnx.ModelProto, max_elements: int) -> int:
    g = model.graph
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    shapes = _static_shapes(model)
    inits = {t.name: t for t in g.initializer}
    cache: dict[str, np.ndarray] = {}

    def value(name: str) -> np.ndarray:
        if name not in cache:
            cache[name] = numpy_helper.to_array(inits[name])
        return cache[name]

    kept, folded = [], 0
    for node in g.node:
        results: list[np.ndarray] | None = None
        if node.domain not in ("", "ai.onnx") or node.op_type in _NEVER_FOLD \
                or any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                       for a in node.attribute):
            results = None
        elif node.op_type in ("Shape", "Size") and node.input[0] in shapes:
            results = [_shape_value(node, shapes[node.input[0]])]
        elif all(not name or name in inits for name in node.input):
            size = sum(int(np.prod(shapes.get(o, [max_elements + 1]))) for o in node.output)
            if node.op_type == "Constant" or size <= max_elements:
                results = _evaluate(node, [value(n) if n else None for n in node.input], opset)
        if results is None:
            kept.append(node)
            continue
        for name, arr in zip(node.output, results):
            tensor = numpy_helper.from_array(arr, name)
            g.initializer.append(tensor)
            inits[name] = tensor
            cache[name] = arr
        folded += 1
    del g.node[:]
    g.node.extend(kept)
    return folded


def remove_dead(model: onnx.ModelProto) -> None:
    """Drop nodes that do not reach a graph output and initializers nobody reads."""
    g = model.graph
    live = {o.name for o in g.output}
    kept = []
    for node in reversed(list(g.node)):
        if any(o in live for o in node.output):
            kept.append(node)
            live.update(i for i in node.input if i)
            for a in node.attribute:  # names read by subgraphs of If / Loop / Scan
                for sub in ([a.g] if a.type == onnx.AttributeProto.GRAPH else list(a.graphs)):
                    live.update(i for n in sub.node for i in n.input)
    del g.node[:]
    g.node.extend(reversed(kept))
    for i in reversed(range(len(g.initializer))):  # in place: no copies of big weights
        if g.initializer[i].name not in live:
            del g.initializer[i]
    graph_inputs = [i for i in g.input if i.name in live or i.name in {o.name for o in g.output}]
    del g.input[:]
    g.input.extend(graph_inputs)


def fold_constants(model: onnx.ModelProto, max_elements: int = 1 << 18,
                   max_rounds: int = 512) -> onnx.ModelProto:
    """Fold shape computations and constant subgraphs of a statically shaped model.

    Parameters
    ----------
    model : onnx.ModelProto
        Model with static input shapes; modified in place and returned.
    max_elements : int
        Constant subgraphs whose results exceed this many elements stay in the graph.
    max_rounds : int
        Upper bound on infer/fold rounds. ONNX shape inference stops at the first
        ``Slice`` / ``Reshape`` fed by a not-yet-folded shape computation, so a deep
        network folds roughly one block per round (NAFNet needs about 40).

    Returns
    -------
    onnx.ModelProto
        The folded model, with fresh inferred ``value_info``.
    """
    for round_ in range(max_rounds):
        folded = _fold_once(model, max_elements)
        remove_dead(model)
        log.debug("fold round %d: %d nodes folded", round_, folded)
        if not folded:
            break
    else:
        log.warning("fold_constants: still folding after %d rounds", max_rounds)
    left = sorted({n.op_type for n in model.graph.node if n.op_type in ("Shape", "Size")})
    if left:
        log.warning("fold_constants: %s nodes on dynamic shapes remain", ", ".join(left))
    infer_value_info(model)
    return model
