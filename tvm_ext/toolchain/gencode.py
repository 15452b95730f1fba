"""nvcc ``-gencode`` flags: which GPUs a compiled binary runs on (one builder for the package).

For archs ``sm_80 sm_90`` the binary holds SASS (machine code) for each listed arch, plus the
PTX of the newest one. A driver JIT-compiles that PTX on a GPU newer than every listed arch,
so the binary still loads there (forward compatibility); without PTX it fails with "no
kernel image is available". PTX costs little: nvcc produces it on the way to SASS anyway.

Names are ``sm_<major><minor>`` with an optional suffix: ``a`` (arch-specific features such as
Hopper's wgmma: ``sm_90a``) or ``f`` (family-specific). PTX keeps the suffix, because code that
uses those features does not compile to plain ``compute_90``; such PTX only loads on that arch
(``a``) or family (``f``), so forward compatibility holds for suffix-free names only.
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from ..errors import KernelCompileError

_ARCH = re.compile(r"sm_(\d+)([af]?)")


def _parse(arch: str) -> tuple[int, str]:
    match = _ARCH.fullmatch(arch)
    if match is None:
        raise KernelCompileError(f"cannot compile for CUDA arch {arch!r} (expected a name like sm_80 or sm_90a)")
    return int(match.group(1)), match.group(2)


def gencode_flags(archs: str | Sequence[str]) -> list[str]:
    """nvcc flags for SASS of every arch in ``archs`` plus PTX of the newest.

    Parameters
    ----------
    archs : str or sequence of str
        One arch (``"sm_90a"``) or several (``["sm_80", "sm_90"]``); duplicates are dropped.

    Returns
    -------
    list of str
        ``["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=[sm_90,compute_90]"]``.

    Raises
    ------
    KernelCompileError
        A name is not of the form ``sm_<digits>`` with an optional ``a``/``f`` suffix, or none is given.
    """
    names = [archs] if isinstance(archs, str) else list(archs)
    parsed = sorted({_parse(a) for a in names})
    if not parsed:
        raise KernelCompileError("no CUDA arch to compile for")
    flags: list[str] = []
    for i, (num, suffix) in enumerate(parsed):
        sm = f"{num}{suffix}"
        code = f"[sm_{sm},compute_{sm}]" if i == len(parsed) - 1 else f"sm_{sm}"
        flags += ["-gencode", f"arch=compute_{sm},code={code}"]
    return flags
