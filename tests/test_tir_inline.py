"""Inlining many blocks in one substitution pass gives what TVM's ``compute_inline`` gives, one
block at a time (which re-analyses the whole function per call: 15 s for the stitched LSTM's 909
local ops, 1 s in one pass)."""
from __future__ import annotations

import tvm
from tvm import te

from tvm_ext.tir.inline import inline_blocks, inline_with_schedule


def _scaled_exp(prev):
    return lambda a, b: te.exp(prev[a, b]) * 0.5


def _row_sum(t):
    k = te.reduce_axis((0, 16), "k")
    return lambda a: te.sum(t[a, k], axis=k)


def _divided(t, s):
    return lambda a, b: t[a, b] / s[a]


def _chain_with_reductions(n: int = 6):
    """Elementwise ops, a row reduction and a broadcast read between them, a transposed producer."""
    x = te.placeholder((8, 16), "float32", name="x")
    t, names = x, []
    for i in range(n):
        t = te.compute((8, 16), _scaled_exp(t), name=f"e{i}")
        names.append(f"e{i}")
        if i % 3 == 1:
            s = te.compute((8,), _row_sum(t), name=f"s{i}")
            t = te.compute((8, 16), _divided(t, s), name=f"d{i}")
            names.append(f"d{i}")
    last = t
    tr = te.compute((16, 8), lambda b, a: last[a, b] + 1.0, name="transposed")
    y = te.compute((8, 16), lambda a, b: tr[b, a] * 2.0, name="y")
    return te.create_prim_func([x, y]), names + ["transposed"]


def _by_tvm(func, names):
    sch = tvm.s_tir.Schedule(func)
    failed = []
    for name in names:
        try:
            sch.compute_inline(sch.get_sblock(name))
        except tvm.error.TVMError:
            failed.append(name)
    return sch.mod["main"], failed


def test_one_pass_inlining_equals_compute_inline_one_block_at_a_time():
    func, names = _chain_with_reductions()
    expected, failed = _by_tvm(func, names)
    assert failed == []
    ours, rest = inline_blocks(func, names)
    assert rest == []                                   # every producer here substitutes
    tvm.ir.assert_structural_equal(ours, expected)


def test_blocks_the_substitution_does_not_handle_go_to_compute_inline():
    func, names = _chain_with_reductions(3)
    _, rest = inline_blocks(func, names + ["s1", "y"])
    assert rest == ["s1", "y"]                          # a reduction (init) and the output block
    sch, failed = inline_with_schedule(func, names + ["s1", "y"])
    assert failed == ["s1", "y"]                        # compute_inline refuses them too
    expected, _ = _by_tvm(func, names)
    tvm.ir.assert_structural_equal(sch.mod["main"], expected)
