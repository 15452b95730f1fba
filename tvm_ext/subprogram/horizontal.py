"""Horizontal transform (SOUFFLE §6.1) at the Relax level: GEMMs sharing an input become one.

Independent ``R.matmul`` calls of one dataflow block that read the same left operand (BERT's
Q/K/V projections, LLaMA's gate/up) are replaced by one matmul with the right operands
concatenated along N, an optional bias add with the biases concatenated the same way, and one
``R.strided_slice`` per branch at the branch's column offset. The shared input is then read by
one kernel instead of three, and two launches are saved per group; the slices are injective and
fuse into the branches' consumers (reshape / permute), so they cost no launch of their own.

The pass is what TVM's ``relax.transform.CombineParallelMatmul`` does, for the forms our
importer produces, which that pass leaves alone: weights and biases that are *constants*
(``CombineParallelMatmul`` matches variables only), and a bias added as ``R.add(b, mm)``
(it matches ``R.add(mm, b)`` only). Constant operands are concatenated here (no runtime
concat); variable operands (weights kept as parameters) get an ``R.concat`` in front.

Conditions for a branch ``y_i = [R.add(] R.matmul(x, w_i) [, b_i)]`` to join a group: ``x`` is a
variable; every ``w_i`` has the same rank (>= 2), dtype and batch dimensions and the matmuls the
same ``out_dtype``; variable weights are defined before the group's first matmul (so no branch
depends on another). A weight ``permute_dims(w)`` read by the matmul alone (a Linear layer as
the importers write it) is taken along: folded when ``w`` is a constant, re-emitted in front of
the concat otherwise, so it only needs ``w`` to be available. A bias joins only when every branch has one (constant or variable,
broadcast along the last axis only) and the matmul result has no other use; otherwise the adds
stay on the branches. Anything else is left unchanged and logged.

Example
-------
>>> mod = HorizontalMatmul()(mod)           # Q/K/V: one matmul, one add, three strided_slice
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import tvm
from tvm import relax

logger = logging.getLogger(__name__)

_MATMUL = tvm.ir.Op.get("relax.matmul")
_ADD = tvm.ir.Op.get("relax.add")
_PERMUTE = tvm.ir.Op.get("relax.permute_dims")

#: Module attribute: number of matmuls merged and groups formed, as ``"merged/groups"``.
HORIZONTAL_ATTR = "tvm_ext.horizontal_merged"


@dataclass
class _Branch:
    matmul_var: relax.Var
    weight: relax.Expr
    out_var: relax.Var        # the var the rest of the function reads (the add's, or the matmul's)
    bias: relax.Expr | None = None
    bias_var: relax.Var | None = None   # the add binding folded into the group
    weight_var: relax.Var | None = None   # a ``permute_dims(w)`` binding folded into the group


@dataclass
class _Group:
    lhs: relax.Var
    out_dtype: object   # the matmul attribute as it was (void: the operands' dtype)
    branches: list[_Branch] = field(default_factory=list)


def _static_shape(expr) -> tuple[int, ...] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = []
    for d in ty.shape.values:
        if not isinstance(d, tvm.tirx.IntImm):
            return None
        dims.append(int(d.value))
    return tuple(dims)


def _is_call(value, op) -> bool:
    return isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op) and value.op.same_as(op)


@relax.expr_functor.visitor
class _Uses(relax.PyExprVisitor):
    """Use count and using bindings of every variable of a function."""

    def __init__(self):
        self.count: dict = {}
        self.users: dict = {}
        self._current = None

    def visit_var_binding_(self, binding) -> None:
        self._current = binding
        self.visit_expr(binding.value)
        self._current = None

    def visit_var_(self, var) -> None:
        self.count[var] = self.count.get(var, 0) + 1
        self.users.setdefault(var, []).append(self._current)

    def visit_dataflow_var_(self, var) -> None:
        self.visit_var_(var)



def _bias_of(add_value, mm_var, out_shape) -> relax.Expr | None:
    """The bias operand of ``add_value`` if it is ``mm + b`` / ``b + mm`` with ``b`` broadcast along
    the last axis only, else None."""
    a, b = add_value.args
    other = b if a.same_as(mm_var) else a if b.same_as(mm_var) else None
    if other is None or not isinstance(other, (relax.Var, tvm.ir.Constant)):
        return None
    shape = _static_shape(other)
    if shape is None or not shape or len(shape) > len(out_shape):
        return None
    if shape[-1] != out_shape[-1] or any(d != 1 for d in shape[:-1]):
        return None
    if str(other.ty.dtype) != str(add_value.ty.dtype) or _static_shape(add_value) != out_shape:
        return None
    return other


class _Planner:
    """Finds the groups of one function."""

    def __init__(self, func: relax.Function):
        self.uses = _Uses()
        self.uses.visit_expr(func)
        self.params = set(func.params)

    def _weight(self, rhs, bound: dict, position: dict, head: int) -> tuple[relax.Expr | None, relax.Var | None]:
        """The weight expression of a branch and the permute binding it absorbs, or (None, None)
        when the weight is not available at the group's first matmul."""
        value = bound.get(rhs)
        if value is not None and _is_call(value, _PERMUTE) and self.uses.count.get(rhs, 0) == 1:
            src = value.args[0]   # Linear layers: matmul(x, permute_dims(w)); re-emitted with the group
            if isinstance(src, tvm.ir.Constant) or position.get(src, -1) < head:
                return value, rhs
        if isinstance(rhs, relax.Var) and position.get(rhs, -1) >= head:
            return None, None
        return rhs, None

    def plan(self, block) -> list[_Group]:
        position = {b.var: k for k, b in enumerate(block.bindings)}
        bound = {b.var: b.value for b in block.bindings if isinstance(b, relax.VarBinding)}
        groups: dict[tuple, _Group] = {}
        first: dict[tuple, int] = {}
        for k, binding in enumerate(block.bindings):
            value = binding.value
            if not _is_call(value, _MATMUL):
                continue
            lhs, rhs = value.args
            w_shape, out_shape = _static_shape(rhs), _static_shape(value)
            if not isinstance(lhs, relax.Var) or w_shape is None or out_shape is None or len(w_shape) < 2:
                continue
            if not isinstance(rhs, (relax.Var, tvm.ir.Constant)):
                logger.debug("horizontal: %s skipped (weight is a %s)", binding.var.name, type(rhs).__name__)
                continue
            key = (lhs, len(w_shape), w_shape[:-2], str(rhs.ty.dtype), str(value.attrs.out_dtype),
                   len(out_shape))
            first.setdefault(key, k)
            weight, weight_var = self._weight(rhs, bound, position, first[key])
            if weight is None:
                logger.info("horizontal: %s left alone (its weight is computed after the group's first matmul)",
                            binding.var.name)
                continue
            group = groups.setdefault(key, _Group(lhs, value.attrs.out_dtype))
            branch = self._branch(binding, out_shape, position, first[key])
            branch.weight, branch.weight_var = weight, weight_var
            group.branches.append(branch)
        out = [g for g in groups.values() if len(g.branches) > 1]
        for g in out:
            if any(br.bias is None for br in g.branches):
                for br in g.branches:
                    br.bias, br.bias_var, br.out_var = None, None, br.matmul_var
        return out

    def _branch(self, binding, out_shape, position, head: int) -> _Branch:
        var = binding.var
        branch = _Branch(var, binding.value.args[1], var)
        users = self.uses.users.get(var, [])
        if self.uses.count.get(var, 0) != 1 or users[0] is None or not _is_call(users[0].value, _ADD):
            return branch
        bias = _bias_of(users[0].value, var, out_shape)
        if bias is None or (isinstance(bias, relax.Var) and bias not in self.params
                            and position.get(bias, len(position)) >= head):
            return branch
        branch.bias, branch.bias_var, branch.out_var = bias, users[0].var, users[0].var
        return branch


def _constant(expr) -> np.ndarray | None:
    """The value of a constant or of ``permute_dims`` of a constant, else None."""
    if isinstance(expr, tvm.ir.Constant):
        return expr.value.numpy()
    if _is_call(expr, _PERMUTE) and isinstance(expr.args[0], tvm.ir.Constant):
        axes = expr.attrs.axes
        return np.transpose(expr.args[0].value.numpy(), None if axes is None else [int(a) for a in axes])
    return None


def _concat(operands: list, axis: int) -> relax.Expr:
    """Constants concatenated now; anything else by an ``R.concat``."""
    values = [_constant(o) for o in operands]
    if all(v is not None for v in values):
        return relax.const(np.concatenate(values, axis=axis))
    return relax.op.concat(relax.Tuple(operands), axis=axis)


def _flat_bias(bias: relax.Expr) -> relax.Expr:
    shape = _static_shape(bias)
    if len(shape) == 1:
        return bias
    if isinstance(bias, tvm.ir.Constant):
        return relax.const(bias.value.numpy().reshape(shape[-1]))
    return relax.op.reshape(bias, (shape[-1],))


@relax.expr_functor.mutator
class _Rewriter(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule, groups: list[_Group]):
        super().__init__(mod)
        self.heads = {g.branches[0].matmul_var: g for g in groups}
        self.dropped = {v for g in groups for br in g.branches for v in (br.matmul_var, br.bias_var, br.weight_var)
                        if v is not None}

    def visit_var_binding_(self, binding) -> None:
        group = self.heads.get(binding.var)
        if group is not None:
            self._emit_group(group)
        elif binding.var not in self.dropped:
            super().visit_var_binding_(binding)

    def _emit_group(self, group: _Group) -> None:
        bb = self.builder_
        branches = group.branches
        weight = _concat([self.visit_expr(br.weight) for br in branches], axis=-1)
        if not isinstance(weight, tvm.ir.Constant):
            weight = bb.emit(weight, "hweight")
        out = bb.emit(relax.op.matmul(self.visit_expr(group.lhs), weight, out_dtype=group.out_dtype), "hmatmul")
        if branches[0].bias is not None:
            bias = _concat([_flat_bias(self.visit_expr(br.bias)) for br in branches], axis=0)
            if not isinstance(bias, tvm.ir.Constant):
                bias = bb.emit(bias, "hbias")
            out = bb.emit(relax.op.add(out, bias), "hadd")
        axis = len(_static_shape(out)) - 1
        offset = 0
        for br in branches:
            width = _static_shape(br.out_var)[-1]
            piece = bb.normalize(relax.op.strided_slice(out, axes=[axis], begin=[offset], end=[offset + width]))
            bb.emit_normalized(relax.VarBinding(br.out_var, piece))
            offset += width


def combine_function(mod: tvm.IRModule, func: relax.Function) -> tuple[relax.Function, int, int]:
    """``func`` with its parallel matmuls combined; also the number of matmuls and groups merged."""
    planner = _Planner(func)
    groups = [g for block in func.body.blocks if isinstance(block, relax.DataflowBlock)
              for g in planner.plan(block)]
    if not groups:
        return func, 0, 0
    for g in groups:
        logger.info("horizontal: %d matmuls on %s -> one (N = %s)%s", len(g.branches), g.lhs.name,
                    "+".join(str(_static_shape(br.matmul_var)[-1]) for br in g.branches),
                    ", bias concatenated" if g.branches[0].bias is not None else "")
    new = _Rewriter(mod, groups).visit_expr(func)
    return new, sum(len(g.branches) for g in groups), len(groups)


@tvm.transform.module_pass(opt_level=0, name="tvm_ext.HorizontalMatmul")
class HorizontalMatmul:
    """Combine independent matmuls sharing their left operand (see the module docstring).

    The number of matmuls merged and of groups formed go into :data:`HORIZONTAL_ATTR`.
    """

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:  # noqa: D102 - pass protocol
        merged = groups = 0
        updates = {}
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function) or (func.attrs is not None and "Primitive" in func.attrs):
                continue
            new, m, g = combine_function(mod, func)
            if g:
                updates[gv] = new
                merged, groups = merged + m, groups + g
        if updates:
            infos = dict(mod.global_infos) if mod.global_infos is not None else None
            mod = tvm.IRModule({gv: updates.get(gv, f) for gv, f in mod.functions_items()}, attrs=mod.attrs,
                               global_infos=infos)
        return mod.with_attr(HORIZONTAL_ATTR, f"{merged}/{groups}")


__all__ = ["HORIZONTAL_ATTR", "HorizontalMatmul", "combine_function"]
