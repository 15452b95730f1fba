#!/usr/bin/env python3
"""Three ways to compile an ONNX model for an NVIDIA GPU with tvm_ext.

1. tvm_ext's passes inside *your own* ``tvm.transform.Sequential`` (mix them with TVM's
   passes and your own; ``tvm.compile`` runs the Sequential as the Relax pipeline);
2. plain ``tvm.compile`` with our target tag and pipeline name
   (``target="tvm_ext/h100", relax_pipeline="tvm_ext", tir_pipeline="tvm_ext"``);
3. the short form ``tvm_ext.compile(path, target)``.

Each uses the default preset (``full``: every technique's candidates, one cost-based selection)
and all three give the same set of kernels. ``tir_pipeline="tvm_ext"`` marks kernels with an
in-kernel grid barrier for cooperative launch. No GPU is needed: ``tvm_ext.export_library``
compiles the generated CUDA source with nvcc (SASS for the target's arch plus PTX), so the GPU
machine loads the libraries with the TVM runtime alone (``tvm-ext run LIB``).

Usage::

    python python/compile_onnx_example.py [model.onnx] [--target tvm_ext/h100] [--out-dir DIR]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import tvm
from tvm import relax

import tvm_ext
from tvm_ext.frontend import from_onnx
from tvm_ext.inspect import cuda_source, global_kernel_names
from tvm_ext.models import BUNDLED_FILE


def way1_your_sequential(mod: tvm.IRModule, target: tvm.target.Target) -> tvm.runtime.Executable:
    """tvm_ext's stages as passes in a user-built Sequential."""
    stages = tvm_ext.preset_passes(tvm_ext.DEFAULT_PRESET, target)   # the preset's passes, stage by stage
    pipeline = tvm.transform.Sequential([
        relax.transform.FoldConstant(),                   # any pass of your own
        *stages.graph,                                    # tvm_ext: candidates, selection, fusion
        *stages.schedule,                                 # every kernel scheduled from its plan, dlight for the rest
        *stages.lower,                                    # TVM's lowering for the VM
    ], name="my_pipeline")
    return tvm.compile(mod, target, relax_pipeline=pipeline, tir_pipeline="tvm_ext")


def way2_tvm_compile(mod: tvm.IRModule) -> tvm.runtime.Executable:
    """``import tvm_ext`` registered the target tag and the pipeline name."""
    return tvm.compile(mod, target="tvm_ext/h100", relax_pipeline="tvm_ext", tir_pipeline="tvm_ext")


def way3_tvm_ext_compile(model: Path, target: str) -> tvm.runtime.Executable:
    """One call from the ONNX file."""
    return tvm_ext.compile(model, target=target)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default=str(BUNDLED_FILE), help="ONNX model (default: bundled BERT layer)")
    parser.add_argument("--target", default="tvm_ext/h100")
    parser.add_argument("--out-dir", default=None, help="where to write the .so files (default: a temp dir)")
    args = parser.parse_args(argv)

    model = Path(args.model)
    target = tvm.target.Target(args.target)
    mod = from_onnx(model)
    out_dir = Path(args.out_dir or tempfile.mkdtemp(prefix="tvm_ext_example_"))
    out_dir.mkdir(parents=True, exist_ok=True)

    results = {
        "1 passes in your Sequential": way1_your_sequential(mod, target),
        "2 tvm.compile + tag + pipeline name": way2_tvm_compile(mod),
        "3 tvm_ext.compile": way3_tvm_ext_compile(model, args.target),
    }
    kernel_sets = []
    for i, (label, ex) in enumerate(results.items(), start=1):
        kernels = global_kernel_names(cuda_source(ex))
        kernel_sets.append(sorted(kernels))
        path = out_dir / f"{model.stem}_way{i}.so"
        exported = tvm_ext.export_library(ex, path)
        print(f"way {label}: {len(kernels)} CUDA kernels, exported {path}: {exported.describe_device_code()}")
    same = all(k == kernel_sets[0] for k in kernel_sets)
    print(f"same set of kernels in all three: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
