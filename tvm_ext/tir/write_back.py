"""Register write-backs that run only where their producer ran.

A kernel that accumulates in a register (``cache_write(block, 0, "local")``) and writes the
register back with ``reverse_compute_at(write_back, loop)`` runs the write-back under the
producer's loops. When those loops cover a padded tile (a tile of ``4 x 48`` outputs on
``4 x 32`` threads, two iterations: 256 lanes for 192 outputs), the producer carries the tile's
predicate (``... < 192``) but TVM gives the write-back only its buffer's bounds: the 64 extra
lanes store whatever their register holds onto the next tile's rows, which another block writes
too (stitch's softmax + GEMM kernel at head dimension 48; threads serialized in increasing order,
the next block's store lands last and the output looks right).

:func:`predicate_write_backs` gives each such write-back the conjuncts of its producer's
predicate that depend only on loops enclosing the write-back: a block that reads a local buffer
that an earlier statement of the same sequence writes under a predicate. The schedule stage
applies it to every kernel a generator schedules.

Example
-------
>>> fixed = predicate_write_backs(scheduled)
"""
from __future__ import annotations

import tvm
import tvm_ffi
from tvm import tirx
from tvm.s_tir import SBlockRealize

from .predicates import conjoin, conjuncts, is_true
from .substitute import vars_of
from .workspace import buffer_scope


def _local_writes(stmt) -> dict:
    """Local buffer -> the predicate conjuncts of the blocks that write it in ``stmt``."""
    out: dict = {}

    def on_realize(realize) -> None:
        for region in realize.block.writes:
            if buffer_scope(region.source) == "local" and not is_true(realize.predicate):
                out.setdefault(region.source, []).extend(conjuncts(realize.predicate))

    tvm_ffi.structural_walk(stmt, (SBlockRealize, on_realize))
    return out


class _Fixer:
    def __init__(self):
        self.loops: list = []
        self.fixed = 0

    def visit(self, stmt):
        if isinstance(stmt, tirx.SeqStmt):
            produced: dict = {}
            out = []
            for item in stmt.seq:
                item = self._predicated(item, produced)
                out.append(self.visit(item))
                for buf, conds in _local_writes(item).items():
                    produced.setdefault(buf, []).extend(conds)
            return tirx.SeqStmt(out)
        if isinstance(stmt, tirx.For):
            self.loops.append(stmt.loop_var)
            try:
                body = self.visit(stmt.body)
            finally:
                self.loops.pop()
            return tirx.For(stmt.loop_var, stmt.min, stmt.extent, stmt.kind, body, stmt.thread_binding,
                            stmt.annotations)
        if isinstance(stmt, SBlockRealize):
            block = stmt.block
            new_block = tvm.s_tir.SBlock(block.iter_vars, block.reads, block.writes, block.name_hint,
                                         self.visit(block.body), block.init, block.alloc_buffers,
                                         block.match_buffers, block.annotations)
            return SBlockRealize(stmt.iter_values, stmt.predicate, new_block)
        if isinstance(stmt, tirx.IfThenElse):
            return tirx.IfThenElse(stmt.condition, self.visit(stmt.then_case),
                                   None if stmt.else_case is None else self.visit(stmt.else_case))
        if isinstance(stmt, tirx.AttrStmt):
            return tirx.AttrStmt(stmt.node, stmt.attr_key, stmt.value, self.visit(stmt.body))
        return stmt

    def _predicated(self, stmt, produced: dict):
        """``stmt`` (a write-back realize, possibly under loops) with its producers' predicates."""
        if not produced or not isinstance(stmt, SBlockRealize):
            return stmt
        block = stmt.block
        reads_local = [r.source for r in block.reads if r.source in produced]
        if not reads_local or all(buffer_scope(w.source) == "local" for w in block.writes):
            return stmt
        scope = set(self.loops)
        have = {str(c) for c in conjuncts(stmt.predicate)}
        extra = [c for buf in reads_local for c in produced[buf]
                 if vars_of([c]) <= scope and str(c) not in have]
        if not extra:
            return stmt
        predicate = conjoin(dict.fromkeys(extra), start=stmt.predicate)
        self.fixed += 1
        return SBlockRealize(stmt.iter_values, predicate, block)


def predicate_write_backs(func: tirx.PrimFunc) -> tirx.PrimFunc:
    """``func`` with every register write-back predicated like its producer (module docstring);
    ``func`` itself when none needs it."""
    fixer = _Fixer()
    body = fixer.visit(func.body)
    return func.with_body(body) if fixer.fixed else func


__all__ = ["predicate_write_backs"]
