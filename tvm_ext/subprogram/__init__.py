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

* :mod:`.stages`, :mod:`.uniform`, :mod:`.merge`, :mod:`.kernel` — the merged multi-stage kernel:
  a fused function cut into stages (GEMMs with their epilogues scheduled by dlight, the rest
  scheduled to the GEMMs' thread shape), run by one resident grid as virtual blocks, with grid
  barriers where a stage reads what an earlier one wrote and cooperative launch.
* :mod:`.generator` — the ``subprogram`` generator: each subprogram, cut where the GEMMs' thread
  shape changes, is a candidate priced stage by stage; the ``subprogram`` preset takes them
  first, ``full`` where the cost model prices them lower.

Not built yet (issue 14, item 6): cross-stage optimisation (``cp.async`` prefetch of the next
stage's weights, a stage's output kept in shared memory for the next); two-phase reductions
(a reduction stage runs one row per ``threadIdx.y``, no cross-block partial sums).
"""
from .generator import SubprogramGenerator, pieces
from .horizontal import HORIZONTAL_ATTR, HorizontalMatmul, combine_function
from .partition import Subprogram, dlight_shapes, partition, resident_blocks
from .te_graph import INTENSITY_THRESHOLD, Dependence, Reuse, ReuseKind, TEEdge, TEGraph, edge_dependence
from .te_horizontal import stack_computes
from .vertical import IndexMap, VerticalChain, index_map, inline_one_to_one, vertical_chains

from .kernel import Design, build, design
from .merge import MergedKernel, merge_stages
from .plans import SubprogramPlan
from .stages import StageError, StageSpec, default_stages, stage_function
from .uniform import ThreadShape, schedule_to_shape, thread_shape

__all__ = ["SubprogramGenerator", "pieces", "Design", "build", "design", "MergedKernel", "merge_stages",
           "SubprogramPlan", "StageError", "StageSpec", "default_stages", "stage_function",
           "ThreadShape", "schedule_to_shape", "thread_shape",
           "HORIZONTAL_ATTR", "HorizontalMatmul", "combine_function",
           "Subprogram", "dlight_shapes", "partition", "resident_blocks",
           "INTENSITY_THRESHOLD", "Dependence", "Reuse", "ReuseKind", "TEEdge", "TEGraph", "edge_dependence",
           "stack_computes",
           "IndexMap", "VerticalChain", "index_map", "inline_one_to_one", "vertical_chains"]
