"""The import blob of an exported library, with CUDA device code compiled at export time.

``export_library`` links the host code and a blob, ``__tvm_ffi__library_bin``, holding the
serialized modules the host imports (the import tree, then one record per module: its kind,
then ``SaveToBytes`` of the module, or ``_lib`` for code linked into the library). A CUDA
module's record is ``[format][function table][code]``. On a host without the NVIDIA driver
TVM's CUDA code generator keeps the *source* there (format ``cuda``, a
``CUDAFallbackModule``), and the GPU machine would compile it every time it loads the file.

:func:`write_compiled_blob` packs the same blob with every CUDA source record replaced by a
record whose code is the fatbin nvcc built from that source
(:func:`~tvm_ext.toolchain.kernel_check.compile_cuda_source`: SASS for the arch plus PTX),
labelled ``cubin`` as TVM labels every binary its CUDA module compiles (the driver's
``cuModuleLoadData`` takes cubins and fatbins alike). That is byte for byte what TVM's real
CUDA module saves after compiling the source itself with the same nvcc flags,
so the GPU machine's loader (``ffi.Module.load_from_bytes.cuda``) takes it as it is. The blob
goes into the library through an assembler file (``.incbin``), which builds in no time even
for fatbins of hundreds of MB.
"""
from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import KernelCompileError

#: Symbol the TVM loader looks up in a library (``tvm_ffi`` ``library_module``).
LIBRARY_BIN = "__tvm_ffi__library_bin"
#: Format names of a CUDA record: source and compiled.
SOURCE_FORMAT = "cuda"
COMPILED_FORMAT = "cubin"
_U64 = struct.Struct("<Q")


def _string(data: bytes) -> bytes:
    return _U64.pack(len(data)) + data


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.pos = data, 0

    def u64(self) -> int:
        if self.pos + 8 > len(self.data):
            raise KernelCompileError("truncated import blob")
        (value,) = _U64.unpack_from(self.data, self.pos)
        self.pos += 8
        return value

    def string(self) -> bytes:
        size = self.u64()
        if self.pos + size > len(self.data):
            raise KernelCompileError("truncated import blob")
        out = self.data[self.pos:self.pos + size]
        self.pos += size
        return out


@dataclass
class ImportBlob:
    """A parsed ``__tvm_ffi__library_bin``: the import tree and one (kind, payload) per module."""

    row_ptr: list[int]
    child_indices: list[int]
    modules: list[tuple[str, bytes | None]] = field(default_factory=list)

    @classmethod
    def parse(cls, blob: bytes) -> "ImportBlob":
        """Parse a blob (with its leading byte count).

        Raises
        ------
        KernelCompileError
            The bytes are not a blob of this layout.
        """
        reader = _Reader(blob)
        if reader.u64() != len(blob) - 8:
            raise KernelCompileError("import blob: its byte count does not match its size")
        row_ptr = [reader.u64() for _ in range(reader.u64())]
        children = [reader.u64() for _ in range(reader.u64())]
        modules: list[tuple[str, bytes | None]] = []
        while reader.pos < len(blob):
            kind = reader.string().decode()
            modules.append((kind, None if kind == "_lib" else reader.string()))
        return cls(row_ptr, children, modules)

    def to_bytes(self) -> bytes:
        """The blob again (with its leading byte count)."""
        body = [_U64.pack(len(self.row_ptr)), *map(_U64.pack, self.row_ptr),
                _U64.pack(len(self.child_indices)), *map(_U64.pack, self.child_indices)]
        for kind, payload in self.modules:
            body.append(_string(kind.encode()))
            if payload is not None:
                body.append(_string(payload))
        data = b"".join(body)
        return _U64.pack(len(data)) + data


def cuda_record_format(payload: bytes) -> str:
    """The format of a CUDA module record (``cuda`` for source, ``fatbin``, ``cubin``, ``ptx``)."""
    return _Reader(payload).string().decode()


def _compiled_record(payload: bytes, sources: list[str], compile_source: Callable[[str], bytes]) -> bytes:
    reader = _Reader(payload)
    reader.string()  # the format
    for source in sources:
        code = source.encode()
        tail = _string(code)
        if payload.endswith(tail) and len(payload) - len(tail) >= reader.pos:
            function_table = payload[reader.pos:len(payload) - len(tail)]
            return _string(COMPILED_FORMAT.encode()) + function_table + _string(compile_source(source))
    raise KernelCompileError("a CUDA source record of the import blob matches no CUDA module of the executable")


def compile_blob(blob: bytes, sources: list[str], compile_source: Callable[[str], bytes]) -> tuple[bytes, int]:
    """``blob`` with each CUDA source record compiled; returns the blob and how many were compiled.

    ``sources`` are the CUDA sources of the modules in the import tree (to find where each
    record's code starts); ``compile_source`` turns one into a fatbin.
    """
    parsed = ImportBlob.parse(blob)
    compiled = 0
    for i, (kind, payload) in enumerate(parsed.modules):
        if kind == "cuda" and payload is not None and cuda_record_format(payload) == SOURCE_FORMAT:
            parsed.modules[i] = (kind, _compiled_record(payload, sources, compile_source))
            compiled += 1
    return parsed.to_bytes(), compiled


def write_assembly(blob: bytes, directory: str | Path, symbol_prefix: str = "") -> Path:
    """Write ``blob`` as ``devc.bin`` and an assembler file defining the exported blob symbol."""
    directory = Path(directory)
    data = directory / f"{symbol_prefix}devc.bin"
    data.write_bytes(blob)
    symbol = f"{symbol_prefix}{LIBRARY_BIN}"
    asm = directory / f"{symbol_prefix}devc.S"
    asm.write_text("\n".join([
        "/* Modules imported by the host code (see tvm_ext.toolchain.library_bin). */",
        '\t.section .rodata,"a",@progbits',
        f"\t.globl {symbol}",
        f"\t.type {symbol}, @object",
        "\t.p2align 4",
        f"{symbol}:",
        f'\t.incbin "{data}"',
        f"\t.size {symbol}, {len(blob)}",
        '\t.section .note.GNU-stack,"",@progbits',
        ""]))
    return asm


__all__ = ["LIBRARY_BIN", "SOURCE_FORMAT", "COMPILED_FORMAT", "ImportBlob", "cuda_record_format", "compile_blob",
           "write_assembly"]
