"""The CUTLASS library calls a preset's build makes for a target, checked on the host.

The graph stage runs as :func:`~tvm_ext.driver.stages.build` runs it, but the library calls are
left as ``Codegen`` functions instead of being compiled; each is then put through the contract
check with the instance its plan names (:func:`~tvm_ext.cutlass.codegen.checked_kernels`). No
nvcc compile of the instances themselves, no GPU: what ``tvm-ext check --target`` and
``scripts/check_cutlass_calls.py`` print. A full build checks the same calls in its codegen and
fails at compile time on a refused one.
"""
from __future__ import annotations

import tvm

from ..cutlass.codegen import checked_kernels
from ..cutlass.contract import ContractCall, ContractResult
from ..cutlass.passes import codegen_options
from ..cutlass.patterns import CODEGEN_NAME
from ..hardware import planning_target
from ..driver.presets import Preset, get_preset
from ..driver.stages import cuda_graph_context, preset_passes


def library_calls(mod: tvm.IRModule, target: tvm.target.Target, preset: str | Preset
                  ) -> list[tuple[ContractCall | None, ContractResult]]:
    """Every CUTLASS call the preset selects for ``target`` with its verdict (the call is None
    when no configuration was accepted for it); empty for a target CUTLASS does not serve."""
    p = get_preset(preset)
    if target.kind.name != "cuda":
        return []
    with cuda_graph_context(False), target:
        fused = tvm.transform.Sequential(preset_passes(p, target, library_codegen=False).fuse)(mod)
    funcs = [f for _, f in fused.functions_items()
             if isinstance(f, tvm.relax.Function) and f.attrs and f.attrs.get("Codegen") == CODEGEN_NAME]
    if not funcs:
        return []
    offloads, kernels, results = checked_kernels(funcs, codegen_options(planning_target(target)))
    return [(None if k is None else ContractCall(o, k), r) for o, k, r in zip(offloads, kernels, results)]


__all__ = ["library_calls"]
