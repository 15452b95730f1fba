"""Model import: ONNX (and torch.export) to a static-shape, canonical Relax IRModule.

Modules, one concept each:

* :mod:`~tvm_ext.frontend.onnx_import` - load and validate an ONNX model, check operator
  support, convert it (:func:`from_onnx`);
* :mod:`~tvm_ext.frontend.torch_import` - :func:`from_torch` through ``torch.export``;
* :mod:`~tvm_ext.frontend.canonicalize` - the cleanups every import ends with;
* :mod:`~tvm_ext.frontend.fp16` - :class:`ConvertToFloat16` (pure fp16 models);
* :mod:`~tvm_ext.frontend.shapes` - binding free input dimensions to static sizes;
* :mod:`~tvm_ext.frontend.inputs` - input names/shapes/dtypes and random input data;
* :mod:`~tvm_ext.frontend.names` - ONNX value names made C identifiers, and the ONNX name
  of each input of an imported module;
* :mod:`~tvm_ext.frontend.split_slices` - :class:`SplitToSlices`, a split read part by part as
  one slice per part (not part of the canonical form: the generators that fuse slices into
  their readers ask for it).
"""
from __future__ import annotations

from .canonicalize import canonicalize_passes, finalize_module
from .fp16 import ConvertToFloat16
from .inputs import index_bounds, input_info, random_inputs
from .names import onnx_input_names, sanitize_value_names
from .split_slices import SplitToSlices, split_to_slices
from .onnx_import import from_onnx, load_onnx, unsupported_ops
from .torch_import import from_torch

__all__ = [
    "from_onnx", "from_torch", "canonicalize_passes", "finalize_module", "load_onnx",
    "unsupported_ops", "input_info", "random_inputs", "index_bounds", "ConvertToFloat16",
    "onnx_input_names", "sanitize_value_names", "SplitToSlices", "split_to_slices",
]
