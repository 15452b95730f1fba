"""Matmul-like nodes of a tile graph and their reduction steps (Welder §3.1 "rstep", §4.1 TensorCore).

A node is *matmul-like* when its PrimFunc contracts two inputs over one reduction iterator and
every index of both reads is a bare iterator: ``C[.., m, n] = sum_k A[.., m, k] * B[.., k, n]``
(batch matmul and a transposed ``B`` included; a convolution's ``h * s + r`` indices are not).
Such a node can load its inputs in *reduction steps* (``rstep`` elements of ``k`` at a time): the
per-step input tiles shrink, the global traffic does not (every step is loaded once per tile).
In 16-bit floating point it is a TensorCore candidate, whose tile axes must be multiples of the
MMA fragment.

Example
-------
>>> info = matmul_like(graph, 0)           # Welder §2: C = A[98304x64] @ B[64x128]
>>> info.reduce_extent, info.tensor_core
(64, False)
>>> rstep_regions(graph, [0, 1], regions, 16)["B"].extents
(16, 128)
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from tvm import tirx

from ..analysis import Region, node_access_maps
from ..graph import OpClass, OpGraph

#: Input dtypes that run on TensorCores. Welder §5 evaluates "FP16 on TensorCore"; bfloat16 has the
#: same MMA shapes (CUDA C++ Programming Guide, "Warp Matrix Functions": __nv_bfloat16 m16n16k16).
TENSOR_CORE_DTYPES = frozenset({"float16", "bfloat16"})


@dataclass(frozen=True)
class MatmulLike:
    """A contraction node: its output, reduction iterator and input dtype."""

    node: int
    output: str
    reduce_var: tirx.Var
    reduce_extent: int
    inputs: tuple[str, str]
    dtype: str

    @property
    def tensor_core(self) -> bool:
        """Whether the node is a TensorCore candidate (16-bit float inputs)."""
        return self.dtype in TENSOR_CORE_DTYPES


def _bare(expr, allowed) -> bool:
    return isinstance(expr, tirx.Var) and any(expr.same_as(v) for v in allowed)


def matmul_like(graph: OpGraph, index: int) -> MatmulLike | None:
    """The :class:`MatmulLike` description of node ``index``, or None if it is not one.

    Examples
    --------
    >>> matmul_like(graph, 1) is None          # softmax reduces, but is no contraction
    True
    """
    node = graph.nodes[index]
    if node.func is None or node.op_class != OpClass.COMPUTE or len(node.outputs) != 1:
        return None
    amap = node_access_maps(graph, index)[node.outputs[0]]
    if not amap.exact or len(amap.free_vars) != 1 or len(amap.inputs) != 2:
        return None
    ((kvar, (_, extent)),) = amap.free_vars.items()
    allowed = tuple(amap.out_vars) + (kvar,)
    for name in amap.inputs:
        accesses = amap.accesses[name]
        if len(accesses) != 1:
            return None
        indices = accesses[0].indices
        if not all(e is not None and _bare(e, allowed) for e in indices):
            return None
        if not any(e.same_as(kvar) for e in indices):
            return None
    a, b = amap.inputs
    dtypes = {graph.tensors[a].dtype, graph.tensors[b].dtype}
    dtype = dtypes.pop() if len(dtypes) == 1 else graph.tensors[a].dtype
    return MatmulLike(index, node.outputs[0], kvar, int(extent), (a, b), dtype)


def matmul_nodes(graph: OpGraph, members: Iterable[int]) -> list[MatmulLike]:
    """The matmul-like nodes among ``members`` (in the given order)."""
    found = (matmul_like(graph, i) for i in members)
    return [m for m in found if m is not None]


def rstep_regions(graph: OpGraph, members: Iterable[int], regions: Mapping[str, Region],
                  rstep: int | None) -> dict[str, Region]:
    """Per-step regions: ``regions`` with the global inputs of matmul-like members cut to ``rstep``.

    Only inputs loaded from outside ``members`` and read by no other member shrink (an input
    another member reads whole stays whole). ``rstep=None`` returns ``regions`` unchanged.

    Parameters
    ----------
    graph : OpGraph
        The operator graph.
    members : iterable of int
        The node indices of one kernel.
    regions : mapping of str to Region
        Interior regions of one tile (from :func:`~tvm_ext.analysis.propagate`).
    rstep : int or None
        Elements of the reduction axis loaded per step (capped at each node's extent).

    Returns
    -------
    dict of str to Region
    """
    out = dict(regions)
    if rstep is None:
        return out
    inside = set(members)
    for info in matmul_nodes(graph, sorted(inside)):
        amap = node_access_maps(graph, info.node)[info.output]
        start, extent = amap.free_vars[info.reduce_var]
        stepped = dataclasses.replace(amap, free_vars={info.reduce_var: (start, min(extent, rstep))})
        if regions[info.output].is_empty:
            continue
        step = stepped.input_regions(regions[info.output], interior=True)
        for name in info.inputs:
            tensor = graph.tensors[name]
            readers = {c for c in tensor.consumers if c in inside}
            if tensor.producer not in inside and readers == {info.node}:
                out[name] = step[name]
    return out
