"""Thresholds on the work a kernel executes against the work of the function it computes.

Planned work is counted statically on the unscheduled function
(:func:`~tvm_ext.analysis.work.function_work`, where the counting lives: the cost model prices a
built kernel from its static executed count, :func:`~tvm_ext.analysis.work.executed_work`).
Executed work is counted here by the emulator on the lowered kernel, lane by lane, over the blocks it ran and scaled to the grid
(:mod:`tvm_ext.checks.emulator`): a thread-predicated statement counts only the threads that run it.

Inlining an elementwise op into its consumers recomputes it by design (softmax's ``exp`` in the
sum and in the normalisation: 2x); a kernel that executes more than :data:`RECOMPUTE_LIMIT`
times its function's transcendentals or global loads recomputes beyond that (the stitched LSTM
recomputed the recurrence from step 0 at every step: a finding, and the kernel is priced from
what it executes).

Example
-------
>>> planned = function_work(fused_func)
>>> verdict = emulate_function(fused_func, scheduled, target)
>>> verdict.executed.ratio_over(planned)
1.0
"""
from __future__ import annotations

#: Executed / planned work above which a kernel is reported as recomputing.
RECOMPUTE_LIMIT = 3.0
#: Finding kinds about cost, not correctness (reported as warnings: the kernel computes right).
PERFORMANCE_KINDS = frozenset({"recompute", "spill"})
#: Executed / planned work at which the emulation stops (the kernel is reported, not run to the
#: end), plus :data:`EMULATION_ALLOWANCE` of each count (a small function's 10x is still cheap to run).
EMULATION_BUDGET = 8.0
EMULATION_ALLOWANCE = 2e5

__all__ = ["EMULATION_ALLOWANCE", "EMULATION_BUDGET", "PERFORMANCE_KINDS", "RECOMPUTE_LIMIT"]
