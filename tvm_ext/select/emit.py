"""Emit node groups of an OpGraph as Relax ``Primitive`` functions (what ``FuseOps`` emits).

Given groups of ``call_tir`` bindings of one Relax function, every group of two or more
calls becomes a private function with attribute ``Primitive`` whose body is the group's
bindings; the calling function calls it once and unpacks the escaping results. Constants
read by the group become parameters (as ``FuseOps`` lifts them). ``relax.transform.FuseTIR``
then turns each such function into one PrimFunc.

A group may instead come with a *maker* (a library generator's): it is handed the group's
bindings and escaping variables and returns the callee and arguments of the call that replaces
them (a ``Codegen`` function for a library kernel); such a group is emitted even with one node.

The bindings of the calling function are re-ordered topologically over units (one per
group, one per remaining binding), which is always possible because groups are convex.

Example
-------
>>> new_mod, names = emit_groups(mod, [[3, 4, 5]], attrs=[{"tvm_ext.plan": text}])
>>> names
['fused_layer_norm_add']
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import tvm
from tvm import relax

from ..errors import TvmExtError
from ..ir_update import with_functions

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


class EmitError(TvmExtError):
    """A node group cannot be emitted as one function (it is not convex or not in one block)."""


#: ``maker(bb, member_bindings, escaping_vars) -> (callee, args)`` for a group emitted as a library call.
Maker = Callable[[relax.BlockBuilder, list, list], tuple]


def call_bindings(func: relax.Function) -> list[tuple[int, int]]:
    """``(block index, binding index)`` of every binding OpGraph turns into a node, in order."""
    found = []
    for bi, block in enumerate(func.body.blocks):
        for ki, binding in enumerate(block.bindings):
            value = binding.value
            if isinstance(value, relax.Call):
                found.append((bi, ki))
    return found


def var_refs(expr) -> list:
    """Relax variables referenced by ``expr`` (in first-use order)."""
    seen: list = []

    def visit(e) -> None:
        if isinstance(e, relax.Var) and not isinstance(e, tvm.ir.GlobalVar):
            if not any(e.same_as(s) for s in seen):
                seen.append(e)

    relax.analysis.post_order_visit(expr, visit)
    return seen


def _constants(expr) -> list:
    found: list = []

    def visit(e) -> None:
        # tensor constants only (integer immediates of shapes are Constants too in TVM 0.27)
        if (isinstance(e, tvm.ir.Constant) and isinstance(getattr(e, "ty", None), relax.TensorType)
                and not any(e.same_as(c) for c in found)):
            found.append(e)

    relax.analysis.post_order_visit(expr, visit)
    return found


@dataclass
class _Unit:
    group: int | None
    bindings: list[int] = field(default_factory=list)


@relax.expr_functor.mutator
class Rebind(relax.PyExprMutator):
    """Replace variables and constants by new variables."""

    def __init__(self, mapping: Mapping):
        super().__init__()
        self.mapping = mapping

    def visit_var_(self, var):
        return self.mapping.get(var, var)

    def visit_dataflow_var_(self, var):
        return self.mapping.get(var, var)

    def visit_generic_const_(self, const):
        return self.mapping.get(const, const)


def emit_groups(mod: tvm.IRModule, groups: Sequence[Sequence[int]], *, func_name: str = "main",
                names: Sequence[str] | None = None,
                attrs: Sequence[Mapping[str, object]] | None = None,
                makers: Sequence[Maker | None] | None = None) -> tuple[tvm.IRModule, list[str]]:
    """Turn each node group of ``mod[func_name]`` into a ``Primitive`` function.

    Parameters
    ----------
    mod : tvm.IRModule
        Legalized module (one ``call_tir`` per node, as OpGraph sees it).
    groups : sequence of sequences of int
        OpGraph node indices per group; groups of one node are left as they are.
    func_name : str
        The Relax function to rewrite.
    names : sequence of str, optional
        Function name per group (made unique); default ``fused_<member funcs>``.
    attrs : sequence of mappings, optional
        Extra function attributes per group (besides ``Primitive``).
    makers : sequence of callables or None, optional
        Per group, a maker that emits the group as a call of its own (see the module docstring).

    Returns
    -------
    (tvm.IRModule, list of str)
        The new module and the name given to each group (``""`` for groups left alone).

    Raises
    ------
    EmitError
        A group spans several binding blocks, or is not convex.
    """
    func = mod[func_name]
    sites = call_bindings(func)
    blocks = list(func.body.blocks)
    owner: dict[tuple[int, int], int] = {}
    for gi, nodes in enumerate(groups):
        if len(nodes) < 2 and not (makers and makers[gi] is not None):
            continue
        where = {sites[n][0] for n in nodes}
        if len(where) != 1 or not isinstance(blocks[next(iter(where))], relax.DataflowBlock):
            raise EmitError(f"group {gi} spans binding blocks {sorted(where)} or is outside a dataflow block")
        for n in nodes:
            owner[sites[n]] = gi

    bb = relax.BlockBuilder(mod)
    given: list[str] = [""] * len(groups)
    new_blocks = []
    for bi, block in enumerate(blocks):
        if not any(key[0] == bi for key in owner):
            new_blocks.append(block)
            continue
        new_blocks.append(_rewrite_block(bb, block, bi, owner, names, attrs, makers, given))
    new_body = relax.SeqExpr(new_blocks, func.body.body)
    new_func = relax.Function(list(func.params), new_body, func.ret_ty, func.is_pure, func.attrs)
    out = bb.get()
    return with_functions(out, {out.get_global_var(func_name): new_func}), given


def _rewrite_block(bb: relax.BlockBuilder, block, bi: int, owner, names, attrs, makers, given):
    bindings = list(block.bindings)
    defined: dict = {}  # var -> unit id
    units: list[_Unit] = []
    group_unit: dict[int, int] = {}
    for ki, binding in enumerate(bindings):
        gi = owner.get((bi, ki))
        if gi is None and not isinstance(binding.value, relax.Call):
            # a tuple / alias / item binding joins a group only if everything it reads is the group's
            refs = var_refs(binding.value)
            homes = {defined.get(r) for r in refs}
            if refs and len(homes) == 1 and None not in homes and units[next(iter(homes))].group is not None:
                gi = units[next(iter(homes))].group
        if gi is not None:
            if gi not in group_unit:
                group_unit[gi] = len(units)
                units.append(_Unit(gi))
            uid = group_unit[gi]
        else:
            uid = len(units)
            units.append(_Unit(None))
        units[uid].bindings.append(ki)
        defined[binding.var] = uid

    deps: list[set[int]] = [set() for _ in units]
    for uid, unit in enumerate(units):
        for ki in unit.bindings:
            for r in var_refs(bindings[ki].value):
                if r in defined and defined[r] != uid:
                    deps[uid].add(defined[r])
    # escaping vars of each group: used by another unit, or a non-dataflow (block output) var
    used_elsewhere: dict[int, list] = {uid: [] for uid in range(len(units))}
    for uid, unit in enumerate(units):
        for ki in unit.bindings:
            for r in var_refs(bindings[ki].value):
                if r in defined and defined[r] != uid and not any(r.same_as(x) for x in used_elsewhere[defined[r]]):
                    used_elsewhere[defined[r]].append(r)
    for uid, unit in enumerate(units):
        for ki in unit.bindings:
            var = bindings[ki].var
            if not isinstance(var, relax.DataflowVar) and not any(var.same_as(x) for x in used_elsewhere[uid]):
                used_elsewhere[uid].append(var)

    order = _topological(deps)
    out_bindings = []
    for uid in order:
        unit = units[uid]
        if unit.group is None:
            out_bindings.extend(bindings[ki] for ki in unit.bindings)
            continue
        escaping = [b.var for ki in unit.bindings if (b := bindings[ki]).var in used_elsewhere[uid]]
        escaping = [v for v in used_elsewhere[uid] if any(v.same_as(e) for e in escaping)]
        # an alias (``y = x``) of a value the group also returns is bound outside, after the call:
        # returning one value twice made FuseTIR bind one buffer to two parameters (ill-formed)
        aliases = [b for ki in unit.bindings if isinstance((b := bindings[ki]).value, relax.Var)
                   and any(b.value.same_as(e) for e in escaping) and any(b.var.same_as(e) for e in escaping)
                   and not any(b.var.same_as(r) for kj in unit.bindings for r in var_refs(bindings[kj].value))]
        escaping = [v for v in escaping if not any(v.same_as(a.var) for a in aliases)]
        gi = unit.group
        members = [bindings[ki] for ki in unit.bindings if not any(bindings[ki].same_as(a) for a in aliases)]
        maker = makers[gi] if makers else None
        if maker is not None:
            callee, args = maker(bb, members, escaping)
        else:
            name = (names[gi] if names else "") or _default_name(bindings, unit.bindings)
            extra = dict(attrs[gi]) if attrs else {}
            callee, args = _make_function(bb, members, escaping, name, extra)
        given[gi] = callee.name_hint
        call = relax.Call(callee, args)
        if len(escaping) == 1:
            out_bindings.append(relax.VarBinding(escaping[0], bb.normalize(call)))
        else:
            tup = relax.DataflowVar(f"{callee.name_hint}_out", bb.normalize(call).ty)
            out_bindings.append(relax.VarBinding(tup, bb.normalize(call)))
            for i, var in enumerate(escaping):
                out_bindings.append(relax.VarBinding(var, bb.normalize(relax.TupleGetItem(tup, i))))
        out_bindings.extend(aliases)
    return relax.DataflowBlock(out_bindings)


def _topological(deps: list[set[int]]) -> list[int]:
    indeg = [len(d) for d in deps]
    users: list[list[int]] = [[] for _ in deps]
    for u, ds in enumerate(deps):
        for d in ds:
            users[d].append(u)
    ready = [u for u, n in enumerate(indeg) if n == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        u = heapq.heappop(ready)
        order.append(u)
        for v in users[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                heapq.heappush(ready, v)
    if len(order) != len(deps):
        raise EmitError("node groups are not convex: their binding units form a cycle")
    return order


def _default_name(bindings, kis: Sequence[int]) -> str:
    parts = []
    for ki in kis:
        value = bindings[ki].value
        if isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR):
            parts.append(value.args[0].name_hint)
    return "fused_" + "_".join(parts[:6]) if parts else "fused_group"


def _make_function(bb: relax.BlockBuilder, members: list, escaping: list, name: str,
                   extra: Mapping[str, object]):
    """Build the Primitive function of one group; returns its GlobalVar and call arguments."""
    inner = {b.var for b in members}
    args: list = []
    mapping: dict = {}
    for b in members:
        for r in var_refs(b.value):
            if r not in inner and r not in mapping:
                mapping[r] = relax.Var(r.name, r.ty)
                args.append(r)
        for c in _constants(b.value):
            if c not in mapping:
                mapping[c] = relax.Var(f"param_{len(args)}", c.ty)
                args.append(c)
    params = [mapping[a] for a in args]
    new_bindings = []
    last = members[-1].var
    single_last = len(escaping) == 1 and escaping[0].same_as(last)
    for b in members:
        is_out = single_last and b.var.same_as(last)
        var = (relax.Var if is_out else relax.DataflowVar)(b.var.name, b.var.ty)
        value = Rebind(mapping).visit_expr(b.value)
        mapping[b.var] = var
        new_bindings.append(relax.VarBinding(var, value))
    if single_last:
        ret = mapping[last]
    elif len(escaping) == 1:
        ret = relax.Var("gv", escaping[0].ty)
        new_bindings.append(relax.VarBinding(ret, mapping[escaping[0]]))
    else:
        tup = relax.Tuple([mapping[v] for v in escaping])
        ret = relax.Var("gv", relax.TupleType([v.ty for v in escaping]))
        new_bindings.append(relax.VarBinding(ret, tup))
    body = relax.SeqExpr([relax.DataflowBlock(new_bindings)], ret)
    fn = relax.Function(params, body, ret.ty, True)
    fn = fn.with_attr("Primitive", True)
    for key, value in extra.items():
        fn = fn.with_attr(key, value)
    gvar = bb.add_func(fn, name)
    return gvar, args


__all__ = ["EmitError", "Maker", "Rebind", "call_bindings", "emit_groups", "var_refs"]
