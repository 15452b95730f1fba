"""TVMScript-heavy TVM modules imported without inspect's per-frame module scan
(``tvm_ext.tir.script_import``): the decorators see the same frames, do no scan of
``sys.modules`` per frame, the intrinsics are registered, and ``inspect`` is left as it was."""
from __future__ import annotations

import contextlib
import inspect
import linecache
import sys

import pytest
import tvm
from tvm import s_tir

from tvm_ext.tir.script_import import CONTEXT_FRAMES, CUDA_TENSOR_INTRINSICS, fast_frame_lookup, import_tensor_intrinsics

#: A prim_func defined by code whose file is a pseudo-name, as the import machinery's frames are.
PSEUDO_FILE_SOURCE = '''
from tvm.script import tirx as T

def define():
    @T.prim_func(s_tir=True)
    def copy(a: T.Buffer((4,), "float32"), b: T.Buffer((4,), "float32")):
        for i in range(4):
            with T.sblock("copy"):
                vi = T.axis.spatial(4, i)
                b[vi] = a[vi]
    return copy

def frames():
    return [(f.filename, f.function, f.code_context) for f in inspect.stack()]
'''


@pytest.fixture()
def pseudo_file():
    name = "<tvm_ext probe>"
    # TVMScript reads the function's source: the line cache holds it, as it does for IPython cells
    linecache.cache[name] = (len(PSEUDO_FILE_SOURCE), None, PSEUDO_FILE_SOURCE.splitlines(True), name)
    namespace: dict = {"inspect": inspect}
    exec(compile(PSEUDO_FILE_SOURCE, name, "exec"), namespace)  # noqa: S102 - fixed source
    yield namespace
    linecache.cache.pop(name, None)


def test_the_decorators_see_the_frames_the_scan_gives(pseudo_file):
    seen = []
    for fast in (False, True):
        with fast_frame_lookup() if fast else contextlib.nullcontext():
            seen.append(pseudo_file["frames"]())
    slow, fast = seen
    assert [f[:2] for f in slow] == [f[:2] for f in fast]
    assert slow[:CONTEXT_FRAMES] == fast[:CONTEXT_FRAMES]      # the parser reads frames[2]'s line
    assert all(f[2] is None for f in fast[CONTEXT_FRAMES:])    # no source read for the rest
    assert any(f[2] is not None for f in slow[CONTEXT_FRAMES:])
    assert [f for f in slow if f[0] == "<tvm_ext probe>"]
    with fast_frame_lookup():
        fast = pseudo_file["define"]()
    tvm.ir.assert_structural_equal(fast, pseudo_file["define"]())


def test_no_scan_of_the_loaded_modules_per_pseudo_file_frame(pseudo_file, monkeypatch):
    calls = [0]
    real = inspect.ismodule

    def counted(obj):
        calls[0] += 1
        return real(obj)

    monkeypatch.setattr(inspect, "ismodule", counted)
    pseudo_file["define"]()
    slow = calls[0]
    calls[0] = 0
    with fast_frame_lookup():
        pseudo_file["define"]()
    assert slow >= len(sys.modules)          # inspect.stack() scanned every loaded module at least once
    assert calls[0] < slow / 10


def test_inspect_is_restored_even_when_the_block_raises():
    original, original_stack = inspect.getmodule, inspect.stack
    with pytest.raises(KeyError), fast_frame_lookup():
        assert inspect.getmodule is not original and inspect.stack is not original_stack
        raise KeyError("inside")
    assert inspect.getmodule is original and inspect.stack is original_stack


def test_the_cuda_tensor_intrinsics_are_registered():
    module = import_tensor_intrinsics()
    assert module.__name__ == CUDA_TENSOR_INTRINSICS and import_tensor_intrinsics() is module
    intrin = s_tir.TensorIntrin.get(module.WMMA_SYNC_16x16x16_f16f16f32_INTRIN)
    assert isinstance(intrin.desc, tvm.tirx.PrimFunc)
