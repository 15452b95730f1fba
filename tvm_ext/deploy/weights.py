"""Weights outside the library: a params file loaded at run time (for large models).

Build side (:func:`externalize_weights`): every constant of ``main`` with at least
:data:`MIN_ELEMENTS` elements becomes a parameter after the inputs, ``main`` gets
``num_input``, and :func:`lift_weight_work` moves what depends on weights alone (transposes,
casts) to ``main_transform_params``, run once at load (the benchmark bundles do the same with
their regenerated weights). The values go to an ``.npz`` file in parameter order
(:func:`save_params`). Run side: :func:`load_params` (numpy only).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from . import DeployError

#: Constants with fewer elements (shapes, scalars, small biases) stay in the library.
MIN_ELEMENTS = 1024
_KEY = "param_{:05d}"


def lift_weight_work(mod: Any, num_input: int) -> Any:
    """Mark ``main``'s first ``num_input`` parameters as inputs, the rest as weights, and lift
    weight-only work into ``main_transform_params`` (``relax.transform.LiftTransformParams``)."""
    from tvm import relax  # noqa: PLC0415

    main = mod["main"]
    mod = _copy(mod)
    mod["main"] = main.with_attr("num_input", num_input)
    return relax.transform.LiftTransformParams()(mod) if len(main.params) > num_input else mod


def _copy(mod: Any) -> Any:
    import tvm  # noqa: PLC0415

    infos = dict(mod.global_infos) if mod.global_infos is not None else None
    return tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=infos)


def externalize_weights(mod: Any, min_elements: int = MIN_ELEMENTS) -> tuple[Any, list[np.ndarray]]:
    """``mod`` whose ``main`` takes its large constants as parameters, and their values in order."""
    from tvm import relax  # noqa: PLC0415

    values: list[np.ndarray] = []
    new_params: list[Any] = []

    @relax.expr_functor.mutator
    class _Lift(relax.PyExprMutator):
        def __init__(self) -> None:
            super().__init__()
            self.seen: dict[Any, Any] = {}

        def visit_generic_const_(self, const: Any) -> Any:  # noqa: D102 - mutator protocol (relax constants)
            if int(np.prod(const.value.shape, dtype=np.int64)) < min_elements:
                return const
            if const not in self.seen:
                var = relax.Var(f"weight_{len(new_params)}", const.ty)
                self.seen[const] = var
                new_params.append(var)
                values.append(const.value.numpy())
            return self.seen[const]

    main = mod["main"]
    body = _Lift().visit_expr(main.body)
    if not new_params:
        return mod, []
    func = relax.Function(list(main.params) + new_params, body, main.ret_ty if hasattr(main, "ret_ty") else None,
                          main.is_pure, main.attrs)
    out = _copy(mod)
    out["main"] = func
    return lift_weight_work(out, len(main.params)), values


def save_params(values: list[np.ndarray], path: str | Path) -> Path:
    """Write the weights, in parameter order, to an ``.npz`` file."""
    path = Path(path)
    np.savez(path, **{_KEY.format(i): v for i, v in enumerate(values)})
    return path if path.suffix == ".npz" else path.with_name(path.name + ".npz")


def load_params(path: str | Path, count: int) -> list[np.ndarray]:
    """The ``count`` weights of a params file, in parameter order.

    Raises
    ------
    DeployError
        The file is missing, unreadable or holds a different number of weights.
    """
    path = Path(path)
    if not path.is_file():
        raise DeployError(f"params file not found: {path} (the library keeps its weights outside; "
                          "give it with --params FILE)")
    try:
        with np.load(path) as data:
            keys = [_KEY.format(i) for i in range(count)]
            if sorted(data.files) != sorted(keys):
                raise DeployError(f"{path} holds {len(data.files)} weights, the library takes {count}")
            return [data[k] for k in keys]
    except (OSError, ValueError) as err:
        raise DeployError(f"cannot read params file {path}: {err}") from None


__all__ = ["MIN_ELEMENTS", "lift_weight_work", "externalize_weights", "save_params", "load_params"]
