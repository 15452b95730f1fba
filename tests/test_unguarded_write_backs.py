"""Cross-thread reductions whose write-back TVM lowers without the block predicate (tir/thread_reductions.py).

``tvm-ext verify yolov5s --preset orchestrate`` found three dlight-built kernels (``GeneralReduction``
on a 1x1 convolution, its bias, SiLU and the ``concatenate`` after it) storing their shared
convolution tile at a negative index: the reduction block is predicated to the concatenate's
second half (``T.where(5120 <= blockIdx)``) and ``LowerCrossThreadReduction`` writes its result
back outside that predicate. dlight's rules now skip such a schedule, as they skip one that
stores an element from two threads.
"""
from __future__ import annotations

from pathlib import Path

import tvm

from tvm_ext.checks import emulate_in_domain
from tvm_ext.dlight.rules import apply_rules
from tvm_ext.tir.thread_reductions import unguarded_write_backs

TARGET = tvm.target.Target("tvm_ext/h100")
FIXTURE = Path(__file__).parent / "fixtures" / "yolov5s_conv_concat.tvmscript"


def _function():
    return tvm.script.from_source(FIXTURE.read_text().replace("private=True, ", ""))


def test_general_reduction_on_the_conv_concat_is_found_and_skipped():
    from tvm.s_tir import dlight as dl

    func = _function()
    space = dl.gpu.GeneralReduction().apply(func, TARGET, False)
    scheduled = (space if isinstance(space, tvm.s_tir.Schedule) else space[0]).mod["main"]
    assert unguarded_write_backs(scheduled.body) == ["conv2d_nchw"]      # what verify reported
    verdict = emulate_in_domain(func, scheduled.with_attr("tirx.is_scheduled", True), TARGET, inputs=4)
    assert any(f.kind == "out_of_bounds" for f in verdict.findings)
    outcome = apply_rules(func, TARGET)
    assert outcome.rule != "GeneralReduction" and outcome.rule != "none"
    assert any("write back outside its block predicate" in f for f in outcome.failures)
    assert not unguarded_write_backs(outcome.func.body)
    assert emulate_in_domain(func, outcome.func, TARGET, inputs=4).ok
