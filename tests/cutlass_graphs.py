"""Helpers of the CUTLASS graph-rewrite tests: run a Relax module on the CPU, list what CUTLASS takes."""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from tvm_ext.cutlass import partition_for_cutlass, workload_from_function


def run_llvm(mod: tvm.IRModule, args, llvm_target) -> np.ndarray:
    """``main`` of ``mod`` built for the CPU on ``args``, its output as float32."""
    vm = relax.VirtualMachine(tvm.compile(mod, llvm_target), tvm.cpu())
    return vm["main"](*(tvm.runtime.tensor(a) for a in args)).numpy().astype("float32")


def offloaded(mod: tvm.IRModule) -> list:
    """The workloads of the calls :func:`~tvm_ext.cutlass.partition_for_cutlass` offloads."""
    return [workload_from_function(f).workload for _, f in partition_for_cutlass(mod).functions_items()
            if f.attrs is not None and "Codegen" in f.attrs]
