"""Whether TVM lowers a scheduled kernel: lower and generate code for one function alone.

Generators that build their own schedules check their kernels with it (the schedule stage for
every kernel of a generator with ``verify_lowering``; the subprogram generator when it designs a
merged kernel), so a kernel TVM's lowering rejects is refused, not a failed build.

Example
-------
>>> lowering_problem(scheduled, "fused_softmax", target) is None
True
"""
from __future__ import annotations

import re

import tvm
from tvm import tirx

from ..errors import TVM_ERRORS
from ..toolchain.cuda_source import global_kernel_names, kernel_source
from ..tir.launch_params import PIPELINE_NAME

_SHARED = re.compile(r"__shared__\s+(?:alignas\(\d+\)\s+)?(\w+)\s+\w+\[(\d+)\];")
_BYTES = {"half": 2, "__half": 2, "nv_bfloat16": 2, "__nv_bfloat16": 2, "float": 4, "int": 4, "uint": 4,
          "double": 8, "int64_t": 8, "uint64_t": 8, "char": 1, "uchar": 1, "int8_t": 1, "uint8_t": 1,
          "short": 2, "ushort": 2, "bool": 1}


def static_shared_bytes(cuda_source: str) -> list[int]:
    """Bytes of static ``__shared__`` arrays of each kernel defined in ``cuda_source``."""
    return [sum(_BYTES.get(t, 4) * int(n) for t, n in _SHARED.findall(kernel_source(cuda_source, name)))
            for name in global_kernel_names(cuda_source)]


def lowering_problem(func: tirx.PrimFunc, name: str, target: tvm.target.Target) -> str | None:
    """Lower and generate code for ``func`` alone; the last error line, or None if it builds.

    A CUDA kernel whose static shared memory exceeds the target's ``max_shared_memory_per_block``
    (which only ptxas would reject, at export) is a problem too: TVM's buffer compaction cannot
    shrink a shared buffer whose accessed region it cannot prove smaller.
    """
    try:
        with target:
            built = tvm.tirx.build(tvm.IRModule({name: func.with_attr("global_symbol", name)}), target=target,
                                   pipeline=PIPELINE_NAME)
    except TVM_ERRORS as err:  # the lowering rejects the function
        text = str(err).strip()
        return text.splitlines()[-1][:300] if text else type(err).__name__
    limit = target.attrs.get("max_shared_memory_per_block") if target.kind.name == "cuda" else None
    if limit is not None and built.imports:
        used = max(static_shared_bytes(built.imports[0].inspect_source()), default=0)
        if used > int(limit):
            return f"{used} B of static shared memory exceed the target's {int(limit)} B per block"
    return None


__all__ = ["lowering_problem", "static_shared_bytes"]
