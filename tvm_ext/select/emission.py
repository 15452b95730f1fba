"""Emit a selection: every chosen candidate becomes a function that carries its plan.

* a TIR candidate of several nodes -> one ``Primitive`` Relax function with the plan attributes
  (``FuseTIRKeepPlans`` makes it a PrimFunc and keeps them);
* a TIR candidate of one node -> its PrimFunc carries the plan (when two call sites of one
  PrimFunc got different plans, the second gets a copy of the PrimFunc under a new name);
* a library candidate -> the call of the function its generator emits (a ``Codegen`` function
  carrying the plan), recorded in the module attribute
  :data:`~tvm_ext.select.attrs.LIBRARY_KERNELS_ATTR` under its external symbol.

A candidate that recomputes nodes gets its own copy of their bindings first
(:func:`~tvm_ext.select.recompute.copy_recomputed`).

Example
-------
>>> mod = emit_selection(ctx, selection.chosen)
"""
from __future__ import annotations

import json
from typing import Sequence

import tvm
from tvm import relax

from ..ir_update import with_functions
from .attrs import GENERATOR_ATTR, LIBRARY_KERNELS_ATTR, PLAN_ATTR
from .candidate import Candidate
from .context import SelectionContext
from .emit import Maker, call_bindings, emit_groups
from .generator import get_generator
from .measured import kernel_description
from .plan import plan_to_text
from .recompute import copy_recomputed

def _retarget_call(func: relax.Function, site: tuple[int, int], new_gvar: tvm.ir.GlobalVar) -> relax.Function:
    """``func`` with the ``call_tir`` at ``site`` calling ``new_gvar`` instead."""
    blocks = list(func.body.blocks)
    bi, ki = site
    bindings = list(blocks[bi].bindings)
    binding = bindings[ki]
    call = binding.value
    bindings[ki] = relax.VarBinding(binding.var, relax.Call(call.op, [new_gvar, *call.args[1:]], call.attrs,
                                                            call.ty_args))
    blocks[bi] = relax.DataflowBlock(bindings) if isinstance(blocks[bi], relax.DataflowBlock) \
        else relax.BindingBlock(bindings)
    return relax.Function(list(func.params), relax.SeqExpr(blocks, func.body.body), func.ret_ty, func.is_pure,
                          func.attrs)


def _attach_single_plans(mod: tvm.IRModule, func_name: str, ctx: SelectionContext,
                         singles: Sequence[Candidate]) -> tvm.IRModule:
    """Put each single-node plan on its PrimFunc; copy the PrimFunc where call sites disagree."""
    func = mod[func_name]
    sites = call_bindings(func)
    given: dict[str, str] = {}
    bb = relax.BlockBuilder(mod)
    changed = False
    for cand in singles:
        node = ctx.graph.nodes[cand.nodes[0]]
        text = plan_to_text(cand.plan)
        name = node.func_name
        if given.get(name, text) == text:
            given[name] = text
            continue
        copy_name = f"{name}_{cand.generator}"
        k = 1
        while copy_name in given and given[copy_name] != text:
            copy_name = f"{name}_{cand.generator}{k}"
            k += 1
        if copy_name not in given:
            gvar = bb.add_func(mod[name], copy_name)
            copy_name = gvar.name_hint
            given[copy_name] = text
        new_gvar = bb.get().get_global_var(copy_name)
        func = _retarget_call(func, sites[cand.nodes[0]], new_gvar)
        changed = True
    out = bb.get()
    updates = {out.get_global_var(func_name): func} if changed else {}
    for name, text in given.items():
        gvar = out.get_global_var(name)
        generator = json.loads(text)["generator"]
        updates[gvar] = out[gvar].with_attr(PLAN_ATTR, text).with_attr(GENERATOR_ATTR, generator)
    return with_functions(out, updates)   # never the caller's module: bb.get() is mod until a function is added


def add_library_function(bb: relax.BlockBuilder, function: relax.Function) -> tvm.ir.GlobalVar:
    """Add a library (``Codegen``) function under its ``global_symbol``; when another function
    already has that name (candidates from separate partitions of one function are named alike),
    the new one gets a fresh name and its ``global_symbol`` follows, since the library exports
    each function under its ``global_symbol``."""
    gvar = bb.add_func(function, str(function.attrs["global_symbol"]))
    if str(bb.get()[gvar].attrs["global_symbol"]) != gvar.name_hint:
        bb.update_func(gvar, function.with_attr("global_symbol", gvar.name_hint))
    return gvar


def _library_maker(cand: Candidate, ctx: SelectionContext, records: dict) -> Maker:
    generator = get_generator(cand.generator)

    def make(bb: relax.BlockBuilder, members: list, escaping: list) -> tuple:
        function, args = generator.library_call(cand, ctx)
        gvar = add_library_function(bb, function)
        symbol = gvar.name_hint
        records[symbol] = {"generator": cand.generator, "plan": plan_to_text(cand.plan),
                           "launches_per_call": int(cand.launch.kernels), "flops": int(cand.flops),
                           "global_bytes": int(cand.global_bytes), "key": cand.key,
                           "record_dtype": cand.database_dtype, "kernel": json.dumps(kernel_description(cand))}
        return gvar, args

    return make


def emit_selection(ctx: SelectionContext, chosen: Sequence[Candidate]) -> tvm.IRModule:
    """The module of ``ctx`` with ``chosen`` emitted (see the module docstring)."""
    singles = [c for c in chosen if len(c.nodes) == 1 and get_generator(c.generator).kernel_kind == "tir"]
    mod = _attach_single_plans(ctx.mod, ctx.func_name, ctx, singles) if singles else ctx.mod
    mod, members = copy_recomputed(mod, ctx, chosen)
    groups, attrs, makers = [], [], []
    records: dict[str, dict] = {}
    for cand, nodes in zip(chosen, members):
        kind = get_generator(cand.generator).kernel_kind
        if kind == "library":
            groups.append(nodes)
            attrs.append({})
            makers.append(_library_maker(cand, ctx, records))
        elif len(cand.nodes) > 1:
            groups.append(nodes)
            attrs.append({PLAN_ATTR: plan_to_text(cand.plan), GENERATOR_ATTR: cand.generator})
            makers.append(None)
    if groups:
        mod, _ = emit_groups(mod, groups, func_name=ctx.func_name, attrs=attrs, makers=makers)
    if records:
        known = {}
        if mod.attrs is not None and LIBRARY_KERNELS_ATTR in mod.attrs:
            known = {str(k): dict(v) for k, v in mod.attrs[LIBRARY_KERNELS_ATTR].items()}
        mod = mod.with_attr(LIBRARY_KERNELS_ATTR, {**known, **records})
    return mod


__all__ = ["emit_selection"]
