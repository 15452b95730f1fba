"""Keep the pre-legalization form of every Relax function for the selection that follows.

``LegalizeOps`` replaces each Relax op call by a ``call_tir`` but keeps the binding variables,
so the legalized graph's nodes can be traced back to the Relax calls they came from. Library
generators (CUTLASS) match their patterns on those calls. :class:`RecordOrigin` stores the
functions in the module attribute :data:`ORIGIN_ATTR` just before legalization;
:class:`~tvm_ext.select.select_pass.SelectKernels` reads it and removes it.

Example
-------
>>> mod = RecordOrigin()(mod)
>>> sorted(origin_functions(mod))
['main']
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import relax

ORIGIN_ATTR = "tvm_ext.origin"


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.RecordOrigin")
class RecordOrigin:
    """Store every Relax function (by name) in the module attribute :data:`ORIGIN_ATTR`."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        funcs = {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, relax.Function)}
        return mod.with_attr(ORIGIN_ATTR, funcs)


def origin_functions(mod: tvm.IRModule) -> dict[str, relax.Function]:
    """The recorded pre-legalization functions (empty when none were recorded)."""
    if mod.attrs is None or ORIGIN_ATTR not in mod.attrs:
        return {}
    return {str(k): v for k, v in mod.attrs[ORIGIN_ATTR].items()}


def without_origin(mod: tvm.IRModule) -> tvm.IRModule:
    """``mod`` without the recorded functions (they must not reach code generation)."""
    if mod.attrs is None or ORIGIN_ATTR not in mod.attrs:
        return mod
    return mod.without_attr(ORIGIN_ATTR)




def call_key(call: relax.Call) -> str:
    """What two matching calls share: the op name, and for ``call_tir`` also the PrimFunc called."""
    name = call.op.name if isinstance(call.op, tvm.ir.Op) else str(call.op)
    if call.args and isinstance(call.args[0], tvm.ir.GlobalVar):
        name += ":" + call.args[0].name_hint
    return name


def _same_arg(a, b, mapping: dict) -> bool:
    a = mapping.get(a, a)
    if isinstance(a, relax.Tuple) and isinstance(b, relax.Tuple):
        return len(a.fields) == len(b.fields) and all(_same_arg(x, y, mapping) for x, y in zip(a.fields, b.fields))
    if a.same_as(b):
        return True
    return isinstance(a, tvm.ir.Constant) and isinstance(b, tvm.ir.Constant) and tvm_ffi.structural_equal(a, b)


def same_call(pattern: relax.Call, value: relax.Call, mapping: dict) -> bool:
    """Whether ``pattern`` with its variables replaced by ``mapping`` is the call ``value``: same op,
    the same arguments (variables by identity, constants by value) and equal attributes."""
    if not (isinstance(pattern, relax.Call) and isinstance(value, relax.Call)):
        return False
    if not pattern.op.same_as(value.op) or len(pattern.args) != len(value.args):
        return False
    if not all(_same_arg(a, b, mapping) for a, b in zip(pattern.args, value.args)):
        return False
    return tvm_ffi.structural_equal(pattern.attrs, value.attrs)


def calls_by_key(func: relax.Function) -> dict[str, list]:
    """The call bindings of ``func`` grouped by :func:`call_key` (what :func:`match_calls` searches)."""
    out: dict[str, list] = {}
    for block in func.body.blocks:
        for binding in block.bindings:
            if isinstance(binding.value, relax.Call) and isinstance(binding.value.op, tvm.ir.Op):
                out.setdefault(call_key(binding.value), []).append(binding)
    return out


def _result(func: relax.Function, mapping: dict):
    """The original variable(s) a function's result stands for (a tuple result: one per field)."""
    body = func.body.body
    if isinstance(body, relax.Tuple):
        return tuple(mapping.get(f, f) for f in body.fields)
    return mapping.get(body, body)


def match_calls(group: relax.Function, args: list, by_key: dict[str, list], claimed: set
                ) -> tuple[list, object] | None:
    """The variables of the original function that a group function's calls compute at one call site.

    ``group`` is a function a partitioner made (a ``Primitive`` group of ``FuseOps`` or a library
    composite); ``args`` are the arguments of its call site, as original variables. Each of its
    calls is matched, in order, against the original calls (``by_key``, from
    :func:`calls_by_key`) with its parameters bound to ``args`` and its earlier calls bound to the
    variables already matched; variables in ``claimed`` belong to other groups. Returns the
    matched variables and the original variable(s) of the group's result, or None when some call
    has no match.
    """
    mapping: dict = dict(zip(group.params, args))
    found: list = []
    for block in group.body.blocks:
        for b in block.bindings:
            value = b.value
            if isinstance(value, relax.Function):              # a composite inside its wrapper
                mapping[b.var] = value
                continue
            if isinstance(value, relax.TupleGetItem):
                source = mapping.get(value.tuple_value, value.tuple_value)
                mapping[b.var] = source[value.index] if isinstance(source, tuple) else source
                continue
            if isinstance(value, relax.Tuple):
                mapping[b.var] = tuple(mapping.get(f, f) for f in value.fields)
                continue
            if not isinstance(value, relax.Call):
                return None
            if not isinstance(value.op, tvm.ir.Op):
                callee = mapping.get(value.op)
                if not isinstance(callee, relax.Function):
                    return None
                inner = match_calls(callee, [mapping.get(a, a) for a in value.args], by_key, claimed)
                if inner is None:
                    return None
                found.extend(inner[0])
                mapping[b.var] = inner[1]
                continue
            match = next((o for o in by_key.get(call_key(value), ())
                          if o.var not in claimed and same_call(value, o.value, mapping)), None)
            if match is None:
                return None
            mapping[b.var] = match.var
            found.append(match.var)
    return found, _result(group, mapping)


def trace_partition(partitioned: tvm.IRModule, func_name: str, original: relax.Function, is_group
                    ) -> list[tuple[relax.Function, list, list]]:
    """Every group call of ``partitioned[func_name]`` (a partitioner's output of ``original``) traced
    back to the original function: ``(group function, call arguments as original variables,
    original variables it computes)`` per call site, in order. ``is_group(function)`` says which
    called functions are groups; a call site that cannot be traced is left out.

    The partitioner gives each group call a new variable; later call sites read those, so the
    walk maps every new variable (and tuple items of it) back to the original one it stands for.
    """
    by_key = calls_by_key(original)
    renamed: dict = {}
    claimed: set = set()
    out: list = []
    for block in partitioned[func_name].body.blocks:
        for binding in block.bindings:
            value = binding.value
            if isinstance(value, relax.TupleGetItem) and value.tuple_value in renamed:
                source = renamed[value.tuple_value]
                renamed[binding.var] = source[value.index] if isinstance(source, tuple) else source
                continue
            if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar)):
                continue
            group = partitioned[value.op]
            if not isinstance(group, relax.Function) or not is_group(group):
                continue
            args = [renamed.get(a, a) for a in value.args]
            matched = match_calls(group, args, by_key, claimed)
            if matched is None:
                continue
            found, result = matched
            claimed.update(found)
            renamed[binding.var] = result
            out.append((group, args, found))
    return out


__all__ = ["ORIGIN_ATTR", "RecordOrigin", "call_key", "calls_by_key", "match_calls", "origin_functions", "same_call",
           "trace_partition", "without_origin"]
