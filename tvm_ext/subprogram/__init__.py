"""SOUFFLE (ASPLOS'24): global tensor-expression analysis and transforms (first slice of issue 14).

Built:

* :mod:`.te_graph` — the whole-model TE dependency graph over :class:`~tvm_ext.graph.OpGraph` and
  the access maps of :mod:`tvm_ext.analysis`: one-relies-on-one / one-relies-on-many edges,
  intensity classes (threshold 3 operations per element), spatial and temporal reuse, live ranges.
* :mod:`.horizontal` — the horizontal transform as a Relax pass: independent GEMMs sharing an
  input become one GEMM with concatenated weights (Q/K/V, gate/up); ``full`` applies it where
  the cost model prices the selection lower (:class:`tvm_ext.driver.graph_choice.CheaperOf`).
* :mod:`.te_horizontal` — the horizontal transform on TEs (Fig. 3): independent TEs stacked
  along an axis with range predicates and offsets, for TEs that share no GEMM operand.
* :mod:`.vertical` — the vertical transform: chains of one-relies-on-one TEs composed into one
  quasi-affine index map (consumer first; Fig. 4's printed result is wrong), the compute
  producer each chain attaches to, and the chain inlined inside a PrimFunc.
* :mod:`.partition` — the resource-bounded partition into subprograms (cuts at compute-intensive
  nodes when the largest grid no longer fits the blocks resident with the largest block).

Not built yet (issue 14, items 5-7): the merged multi-stage kernel (one PrimFunc per
subprogram, grid sync, two-phase reductions, cooperative launch; :mod:`.te_horizontal`,
:mod:`.vertical` and :mod:`.partition` are its building blocks), cross-stage optimisation, the
``subprogram`` preset and its candidates in ``full``. Nothing but the horizontal pass is used by
the driver yet.
"""
from .horizontal import HORIZONTAL_ATTR, HorizontalMatmul, combine_function
from .partition import Subprogram, dlight_shapes, partition, resident_blocks
from .te_graph import INTENSITY_THRESHOLD, Dependence, Reuse, ReuseKind, TEEdge, TEGraph, edge_dependence
from .te_horizontal import stack_computes
from .vertical import IndexMap, VerticalChain, index_map, inline_one_to_one, vertical_chains

__all__ = ["HORIZONTAL_ATTR", "HorizontalMatmul", "combine_function",
           "Subprogram", "dlight_shapes", "partition", "resident_blocks",
           "INTENSITY_THRESHOLD", "Dependence", "Reuse", "ReuseKind", "TEEdge", "TEGraph", "edge_dependence",
           "stack_computes",
           "IndexMap", "VerticalChain", "index_map", "inline_one_to_one", "vertical_chains"]
