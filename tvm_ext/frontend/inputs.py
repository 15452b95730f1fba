"""Inputs of imported models: their names, shapes and dtypes, and random data to feed them."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from ..errors import TvmExtError
from .onnx_import import ModelLike, load_onnx
from .shapes import onnx_input_info


def input_info(mod_or_model: tvm.IRModule | ModelLike) -> dict[str, tuple[tuple | None, str]]:
    """Name -> (shape, dtype) of the inputs of a Relax module's ``main`` or of an ONNX model.

    For a module, shape entries are ints (or strings for symbolic sizes). For an ONNX
    model, initializers are excluded; unset dims are ``None``, named ones their
    ``dim_param``, and the shape itself is ``None`` when the rank is unknown.
    """
    if isinstance(mod_or_model, tvm.IRModule):
        return module_input_info(mod_or_model)
    return onnx_input_info(load_onnx(mod_or_model).graph)


def module_input_info(mod: tvm.IRModule) -> dict[str, tuple[tuple | None, str]]:
    """Name -> (shape, dtype) of the parameters of ``mod["main"]``.

    Shape entries are ints, or strings for symbolic sizes; the shape is ``None`` when
    the rank is unknown.
    """
    main = _main(mod)
    info = {}
    for p in main.params:
        if not isinstance(p.ty, relax.TensorType):
            raise TvmExtError(f"parameter '{p.name}' of main is not a tensor ({p.ty})")
        info[p.name] = (_static_shape(p.ty, allow_symbolic=True), str(p.ty.dtype))
    return info


def random_inputs(mod: tvm.IRModule, seed: int = 0) -> dict[str, np.ndarray]:
    """Fresh random inputs for ``mod["main"]``, keyed by parameter name, in parameter order.

    * float inputs: standard normal (in the parameter's dtype);
    * bool inputs: fair coin flips;
    * integer inputs used (directly or through other ops) as indices of ``relax.take``
      (ONNX Gather: embedding lookups): uniform in ``[0, n)`` where ``n`` is the smallest
      size of the gathered axis over all such uses, so every id is valid;
    * other integer inputs: uniform in ``[0, 100)`` (small, non-negative, mostly non-zero).
    """
    main = _main(mod)
    rng = np.random.default_rng(seed)
    bounds = index_bounds(main)
    out: dict[str, np.ndarray] = {}
    for p in main.params:
        if not isinstance(p.ty, relax.TensorType):
            raise TvmExtError(f"parameter '{p.name}' of main is not a tensor ({p.ty})")
        shape = _static_shape(p.ty, allow_symbolic=False, name=p.name)
        dtype = np.dtype(str(p.ty.dtype))
        if dtype.kind == "f":
            out[p.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            out[p.name] = rng.random(shape) < 0.5
        elif dtype.kind in "iu":
            high = bounds.get(p.name, 100)
            out[p.name] = rng.integers(0, high, size=shape).astype(dtype)
        else:
            raise TvmExtError(f"cannot make random data for '{p.name}' of dtype {dtype}")
    return out


def _main(mod: tvm.IRModule) -> relax.Function:
    if not any(gv.name_hint == "main" for gv in mod.get_global_vars()):
        raise TvmExtError("the module has no 'main' function")
    main = mod["main"]
    if not isinstance(main, relax.Function):
        raise TvmExtError("'main' is not a Relax function")
    return main


def _static_shape(ty: relax.TensorType, *, allow_symbolic: bool, name: str = "") -> tuple | None:
    if ty.shape is None:
        if allow_symbolic:
            return None
        raise TvmExtError(f"parameter '{name}' has unknown rank; bind its shape first")
    dims = []
    for d in ty.shape.values:
        if isinstance(d, tvm.tirx.IntImm):
            dims.append(int(d))
        elif allow_symbolic:
            dims.append(str(d))
        else:
            raise TvmExtError(f"parameter '{name}' has symbolic dimension '{d}'; bind it first")
    return tuple(dims)


def index_bounds(main: relax.Function) -> dict[str, int]:
    """Param name -> exclusive upper bound for the integer params that feed ``relax.take`` indices.

    The bound is the smallest size of the gathered axis over all such uses (the whole
    tensor's size for a ``take`` without axis); params feeding no ``take`` are absent.
    """
    take = tvm.ir.Op.get("relax.take")
    var2val = relax.analysis.get_var2val(main)
    params = {p.name: p for p in main.params}
    bounds: dict[str, int] = {}
    for value in var2val.values():
        if not (isinstance(value, relax.Call) and value.op.same_as(take)):
            continue
        data, indices = value.args[0], value.args[1]
        shape = data.ty.shape if isinstance(data.ty, relax.TensorType) else None
        if shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in shape.values):
            continue
        dims = [int(d) for d in shape.values]
        # take without an axis indexes the flattened tensor
        size = int(np.prod(dims)) if value.attrs.axis is None else dims[int(value.attrs.axis)]
        for pname in _params_feeding(indices, var2val, params):
            bounds[pname] = min(bounds.get(pname, size), size)
    return bounds


def _params_feeding(expr: relax.Expr, var2val, params: dict) -> set[str]:
    """Names of the parameters that ``expr`` depends on, through any chain of bindings."""
    found: set[str] = set()
    stack = [expr] if isinstance(expr, relax.Var) else list(relax.analysis.free_vars(expr))
    seen: set = set()  # relax vars hash by identity
    while stack:
        var = stack.pop()
        if var in seen:
            continue
        seen.add(var)
        if var.name in params and var.same_as(params[var.name]):
            found.add(var.name)
        elif var in var2val:
            stack.extend(relax.analysis.free_vars(var2val[var]))
    return found
