"""SOUFFLE (ASPLOS'24): global tensor-expression analysis and transforms (first slice of issue 14).

Built:

* :mod:`.horizontal` — the horizontal transform as a Relax pass: independent GEMMs sharing an
  input become one GEMM with concatenated weights (Q/K/V, gate/up); ``full`` applies it where
  the cost model prices the selection lower (:class:`tvm_ext.driver.graph_choice.CheaperOf`).

Not built yet (issue 14, items 4-7): the resource-bounded partition into subprograms, the
merged multi-stage kernel (one PrimFunc per subprogram, grid sync, two-phase reductions,
cooperative launch), cross-stage optimisation, the ``subprogram`` preset and its candidates.
"""
from .horizontal import HORIZONTAL_ATTR, HorizontalMatmul, combine_function

__all__ = ["HORIZONTAL_ATTR", "HorizontalMatmul", "combine_function"]
