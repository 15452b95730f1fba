"""Dependency class of an (input, output) edge of an operator, from its index expressions.

The class says how output elements depend on input elements, which is what the fusion
techniques need: a one-to-one edge can stay in registers, a one-to-many edge (reduction,
broadcast, window) needs the producer tile shared or recomputed, a data-dependent edge
only admits conservative (whole-dimension) regions.

Example
-------
>>> DependencyKind.WINDOW.is_one_to_many
True
>>> DependencyKind.combine([DependencyKind.ONE_TO_ONE, DependencyKind.REDUCTION])
<DependencyKind.REDUCTION: 'reduction'>
"""
from __future__ import annotations

import enum
from typing import Iterable, Mapping, Sequence

import tvm
import tvm_ffi
from tvm import tirx


class DependencyKind(str, enum.Enum):
    """How the elements of an output depend on the elements of one input.

    ``ONE_TO_ONE``: each input element feeds the output element at the same position (up to a
    constant offset; elementwise, slice, split). ``INJECTIVE_REMAP``: each input element is read
    at most once but reordered (transpose, reshape, strided slice). ``BROADCAST``: an input
    element is replicated along output dimensions it does not index (bias add).
    ``REDUCTION``: an output element reads many input elements along reduction iterators
    (matmul, sum, softmax). ``WINDOW``: one index combines output and reduction iterators
    (``a*out + b*red``: convolution, pooling), so neighbouring outputs share inputs.
    ``OPAQUE``: data-dependent (gather / take) or not analyzable.
    """

    ONE_TO_ONE = "one_to_one"
    INJECTIVE_REMAP = "injective_remap"
    BROADCAST = "broadcast"
    REDUCTION = "reduction"
    WINDOW = "window"
    OPAQUE = "opaque"

    @property
    def is_one_to_many(self) -> bool:
        """Whether one input element feeds several output elements (reduction/broadcast/window)."""
        return self in (DependencyKind.BROADCAST, DependencyKind.REDUCTION, DependencyKind.WINDOW)

    @property
    def rank(self) -> int:
        """Severity order used by :meth:`combine` (higher dominates)."""
        return _ORDER.index(self)

    @staticmethod
    def combine(kinds: Iterable["DependencyKind"]) -> "DependencyKind":
        """The dominating kind of several accesses of the same input.

        Order: ONE_TO_ONE < INJECTIVE_REMAP < BROADCAST < REDUCTION < WINDOW < OPAQUE.
        """
        found = list(kinds)
        if not found:
            raise ValueError("combine() needs at least one kind")
        return max(found, key=lambda k: k.rank)


_ORDER = [DependencyKind.ONE_TO_ONE, DependencyKind.INJECTIVE_REMAP, DependencyKind.BROADCAST,
          DependencyKind.REDUCTION, DependencyKind.WINDOW, DependencyKind.OPAQUE]


def vars_of(expr) -> set:
    """Free ``tvm.ir.Var`` nodes of a PrimExpr."""
    found: set = set()
    tvm_ffi.structural_walk(expr, (tvm.ir.Var, found.add))
    return found


def _linear(expr, variables: Sequence) -> list[int] | None:
    """Integer coefficients of ``expr`` over ``variables`` (last entry: the constant), or None."""
    coeffs = tvm.sym.detect_linear_equation(expr, list(variables))
    if len(coeffs) == 0:
        return None
    values = []
    for c in coeffs:
        if not isinstance(c, tirx.IntImm):
            return None
        values.append(int(c.value))
    return values


def _mixed_radix_injective(terms: list[tuple[int, int]]) -> bool:
    """Whether ``sum(c_i * v_i)`` with ``v_i in [0, n_i)`` is injective (sufficient test)."""
    span = 0  # largest reachable value of the terms already placed
    for coef, extent in sorted(((abs(c), n) for c, n in terms), key=lambda t: t[0]):
        if coef == 0 or coef <= span:
            return False
        span += coef * (extent - 1)
    return True


def classify_access(indices: Sequence, out_vars: Sequence, out_extents: Sequence[int],
                    free_vars: Mapping) -> DependencyKind:
    """Dependency kind of one access ``input[indices]``.

    ``indices`` are PrimExprs over the output iterators ``out_vars`` (extents ``out_extents``) and
    the reduction/free iterators ``free_vars`` (var -> (min, extent)); ``None`` marks a
    data-dependent dimension.

    Examples
    --------
    >>> i, j, k = (tvm.tirx.Var(n, "int64") for n in "ijk")
    >>> classify_access([i, k], [i, j], [4, 8], {k: (0, 16)})
    <DependencyKind.REDUCTION: 'reduction'>
    """
    if any(e is None for e in indices):
        return DependencyKind.OPAQUE
    outs = set(out_vars)
    used_out, used_free = set(), set()
    for e in indices:
        vs = vars_of(e)
        if vs - outs - set(free_vars):
            return DependencyKind.OPAQUE  # a variable the analysis does not know
        o, f = vs & outs, vs & set(free_vars)
        if o and f:
            return DependencyKind.WINDOW
        used_out |= o
        used_free |= f
    if used_free:
        return DependencyKind.REDUCTION
    extent_of = dict(zip(out_vars, out_extents))
    nontrivial = [v for v in out_vars if extent_of[v] > 1]
    if not set(nontrivial) <= used_out:
        return DependencyKind.BROADCAST
    return _classify_remap(indices, nontrivial, extent_of)


def _classify_remap(indices: Sequence, nontrivial: list, extent_of: dict) -> DependencyKind:
    """ONE_TO_ONE, INJECTIVE_REMAP, WINDOW (overlapping affine) or OPAQUE for a reduction-free access."""
    used = list(nontrivial)
    dims = [e for e in indices if vars_of(e) & set(used)]
    coeffs = [_linear(e, used) for e in dims]
    if all(c is not None for c in coeffs):
        order = []
        for c in coeffs:
            terms = [(coef, extent_of[v]) for coef, v in zip(c[:-1], used) if coef != 0]
            if not _mixed_radix_injective(terms):
                return DependencyKind.WINDOW  # several outputs read the same element (unfold)
            order.extend(v for coef, v in zip(c[:-1], used) if coef != 0)
        if len(order) != len(set(order)):
            return DependencyKind.OPAQUE  # one iterator in several dims: not analysed further
        identity = all(len([x for x in c[:-1] if x]) == 1 and sum(c[:-1]) == 1 for c in coeffs)
        if identity and order == used:
            return DependencyKind.ONE_TO_ONE
        return DependencyKind.INJECTIVE_REMAP
    domain = {v: tvm.ir.Range.from_min_extent(tirx.const(0, str(v.ty)), tirx.const(extent_of[v], str(v.ty)))
              for v in used}
    if len(tvm.sym.detect_iter_map(list(dims), domain, check_level="bijective").indices) == len(dims):
        return DependencyKind.INJECTIVE_REMAP  # reshape
    if len(tvm.sym.detect_iter_map(list(dims), domain, check_level="surjective").indices) == len(dims):
        return DependencyKind.BROADCAST  # affine but not injective: replication (tile, repeat)
    return DependencyKind.OPAQUE
