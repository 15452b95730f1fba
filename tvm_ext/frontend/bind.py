"""Graph inputs bound to values: shape-like operands the importer needs as constants.

TVM's ONNX importer builds static shapes, so operands such as Reshape's ``shape``, Slice's
``starts``/``ends``, a Reduce's ``axes`` or TopK's ``k`` must be constants. A model (ONNX's
node tests, models exported with dynamic axes) may take them as graph inputs instead. The
caller knows their values: :func:`bind_inputs` turns such inputs into initializers before
import (``from_onnx(..., bind={"shape": [1, -1, 64]})``, ``tvm-ext ... --bind shape=1,-1,64``),
and :func:`constant_operand_inputs` finds which inputs need it, for error messages and for
test runners that hold the values.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import InputBindingError
from .shapes import declared_shape, user_inputs

#: ONNX op type -> positions of its inputs that TVM's importer needs as constants (shape,
#: axes, sizes, counts); read from the importer's converters, which call ``get_constant`` or
#: reject a non-constant there.
CONSTANT_OPERANDS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "Slice": (1, 2, 3, 4), "Pad": (1, 2, 3),
    "TopK": (1,), "Resize": (1, 2, 3), "Upsample": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "OneHot": (1, 2), "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "CumSum": (1,),
    "CenterCropPad": (1,), "AffineGrid": (1,), "Trilu": (1,), "NonMaxSuppression": (2, 3, 4),
    "Col2Im": (1, 2), "BlackmanWindow": (0,), "HammingWindow": (0,), "HannWindow": (0,),
    **{f"Reduce{kind}": (1,) for kind in
       ("Sum", "Mean", "Max", "Min", "Prod", "L1", "L2", "LogSum", "LogSumExp", "SumSquare")},
}
#: Ops that pass a value through unchanged in content (a bound input may reach the operand
#: through them).
_PASS_THROUGH = frozenset({"Cast", "Identity", "CastLike"})


def constant_operand_inputs(graph: onnx.GraphProto) -> dict[str, list[str]]:
    """Graph inputs (initializers excluded) that reach an operand the importer needs constant.

    Returns
    -------
    dict of str to list of str
        Input name -> the operands it feeds, e.g. ``["Reshape 'r0' input 1"]``; in graph
        input order. Inputs reach an operand directly or through Cast/Identity.
    """
    inputs = [i.name for i in user_inputs(graph)]
    origin = {name: name for name in inputs}  # value -> the graph input it passes through from
    found: dict[str, list[str]] = {}
    for node in graph.node:
        for pos in CONSTANT_OPERANDS.get(node.op_type, ()):
            if pos < len(node.input) and node.input[pos] in origin:
                found.setdefault(origin[node.input[pos]], []).append(
                    f"{node.op_type} '{node.name or node.output[0]}' input {pos}")
        if node.op_type in _PASS_THROUGH and node.input and node.input[0] in origin:
            for out in node.output:
                origin[out] = origin[node.input[0]]
    return {name: found[name] for name in inputs if name in found}


def bind_inputs(model: onnx.ModelProto, values: Mapping[str, Any]) -> onnx.ModelProto:
    """A copy of ``model`` whose named graph inputs are initializers holding ``values``.

    Parameters
    ----------
    model : onnx.ModelProto
    values : mapping of str to array-like
        ONNX graph input name -> value (array, list or scalar), converted to the input's
        declared element type; its shape must match the declared static dimensions.

    Raises
    ------
    InputBindingError
        A name is not a graph input (or already an initializer), a value does not convert to
        the declared type, or its shape contradicts the declared one.
    """
    if not values:
        return model
    graph = model.graph
    declared = {i.name: i for i in user_inputs(graph)}
    unknown = [name for name in values if name not in declared]
    if unknown:
        initializers = {t.name for t in graph.initializer}
        what = ", ".join(f"'{n}'" + (" (already a constant initializer)" if n in initializers else "")
                         for n in unknown)
        raise InputBindingError(f"cannot bind {what}: not a graph input; graph inputs are "
                                + (", ".join(f"'{n}'" for n in declared) or "none"))
    tensors = [_tensor_for(declared[name], value) for name, value in values.items()]
    bound = onnx.ModelProto()
    bound.CopyFrom(model)
    keep = [i for i in bound.graph.input if i.name not in values]
    del bound.graph.input[:]
    bound.graph.input.extend(keep)
    bound.graph.initializer.extend(tensors)
    return bound


def _tensor_for(info: onnx.ValueInfoProto, value: Any) -> onnx.TensorProto:
    elem = info.type.tensor_type.elem_type
    if info.type.WhichOneof("value") != "tensor_type" or not elem:
        raise InputBindingError(f"cannot bind '{info.name}': it is not a tensor of a known element type")
    dtype = onnx.helper.tensor_dtype_to_np_dtype(elem)
    try:
        array = np.asarray(value)
        converted = array.astype(dtype)
    except (TypeError, ValueError) as err:
        raise InputBindingError(f"cannot bind '{info.name}': value {value!r} is not convertible to "
                                f"{np.dtype(dtype).name} ({err})") from None
    if array.dtype.kind == "f" and np.dtype(dtype).kind in "iub" and not np.array_equal(converted, array):
        raise InputBindingError(f"cannot bind '{info.name}': it is {np.dtype(dtype).name}, "
                                f"the value has fractions ({value!r})")
    shape = declared_shape(info)
    if shape == [] and converted.size == 1:  # a scalar input bound from a one-number list
        converted = converted.reshape(())
    if shape is not None and not _fits(shape, converted.shape):
        raise InputBindingError(f"cannot bind '{info.name}': value shape {list(converted.shape)} does not "
                                f"match the declared shape {['?' if d is None else d for d in shape]}")
    return numpy_helper.from_array(converted, info.name)


def _fits(declared: Iterable[int | str | None], actual: tuple[int, ...]) -> bool:
    declared = list(declared)
    return len(declared) == len(actual) and all(not isinstance(d, int) or d == a
                                                for d, a in zip(declared, actual))


def parse_bind_arg(text: str) -> tuple[str, list[float] | list[int]]:
    """``NAME=V1,V2,...`` (a 1-D value; ``NAME=`` for an empty one) -> (name, values).

    Integers stay ints, anything else is read as float; the element type is the input's.

    Raises
    ------
    InputBindingError
        No ``=``, an empty name, or a value that is not a number.
    """
    name, sep, rest = text.partition("=")
    if not sep or not name.strip():
        raise InputBindingError(f"--bind expects NAME=V1,V2,..., got {text!r}")
    items = [v.strip() for v in rest.split(",") if v.strip()]
    try:
        return name.strip(), [int(v) for v in items]
    except ValueError:
        try:
            return name.strip(), [float(v) for v in items]
        except ValueError:
            raise InputBindingError(f"--bind {name.strip()}: values must be numbers, got {rest!r}") from None
