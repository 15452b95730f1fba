"""The BYOC codegen ``relax.ext.tvm_ext_cutlass`` run by ``relax.transform.RunCodegen``.

For the functions it receives it: reads each workload, takes the kernel configuration of the
plan the function carries (:data:`~tvm_ext.select.attrs.PLAN_ATTR`, set by the cutlass generator
when the candidate was selected; a function partitioned without the spine gets
:func:`choose_config`'s: the fastest measured configuration, else the heuristic default), emits
one CUDA translation unit per distinct instance (cutlass_library) and one host glue unit with the
TVM-FFI functions, compiles them (nvcc / g++, in parallel, cached), merges the objects with
``ld -r`` and returns a ``static_library`` module so ``export_library`` carries the code into
the final ``.so``.

Options (``RunCodegen(target_options={"tvm_ext_cutlass": {...}})``): ``arch`` (``"sm_80"``,
``"sm_90a"``, ...; default ``"sm_80"``), ``device`` (device name, default: the device the target
policy gives for the arch), and ``database`` (path of a JSON-lines database; empty for none).
"""
from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import tvm
import tvm_ffi

from ..errors import UnknownDeviceError
from ..hardware import DeviceSpec, device_from_target, load_device
from ..select.database import Database
from ..select.plan import PlanError, plan_of
from .candidates import arch_number
from .config import API_3X, KernelConfig
from .emit_b2b import b2b_candidates, emit_b2b_conv2d, emit_b2b_gemm
from .emit_conv import emit_conv2d
from .emit_gemm import emit_gemm
from .errors import CutlassCodegenError
from .nvcc import cache_dir, compile_many, link_relocatable
from .patterns import CODEGEN_NAME
from .pricing import cheapest_config
from .records import best_config
from .wrapper import compile_glue, emit_glue
from .workload import Offload, workload_from_function

_LOG = logging.getLogger(__name__)
#: Workload kinds fused only with measurements (their default is the first register-file variant).
FUSED_KINDS = ("b2b_gemm", "b2b_conv2d")
#: kind -> ``emit(workload, config, entry) -> CUDA source`` of the instance.
EMITTERS = {
    "gemm": lambda wl, cfg, entry: emit_gemm(wl, cfg, 90 if cfg.api == API_3X else 80, entry),
    "conv2d": emit_conv2d,
    "b2b_gemm": emit_b2b_gemm,
    "b2b_conv2d": emit_b2b_conv2d,
}


@dataclass(frozen=True)
class Kernel:
    """A chosen instance: C entry point, shape-free instance key, the offload's config, CUDA source.

    ``config`` is the offload's full choice; its runtime part (split-K slices) is not in the
    instance, so offloads with different shapes or split-K share one ``entry`` and ``source``.
    """

    entry: str
    config: KernelConfig
    source: str
    from_database: bool
    key: str = ""


def device_for(arch: str, device: str | None = None) -> DeviceSpec:
    """The device the configuration is chosen for: the named one, else what the target policy
    (:func:`tvm_ext.hardware.device_from_target`) gives for ``arch``."""
    try:
        if device:
            return load_device(device)
        return device_from_target({"kind": "cuda", "arch": arch})
    except UnknownDeviceError as err:
        raise CutlassCodegenError(f"no device description for {arch}: {err}") from err


def choose_config(wl, arch: str, device: DeviceSpec, database: Database | None) -> tuple[KernelConfig, bool]:
    """The fastest configuration measured on ``device`` that builds for ``arch``, else the one the
    analytic cost model prices lowest (a back-to-back pair: its first register-file variant);
    also whether it came from a measurement."""
    measured = best_config(database, wl, device.name, arch)
    if measured is not None:
        return measured[0], True
    if wl.kind in FUSED_KINDS:
        cands = b2b_candidates(wl)
        if not cands:
            raise CutlassCodegenError(f"no back-to-back configuration for {wl.key()}")
        return cands[0], False
    return cheapest_config(wl, arch, device)[0], False


def instance_key(wl, cfg: KernelConfig) -> str:
    """Shape-free identity of the compiled instance of ``wl`` with ``cfg``.

    Everything that is a template parameter, nothing that is a runtime argument: operator kind,
    dtypes, B layout, epilogue, tile configuration (threadblock, warps, instruction, stages,
    swizzle, alignment, 3.x cluster and schedule), the conv stride support and the kernel arch
    (``sm80`` for 2.x kernels, also when built for sm_90a; ``sm90`` for 3.x). Problem sizes,
    batch count and split-K slices are runtime arguments of the launcher.
    """
    tile = dataclasses.replace(cfg, split_k=1).name().replace("_k1_", "_")
    if wl.kind in FUSED_KINDS:  # N0 and N1 are threadblock N of the two GEMMs
        return f"{wl.kind}|{wl.dtype}|bias_relu,bias_{wl.activation1}|{tile}|sm80"
    kernel_arch = 90 if cfg.api == API_3X else 80
    ep = wl.epilogue.suffix.strip("_") or "plain"
    if wl.kind == "conv2d":
        stride = "unit" if wl.stride == (1, 1) else "strided"
        return f"conv2d_fprop|{wl.dtype}->{wl.final_dtype}|nhwc|{ep}|stride={stride}|{tile}|sm{kernel_arch}"
    return (f"gemm|{wl.dtype}->{wl.out_dtype}->{wl.final_dtype}|a=row,b={wl.layout_b}|{ep}|{tile}"
            f"|sm{kernel_arch}")


def kernel_for(off: Offload, cfg: KernelConfig, arch: str, from_db: bool = False) -> Kernel:
    """Emit the instance source for one offload (entry name = hash of :func:`instance_key`)."""
    wl = off.workload
    key = instance_key(wl, cfg)
    entry = "tvm_ext_cutlass_" + hashlib.sha1(key.encode()).hexdigest()[:16]
    return Kernel(entry, cfg, EMITTERS[wl.kind](wl, cfg, entry), from_db, key)


def build_static_library(offloads: Sequence[Offload], kernels: Sequence[Kernel], arch: str,
                         out_dir: Path | None = None) -> tvm.runtime.Module:
    """Compile kernels + glue and wrap the merged object as a ``static_library`` module."""
    unique: dict[str, str] = {}
    for k in kernels:
        unique.setdefault(k.entry, k.source)
    objects = compile_many(list(unique.values()), arch)
    glue = compile_glue(emit_glue(offloads, [k.entry for k in kernels], [k.config.split_k for k in kernels]))
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


def plan_kernels(funcs: Sequence, options: Mapping | None = None) -> tuple[list[Offload], list[Kernel]]:
    """Workloads and emitted kernels for partitioned functions, without compiling anything."""
    opts = dict(options or {})
    arch = str(opts.get("arch", "sm_80"))
    if arch_number(arch) < 80:
        raise CutlassCodegenError(f"the CUTLASS offload needs sm_80 or newer, got {arch}")
    device = device_for(arch, str(opts["device"]) if opts.get("device") else None)
    db_path = str(opts.get("database", "") or "")
    database = Database(db_path) if db_path else None
    offloads, kernels = [], []
    for func in funcs:
        off = workload_from_function(func)
        planned = _planned_config(func)
        if planned is not None:
            cfg, from_db, why = planned, False, "plan"
        else:
            cfg, from_db = choose_config(off.workload, arch, device, database)
            why = "database" if from_db else "heuristic"
        _LOG.info("%s: %s -> %s (%s)", off.symbol, off.composite, cfg.name(), why)
        offloads.append(off)
        kernels.append(kernel_for(off, cfg, arch, from_db))
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
