"""The BYOC codegen ``relax.ext.tvm_ext_cutlass`` run by ``relax.transform.RunCodegen``.

For the functions it receives it: reads each workload, takes the kernel configuration of the
plan the function carries (:data:`~tvm_ext.select.attrs.PLAN_ATTR`, set by the cutlass generator
when the candidate was selected; a function partitioned without the spine gets the best
configuration of :func:`ranked_configs` that the contract check accepts), checks every call on
the host (:mod:`~tvm_ext.cutlass.contract`; a refused call fails the build here, never on the
GPU), emits one CUDA translation unit per distinct instance (cutlass_library) and one host glue unit with the
TVM-FFI functions, compiles them (nvcc / g++, in parallel, cached), merges the objects with
``ld -r`` and returns a ``static_library`` module so ``export_library`` carries the code into
the final ``.so``.

Options (``RunCodegen(target_options={"tvm_ext_cutlass": {...}})``): ``arch`` (``"sm_80"``,
``"sm_90a"``, ...; default ``"sm_80"``), ``device`` (device name, default: the device the target
policy gives for the arch), and ``database`` (path of a JSON-lines database; empty for none).
"""
from __future__ import annotations

import hashlib
import logging
from pathlib import Path
from typing import Mapping, Sequence

import tvm
import tvm_ffi

from ..errors import UnknownDeviceError
from ..hardware import DeviceSpec, device_from_target, load_device
from ..select.database import Database
from ..select.plan import PlanError, plan_of
from .candidates import arch_number
from .config import KernelConfig
from .emit_b2b import b2b_candidates
from .contract import ContractCall, ContractResult, check_calls, first_accepted
from .instance import FUSED_KINDS, Kernel, kernel_for
from .errors import CutlassCodegenError
from .nvcc import cache_dir, compile_many, link_relocatable
from .patterns import CODEGEN_NAME
from .pricing import ranked_by_price
from .records import best_configs
from .wrapper import compile_glue, emit_glue
from .workload import Offload, workload_from_function

_LOG = logging.getLogger(__name__)
def device_for(arch: str, device: str | None = None) -> DeviceSpec:
    """The device the configuration is chosen for: the named one, else what the target policy
    (:func:`tvm_ext.hardware.device_from_target`) gives for ``arch``."""
    try:
        if device:
            return load_device(device)
        return device_from_target({"kind": "cuda", "arch": arch})
    except UnknownDeviceError as err:
        raise CutlassCodegenError(f"no device description for {arch}: {err}") from err


def ranked_configs(wl, arch: str, device: DeviceSpec, database: Database | None) -> list[tuple[KernelConfig, bool]]:
    """Configurations of ``wl`` for ``arch`` best first, each with whether it was measured: the
    measured ones on ``device`` (fastest first), then the rest as the analytic cost model prices
    them (a back-to-back pair: its register-file variants first)."""
    measured = best_configs(database, wl, device.name, arch)
    out = [(cfg, True) for cfg, _ in measured]
    seen = {cfg for cfg, _ in out}
    rest = b2b_candidates(wl) if wl.kind in FUSED_KINDS else ranked_by_price(wl, arch, device)
    out += [(cfg, False) for cfg in rest if cfg not in seen]
    if not out:
        raise CutlassCodegenError(f"no CUTLASS configuration for {wl.key()} on {arch}")
    return out


def choose_config(wl, arch: str, device: DeviceSpec, database: Database | None) -> tuple[KernelConfig, bool]:
    """The fastest configuration measured on ``device`` that builds for ``arch``, else the one the
    analytic cost model prices lowest (a back-to-back pair: its first register-file variant);
    also whether it came from a measurement. Whether CUTLASS accepts the call is
    :func:`~tvm_ext.cutlass.contract.first_accepted`'s question."""
    return ranked_configs(wl, arch, device, database)[0]


def build_static_library(offloads: Sequence[Offload], kernels: Sequence[Kernel], arch: str,
                         out_dir: Path | None = None) -> tvm.runtime.Module:
    """Compile kernels + glue and wrap the merged object as a ``static_library`` module."""
    unique: dict[str, str] = {}
    for k in kernels:
        unique.setdefault(k.entry, k.source)
    objects = compile_many(list(unique.values()), arch)
    glue = compile_glue(emit_glue(offloads, [k.entry for k in kernels], [k.config for k in kernels]))
    digest = hashlib.sha1("|".join(p.name for p in [glue, *objects]).encode()).hexdigest()[:24]
    merged = (out_dir or cache_dir()) / f"lib_{digest}.o"
    if not merged.exists():
        link_relocatable([glue, *objects], merged)
    return tvm.runtime.load_static_library(str(merged), [o.symbol for o in offloads])


def _planned_config(func) -> KernelConfig | None:
    """The configuration of the plan ``func`` carries (None without a plan)."""
    try:
        plan = plan_of(func)
    except PlanError as err:
        raise CutlassCodegenError(f"unreadable plan on a CUTLASS function: {err}") from None
    return None if plan is None else plan.config


def _codegen_setup(options: Mapping | None) -> tuple[str, DeviceSpec, Database | None]:
    """``(arch, device, database)`` of the codegen options."""
    opts = dict(options or {})
    arch = str(opts.get("arch", "sm_80"))
    if arch_number(arch) < 80:
        raise CutlassCodegenError(f"the CUTLASS offload needs sm_80 or newer, got {arch}")
    device = device_for(arch, str(opts["device"]) if opts.get("device") else None)
    db_path = str(opts.get("database", "") or "")
    return arch, device, Database(db_path) if db_path else None


def planned_kernels(funcs: Sequence, options: Mapping | None = None) -> tuple[list[Offload], list[Kernel]]:
    """Workloads and kernels of partitioned functions *before* any check: each plan's
    configuration, else the best-ranked one (:func:`ranked_configs`). What the suite compiles
    and then checks all at once; a build uses :func:`plan_kernels`."""
    arch, device, database = _codegen_setup(options)
    offloads = [workload_from_function(func) for func in funcs]
    kernels = []
    for off, func in zip(offloads, funcs):
        planned = _planned_config(func)
        cfg, measured = (planned, False) if planned is not None else \
            ranked_configs(off.workload, arch, device, database)[0]
        kernels.append(kernel_for(off, cfg, arch, measured))
    return offloads, kernels


def checked_kernels(funcs: Sequence, options: Mapping | None = None
                    ) -> tuple[list[Offload], list[Kernel | None], list[ContractResult]]:
    """Workloads, kernels and contract verdicts of partitioned functions (see :func:`plan_kernels`).

    A function with a plan keeps its configuration; one without gets the best configuration
    (:func:`ranked_configs`) whose call passes the contract check
    (:func:`~tvm_ext.cutlass.contract.first_accepted`), or None when none does. Each verdict is
    the built kernel's, else the first refusal's.
    """
    arch, device, database = _codegen_setup(options)
    offloads = [workload_from_function(func) for func in funcs]
    planned = [_planned_config(func) for func in funcs]
    kernels: list[Kernel | None] = [None if cfg is None else kernel_for(off, cfg, arch)
                                    for off, cfg in zip(offloads, planned)]
    unplanned = [i for i, cfg in enumerate(planned) if cfg is None]
    ranked = [ranked_configs(offloads[i].workload, arch, device, database) for i in unplanned]
    results: list[ContractResult | None] = [None] * len(funcs)
    for i, accepted in zip(unplanned, first_accepted([offloads[i] for i in unplanned], ranked, arch)):
        kernels[i] = accepted.kernel
        if accepted.kernel is None:
            results[i] = accepted.refused[0]
            _LOG.warning("%s: %s", offloads[i].symbol, accepted.reason())
    calls = [(i, ContractCall(offloads[i], k)) for i, k in enumerate(kernels) if k is not None]
    for (i, _), result in zip(calls, check_calls([c for _, c in calls])):  # cached for the accepted
        results[i] = result
    for off, kernel, cfg in zip(offloads, kernels, planned):
        if kernel is not None:
            why = "plan" if cfg is not None else ("database" if kernel.from_database else "heuristic")
            _LOG.info("%s: %s -> %s (%s)", off.symbol, off.composite, kernel.config.name(), why)
    return offloads, kernels, [r for r in results if r is not None]


def plan_kernels(funcs: Sequence, options: Mapping | None = None) -> tuple[list[Offload], list[Kernel]]:
    """Workloads and emitted kernels for partitioned functions, each call checked on the host
    (:func:`checked_kernels`): no refused call reaches a GPU, a shape known here fails here.

    Raises
    ------
    CutlassCodegenError
        A call that no configuration tried (or the planned one) is accepted for.
    """
    offloads, kernels, results = checked_kernels(funcs, options)
    for off, kernel, result in zip(offloads, kernels, results):
        if kernel is None or not result.ok:
            raise CutlassCodegenError(f"{off.symbol} ({off.composite}): the CUTLASS call is refused: {result.line()}")
    return offloads, kernels


def module_kernels(mod: tvm.IRModule, options: Mapping | None = None) -> dict[str, str]:
    """Distinct kernel sources (entry -> CUDA source) of an already partitioned module.

    CI uses it to compile each distinct instance of a model suite once per arch.
    """
    funcs = [f for _, f in mod.functions_items()
             if isinstance(f, tvm.relax.Function) and f.attrs and f.attrs.get("Codegen") == CODEGEN_NAME]
    _, kernels = plan_kernels(funcs, options)
    return {k.entry: k.source for k in kernels}


def codegen(funcs: Sequence, options: Mapping | None = None) -> list[tvm.runtime.Module]:
    """Python entry of the codegen (also callable directly, e.g. from tests)."""
    offloads, kernels = plan_kernels(funcs, options)
    if not offloads:
        return []
    return [build_static_library(offloads, kernels, str(dict(options or {}).get("arch", "sm_80")))]


@tvm_ffi.register_global_func(f"relax.ext.{CODEGEN_NAME}", override=True)
def _relax_ext_codegen(funcs, options, constant_names):  # noqa: ARG001 - signature fixed by RunCodegen
    return codegen(list(funcs), options)
