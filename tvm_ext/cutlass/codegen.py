"""The BYOC codegen ``relax.ext.tvm_ext_cutlass`` run by ``relax.transform.RunCodegen``.

For the functions it receives it: reads each workload, picks a kernel configuration (database
record for (workload, dtype, arch), else the heuristic default), emits one CUDA translation
unit per distinct instance (cutlass_library) and one host glue unit with the TVM-FFI functions,
compiles them (nvcc / g++, in parallel, cached), merges the objects with ``ld -r`` and returns
a ``static_library`` module so ``export_library`` carries the code into the final ``.so``.

Options (``RunCodegen(target_options={"tvm_ext_cutlass": {...}})``): ``arch`` (``"sm_80"``,
``"sm_90a"``, ...; default ``"sm_80"``), ``device`` (device name for the heuristic), and
``database`` (path of a JSON-lines database; empty for none).
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
from ..hardware import DeviceSpec, load_device
from .b2b import B2bGemmWorkload
from .b2b_conv import B2bConv2dWorkload
from .candidates import arch_number, heuristic_config
from .config import API_3X, KernelConfig
from .database import Database, dtype_key
from .emit_b2b import b2b_candidates, emit_b2b_conv2d, emit_b2b_gemm
from .emit_conv import emit_conv2d
from .emit_gemm import emit_gemm
from .errors import CutlassCodegenError
from .nvcc import cache_dir, compile_many, link_relocatable
from .patterns import CODEGEN_NAME
from .wrapper import compile_glue, emit_glue
from .workload import Conv2dWorkload, Offload, workload_from_function

_LOG = logging.getLogger(__name__)
_ARCH_DEVICE = {80: "a100", 86: "rtx3090", 90: "h100"}


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
    """The device description used by the heuristic (named device, else one per arch)."""
    if device:
        return load_device(device)
    num = arch_number(arch)
    name = _ARCH_DEVICE.get(num) or _ARCH_DEVICE[max(a for a in _ARCH_DEVICE if a <= num)]
    try:
        return load_device(name)
    except UnknownDeviceError as err:
        raise CutlassCodegenError(f"no device description for {arch}: {err}") from err


def choose_config(off: Offload, arch: str, device: DeviceSpec, database: Database | None) -> tuple[KernelConfig, bool]:
    """Database record if present (and valid for this arch), else the heuristic default."""
    wl = off.workload
    if database is not None:
        rec = database.lookup(wl.key(), dtype_key(wl.dtype, wl.final_dtype), arch)
        if rec is not None:
            return rec.config, True
    if isinstance(wl, (B2bGemmWorkload, B2bConv2dWorkload)):  # fused only with a record; else the first RF variant
        cands = b2b_candidates(wl)
        if not cands:
            raise CutlassCodegenError(f"no back-to-back configuration for {wl.key()}")
        return cands[0], False
    return heuristic_config(wl, arch, device), False


def instance_key(wl, cfg: KernelConfig) -> str:
    """Shape-free identity of the compiled instance of ``wl`` with ``cfg``.

    Everything that is a template parameter, nothing that is a runtime argument: operator kind,
    dtypes, B layout, epilogue, tile configuration (threadblock, warps, instruction, stages,
    swizzle, alignment, 3.x cluster and schedule), the conv stride support and the kernel arch
    (``sm80`` for 2.x kernels, also when built for sm_90a; ``sm90`` for 3.x). Problem sizes,
    batch count and split-K slices are runtime arguments of the launcher.
    """
    tile = dataclasses.replace(cfg, split_k=1).name().replace("_k1_", "_")
    if isinstance(wl, (B2bGemmWorkload, B2bConv2dWorkload)):  # N0 and N1 are threadblock N of the two GEMMs
        return f"{wl.kind}|{wl.dtype}|bias_relu,bias_{wl.activation1}|{tile}|sm80"
    kernel_arch = 90 if cfg.api == API_3X else 80
    ep = wl.epilogue.suffix.strip("_") or "plain"
    if isinstance(wl, Conv2dWorkload):
        stride = "unit" if wl.stride == (1, 1) else "strided"
        return f"conv2d_fprop|{wl.dtype}->{wl.final_dtype}|nhwc|{ep}|stride={stride}|{tile}|sm{kernel_arch}"
    return (f"gemm|{wl.dtype}->{wl.out_dtype}->{wl.final_dtype}|a=row,b={wl.layout_b}|{ep}|{tile}"
            f"|sm{kernel_arch}")


def kernel_for(off: Offload, cfg: KernelConfig, arch: str, from_db: bool = False) -> Kernel:
    """Emit the instance source for one offload (entry name = hash of :func:`instance_key`)."""
    wl = off.workload
    key = instance_key(wl, cfg)
    entry = "tvm_ext_cutlass_" + hashlib.sha1(key.encode()).hexdigest()[:16]
    if isinstance(wl, B2bGemmWorkload):
        source = emit_b2b_gemm(wl, cfg, entry)
    elif isinstance(wl, B2bConv2dWorkload):
        source = emit_b2b_conv2d(wl, cfg, entry)
    elif isinstance(wl, Conv2dWorkload):
        source = emit_conv2d(wl, cfg, entry)
    else:
        source = emit_gemm(wl, cfg, 90 if cfg.api == API_3X else 80, entry)
    return Kernel(entry, cfg, source, from_db, key)


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
        cfg, from_db = choose_config(off, arch, device, database)
        _LOG.info("%s: %s -> %s (%s)", off.symbol, off.composite, cfg.name(), "database" if from_db else "heuristic")
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
