"""Read-only operator graph over legalized Relax, with operator classes."""
from .classify import (OpClass, PATTERN_NAMES, block_float_work, classify, func_flops, has_contraction, is_contraction,
                       is_reduction, sblocks, weighted_dtype)
from .components import components
from .gather import gathered_reads, tensor_loads
from .opgraph import DEFAULT_INTENSITY_THRESHOLD, OpGraph, OpNode, TensorInfo, TensorKind, element_bytes

__all__ = ["OpClass", "PATTERN_NAMES", "block_float_work", "classify", "func_flops", "has_contraction", "is_contraction",
           "is_reduction", "sblocks", "weighted_dtype",
           "components", "gathered_reads", "tensor_loads", "DEFAULT_INTENSITY_THRESHOLD", "OpGraph", "OpNode", "TensorInfo", "TensorKind", "element_bytes"]
