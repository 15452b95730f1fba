"""ONNX ``Constant`` nodes rewritten to the one attribute form TVM's importer reads.

A Constant carries its value in exactly one of ``value`` (a tensor), ``value_float``,
``value_floats``, ``value_int``, ``value_ints`` (and string or sparse forms). TVM's converter
reads ``value`` only and fails with "no value in Constant" on the others, which ONNX's own
function expansions use (Elu, Selu, LeakyRelu, HardSigmoid, Shrink, window functions ...).
:func:`normalize_constant_nodes` turns the numeric forms into ``value`` tensors of the same
type and shape (scalars for ``value_float``/``value_int``, 1-D for the lists).
"""
from __future__ import annotations

import numpy as np
import onnx
from onnx import numpy_helper

from .names import iter_graphs

#: Attribute name -> (numpy dtype, whether the value is a list).
_NUMERIC_FORMS = {
    "value_float": (np.float32, False), "value_floats": (np.float32, True),
    "value_int": (np.int64, False), "value_ints": (np.int64, True),
}


def normalize_constant_nodes(model: onnx.ModelProto) -> int:
    """Rewrite, in place, every numeric non-``value`` Constant of ``model`` (subgraphs included).

    Returns
    -------
    int
        How many nodes were rewritten.
    """
    count = 0
    for graph in iter_graphs(model.graph):
        for node in graph.node:
            if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or len(node.attribute) != 1:
                continue
            attr = node.attribute[0]
            if attr.name not in _NUMERIC_FORMS:
                continue
            dtype, is_list = _NUMERIC_FORMS[attr.name]
            value = onnx.helper.get_attribute_value(attr)
            array = np.asarray(list(value) if is_list else value, dtype=dtype)
            del node.attribute[:]
            node.attribute.append(onnx.helper.make_attribute("value", numpy_helper.from_array(array)))
            count += 1
    return count
