"""Parsing TVMScript at import time without ``inspect``'s per-frame module scan.

TVMScript's decorators (``T.prim_func``, ``I.ir_module``) call ``inspect.stack()``, which looks
up the module of every frame on the stack. For a frame whose file is a pseudo-name
(``<frozen importlib._bootstrap>``: the import machinery's frames are on the stack through any
import) ``inspect.getmodule`` finds no cached answer and scans every loaded module, about 1,100
after ``import tvm``, on each call. Importing ``tvm.s_tir.tensor_intrin.cuda`` (about 250
decorated functions: TVM's CUDA tensor intrinsics, which dlight's tensor-core matmul and the
tile graph's WMMA stages need) took **60-71 s** on this 2-core machine, 90% of it in that scan;
under :func:`fast_frame_lookup` it takes **5 s** (``python3 -c "import tvm; import
tvm.s_tir.tensor_intrin.cuda"``, timed with and without, 2026-11-28).

``inspect.stack()`` also reads a line of source for every frame, and the parser only looks at the
third one's (``utils.is_defined_in_class``); the rest it reads for their frame objects. Imported
from inside a compile (about 60 frames deep: pass infrastructure, generators), the import took
9.3 s against 5.6 s at the top of a script; so inside the block ``inspect.stack`` reads source
for the first :data:`CONTEXT_FRAMES` frames only (``code_context`` is ``None`` beyond them, and
their file is the code object's).

The lookup answers ``None`` at once for a frame or code object whose file is a ``<...>``
pseudo-name: the answer the scan gives, since a loaded module's file is a path (the scan matches
real files only and then gives up on objects without ``__name__``, as frames and code objects are).

Example
-------
>>> cuda = import_tensor_intrinsics()
>>> cuda.WMMA_SYNC_16x16x16_f16f16f32_INTRIN
'wmma_sync_16x16x16_f16f16f32'
"""
from __future__ import annotations

import contextlib
import dis
import importlib
import inspect
import sys
import threading
from collections.abc import Iterator
from types import ModuleType

#: TVM's CUDA tensor intrinsics (WMMA, ``ldmatrix``/``mma.sync``): registered by importing it.
CUDA_TENSOR_INTRINSICS = "tvm.s_tir.tensor_intrin.cuda"

_LOCK = threading.Lock()

#: Frames of ``inspect.stack()`` that keep their line of source inside :func:`fast_frame_lookup`.
CONTEXT_FRAMES = 3


def _is_pseudo_file(name: str | None) -> bool:
    return bool(name) and name.startswith("<") and name.endswith(">")


@contextlib.contextmanager
def fast_frame_lookup() -> Iterator[None]:
    """Within the block, ``inspect.getmodule`` of a frame or code object from a ``<...>`` file
    returns ``None`` without scanning ``sys.modules``, and ``inspect.stack`` reads source for the
    first :data:`CONTEXT_FRAMES` frames only (see the module docstring). Not re-entrant across
    threads: it swaps both under a lock for the duration."""
    with _LOCK:
        original, original_stack = inspect.getmodule, inspect.stack

        def getmodule(obj, _filename=None):
            if (_is_pseudo_file(_filename) and _filename not in inspect.modulesbyfile
                    and (inspect.isframe(obj) or inspect.iscode(obj))):
                return None
            return original(obj, _filename)

        def stack(context: int = 1) -> list[inspect.FrameInfo]:
            frames: list[inspect.FrameInfo] = []
            frame = sys._getframe(1)
            while frame is not None:
                if len(frames) < CONTEXT_FRAMES:
                    info = inspect.getframeinfo(frame, context)
                    frames.append(inspect.FrameInfo(frame, *info, positions=info.positions))
                else:   # what the frame says of itself: no source file lookup, no source read
                    code, line = frame.f_code, frame.f_lineno
                    frames.append(inspect.FrameInfo(frame, code.co_filename, line, code.co_name, None, None,
                                                    positions=dis.Positions(line, line, None, None)))
                frame = frame.f_back
            return frames

        inspect.getmodule, inspect.stack = getmodule, stack
        try:
            yield
        finally:
            inspect.getmodule, inspect.stack = original, original_stack


def import_tensor_intrinsics(module: str = CUDA_TENSOR_INTRINSICS) -> ModuleType:
    """Import (once per process) a TVMScript-heavy TVM module such as TVM's CUDA tensor
    intrinsics under :func:`fast_frame_lookup`; later imports of it, TVM's own included, are free."""
    if module in sys.modules:
        return sys.modules[module]
    with fast_frame_lookup():
        return importlib.import_module(module)


def register_all_tensor_intrinsics() -> None:
    """Import every tensor-intrinsic module TVM has (what MetaSchedule's builder imports in each
    worker); an ``initializer`` for its ``LocalBuilder`` workers."""
    import_tensor_intrinsics("tvm.s_tir.tensor_intrin")


__all__ = ["CONTEXT_FRAMES", "CUDA_TENSOR_INTRINSICS", "fast_frame_lookup", "import_tensor_intrinsics",
           "register_all_tensor_intrinsics"]
