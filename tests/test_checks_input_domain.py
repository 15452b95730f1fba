"""The emulation's random inputs against the function's own domain (checks/input_domain.py).

BERT-base s384 under ``orchestrate`` was reported reading past its embedding table: its kernel
computes ``table[where(mask, ids + vocab, ids)]`` with ``mask = ids < 0`` made by another kernel,
and random 0/1 masks and ids leave the table. The function itself reads there on those inputs;
the check must say so and check the kernel on inputs it is defined on. A schedule that reads
outside where the function does not stays a finding.
"""
from __future__ import annotations

import tvm
from tvm import tirx
from tvm.script import tirx as T

from tvm_ext.checks import emulate_function, emulate_in_domain
from tvm_ext.dlight.rules import apply_rules

TARGET = tvm.target.Target("tvm_ext/h100")
VOCAB = 16


def _embedding(shift: int = 0, masked: bool = True) -> tirx.PrimFunc:
    """``out[i] = table[where(mask[i], ids[i] + shift + VOCAB, ids[i] + shift)]``, as the build
    fuses BERT's embedding with its negative-index handling (``mask`` from another kernel);
    unmasked, ``table[ids[i] + shift]`` (``mask`` unread)."""
    wrap = VOCAB if masked else 0

    @T.prim_func(s_tir=True)
    def embedding(table: T.Buffer((VOCAB, 4), "float32"), ids: T.Buffer((8,), "int64"),
                  mask: T.Buffer((8,), "bool"), out: T.Buffer((8, 4), "float32")):
        for i, j in T.grid(8, 4):
            with T.sblock("take"):
                vi, vj = T.axis.remap("SS", [i, j])
                out[vi, vj] = table[T.if_then_else(mask[vi], ids[vi] + T.int64(shift + wrap),
                                                   ids[vi] + T.int64(shift)), vj]

    return embedding


def _scheduled(func: tirx.PrimFunc) -> tirx.PrimFunc:
    outcome = apply_rules(func, TARGET)
    assert outcome.rule != "none"
    return outcome.func


def test_a_read_outside_that_the_function_itself_makes_is_checked_on_zero_indices():
    reference = _embedding()
    scheduled = _scheduled(reference)
    random = emulate_function(reference, scheduled, TARGET, inputs=3)
    assert [f.kind for f in random.findings if f.kind == "out_of_bounds"]    # what verify reported
    verdict = emulate_in_domain(reference, scheduled, TARGET, inputs=3)
    assert verdict.ok and verdict.compared > 0, verdict.findings
    assert "read outside table" in verdict.domain


def test_a_schedule_reading_where_the_function_does_not_stays_a_finding():
    reference = _embedding(masked=False)                      # table[ids]: inside for ids 0/1
    wrong = _scheduled(_embedding(shift=VOCAB - 1, masked=False))     # past the table for ids >= 1
    verdict = emulate_in_domain(reference, wrong, TARGET, inputs=3)
    assert not verdict.ok and verdict.domain == ""
    assert any(f.kind == "out_of_bounds" for f in verdict.findings)
