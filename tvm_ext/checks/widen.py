"""A half-precision PrimFunc computed in float32: the reference a half-precision kernel is checked against.

The package's tolerance policy compares float16 results with a float32 reference
(:mod:`tvm_ext.testing.tolerance`): two float16 computations of one long reduction in different
orders (a GPU's tree allreduce, the reference's loop) each carry their own rounding and can
differ by more than the float16 tolerance where neither is wrong. :func:`widened` rewrites an
unscheduled function so that every float16 / bfloat16 buffer, variable, constant, cast and
operation is float32; its inputs are the same values, upcast exactly.

Example
-------
>>> ref32 = widened(fused_func)
>>> [str(p.ty.dtype) for p in ref32.params]
['float32', 'float32']
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

_HALF = ("float16", "bfloat16")
_REBUILT = ("Add", "Sub", "Mul", "Div", "Mod", "FloorDiv", "FloorMod", "Min", "Max", "EQ", "NE", "LT", "LE",
            "GT", "GE", "And", "Or")


def _wide(dtype) -> str:
    text = str(dtype)
    for half in _HALF:
        if text == half or text.startswith(half + "x"):
            return "float32" + text[len(half):]
    return text


def widened(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every half-precision type made float32 (module docstring)."""
    swap: dict = {}

    def new_buffer(buf):
        return tirx.decl_buffer(buf.ty.shape, _wide(buf.ty.dtype), buf.name, scope=str(buf.ty.storage_scope or "global"))

    def on_block(block) -> None:
        for buf in block.alloc_buffers:
            if _wide(buf.ty.dtype) != str(buf.ty.dtype):
                swap[buf] = new_buffer(buf)

    tvm_ffi.structural_walk(func.body, (tvm.s_tir.SBlock, on_block))
    params = []
    for p in func.params:
        if hasattr(p.ty, "storage_scope") and _wide(p.ty.dtype) != str(p.ty.dtype):
            swap[p] = new_buffer(p)
        params.append(swap.get(p, p))

    def on_var(var, mutator):
        found = swap.get(var)
        if found is not None:
            return found
        ty = getattr(var, "ty", None)
        if isinstance(ty, tvm.ir.PrimType) and _wide(ty.dtype) != str(ty.dtype):
            found = swap[var] = tirx.Var(var.name, _wide(ty.dtype))
            return found
        return var

    def on_float(imm, mutator):
        return tirx.FloatImm(_wide(imm.ty.dtype), imm.value) if str(imm.ty.dtype) in _HALF else imm

    def on_cast(cast, mutator):
        return tirx.Cast(_wide(cast.ty.dtype), mutator.default_mutate(cast).value)

    def on_binary(node, mutator):
        new = mutator.default_mutate(node)
        return type(node)(new.a, new.b)

    def on_call(call, mutator):
        new = mutator.default_mutate(call)
        if not isinstance(call.ty, tvm.ir.PrimType) or _wide(call.ty.dtype) == str(call.ty.dtype):
            return new
        if not isinstance(call.op, tvm.ir.Op):
            return new
        return tirx.call_intrin(_wide(call.ty.dtype), call.op.name, *new.args)

    def on_load(load, mutator):
        new = mutator.default_mutate(load)
        return tirx.BufferLoad(new.source, list(new.indices))

    def on_select(node, mutator):
        new = mutator.default_mutate(node)
        return tirx.Select(new.condition, new.true_value, new.false_value)

    handlers = [(tvm.ir.Var, on_var), (tirx.FloatImm, on_float), (tirx.Cast, on_cast), (tvm.ir.Call, on_call),
                (tirx.Select, on_select), (tvm.ir.TensorLoad, on_load)] + [(getattr(tirx, name), on_binary) for name in _REBUILT]
    body = tvm_ffi.structural_mutate(func.body, handlers)
    return tirx.PrimFunc(params, body, attrs=func.attrs)


__all__ = ["widened"]
