"""Compute groups: which nodes a compute node (matmul, conv) keeps in its kernel.

As TVM's ``FuseOps`` does, a compute node keeps the chain of elementwise / broadcast consumers
that follow it (bias, activation, residual). A matmul also keeps the pure data-movement nodes
(reshape, transpose, slice) that only feed it or only follow its epilogue, since dlight's
matmul schedule reads and writes through them. :func:`compute_groups` gives these groups for a
whole graph; the dlight generator proposes them as candidates and the stitch scope keeps
their nodes out of its clusters.

Example
-------
>>> [[graph.nodes[n].func_name for n in g] for g in compute_groups(graph)][:1]
[['reshape', 'matmul', 'add', 'gelu']]
"""
from __future__ import annotations

import heapq

import tvm
import tvm_ffi

from ..graph import OpClass, OpGraph, TensorKind, sblocks

#: TVM op patterns an epilogue may have (``kElemWise``, ``kBroadcast``).
_EPILOGUE_PATTERNS = (0, 1)


def is_compute_intensive(graph: OpGraph, index: int) -> bool:
    """A compute node that is not memory-bound: it bounds stitch groups and keeps its epilogue."""
    return is_compute(graph, index) and not graph.nodes[index].memory_intensive


def is_compute(graph: OpGraph, index: int) -> bool:
    """A compute node: class COMPUTE, or a PrimFunc with a contraction block (a convolution over
    a padded intermediate, which the class test does not see)."""
    node = graph.nodes[index]
    return node.op_class == OpClass.COMPUTE or node.contracts


def _epilogue_eligible(graph: OpGraph, index: int, members: set[int], layout: bool) -> bool:
    """An elementwise / broadcast node reading a member one-to-one (same shape), or (``layout``)
    a layout node whose single input a member produces."""
    node = graph.nodes[index]
    if node.func is None or len(node.outputs) != 1:
        return False
    produced = {t: graph.tensors[t].shape for m in members for t in graph.nodes[m].outputs}
    if layout and is_layout(graph, index):
        return node.inputs[0] in produced
    shape = graph.tensors[node.outputs[0]].shape
    return (node.pattern in _EPILOGUE_PATTERNS and node.op_class in (OpClass.ELEMENTWISE, OpClass.BROADCAST)
            and any(produced.get(t) == shape for t in node.inputs))


def _escaping(graph: OpGraph, members: set[int]) -> set[str]:
    return {t for m in members for t in graph.nodes[m].outputs
            if graph.tensors[t].kind == TensorKind.OUTPUT
            or any(c not in members for c in graph.tensors[t].consumers)}


def epilogue_chain(graph: OpGraph, index: int, taken: set[int], position: dict[int, int],
                    layout: bool = False) -> list[int]:
    """Consumers a compute node absorbs, as ``FuseOps`` does (plus layout nodes if ``layout``).

    Grows the set from the compute node through elementwise / broadcast consumers that read a
    member one-to-one (diamonds such as GELU included) and, with ``layout``, through reshapes and
    transposes; keeps the largest prefix whose only escaping tensor is its last node's output.
    """
    head = graph.nodes[index]
    if len(head.outputs) != 1:
        return []
    members = {index}
    added: list[int] = []
    best: list[int] = []
    pending = [(position[c], c) for c in graph.consumers(index)]
    heapq.heapify(pending)
    while pending:
        _, nxt = heapq.heappop(pending)
        if nxt in members:
            continue
        if nxt in taken or not _epilogue_eligible(graph, nxt, members, layout):
            break
        members.add(nxt)
        added.append(nxt)
        if _escaping(graph, members) <= set(graph.nodes[nxt].outputs) and graph.is_convex(members):
            best = list(added)
        for c in graph.consumers(nxt):
            if c not in members:
                heapq.heappush(pending, (position[c], c))
    return best


def is_layout(graph: OpGraph, index: int) -> bool:
    """A pure data-movement node (reshape, transpose, slice, ...): one tensor in, one out, and a
    single block that stores a single load (a resize, which interpolates, does not qualify). A
    slice from offset 0 is classified elementwise and counts; a same-shape copy (a no-op cast)
    does not: it stays with the memory-intensive op it follows."""
    node = graph.nodes[index]
    if node.func is None or len(node.outputs) != 1 or len(set(node.inputs)) != 1:
        return False
    sliced = graph.tensors[node.outputs[0]].shape != graph.tensors[node.inputs[0]].shape
    if not (node.op_class == OpClass.INJECTIVE or (node.op_class == OpClass.ELEMENTWISE and sliced)):
        return False
    blocks = sblocks(node.func)
    if len(blocks) != 1:
        return False
    stores: list = []
    tvm_ffi.structural_walk(blocks[0][0].body, (tvm.tirx.BufferStore, stores.append))
    return len(stores) == 1 and isinstance(stores[0].value, tvm.ir.TensorLoad)


def is_matmul(graph: OpGraph, index: int) -> bool:
    """A single-block contraction without windows (dlight's matmul rule reads and writes through layouts)."""
    func = graph.nodes[index].func
    if func is None:
        return False
    blocks = sblocks(func)
    if len(blocks) != 1:
        return False
    loads: list = []
    tvm_ffi.structural_walk(blocks[0][0].body, (tvm.ir.TensorLoad, loads.append))
    return all(isinstance(i, (tvm.ir.Var, tvm.tirx.IntImm)) for ld in loads for i in ld.indices)


def _only_feeds(graph: OpGraph, index: int, members: set[int]) -> bool:
    return all(graph.tensors[t].kind != TensorKind.OUTPUT and set(graph.tensors[t].consumers) <= members
               for t in graph.nodes[index].outputs)


def layout_prologue(graph: OpGraph, index: int, taken: set[int]) -> list[int]:
    """Layout nodes feeding only the compute node (transitively): its operand prologue."""
    members = {index}
    todo = list(graph.producers(index))
    found: list[int] = []
    while todo:
        p = todo.pop()
        if p in members or p in taken or not is_layout(graph, p) or not _only_feeds(graph, p, members):
            continue
        members.add(p)
        found.append(p)
        todo.extend(graph.producers(p))
    return found


def compute_groups(graph: OpGraph, *, absorb_layout: bool = True) -> list[list[int]]:
    """Every compute-intensive node with its epilogue chain (and, for a matmul with
    ``absorb_layout``, its layout prologue and the layout nodes after its epilogue), in
    topological order of their compute nodes; nodes are taken once. Compute nodes that keep
    nothing are not listed."""
    order = graph.topological_order()
    position = {n: k for k, n in enumerate(order)}
    taken: set[int] = set()
    groups: list[list[int]] = []
    for i in order:
        if graph.nodes[i].func is None or not is_compute_intensive(graph, i) or i in taken:
            continue
        layout = absorb_layout and is_matmul(graph, i)
        chain = epilogue_chain(graph, i, taken, position, layout)
        if layout:
            prologue = layout_prologue(graph, i, taken | set(chain))
            if prologue and graph.is_convex(set(prologue) | {i} | set(chain)):
                chain = prologue + chain
        if chain:
            members = set([i] + chain)
            groups.append([n for n in order if n in members])
            taken.update(members)
    return groups


__all__ = ["compute_groups", "epilogue_chain", "is_compute", "is_compute_intensive", "is_layout", "is_matmul",
           "layout_prologue"]
