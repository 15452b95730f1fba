"""What ptxas says each compiled kernel uses: registers, stack, spills, shared memory.

The facts of the kernel as built, which the checks compare with what was planned: a kernel
that spills, or a cooperative kernel whose real registers and shared memory let fewer blocks be
resident than its grid. One nvcc run (``-cubin -Xptxas -v``) for all kernels of a source.

Example
-------
>>> usage = resource_usage(cuda_source, tvm.target.Target("tvm_ext/h100"))
>>> usage["softmax_kernel"].registers, usage["softmax_kernel"].spill_bytes
(19, 0)
"""
from __future__ import annotations

import re
import subprocess
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import tvm

from ..errors import KernelCompileError
from .cuda import cuda_root, nvcc_path, use_toolkit

_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers(?:.*?(\d+) bytes smem)?")


@dataclass(frozen=True)
class KernelUsage:
    """ptxas's resource report of one kernel (bytes per thread for stack and spills, per block for smem)."""

    registers: int
    stack_bytes: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int

    @property
    def spill_bytes(self) -> int:
        """Bytes spilled to local memory per thread (stores)."""
        return self.spill_stores


def parse_ptxas(report: str) -> dict[str, KernelUsage]:
    """Kernels of a ``ptxas -v`` report."""
    out: dict[str, KernelUsage] = {}
    name, frame = None, (0, 0, 0)
    for line in report.splitlines():
        if m := _ENTRY.search(line):
            name, frame = m.group(1), (0, 0, 0)
        elif (m := _FRAME.search(line)) and name is not None:
            frame = tuple(int(g) for g in m.groups())
        elif (m := _USED.search(line)) and name is not None:
            out[name] = KernelUsage(int(m.group(1)), frame[0], frame[1], frame[2], int(m.group(2) or 0))
            name = None
    return out


def resource_usage(source: str, target: tvm.target.Target) -> dict[str, KernelUsage]:
    """ptxas's report for every kernel of CUDA ``source`` compiled for ``target``'s arch.

    Raises
    ------
    KernelCompileError
        No toolkit, no arch on the target, or nvcc rejects the source.
    """
    arch = target.attrs.get("arch")
    if arch is None:
        raise KernelCompileError(f"target {target} has no 'arch'; ptxas needs one")
    root = cuda_root()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "kernels.cu"
        path.write_text(source)
        with use_toolkit(root):
            run = subprocess.run([nvcc_path(), "-cubin", f"-arch={arch}", "-Xptxas", "-v", "-w", "-o",
                                  str(Path(tmp) / "kernels.cubin"), str(path)], capture_output=True, text=True,
                                 check=False)
    if run.returncode != 0:
        raise KernelCompileError(f"nvcc failed for {arch}: {run.stderr.strip()[-300:]}")
    return parse_ptxas(run.stderr)


def compiled_usage(mod: tvm.IRModule, names: Iterable[str], target: tvm.target.Target,
                   pipeline: str) -> dict[str, KernelUsage]:
    """ptxas's report of every device kernel of the scheduled PrimFuncs ``names`` of ``mod``: one
    TIR build with ``pipeline`` (the preset's), one nvcc run.

    Raises
    ------
    KernelCompileError
        As :func:`resource_usage`; TVM's own errors when the TIR build fails.
    """
    funcs = {n: mod[n].with_attr("global_symbol", n) for n in names}
    with target:
        lib = tvm.tirx.build(tvm.IRModule(funcs), target=target, pipeline=pipeline)
    return resource_usage(lib.imports[0].inspect_source(), target)


def function_kernels(usage: Mapping[str, KernelUsage], func: str) -> list[KernelUsage]:
    """The reports of the kernels PrimFunc ``func`` launches (TVM names them ``<func>_kernel``,
    ``<func>_kernel_1``, ...)."""
    own = re.compile(re.escape(func) + r"_kernel(_\d+)?")
    return [u for name, u in usage.items() if own.fullmatch(name)]


__all__ = ["KernelUsage", "compiled_usage", "function_kernels", "parse_ptxas", "resource_usage"]
