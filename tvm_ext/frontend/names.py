"""Value names of ONNX graphs made C identifiers, and the ONNX names of ``main``'s inputs.

Exported models name values like ``/encoder/layer.0/MatMul_output_0``, ``onnx::Add_7`` or
``input:0``. Such a name can reach generated CUDA as a kernel parameter (a graph input, or a
value that depends on weights alone once weights are parameters), which must be an identifier;
TVM renames only graph inputs, and only their dots. :func:`sanitize_value_names` renames every
value of a model (graph inputs and outputs, initializers, node outputs, nested subgraphs) to an
identifier, once, before import.

:func:`tvm_ext.frontend.from_onnx` records the ONNX name of each parameter of ``main`` as the
function attribute :data:`ONNX_NAMES_ATTR`; :func:`onnx_input_names` reads it back, so APIs that
take inputs by name accept the original ONNX names.
"""
from __future__ import annotations

import re
from collections.abc import Iterator, Mapping

import onnx
import tvm

#: Function attribute of an imported ``main``: parameter name -> ONNX graph input name.
ONNX_NAMES_ATTR = "tvm_ext.onnx_names"

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def iter_graphs(graph: onnx.GraphProto) -> Iterator[onnx.GraphProto]:
    """``graph`` and every subgraph nested in its nodes' attributes (If/Loop/Scan bodies)."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_graphs(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for sub in attr.graphs:
                    yield from iter_graphs(sub)


def _defined_names(graph: onnx.GraphProto) -> list[str]:
    """Every value a graph defines or declares, in a stable order (inputs first)."""
    names = [v.name for v in graph.input]
    names += [t.name for t in graph.initializer] + [t.values.name for t in graph.sparse_initializer]
    names += [o for n in graph.node for o in n.output]
    names += [v.name for v in graph.output] + [v.name for v in graph.value_info]
    return names


def identifier_renames(model: onnx.ModelProto) -> dict[str, str]:
    """Old name -> new name for every value name of ``model`` that is not a C identifier.

    A new name replaces each non-word character by ``_`` and strips leading and trailing ones
    (``/layer0/MatMul:0`` becomes ``layer0_MatMul_0``), prefixes ``v_`` when it would start with
    a digit, and appends ``_1``,
    ``_2`` ... when it collides with another name of the model. Empty names (omitted optional
    inputs) stay empty.
    """
    graphs = list(iter_graphs(model.graph))
    ordered = dict.fromkeys(name for g in graphs for name in _defined_names(g))
    taken = set(ordered)
    renames: dict[str, str] = {}
    for name in ordered:
        if not name or _IDENT.fullmatch(name):
            continue
        base = re.sub(r"[^A-Za-z0-9_]", "_", name).strip("_") or "v"
        base = base if _IDENT.match(base) else f"v_{base}"
        new, k = base, 1
        while new in taken:
            new, k = f"{base}_{k}", k + 1
        taken.add(new)
        renames[name] = new
    return renames


def rename_values(model: onnx.ModelProto, renames: Mapping[str, str]) -> None:
    """Apply ``renames`` (old -> new) to every value name of ``model`` and its subgraphs, in place."""
    for graph in iter_graphs(model.graph):
        for info in list(graph.input) + list(graph.output) + list(graph.value_info):
            info.name = renames.get(info.name, info.name)
        for tensor in graph.initializer:
            tensor.name = renames.get(tensor.name, tensor.name)
        for sparse in graph.sparse_initializer:
            sparse.values.name = renames.get(sparse.values.name, sparse.values.name)
        for node in graph.node:
            node.input[:] = [renames.get(x, x) for x in node.input]
            node.output[:] = [renames.get(x, x) for x in node.output]


def sanitize_value_names(model: onnx.ModelProto) -> dict[str, str]:
    """Rename every value of ``model`` that is not a C identifier, in place.

    Returns
    -------
    dict of str to str
        Old name -> new name of the renamed values (see :func:`identifier_renames`).
    """
    renames = identifier_renames(model)
    rename_values(model, renames)
    return renames


def onnx_input_names(mod: tvm.IRModule) -> dict[str, str]:
    """Parameter name -> ONNX graph input name, for every parameter of ``mod["main"]``.

    Read from the attribute :func:`~tvm_ext.frontend.from_onnx` sets; a parameter it does not
    name (or a module from elsewhere) maps to its own name.
    """
    main = mod["main"]
    recorded = {str(k): str(v) for k, v in (main.attrs.get(ONNX_NAMES_ATTR) or {}).items()}
    return {p.name: recorded.get(p.name, p.name) for p in main.params}
