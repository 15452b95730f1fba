"""Whether TVM lowers a scheduled kernel: lower and generate code for one function alone.

Generators that build their own schedules check their kernels with it (the schedule stage for
every kernel of a generator with ``verify_lowering``; the subprogram generator when it designs a
merged kernel), so a kernel TVM's lowering rejects is refused, not a failed build.

Example
-------
>>> lowering_problem(scheduled, "fused_softmax", target) is None
True
"""
from __future__ import annotations

import tvm
from tvm import tirx

from ..errors import TVM_ERRORS
from .launch_params import PIPELINE_NAME


def lowering_problem(func: tirx.PrimFunc, name: str, target: tvm.target.Target) -> str | None:
    """Lower and generate code for ``func`` alone; the last error line, or None if it builds."""
    try:
        with target:
            tvm.tirx.build(tvm.IRModule({name: func.with_attr("global_symbol", name)}), target=target,
                           pipeline=PIPELINE_NAME)
    except TVM_ERRORS as err:  # the lowering rejects the function
        text = str(err).strip()
        return text.splitlines()[-1][:300] if text else type(err).__name__
    return None


__all__ = ["lowering_problem"]
