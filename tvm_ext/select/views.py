"""Candidates the build turns into views: no kernel, no traffic.

TVM's ``RewriteDataflowReshape`` (in the CUDA lowering every preset runs) replaces a ``call_tir``
of a function with a reshape pattern by ``vm.builtin.reshape``, a view of its input, when the
function reads one tensor, writes one of the same dtype and element count, and its result is a
dataflow variable (not one of the function's outputs), whichever generator planned it. The
pattern is TVM's analysis of the *scheduled* function, in which the generators have inlined a
chain of data movement: a transpose, reshape, transpose chain that keeps the element order
(Segformer's ``(1, 16384, 32) -> (1, 32, 16384) -> (1, 32, 128, 128) -> (1, 128, 128, 32)``) is
a view as well. The selection spine prices such a candidate as the report sees the build, with
no launch (:func:`as_view`: :class:`~tvm_ext.select.candidate.LaunchShape` ``kernels=0``).

Example
-------
>>> is_view(ctx, (reshape_node,))
True
>>> as_view(ctx, candidate).launch.kernels
0
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from tvm import relax

from ..graph import TensorKind, sblocks
from ..tir.inline import inline_blocks
from .candidate import Candidate, LaunchShape, boundary
from .context import SelectionContext

#: The launch of a candidate that is a view.
VIEW = LaunchShape(grid=1, threads=1, kernels=0)


def is_view(ctx: SelectionContext, members: Sequence[int], recomputes: Sequence[int] = ()) -> bool:
    """Whether the kernel of ``members`` (recomputing ``recomputes``) becomes a view of its input."""
    inputs, outputs = boundary(ctx.graph, members, recomputes)
    if len(inputs) != 1 or len(outputs) != 1:
        return False
    src, dst = ctx.graph.tensors[inputs[0]], ctx.graph.tensors[outputs[0]]
    if dst.kind == TensorKind.OUTPUT or src.dtype != dst.dtype or math.prod(src.shape) != math.prod(dst.shape):
        return False
    func = ctx.fused_function(members, tuple(recomputes))
    if relax.analysis.has_reshape_pattern(func):
        return True
    # a chain (transpose, reshape, transpose back) is one once its blocks are inlined, as every
    # generator's schedule inlines them: the pattern analysis then sees one block
    names = [block.name_hint for block, _ in sblocks(func)]
    inlined, left = inline_blocks(func, names[:-1])
    return len(names) > 1 and not left and bool(relax.analysis.has_reshape_pattern(inlined))


def as_view(ctx: SelectionContext, cand: Candidate) -> Candidate:
    """``cand`` with no launch where the build makes its kernel a view, else ``cand`` itself."""
    if cand.launch.kernels == 0 or not is_view(ctx, cand.nodes, cand.recomputes):
        return cand
    return dataclasses.replace(cand, launch=VIEW, provenance=f"{cand.provenance}; a view (reshape) in the build")


__all__ = ["VIEW", "as_view", "is_view"]
