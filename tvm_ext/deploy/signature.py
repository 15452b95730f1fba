"""What a library takes, carried inside it: the ``tvm_ext_signature`` function.

``tvm_ext.compile`` and ``tvm-ext compile`` add a Relax function :data:`FUNCTION` that returns
a JSON string: the target kind, the inputs of ``main`` (name, shape, dtype and, for integer
inputs such as token ids, the range random values are drawn from), how many weights follow
them as parameters (0 when they are bound into the library), the params file that holds
them and whether ``main_transform_params`` prepares them. ``tvm-ext run`` reads it with the
TVM runtime alone (:func:`read_signature`) to draw random inputs and find the weights.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from ..bench.inputs import InputSpec
from . import DeployError

#: Name of the function (and global symbol) holding the signature.
FUNCTION = "tvm_ext_signature"
#: Name of the function that prepares the weights (``relax.transform.LiftTransformParams``).
TRANSFORM_PARAMS = "main_transform_params"
VERSION = 1


@dataclass
class Signature:
    """Inputs and weights of a library's ``main``.

    Attributes
    ----------
    target_kind : str
        ``cuda`` or ``llvm``.
    inputs : list of InputSpec
        The inputs of ``main``, in order.
    num_params : int
        Weights ``main`` takes after the inputs (0: bound into the library).
    params_file : str or None
        File name of the weights (next to the library), when they are outside.
    transform_params : bool
        The weights go through ``main_transform_params`` first.
    """

    target_kind: str
    inputs: list[InputSpec] = field(default_factory=list)
    num_params: int = 0
    params_file: str | None = None
    transform_params: bool = False

    def to_json(self) -> str:
        """JSON text."""
        return json.dumps({"version": VERSION, "target_kind": self.target_kind,
                           "inputs": [s.to_json() for s in self.inputs], "num_params": self.num_params,
                           "params_file": self.params_file, "transform_params": self.transform_params})

    @classmethod
    def from_json(cls, text: str) -> "Signature":
        """Inverse of :meth:`to_json`.

        Raises
        ------
        DeployError
            Not a signature this version reads.
        """
        try:
            data = json.loads(text)
            if data.get("version") != VERSION:
                raise DeployError(f"library signature version {data.get('version')} is not {VERSION}")
            return cls(target_kind=str(data["target_kind"]), inputs=[InputSpec.from_json(s) for s in data["inputs"]],
                       num_params=int(data["num_params"]), params_file=data.get("params_file"),
                       transform_params=bool(data.get("transform_params", False)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise DeployError(f"malformed library signature: {err}") from None


def signature_of(mod: Any, target_kind: str, params_file: str | None = None) -> Signature:
    """The signature of ``mod``'s ``main`` (inputs: its first ``num_input`` parameters, all without that attribute).

    Raises
    ------
    DeployError
        An input has no static shape.
    """
    import tvm  # noqa: PLC0415

    from ..bench.inputs import spec_for  # noqa: PLC0415
    from ..frontend import index_bounds  # noqa: PLC0415

    main = mod["main"]
    params = list(main.params)
    num_input = int(main.attrs["num_input"]) if main.attrs is not None and "num_input" in main.attrs else len(params)
    names = dict(main.attrs["tvm_ext.onnx_names"]) if main.attrs is not None and "tvm_ext.onnx_names" in main.attrs \
        else {}
    back = {str(v): str(k) for k, v in names.items()}
    bounds = None
    specs = []
    for p in params[:num_input]:
        ty = p.ty
        if ty.shape is None or not all(isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
            raise DeployError(f"input '{p.name}' has no static shape ({ty}); bind it with --shapes")
        shape, dtype = tuple(int(d) for d in ty.shape.values), str(ty.dtype)
        rng = None
        if dtype.startswith(("int", "uint")):
            bounds = index_bounds(main) if bounds is None else bounds
            rng = (0, int(bounds.get(p.name, 100)))
        specs.append(spec_for(back.get(p.name, p.name), shape, dtype, rng))
    lifted = any(gv.name_hint == TRANSFORM_PARAMS for gv in mod.get_global_vars())
    return Signature(target_kind, specs, len(params) - num_input, params_file, lifted)


def attach_signature(mod: Any, signature: Signature) -> Any:
    """``mod`` with the :data:`FUNCTION` function returning ``signature``."""
    import tvm  # noqa: PLC0415
    from tvm import relax  # noqa: PLC0415

    func = relax.Function([], tvm.ir.StringImm(signature.to_json())).with_attr("global_symbol", FUNCTION)
    out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs,
                       global_infos=dict(mod.global_infos) if mod.global_infos is not None else None)
    out[FUNCTION] = func  # a new module: the caller's stays as it was
    return out


def read_signature(vm: Any) -> Signature | None:
    """The signature of a loaded library (a ``VirtualMachine``), None when it carries none."""
    try:
        func = vm[FUNCTION]
    except AttributeError:  # "Module has no function"
        return None
    return Signature.from_json(str(func()))


__all__ = ["FUNCTION", "TRANSFORM_PARAMS", "Signature", "signature_of", "attach_signature", "read_signature"]
