"""Static shape binding for ONNX graph inputs.

Every user input (graph inputs that are not initializers) must end up with a fully static
shape. Static dims come from the model; symbolic (``dim_param``) or unset dims come from
the ``shapes`` argument. A named dim bound through one input binds every other input that
uses the same name (``batch`` and ``seq`` shared by ``input_ids`` and ``attention_mask``).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from ..errors import ShapeOverrideError, UnboundDimensionError

#: A dim as declared by the model: an int (static), a ``dim_param`` name, or None (unset).
DeclaredDim = int | str | None


def user_inputs(graph: onnx.GraphProto) -> list[onnx.ValueInfoProto]:
    """Graph inputs a caller must feed, in graph order (initializers excluded)."""
    init = {t.name for t in graph.initializer} | {t.name for t in graph.sparse_initializer}
    return [i for i in graph.input if i.name not in init]


def declared_shape(info: onnx.ValueInfoProto) -> list[DeclaredDim] | None:
    """The shape of ``info`` as declared; ``None`` when the rank is unknown."""
    tensor_type = info.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    dims: list[DeclaredDim] = []
    for dim in tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            dims.append(int(dim.dim_value))
        elif dim.HasField("dim_param") and dim.dim_param:
            dims.append(dim.dim_param)
        else:
            dims.append(None)
    return dims


def onnx_input_info(graph: onnx.GraphProto) -> dict[str, tuple[tuple | None, str]]:
    """Name -> (declared shape, numpy dtype name) of the user inputs of ``graph``."""
    info = {}
    for inp in user_inputs(graph):
        shape = declared_shape(inp)
        elem = inp.type.tensor_type.elem_type
        dtype = str(onnx.helper.tensor_dtype_to_np_dtype(elem)) if elem else "unknown"
        info[inp.name] = (tuple(shape) if shape is not None else None, dtype)
    return info


def _checked_override(name: str, dims: Sequence[int]) -> list[int]:
    if isinstance(dims, (str, bytes)) or not isinstance(dims, (Sequence, np.ndarray)):
        raise ShapeOverrideError(
            f"shape override for input '{name}' must be a sequence of ints, got {dims!r}"
        )
    if any(isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)) for d in dims):
        raise ShapeOverrideError(
            f"shape override for input '{name}' must contain only ints, got {list(dims)!r}"
        )
    values = [int(d) for d in dims]
    bad = [v for v in values if v < 1]
    if bad:
        raise ShapeOverrideError(
            f"shape override for input '{name}' has non-positive sizes {bad}: {values}"
        )
    return values


def _fmt(dims: Sequence[DeclaredDim]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in dims) + "]"


def bind_input_shapes(
    graph: onnx.GraphProto, shapes: Mapping[str, Sequence[int]] | None
) -> dict[str, list[int]]:
    """Static shape of every user input of ``graph``.

    Raises
    ------
    ShapeOverrideError
        ``shapes`` names an unknown input (all listed), has the wrong rank, contradicts a
        static dim, binds one named dim to two sizes, or holds non-positive sizes.
    UnboundDimensionError
        Some input still has a free dim (all listed, with input, dim name and axis).
    """
    shapes = dict(shapes or {})
    inputs = user_inputs(graph)
    declared = {i.name: declared_shape(i) for i in inputs}

    unknown = [n for n in shapes if n not in declared]
    if unknown:
        known = ", ".join(repr(n) for n in declared) or "none"
        raise ShapeOverrideError(
            f"shapes names unknown input(s) {', '.join(map(repr, unknown))}; model inputs: {known}"
        )

    overrides = {name: _checked_override(name, dims) for name, dims in shapes.items()}
    named: dict[str, tuple[int, str]] = {}  # dim_param -> (size, input that bound it)
    for name, values in overrides.items():
        dims = declared[name]
        if dims is None:
            continue  # unknown rank: any rank is accepted
        if len(values) != len(dims):
            raise ShapeOverrideError(
                f"shape override for input '{name}' has rank {len(values)} ({values}) but the "
                f"model declares rank {len(dims)} ({_fmt(dims)})"
            )
        for axis, (want, have) in enumerate(zip(values, dims)):
            if isinstance(have, int) and have != want:
                raise ShapeOverrideError(
                    f"shape override for input '{name}' sets axis {axis} to {want} but the model "
                    f"fixes it to {have} (declared {_fmt(dims)})"
                )
            if isinstance(have, str):
                prev = named.get(have)
                if prev is not None and prev[0] != want:
                    raise ShapeOverrideError(
                        f"dimension '{have}' is bound to {prev[0]} through input '{prev[1]}' "
                        f"and to {want} through input '{name}'"
                    )
                named[have] = (want, name)

    result: dict[str, list[int]] = {}
    unbound: list[str] = []
    for name, dims in declared.items():
        if name in overrides:
            result[name] = overrides[name]
            continue
        if dims is None:
            unbound.append(f"input '{name}' has unknown rank: pass shapes={{'{name}': [...]}}")
            continue
        resolved: list[int | None] = []
        for d in dims:
            if isinstance(d, int):
                resolved.append(d)
            elif isinstance(d, str) and d in named:
                resolved.append(named[d][0])
            else:
                resolved.append(None)
        free = [axis for axis, v in enumerate(resolved) if v is None]
        if not free:
            result[name] = [int(v) for v in resolved]
            continue
        hint = "[" + ", ".join(str(v) if v is not None else (dims[a] or "?")
                               for a, v in enumerate(resolved)) + "]"
        listed = ", ".join(f"'{dims[a] if dims[a] is not None else '?'}' (axis {a})" for a in free)
        noun = "dimension" if len(free) == 1 else "dimensions"
        unbound.append(f"input '{name}' has free {noun} {listed}: pass shapes={{'{name}': {hint}}}")
    if unbound:
        raise UnboundDimensionError("; ".join(unbound))
    return result
