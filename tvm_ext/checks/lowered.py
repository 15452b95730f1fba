"""What the GPU runs for one scheduled PrimFunc: the device kernels TVM's lowering leaves, in launch order.

The TIR pipeline ``"tvm_ext"`` (reduction lowering, ``ThreadSync``, storage rewrite, grid
barriers, launch parameters) runs without code generation; the host function says which device
kernels it launches, in which order, with which buffers.

Example
-------
>>> lowered = lower_device(scheduled, "fused_softmax", tvm.target.Target("tvm_ext/h100"))
>>> [(l.kernel, l.args) for l in lowered]
[('fused_softmax_kernel', ('T_softmax_norm', 'x'))]
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx

from ..tir import PIPELINE_NAME, global_workspaces, is_device_kernel
from .tir_expr import Unemulated


@dataclass(frozen=True)
class DeviceLaunch:
    """One kernel launch of a host function: the device kernel and, per parameter, the name of
    the PrimFunc parameter it receives (or an ``int`` for a scalar argument)."""

    kernel: str
    func: tirx.PrimFunc
    args: tuple


def lowered_module(mod: tvm.IRModule, target: tvm.target.Target, pipeline: str = PIPELINE_NAME) -> tvm.IRModule:
    """``mod``'s PrimFuncs after a TIR pipeline (default ``"tvm_ext"``): host functions and device
    kernels, split as ``tvm.compile`` splits them, no codegen."""
    prims = {gv: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}
    host = target.host if target.host is not None else tvm.target.Target(
        "llvm" if tvm.runtime.enabled("llvm") else "c")
    bound = tirx.transform.BindTarget(target.with_host(host))(tvm.IRModule(prims))
    passes, _, _ = tvm.tirx.get_tir_pipeline(pipeline)
    with target:
        return passes(bound)


def device_kernels(mod: tvm.IRModule, target: tvm.target.Target) -> dict[str, tirx.PrimFunc]:
    """The device kernels of ``mod`` lowered for ``target``, by name."""
    return {gv.name_hint: f for gv, f in lowered_module(mod, target).functions_items() if is_device_kernel(f)}


def _buffer_name(expr) -> str | None:
    found: list[str] = []

    def on_call(c) -> None:
        if isinstance(c.op, tvm.ir.Op) and c.op.name == "tirx.buffer_data" and not found:
            found.append(c.args[0].name)

    if isinstance(expr, tvm.ir.Var):
        return expr.name
    tvm_ffi.structural_walk(expr, (tvm.ir.Call, on_call))
    return found[0] if found else None


def distinct_parameters(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with a distinct name for every parameter, so that a launch's arguments (named by
    parameter) say which buffer they are. Relax's legalization can give several parameters one
    name (``split``'s 32 outputs are all ``T_split``; TVMScript prints them ``T_split_1``...):
    those go through TVMScript and back, which names them as printed; the function is the same
    but for the names.

    Raises
    ------
    Unemulated
        The names still collide after the round trip.
    """
    names = [p.name for p in func.params]
    if len(set(names)) == len(names):
        return func
    parsed = tvm.script.from_source(func.script())
    parsed = parsed if isinstance(parsed, tirx.PrimFunc) else parsed["main"]
    renamed = [p.name for p in parsed.params]
    if len(set(renamed)) != len(renamed):
        raise Unemulated(f"parameters share names even as TVMScript prints them: {sorted(renamed)}")
    tvm.ir.assert_structural_equal(parsed, func)
    return parsed


def _param_name(name: str, params: set[str]) -> str:
    while name not in params:
        stripped = re.sub(r"_\d+$", "", name)
        if stripped == name:
            raise Unemulated(f"a kernel argument '{name}' is neither a parameter nor a global "
                             "intermediate of the function")
        name = stripped
    return name


def lower_device(func: tirx.PrimFunc, name: str, target: tvm.target.Target,
                 pipeline: str = PIPELINE_NAME) -> list[DeviceLaunch]:
    """The device launches of ``func`` (scheduled, static shapes) in the order its host code runs
    them, lowered by the TIR ``pipeline`` the build uses.

    A pointer argument is named by the parameter, or the global intermediate the host function
    allocates between launches (:func:`~tvm_ext.tir.global_workspaces`), whose data it is
    (parameters sharing a name are named as :func:`distinct_parameters` renames them).

    Raises
    ------
    Unemulated
        A launch passes something other than a parameter's or a global intermediate's data or a constant.
    """
    func = distinct_parameters(func)
    lowered = lowered_module(tvm.IRModule({name: func.with_attr("global_symbol", name)}), target, pipeline)
    kernels = {gv.name_hint: f for gv, f in lowered.functions_items() if is_device_kernel(f)}
    params = {p.name for p in func.params} | {b.name for b in global_workspaces(func)}
    launches: list[DeviceLaunch] = []

    def on_call(c) -> None:
        if not (isinstance(c.op, tvm.ir.Op) and c.op.name == "tirx.call_ffi_kernel"):
            return
        kernel = str(c.args[0].value)
        device = kernels[kernel]
        args = []
        for param, arg in zip(device.params, list(c.args)[1:]):
            if str(param.ty).startswith("T.handle") or "handle" in str(param.ty):
                buffer = _buffer_name(arg)
                if buffer is None:
                    raise Unemulated(f"kernel {kernel} receives a pointer that is no parameter's data: {arg}")
                args.append(_param_name(buffer, params))
            elif isinstance(arg, tirx.IntImm):
                args.append(int(arg.value))
            else:
                raise Unemulated(f"kernel {kernel} receives a scalar computed at run time: {arg}")
        launches.append(DeviceLaunch(kernel, device, tuple(args)))

    for gv, f in lowered.functions_items():
        if not is_device_kernel(f):
            tvm_ffi.structural_walk(f.body, (tvm.ir.Call, on_call))
    return launches


__all__ = ["DeviceLaunch", "device_kernels", "distinct_parameters", "lower_device", "lowered_module"]
