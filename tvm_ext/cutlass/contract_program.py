"""Build and run a CUTLASS contract program: the project's own launchers and glue, on the host.

A program checks a batch of library calls (:class:`ContractCall`) and is linked from three parts:

* the **instances**, each emitted CUDA source exactly as the codegen emits it, compiled with
  ``-DTVM_EXT_CUTLASS_CONTRACT`` so that each launcher ends in the contract hook
  (``include/tvm_ext_cutlass/contract.h``) instead of running the operation. No kernel is
  instantiated, so nvcc makes PTX only and one translation unit holds every instance of the
  batch (each in its own namespace): about 20 s for a model's instances on two cores;
* the **glue**, the TVM-FFI functions :func:`~tvm_ext.cutlass.wrapper.emit_glue` writes for the
  calls (renamed ``tvm_ext_contract_call_<i>`` so calls of several models can share a program),
  compiled by the same g++ step as the production glue;
* a **main** (``contract_main.h``) that gives each glue function host tensors of the call's shapes
  and dtypes, filled as :mod:`.contract_data` says, and prints one JSON line per call.

Objects are cached by content like every CUTLASS compile (:mod:`.nvcc`).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import tvm

from ..errors import KernelCompileError
from ..toolchain.cuda import nvcc_path
from .instance import Kernel
from .config import API_3X
from .emit_gemm import ARGS_HEADER
from .errors import CutlassSetupError
from .nvcc import OWN_INCLUDE, cache_dir, compile_object, source_key, tvm_ffi_include
from .workload import ROLE_A, ROLE_B, ROLE_SCALAR, Offload
from .wrapper import INPUT_ROLES, compile_glue, emit_glue

_DL_CODES = {"float16": (2, 16), "bfloat16": (4, 16), "float32": (2, 32)}
_INCLUDE_LINE = re.compile(r"^\s*#\s*include\s*[<\"].*[>\"]\s*$", re.MULTILINE)
#: Seconds a program may run (emulating a few dozen outputs per call takes milliseconds).
RUN_TIMEOUT = 300.0
#: Instances per translation unit of contract objects (2.x; 3.x ones take several GB each).
UNIT_INSTANCES, UNIT_INSTANCES_3X = 12, 3


@dataclass(frozen=True)
class ContractCall:
    """One library call to check: the offload as the Relax VM calls it and the instance it runs.

    ``misalign`` shifts the data of named glue parameters (``p0``.., ``out``) off their 256-byte
    boundary by that many bytes, as a caller's sliced tensor would be.
    """

    offload: Offload
    kernel: Kernel
    misalign: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class ProgramParam:
    """A tensor the main passes: glue parameter name, role, shape, dtype and fill seed (0: poisoned)."""

    name: str
    role: str
    shape: tuple[int, ...]
    dtype: str
    seed: int
    misalign: int = 0

    @property
    def numel(self) -> int:
        out = 1
        for d in self.shape:
            out *= d
        return out

    @property
    def bytes(self) -> int:
        return self.numel * tvm.DataType(self.dtype).bits // 8


def params_of(call: ContractCall) -> list[ProgramParam]:
    """The tensors passed to the call's glue function, in order (the output last)."""
    wl = call.offload.workload
    shift = dict(call.misalign)
    out_dtype = getattr(wl, "out_dtype", wl.final_dtype)
    params = []
    for i, (role, shape) in enumerate(zip(call.offload.roles, call.offload.param_shapes)):
        dtype = wl.dtype if role in (*INPUT_ROLES, ROLE_SCALAR) else out_dtype
        params.append(ProgramParam(f"p{i}", role, tuple(shape), dtype, i + 1, shift.get(f"p{i}", 0)))
    params.append(ProgramParam("out", "out", tuple(call.offload.out_shape), wl.final_dtype, 0, shift.get("out", 0)))
    return params


@lru_cache(maxsize=1)
def headers_digest() -> str:
    """Hash of the contract headers: a changed header invalidates every cached result."""
    texts = [p.read_text() for p in sorted((OWN_INCLUDE / "tvm_ext_cutlass").glob("*.h"))]
    return source_key("\0".join(texts), ["contract-headers"])


def contract_flags(arch: str) -> list[str]:
    """nvcc flags of the instance translation unit: host code only matters, so PTX of ``arch``
    and light host optimisation."""
    sm = arch.replace("sm_", "")
    return ["-std=c++17", "-O1", "-DNDEBUG", "-DTVM_EXT_CUTLASS_CONTRACT", "-DCUTLASS_ENABLE_TENSOR_CORE_MMA=1",
            "--expt-relaxed-constexpr", "-w", "-Xcompiler=-fPIC", "-gencode", f"arch=compute_{sm},code=compute_{sm}",
            f"-I{OWN_INCLUDE}", f"-DTVM_EXT_CONTRACT_HEADERS={headers_digest()}"]


def instance_unit(kernels: Sequence[Kernel]) -> str:
    """One translation unit holding every kernel's source, each in a namespace of its own."""
    includes: list[str] = []
    for kernel in kernels:
        for line in _INCLUDE_LINE.findall(kernel.source):
            if line.strip() not in includes:
                includes.append(line.strip())
    parts = [*includes, '#include "tvm_ext_cutlass/contract.h"', ARGS_HEADER]
    for kernel in kernels:
        parts.append(f"namespace tvm_ext_contract_{kernel.entry} {{\n{kernel.source}\n}}  // namespace")
    return "\n".join(parts) + "\n"


def _call_symbol(index: int) -> str:
    return f"tvm_ext_contract_call_{index}"


def main_unit(calls: Sequence[ContractCall]) -> str:
    """The program's main: a parameter table per call and the call table."""
    lines = ['#include "tvm_ext_cutlass/contract_main.h"']
    rows = []
    for i, call in enumerate(calls):
        symbol = _call_symbol(i)
        lines.append(f'extern "C" int __tvm_ffi_{symbol}(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);')
        params = params_of(call)
        entries = []
        for p in params:
            code, bits = _DL_CODES[p.dtype]
            shape = ", ".join(map(str, p.shape)) or "0"
            entries.append(f'{{"{p.name}", {len(p.shape)}, {{{shape}}}, {code}, {bits}, {p.seed}u, {p.misalign}}}')
        lines.append(f"static const tvm_ext_contract::Param kParams{i}[] = {{{', '.join(entries)}}};")
        rows.append(f'{{"{call.offload.symbol}", __tvm_ffi_{symbol}, kParams{i}, {len(params)}}}')
    lines.append(f"static const tvm_ext_contract::Call kCalls[] = {{{', '.join(rows)}}};")
    lines.append(f"int main() {{ return tvm_ext_contract::run_all(kCalls, {len(calls)}); }}")
    return "\n".join(lines) + "\n"


def _gxx(source: str, tag: str) -> Path:
    """Compile the main with g++ (cached by content)."""
    flags = ["-std=c++17", "-O1", "-fPIC", "-c", f"-I{OWN_INCLUDE}", f"-I{tvm_ffi_include()}"]
    target = cache_dir() / (source_key(source, flags + [tag, headers_digest()]) + ".o")
    if target.exists():
        return target
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        raise CutlassSetupError("a host C++ compiler (g++) is needed for the CUTLASS contract check")
    with tempfile.TemporaryDirectory(prefix="tvm_ext_contract_") as tmp:
        src, out = Path(tmp) / "main.cc", Path(tmp) / "main.o"
        src.write_text(source)
        proc = subprocess.run([cxx, *flags, str(src), "-o", str(out)], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise KernelCompileError(f"g++ failed on the contract program's main:\n{proc.stderr[-4000:]}")
        shutil.copyfile(out, target.with_suffix(".tmp"))
        target.with_suffix(".tmp").replace(target)
    return target


def _link(objects: Sequence[Path]) -> Path:
    """Link the program (nvcc: the CUDA runtime the instances refer to), cached by its parts."""
    import tvm_ffi.libinfo

    lib_dir = Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent
    target = cache_dir() / (source_key("|".join(p.name for p in objects), ["contract-link"]) + ".bin")
    if target.exists():
        return target
    tmp = target.with_suffix(".tmp")
    # an instance lives in one object (instance_objects' index); should two hold it, both are the
    # same source under the same content-hashed name
    cmd = [nvcc_path(), *map(str, objects), "-o", str(tmp), f"-L{lib_dir}", "-ltvm_ffi",
           "-Xlinker", f"-rpath={lib_dir}", "-Xlinker", "--allow-multiple-definition"]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise KernelCompileError(f"linking the contract program failed:\n{(proc.stderr or proc.stdout)[-4000:]}")
    tmp.replace(target)
    return target


def contract_arch(kernel: Kernel) -> str:
    """The arch a kernel's contract object is compiled for. A 2.x instance is the same source on
    every arch (its key says ``sm80``), so one object serves sm_80 and sm_90a builds; a 3.x
    instance needs sm_90a."""
    return "sm_90a" if kernel.config.api == API_3X else "sm_80"


def _index_path() -> Path:
    path = cache_dir() / "contract"
    path.mkdir(parents=True, exist_ok=True)
    return path / "instances.json"


def _object_key(kernel: Kernel) -> str:
    return source_key(kernel.source, contract_flags(contract_arch(kernel)))


def instance_objects(kernels: Sequence[Kernel]) -> list[Path]:
    """Objects holding the contract-mode launchers of ``kernels``.

    Each instance is compiled once: instances not compiled before share new translation units
    (at most :data:`UNIT_INSTANCES` 2.x or :data:`UNIT_INSTANCES_3X` 3.x ones each: header
    parsing dominates, a 3.x instance takes several GB), and an index in the cache maps every
    instance to the object holding it.
    """
    path = _index_path()
    index: dict[str, str] = json.loads(path.read_text()) if path.exists() else {}
    objects, missing = set(), {}
    for kernel in kernels:
        name = index.get(_object_key(kernel))
        if name and (cache_dir() / name).exists():
            objects.add(cache_dir() / name)
        else:
            missing.setdefault(_object_key(kernel), kernel)
    by_arch: dict[str, list[Kernel]] = {}
    for kernel in missing.values():
        by_arch.setdefault(contract_arch(kernel), []).append(kernel)
    for arch, todo in by_arch.items():
        size = UNIT_INSTANCES_3X if arch == "sm_90a" else UNIT_INSTANCES
        for start in range(0, len(todo), size):
            chunk = todo[start:start + size]
            obj = compile_object(instance_unit(chunk), arch, base_flags=contract_flags(arch))
            objects.add(obj)
            index = json.loads(path.read_text()) if path.exists() else {}
            index.update({_object_key(k): obj.name for k in chunk})
            staged = path.with_suffix(f".{os.getpid()}.tmp")
            staged.write_text(json.dumps(index))
            staged.replace(path)
    return sorted(objects)


def build_program(calls: Sequence[ContractCall]) -> Path:
    """Compile and link the contract program of ``calls`` (all parts cached)."""
    instances = instance_objects(list({c.kernel.entry: c.kernel for c in calls}.values()))
    renamed = [dataclasses.replace(c.offload, symbol=_call_symbol(i)) for i, c in enumerate(calls)]
    glue = compile_glue(emit_glue(renamed, [c.kernel.entry for c in calls], [c.kernel.config for c in calls]))
    main = _gxx(main_unit(calls), "contract-main")
    return _link([main, glue, *instances])


def run_program(program: Path, count: int) -> list[dict]:
    """Run a contract program: one JSON object per call, in order.

    Raises
    ------
    KernelCompileError
        The program crashed, timed out or printed fewer lines than it has calls.
    """
    try:
        proc = subprocess.run([str(program)], capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as err:
        raise KernelCompileError(f"the CUTLASS contract program ran past {RUN_TIMEOUT:.0f} s") from err
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or len(lines) != count:
        raise KernelCompileError(f"the CUTLASS contract program failed (exit {proc.returncode}, {len(lines)} of "
                                 f"{count} calls reported): {proc.stderr[-2000:]}")
    return lines


__all__ = ["ContractCall", "ProgramParam", "build_program", "contract_arch", "contract_flags", "headers_digest",
           "instance_objects", "instance_unit", "main_unit", "params_of", "run_program"]
