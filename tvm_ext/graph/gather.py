"""Bytes an operator reads of an input it only *gathers* from (data-dependent indices).

A gather (``take`` of an embedding table, ``gather_elements``) reads ``t[idx[i], j]``: which rows
it touches depends on data, but each execution of its block loads one element. So the bytes it
reads of ``t`` are at most (block executions x loads of ``t`` per execution x element size), often
far less than ``t`` itself: BERT's word embedding gathers 128 rows (192 KiB in fp16) of a
30522 x 768 table (45 MiB). Counting the whole table priced the embedding lookup as a 45 MiB
read. An input read through any load whose indices do not depend on data is read whole (the
conservative bound the rest of the graph uses).

Example
-------
>>> gathered_reads(take_func)          # T_take[0, i, j] = t[idx[0, i], j], 128 x 64 outputs
{0: 8192}                              # parameter 0 (t): elements; bytes = elements x element size
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx

from .classify import sblocks


def tensor_loads(expr) -> list:
    """Every tensor load in ``expr`` (a data-dependent index has one or more)."""
    found: list = []
    tvm_ffi.structural_walk(expr, (tvm.ir.TensorLoad, found.append))
    return found


def _executions(block) -> int | None:
    """How many times ``block`` runs (its iteration domain), None when not a constant."""
    count = 1
    for iv in block.iter_vars:
        extent = iv.dom.extent
        if not isinstance(extent, tirx.IntImm):
            return None
        count *= int(extent)
    return count


def gathered_reads(func: tirx.PrimFunc) -> dict[int, int]:
    """Elements of each parameter ``func`` reads only through data-dependent indices, at most.

    Parameters
    ----------
    func : tirx.PrimFunc
        A legalized (unscheduled) operator.

    Returns
    -------
    dict of int to int
        Parameter position -> upper bound on the elements read, for every parameter whose every
        load has an index that loads from a tensor. Parameters read any other way are absent
        (read whole).
    """
    params = {p: k for k, p in enumerate(func.params)}   # parameters are buffers in TVM 0.27
    bound: dict[int, int] = {}
    whole: set[int] = set()
    for block, _loops in sblocks(func):
        runs = _executions(block)
        loads: list = []
        tvm_ffi.structural_walk(block.body, (tvm.ir.TensorLoad, lambda n: loads.append(n)))
        for load in loads:
            k = params.get(load.source)
            if k is None:
                continue
            if runs is None or not any(tensor_loads(i) for i in load.indices):
                whole.add(k)
            else:
                bound[k] = bound.get(k, 0) + runs
    return {k: n for k, n in bound.items() if k not in whole}


__all__ = ["gathered_reads", "tensor_loads"]
