"""Recomputation (Korch §5): a cheap node computed inside each kernel that reads it.

A node with several consumers is normally computed once, written to global memory and read
back by every kernel that needs it. When the node is cheap to compute from its own inputs, each
reading kernel may instead compute it itself: nobody writes it, and if no other kernel needs it,
its own kernel disappears (a broadcast attention mask read by every layer's softmax; a cast or
a reshape feeding several kernels).

This module decides *which* nodes may be recomputed (:func:`recomputable_nodes`) and proposes,
for every TIR candidate that reads such a node, the same generator's kernel over the candidate
plus that node (:func:`recomputing_candidates`; a generator offers this through
:class:`Extensible`). The cost model prices those candidates like any other, without writing
the recomputed node; the BLP selector (:mod:`tvm_ext.select.blp`) decides where recomputing
pays, and the emitter gives each such kernel its own copy of the node's binding.

A node is recomputable when it

* is elementwise, broadcast or injective (no reduction, no contraction),
* has two or more consumers,
* reads no more non-constant bytes than it writes (recomputing it reads its inputs instead of
  its value: no more traffic; what it saves is the node's own kernel and its write), and
* is in no library candidate (a library kernel cannot hand out a copy).

Example
-------
>>> extra = recomputing_candidates(ctx, candidates)
>>> extra[0].recomputes, extra[0].provenance
((27,), 'stitch scope: single group; recomputes where1')
"""
from __future__ import annotations

import logging
from typing import Protocol, Sequence, runtime_checkable

import tvm
from tvm import relax

from ..graph.classify import OpClass
from ..ir_update import with_functions
from .candidate import Candidate
from .context import SelectionContext
from .emit import Rebind, call_bindings, var_refs
from .generator import get_generator
from .plan import plan_to_text

logger = logging.getLogger(__name__)

#: Operator classes whose nodes may be recomputed.
RECOMPUTABLE_CLASSES = frozenset({OpClass.ELEMENTWISE, OpClass.BROADCAST, OpClass.INJECTIVE})


@runtime_checkable
class Extensible(Protocol):
    """A TIR generator that can plan one of its candidates over more nodes."""

    def extend(self, ctx: SelectionContext, cand: Candidate, recompute: tuple[int, ...]) -> Candidate | None:
        """``cand``'s kind of kernel also recomputing ``recompute``; None if it cannot plan it."""


def recomputable_nodes(ctx: SelectionContext, candidates: Sequence[Candidate]) -> frozenset[int]:
    """The nodes of ``ctx.graph`` that kernels may recompute (see the module docstring)."""
    graph = ctx.graph
    in_library = {n for c in candidates if get_generator(c.generator).kernel_kind == "library" for n in c.nodes}
    found = set()
    for n in ctx.call_nodes():
        node = graph.nodes[n]
        if node.op_class not in RECOMPUTABLE_CLASSES or n in in_library or len(set(graph.consumers(n))) < 2:
            continue
        read = sum(graph.tensors[t].nbytes for t in node.inputs if graph.tensors[t].kind.value != "constant")
        written = sum(graph.tensors[t].nbytes for t in node.outputs)
        if read <= written:
            found.add(n)
    return frozenset(found)


def recomputing_candidates(ctx: SelectionContext, candidates: Sequence[Candidate]) -> list[Candidate]:
    """For every TIR candidate of an :class:`Extensible` generator that reads a recomputable node,
    the generator's candidate that also recomputes it (one node at a time; convex sets only)."""
    recomputable = recomputable_nodes(ctx, candidates)
    if not recomputable:
        return []
    graph = ctx.graph
    out: list[Candidate] = []
    seen: set[tuple] = set()
    for cand in candidates:
        generator = get_generator(cand.generator)
        if generator.kernel_kind != "tir" or not isinstance(generator, Extensible):
            continue
        members = set(cand.nodes)
        reads = sorted({p for m in cand.nodes for p in graph.producers(m)} & recomputable - members)
        for r in reads:
            key = (plan_to_text(cand.plan), tuple(sorted(members | {r})))
            if key in seen or not graph.is_convex(members | {r}):
                continue
            seen.add(key)
            grown = generator.extend(ctx, cand, (r,))
            if grown is not None:
                out.append(grown)
    logger.info("recomputation: %d recomputable node(s), %d candidate(s) that recompute one",
                len(recomputable), len(out))
    return out


def copy_recomputed(mod: tvm.IRModule, ctx: SelectionContext,
                    chosen: Sequence[Candidate]) -> tuple[tvm.IRModule, list[list[int]]]:
    """Give every chosen candidate its own binding of each node it recomputes.

    The copy is bound right after the node's binding and the candidate's other members read it;
    a node no other kernel reads any more (every reader recomputes it) loses its binding.

    Returns
    -------
    (tvm.IRModule, list of list of int)
        The module, and per candidate its nodes as indices of the new function's call bindings
        (what :func:`~tvm_ext.select.emit.emit_groups` takes).
    """
    func = mod[ctx.func_name]
    sites = call_bindings(func)
    if not any(c.recomputes for c in chosen):
        return mod, [list(c.nodes) for c in chosen]
    blocks = [list(b.bindings) for b in func.body.blocks]
    var_of = lambda n: blocks[sites[n][0]][sites[n][1]].var  # noqa: E731
    replaced: dict[tuple[int, int], relax.VarBinding] = {}
    after: dict[tuple[int, int], list[relax.VarBinding]] = {}   # the copies bound after a node's binding
    copy_of: list[dict[int, relax.Var]] = []
    for k, cand in enumerate(chosen):
        mine = {r: relax.DataflowVar(f"{var_of(r).name}_rc{k}", var_of(r).ty) for r in cand.recomputes}
        copy_of.append(mine)
        if not mine:
            continue
        swap = Rebind({var_of(r): v for r, v in mine.items()})
        for n in cand.nodes:
            binding = blocks[sites[n][0]][sites[n][1]]
            if n in mine:
                after.setdefault(sites[n], []).append(relax.VarBinding(mine[n], swap.visit_expr(binding.value)))
            else:
                replaced[sites[n]] = relax.VarBinding(binding.var, swap.visit_expr(binding.value))
    rebound = []
    for bi in range(len(blocks)):
        bindings = []
        for ki, binding in enumerate(blocks[bi]):
            bindings.append(replaced.get((bi, ki), binding))
            bindings.extend(after.get((bi, ki), ()))
        rebound.append(bindings)
    # a recomputed node's own binding stays only while something still reads it
    used = {v for bindings in rebound for b in bindings for v in var_refs(b.value)} | set(var_refs(func.body.body))
    recomputed = {var_of(r) for c in chosen for r in c.recomputes}
    new_blocks = []
    for old, bindings in zip(func.body.blocks, rebound):
        bindings = [b for b in bindings if b.var not in recomputed or b.var in used]
        new_blocks.append(relax.DataflowBlock(bindings) if isinstance(old, relax.DataflowBlock)
                          else relax.BindingBlock(bindings))
    new_func = relax.Function(list(func.params), relax.SeqExpr(new_blocks, func.body.body), func.ret_ty,
                              func.is_pure, func.attrs)
    index = {new_func.body.blocks[bi].bindings[ki].var: i for i, (bi, ki) in enumerate(call_bindings(new_func))}
    groups = [[index[copy_of[k].get(n, var_of(n))] for n in cand.nodes] for k, cand in enumerate(chosen)]
    return with_functions(mod, {mod.get_global_var(ctx.func_name): new_func}), groups


__all__ = ["Extensible", "RECOMPUTABLE_CLASSES", "copy_recomputed", "recomputable_nodes", "recomputing_candidates"]
