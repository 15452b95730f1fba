"""Reading generated CUDA source: the ``__global__`` kernels it defines and each one's text.

Example
-------
>>> global_kernel_names(source)
['fused_softmax_kernel']
>>> kernel_source(source, "fused_softmax_kernel").startswith('extern "C" __global__')
True
"""
from __future__ import annotations

import re

_GLOBAL_DEF = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\s*\([^)]*\)\s*)?(\w+)\s*\(")


def global_kernel_names(source: str) -> list[str]:
    """Distinct ``__global__`` function names of a CUDA source, in order of appearance."""
    return list(dict.fromkeys(_GLOBAL_DEF.findall(source)))


def kernel_source(source: str, name: str) -> str:
    """The definition of the ``__global__`` function ``name`` in a CUDA source (signature and body).

    Raises
    ------
    KeyError
        No definition of ``name`` in ``source``.
    """
    for match in _GLOBAL_DEF.finditer(source):
        if match.group(1) != name:
            continue
        head = source.rfind("\n", 0, match.start()) + 1
        brace = source.find("{", match.end())
        semicolon = source.find(";", match.end())
        if brace < 0 or 0 <= semicolon < brace:
            continue  # a declaration, not the definition
        depth = 0
        for pos in range(brace, len(source)):
            depth += {"{": 1, "}": -1}.get(source[pos], 0)
            if depth == 0:
                return source[head:pos + 1]
    raise KeyError(f"no definition of __global__ function '{name}' in the CUDA source")


__all__ = ["global_kernel_names", "kernel_source"]
