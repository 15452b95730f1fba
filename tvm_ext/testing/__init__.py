"""Correctness tooling: the CPU oracle, output comparison, the ONNX backend and node suite.

Modules: :mod:`.oracle` (build a preset for llvm, compare with onnxruntime),
:mod:`.compare` (error measures, ``assert_close``), :mod:`.onnx_backend`
(``onnx.backend`` adapter), :mod:`.node_cases` (regenerate / load ONNX node tests),
:mod:`.node_suite` (run them per preset), :mod:`.isolated_pool` (crash-safe workers),
:mod:`.onnx_graphs` (small ONNX graphs written inline). The device kernels of a module, as the
GPU runs them, are :mod:`tvm_ext.checks.lowered`'s.
"""
