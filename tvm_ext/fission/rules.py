"""What every fission rule shares: the rewriting mutator and the helpers rules build on.

A rule is a *rewrite function* ``fn(bb, call) -> expr`` for one or more Relax ops. It checks
everything it needs first and raises :class:`Unsupported` (nothing emitted yet) for a call it
cannot handle; otherwise it emits the intermediate primitive ops with ``bb.emit`` and returns
the last one *unemitted*, so the original binding (and its variable name) is kept for the
result. :func:`fission_module` runs rewrite functions over every Relax function of a module;
a call left alone is logged with the reason, never an exception.

Dtypes: rules compute in the input dtype, as TVM's legalization of the same ops does, except
the normalizations (:func:`upcast`): float16 / bfloat16 statistics are taken in float32.

Example
-------
>>> def fission_relu(bb, call):
...     return relax.op.maximum(call.args[0], const(0.0, tensor_type(call.args[0]).dtype))
>>> mod = fission_module(mod, "relu", {"relax.nn.relu": fission_relu})
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

import tvm
from tvm import relax

from ..ir_update import with_functions

_LOG = logging.getLogger(__name__)

#: ``fn(bb, call)``: the primitive graph equivalent to ``call``; the returned expression is not emitted.
RewriteFn = Callable[[relax.BlockBuilder, relax.Call], relax.Expr]

#: Function attributes marking regions a library codegen owns; fission leaves them whole.
_LIBRARY_ATTRS = ("Codegen", "Composite")
#: Low-precision float dtypes whose statistics the normalization rules take in float32.
_UPCAST_DTYPES = frozenset({"float16", "bfloat16"})


class Unsupported(Exception):
    """Raised by a rewrite function for a call it leaves unchanged; the message says why."""


@relax.expr_functor.mutator
class _FissionMutator(relax.PyExprMutator):
    """Replaces calls of the ops in ``rewrites`` by what their rewrite function returns."""

    def __init__(self, mod: tvm.IRModule, rule: str, rewrites: Sequence[tuple[tvm.ir.Op, RewriteFn]],
                 func_name: str, skip_level: int):
        super().__init__(mod)
        self.rule = rule
        self.rewrites = rewrites
        self.func_name = func_name
        self.skip_level = skip_level
        self.changed = 0

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        for op, rewrite in self.rewrites:
            if call.op.same_as(op):
                try:
                    new = rewrite(self.builder_, call)
                except Unsupported as why:
                    _LOG.log(self.skip_level, "fission rule %r left %s in '%s' unchanged: %s",
                             self.rule, op.name, self.func_name, why)
                    return call
                self.changed += 1
                return new
        return call


def fission_module(mod: tvm.IRModule, rule: str, rewrites: Mapping[str, RewriteFn],
                   skip_level: int = logging.WARNING) -> tvm.IRModule:
    """Apply ``rewrites`` (op name -> rewrite function) to every Relax function of ``mod``.

    Functions owned by a library codegen (attribute ``Codegen`` or ``Composite``) are left
    whole. ``mod`` itself is not changed; it is returned as is when nothing was rewritten.
    Calls a rewrite function refuses are logged at ``skip_level`` (a rule that applies only
    to some calls of its op by design logs them at ``logging.DEBUG``).

    Example
    -------
    >>> mod = fission_module(mod, "softmax", {"relax.nn.softmax": fission_softmax})
    """
    ops = [(tvm.ir.Op.get(name), fn) for name, fn in rewrites.items()]
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, relax.Function):
            continue
        attrs = func.attrs or {}
        if any(key in attrs for key in _LIBRARY_ATTRS):
            _LOG.debug("fission rule %r skips '%s': a library codegen owns it", rule, gv.name_hint)
            continue
        mutator = _FissionMutator(mod, rule, ops, gv.name_hint, skip_level)
        new = mutator.visit_expr(func)
        if mutator.changed:
            _LOG.debug("fission rule %r rewrote %d call(s) in '%s'", rule, mutator.changed, gv.name_hint)
            updates[gv] = new
    return with_functions(mod, updates)


# -- type and attribute helpers -----------------------------------------------------------------

def tensor_type(expr: relax.Expr) -> relax.TensorType:
    """``expr``'s tensor type, of known rank; :class:`Unsupported` otherwise."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.ndim < 0:
        raise Unsupported(f"needs a tensor of known rank, got {ty}")
    return ty


def static_int(dim: tvm.ir.PrimExpr, what: str) -> int:
    """``dim`` as a Python int; :class:`Unsupported` when it is symbolic."""
    if not isinstance(dim, tvm.tirx.IntImm):
        raise Unsupported(f"{what} is symbolic ({dim}); the rule needs it static")
    return int(dim.value)


def known_shape(ty: relax.TensorType) -> list[tvm.ir.PrimExpr]:
    """The dims of ``ty`` (static or symbolic); :class:`Unsupported` when the shape is not known."""
    if not isinstance(ty.shape, relax.ShapeExpr):
        raise Unsupported(f"needs a known shape, got {ty}")
    return list(ty.shape.values)


def normalize_axes(axes: Sequence[int] | None, ndim: int) -> list[int]:
    """``axes`` made non-negative and sorted (all axes when None); :class:`Unsupported` if invalid."""
    if axes is None:
        return list(range(ndim))
    out = sorted(int(a) + ndim if int(a) < 0 else int(a) for a in axes)
    if len(set(out)) != len(out) or any(not 0 <= a < ndim for a in out):
        raise Unsupported(f"axes {list(axes)} are not distinct axes of a rank-{ndim} tensor")
    return out


def const(value: float, dtype: str | tvm.ir.PrimType) -> relax.Constant:
    """A scalar constant of ``dtype`` (a name, or a tensor type's ``dtype``)."""
    return relax.const(value, str(dtype))


# -- emission helpers -----------------------------------------------------------------------------

def upcast(bb: relax.BlockBuilder, x: relax.Expr, dtype: str | tvm.ir.PrimType) -> tuple[relax.Expr, str]:
    """``x`` (of ``dtype``) in the dtype the normalizations compute in, and that dtype's name.

    float16 and bfloat16 become float32 (TVM's own layer/group/instance/rms norm kernels do
    the same); other dtypes are kept.
    """
    dtype = str(dtype)
    if dtype in _UPCAST_DTYPES:
        return bb.emit(relax.op.astype(x, "float32")), "float32"
    return x, dtype


def downcast(bb: relax.BlockBuilder, x: relax.Expr, work_dtype: str, dtype: str | tvm.ir.PrimType) -> relax.Expr:
    """``x`` (computed in ``work_dtype``) emitted, cast back to ``dtype`` when they differ."""
    x = bb.emit(x)
    return bb.emit(relax.op.astype(x, str(dtype))) if work_dtype != str(dtype) else x


def broadcast_param(bb: relax.BlockBuilder, param: relax.Expr, axes: Sequence[int], ndim: int) -> relax.Expr:
    """``param``, whose dims are the data dims ``axes`` (sorted), made to broadcast against the data.

    Unit dims are inserted after the first of ``axes`` wherever a data dim is not in ``axes``
    (leading dims broadcast by themselves): gamma ``(C,)`` of NCHW data on axis 1 becomes
    ``(C, 1, 1)``; gamma ``(D,)`` over the last axis is used as it is.
    """
    first = axes[0]
    inserted = [d - first for d in range(first, ndim) if d not in axes]
    return bb.emit(relax.op.expand_dims(param, inserted)) if inserted else param


def affine(bb: relax.BlockBuilder, norm: relax.Expr, gamma: relax.Expr | None, beta: relax.Expr | None,
           axes: Sequence[int], ndim: int) -> relax.Expr:
    """``norm * gamma + beta`` (either may be None: skipped), params broadcast along ``axes``.

    ``norm`` is an emitted value; the result is not emitted (``norm`` itself when both are None).
    """
    out = norm
    if gamma is not None:
        out = relax.op.multiply(out, broadcast_param(bb, gamma, axes, ndim))
    if beta is not None:
        if gamma is not None:
            out = bb.emit(out)
        out = relax.op.add(out, broadcast_param(bb, beta, axes, ndim))
    return out


__all__ = ["RewriteFn", "Unsupported", "affine", "broadcast_param", "const", "downcast", "fission_module",
           "known_shape", "normalize_axes", "static_int", "tensor_type", "upcast"]
