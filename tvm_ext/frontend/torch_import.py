"""PyTorch import through ``torch.export`` (torch is an optional dependency)."""
from __future__ import annotations

from collections.abc import Sequence

import tvm

from ..errors import TvmExtError
from .canonicalize import finalize_module


def from_torch(
    module,
    example_inputs: Sequence,
    *,
    fp16: bool = False,
    canonicalize: bool = True,
) -> tvm.IRModule:
    """Import a ``torch.nn.Module`` through ``torch.export`` (weights as constants).

    Raises
    ------
    TvmExtError
        If torch is not installed.
    """
    try:
        import torch  # noqa: F401  (optional dependency)
    except ImportError:
        raise TvmExtError(
            "torch is required for from_torch (pip install torch); "
            "or export the model to ONNX and use from_onnx"
        ) from None
    from tvm.relax.frontend.torch import from_exported_program

    exported = torch.export.export(module.eval(), tuple(example_inputs))
    mod = from_exported_program(exported, keep_params_as_input=False, unwrap_unit_return_tuple=True)
    return finalize_module(mod, fp16=fp16, canonicalize=canonicalize)
