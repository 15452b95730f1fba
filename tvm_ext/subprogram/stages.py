"""Stages of a subprogram: a fused PrimFunc cut into the functions its merged kernel runs in turn.

``FuseTIR`` writes a fused function as one root block whose body is the members' loop nests in
order, with the values passed between members as root allocations. A :class:`StageSpec` names a
run of those top-level statements (by position, so a plan made on one fusion of a node set
rebuilds on another) and how it is scheduled:

* ``"compute"`` -- a GEMM-like statement (a reduction over which at least two operands vary),
  with the elementwise statements after it that read its result (its epilogue), scheduled by
  dlight's rules like a kernel of its own;
* ``"memory"`` -- memory-intensive statements, scheduled to the merged kernel's thread shape by
  :mod:`tvm_ext.subprogram.uniform`.

:func:`stage_function` makes a stage a PrimFunc of its own: the fused function's parameters and
the root allocations other stages use become its parameters, the rest stay its allocations.

Example
-------
>>> specs = default_stages(fused)
>>> [(s.kind, s.statements) for s in specs]
[('compute', (0,)), ('compute', (1, 2)), ('memory', (3, 4))]
"""
from __future__ import annotations

import functools
from collections import Counter

from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import tirx

from ..errors import TvmExtError

STAGE_KINDS = ("compute", "memory")


class StageError(TvmExtError):
    """A fused function cannot be cut into stages (not one root block over single-block loop nests)."""


@dataclass(frozen=True)
class StageSpec:
    """One stage: the positions of its top-level statements in the fused function and its kind."""

    statements: tuple[int, ...]
    kind: str

    def __post_init__(self) -> None:
        if self.kind not in STAGE_KINDS:
            raise StageError(f"stage kind must be one of {STAGE_KINDS}, got {self.kind!r}")
        if not self.statements:
            raise StageError("a stage needs at least one statement")

    def to_json(self) -> dict:
        """JSON form."""
        return {"statements": list(self.statements), "kind": self.kind}

    @classmethod
    def from_json(cls, data: dict) -> "StageSpec":
        """Inverse of :meth:`to_json`."""
        return cls(tuple(int(i) for i in data["statements"]), str(data["kind"]))


def root_block(func: tirx.PrimFunc) -> tvm.s_tir.SBlock:
    """The root block of an unscheduled fused function."""
    body = func.body
    if not isinstance(body, tvm.s_tir.SBlockRealize) or body.block.name_hint != "root":
        raise StageError("the function has no root block")
    return body.block


def statements(func: tirx.PrimFunc) -> list[tirx.Stmt]:
    """The top-level statements of ``func``'s root block."""
    body = root_block(func).body
    return list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]


def statement_block(stmt: tirx.Stmt) -> tvm.s_tir.SBlock:
    """The one block of a top-level statement (a loop nest over a single block)."""
    found: list = []
    tvm_ffi.structural_walk(stmt, (tvm.s_tir.SBlock, found.append))
    if len(found) != 1:
        raise StageError(f"a top-level statement holds {len(found)} blocks, expected one")
    return found[0]


def _region_vars(region) -> set:
    out: set = set()
    for rng in region.region:
        tvm_ffi.structural_walk(rng.min, (tvm.ir.Var, out.add))
    return out


def is_gemm_like(block: tvm.s_tir.SBlock) -> bool:
    """A reduction block over which at least two distinct operands vary (matmul, conv, bmm)."""
    reduce_vars = {iv.var for iv in block.iter_vars if iv.iter_type == tirx.IterVar.CommReduce}
    if not reduce_vars:
        return False
    varying = {region.source for region in block.reads if _region_vars(region) & reduce_vars}
    return len(varying) >= 2


def is_spatial(block: tvm.s_tir.SBlock) -> bool:
    """A block without reduction iterators."""
    return all(iv.iter_type == tirx.IterVar.DataPar for iv in block.iter_vars)


def _writes(block) -> set:
    return {r.source for r in block.writes}


def _reads(block) -> set:
    return {r.source for r in block.reads}


def default_stages(func: tirx.PrimFunc) -> list[StageSpec]:
    """Cut ``func`` into stages: each GEMM-like statement with the spatial statements right after
    it that read what the stage wrote (its epilogue), and runs of the other statements."""
    blocks = [statement_block(s) for s in statements(func)]
    out: list[StageSpec] = []
    memory: list[int] = []
    i = 0
    while i < len(blocks):
        if not is_gemm_like(blocks[i]):
            memory.append(i)
            i += 1
            continue
        if memory:
            out.append(StageSpec(tuple(memory), "memory"))
            memory = []
        members, written = [i], _writes(blocks[i])
        i += 1
        while i < len(blocks) and is_spatial(blocks[i]) and _reads(blocks[i]) & written:
            members.append(i)
            written |= _writes(blocks[i])
            i += 1
        out.append(StageSpec(tuple(members), "compute"))
    if memory:
        out.append(StageSpec(tuple(memory), "memory"))
    return out


def split_compute(spec: StageSpec) -> list[StageSpec]:
    """A compute stage as its GEMM alone and its epilogue as a memory stage (when dlight cannot
    schedule the GEMM with its epilogue as one kernel)."""
    if spec.kind != "compute" or len(spec.statements) == 1:
        return [spec]
    return [StageSpec(spec.statements[:1], "compute"), StageSpec(spec.statements[1:], "memory")]


def check_cover(func: tirx.PrimFunc, specs: list[StageSpec]) -> None:
    """Raise :class:`StageError` unless ``specs`` cover ``func``'s statements once each, in order."""
    flat = [i for s in specs for i in s.statements]
    if flat != list(range(len(statements(func)))):
        raise StageError(f"stages cover statements {flat}, the function has {len(statements(func))}")


@functools.lru_cache(maxsize=8)
def _statement_buffers(func: tirx.PrimFunc) -> tuple[frozenset, ...]:
    """The buffers each top-level statement of ``func`` reads or writes (a design cuts one function
    into many stages: scanning every statement per stage was 20 s on the LSTM's 1090 nodes)."""
    return tuple(frozenset(_reads(block) | _writes(block))
                 for block in (statement_block(stmt) for stmt in statements(func)))


def stage_function(func: tirx.PrimFunc, spec: StageSpec) -> tirx.PrimFunc:
    """Stage ``spec`` of ``func`` as a PrimFunc of its own (see the module docstring)."""
    root = root_block(func)
    all_stmts = statements(func)
    mine = [all_stmts[i] for i in spec.statements]
    per_statement = _statement_buffers(func)
    uses = Counter(b for bufs in per_statement for b in bufs)
    used = set().union(*(per_statement[i] for i in spec.statements))
    mine_uses = Counter(b for i in spec.statements for b in per_statement[i])
    used_elsewhere = {b for b in used if uses[b] > mine_uses[b]}
    params = [p for p in func.params if p in used]
    crossing = [b for b in root.alloc_buffers if b in used and b in used_elsewhere]
    local = [b for b in root.alloc_buffers if b in used and b not in used_elsewhere]
    body = tirx.SeqStmt(mine) if len(mine) > 1 else mine[0]
    block = tvm.s_tir.SBlock(root.iter_vars, [], [], "root", body, None, local, root.match_buffers,
                             root.annotations)
    stage = tirx.PrimFunc(params + crossing, tvm.s_tir.SBlockRealize([], True, block), func.ret_type)
    return stage.with_attr("tirx.noalias", True)


__all__ = ["STAGE_KINDS", "StageError", "StageSpec", "check_cover", "default_stages", "is_gemm_like",
           "is_spatial", "root_block", "split_compute", "stage_function", "statement_block", "statements"]
