"""What generators see while they propose candidates: :class:`SelectionContext`.

Besides the graph, the device and the target, the context builds the fused PrimFunc a node
set would become (:meth:`SelectionContext.fused_function`: the set's bindings alone in a small
module, emitted as one ``Primitive`` function and run through ``FuseTIR``, exactly as the
final module will be) and caches it by a structural *signature* of the set, so that identical
layers (BERT's twelve) are fused and planned once. Plans keyed by structure alone
(:meth:`SelectionContext.shared_memo`) are also shared by the contexts of one build: its
graph-stage runs with and without a rewrite (:mod:`tvm_ext.driver.graph_choice`) and its
re-selection rounds plan each group once. Each generator spends planning work from its
:meth:`~SelectionContext.meter` (:mod:`tvm_ext.select.budget`).

Example
-------
>>> ctx = SelectionContext(legalized, "main", graph, load_device("h100"), target)
>>> func = ctx.fused_function((12, 13, 14))
>>> ctx.memo(("stitch", ctx.signature((12, 13, 14))), lambda: plan_prim_func(func, ctx.device))
"""
from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any, NamedTuple, TypeVar

import tvm
import tvm_ffi
from tvm import relax, tirx

from ..errors import TVM_ERRORS
from ..graph import OpGraph
from ..hardware import DeviceSpec
from .budget import UNLIMITED, BudgetMeter, PlanningBudget
from .emit import EmitError, Rebind, call_bindings, emit_groups, var_refs
from .plan import plan_to_text

T = TypeVar("T")


class SelectionContext:
    """One Relax function under selection (see the module docstring).

    Parameters
    ----------
    mod : tvm.IRModule
        The legalized module (one ``call_tir`` per node).
    func_name : str
        The Relax function the graph was built from.
    graph : OpGraph
        Its operator graph (with pre-legalization origins when the driver recorded them).
    device : DeviceSpec
        The device kernels are planned for.
    target : tvm.target.Target
        The compilation target.
    origin : relax.Function, optional
        The function before legalization (library generators match their patterns on it).
    shared : dict, optional
        Plans by structure shared with other contexts of the same build (:meth:`shared_memo`).
    budget : PlanningBudget, optional
        The preset's planning budget (default: unlimited).
    """

    def __init__(self, mod: tvm.IRModule, func_name: str, graph: OpGraph, device: DeviceSpec,
                 target: tvm.target.Target, origin: relax.Function | None = None, *,
                 shared: dict | None = None, budget: PlanningBudget | None = None):
        self.mod = mod
        self.func_name = func_name
        self.graph = graph
        self.device = device
        self.target = target
        self.origin = origin
        self._node_of_var: dict | None = None
        self._site: list | None = None
        #: (generator, nodes, reason) of every candidate a generator could not plan.
        self.dropped: list[tuple[str, tuple[int, ...], str]] = []
        #: Candidates the generators before the current one proposed (a later generator may
        #: build on them: stitch groups around what a library kernel leaves of an epilogue).
        self.proposed: list = []
        #: Lines generators want in the selection report (enumeration counts, caps hit).
        self.notes: list[str] = []
        self._func_hash: dict[str, int] = {}
        self._signatures: dict[tuple, tuple] = {}
        self._memo: dict[Hashable, Any] = {}
        self._shared = self._memo if shared is None else shared
        self.budget = budget or UNLIMITED
        self._meters: dict[str, BudgetMeter] = {}
        self._refs: _References | None = None
        self._order = {n: k for k, n in enumerate(graph.topological_order())}

    def call_nodes(self) -> list[int]:
        """Nodes computed by a PrimFunc (``call_tir``), in topological order."""
        return [n for n in self.graph.topological_order() if self.graph.nodes[n].func is not None]

    def node_of_var(self, var: relax.Var) -> int | None:
        """The node whose binding defines ``var`` (legalization keeps the variables of the
        function it came from, so an origin binding's variable finds its node); None if no node
        defines it (a binding folded into a constant)."""
        if self._node_of_var is None:
            func = self.mod[self.func_name]
            self._node_of_var = {func.body.blocks[bi].bindings[ki].var: n
                                 for n, (bi, ki) in enumerate(call_bindings(func))}
        return self._node_of_var.get(var)

    def ordered(self, nodes: Iterable[int]) -> tuple[int, ...]:
        """``nodes`` in topological order, without duplicates."""
        return tuple(sorted(set(nodes), key=self._order.__getitem__))

    def in_binding_order(self, nodes: Iterable[int]) -> tuple[int, ...]:
        """``nodes`` in the order of their bindings, the order in which ``FuseTIR`` writes their
        statements into the fused function (:meth:`fused_function`); it can differ from the
        topological order :meth:`ordered` gives (Kahn's, breadth first)."""
        if self._site is None:
            self._site = call_bindings(self.mod[self.func_name])
        return tuple(sorted(set(nodes), key=self._site.__getitem__))

    def drop(self, generator: str, nodes: Iterable[int], reason: str) -> None:
        """Record a candidate ``generator`` could not plan (reports list them)."""
        self.dropped.append((generator, self.ordered(nodes), reason))

    def memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """``compute()`` once per ``key`` for this context (plans, schedules, costs)."""
        if key not in self._memo:
            self._memo[key] = compute()
        return self._memo[key]

    def shared_memo(self, key: Hashable, compute: Callable[[], T]) -> T:
        """:meth:`memo` for a ``key`` made of structure only (a :meth:`signature`, a plan), shared
        with the other contexts of the build for the same device and target."""
        full = ("shared", self.device.name, str(self.target), key)
        if full not in self._shared:
            self._shared[full] = compute()
        return self._shared[full]

    def has_shared(self, key: Hashable) -> bool:
        """Whether :meth:`shared_memo` already holds ``key`` (asking for it again is free)."""
        return ("shared", self.device.name, str(self.target), key) in self._shared

    def meter(self, generator: str) -> BudgetMeter:
        """The planning budget of ``generator`` on this function (made on first use, scaled by
        the call nodes; its seconds count from then). It is the build's: what the generator spent
        on a function of this name in earlier runs of the build (a graph stage run twice, a
        re-selection round) is spent (:meth:`finish`); what they planned is free
        (:meth:`has_shared`)."""
        if generator not in self._meters:
            spent = self._shared.get(("budget spent", self.func_name, generator), (0.0, 0.0))
            self._meters[generator] = self.budget.meter(generator, len(self.call_nodes()), spent=spent)
        return self._meters[generator]

    def finish(self, generator: str) -> tuple[float, float]:
        """``generator`` is done with this function: the work units it has charged to its planning
        budget over the build, and the share of the budget that is (:attr:`BudgetMeter.share`);
        (0, 0) if it never metered. Later runs on the function start from what it spent."""
        meter = self._meters.get(generator)
        if meter is None:
            return 0.0, 0.0
        self._shared[("budget spent", self.func_name, generator)] = (meter.work, meter.seconds)
        if meter.exhausted and not any(n.startswith(f"{generator}: budget exhausted") for n in self.notes):
            self.notes.append(meter.note_spent())     # the report says so whichever run it shows
        return meter.work, meter.share

    def _hash(self, func_name: str) -> int:
        if func_name not in self._func_hash:
            self._func_hash[func_name] = tvm_ffi.structural_hash(self.graph_func(func_name))
        return self._func_hash[func_name]

    def graph_func(self, func_name: str) -> tirx.PrimFunc:
        """A PrimFunc of the module by name."""
        return self.mod[func_name]

    def signature(self, nodes: Iterable[int], recomputes: Iterable[int] = ()) -> tuple:
        """A hashable key equal for node sets that fuse into the same PrimFunc.

        Per member (topological order): its PrimFunc's structural hash, where each input comes
        from (a member's output, or an outside tensor of some shape and dtype) and whether each
        output leaves the set (never for the members it ``recomputes``).
        """
        members = self.ordered(nodes)
        recomputed = set(recomputes)
        asked = (members, frozenset(recomputed))
        if asked not in self._signatures:       # asked again and again while planning
            self._signatures[asked] = self._signature(members, recomputed)
        return self._signatures[asked]

    def _signature(self, members: tuple[int, ...], recomputed: set[int]) -> tuple:
        position = {n: k for k, n in enumerate(members)}
        parts = []
        for n in members:
            node = self.graph.nodes[n]
            sources = []
            for t in node.inputs:
                info = self.graph.tensors[t]
                if info.producer in position:
                    sources.append(("m", position[info.producer], self.graph.nodes[info.producer].outputs.index(t)))
                else:
                    sources.append(("x", info.shape, info.dtype, info.kind.value))
            escapes = tuple(n not in recomputed and (any(c not in position for c in self.graph.tensors[t].consumers)
                                                     or self.graph.tensors[t].kind.value == "output")
                            for t in node.outputs)
            parts.append((self._hash(node.func_name) if node.func is not None else node.func_name,
                          tuple(sources), escapes))
        return tuple(parts)

    def kernel_key(self, nodes: Iterable[int], plan, recomputes: Iterable[int] = ()) -> str:
        """The measurement-database key of a TIR kernel (:func:`kernel_key`)."""
        members = self.ordered(nodes)
        recomputes = tuple(recomputes)
        return self.shared_memo(("kernel_key", self.signature(members, recomputes), plan_to_text(plan)),
                                lambda: kernel_key(self.fused_function(members, recomputes), plan))

    def _references(self) -> _References:
        """:func:`references` of the function selected over, computed on first use."""
        if self._refs is None:
            self._refs = references(self.mod[self.func_name])
        return self._refs

    def fused_function(self, nodes: Iterable[int], recomputes: Iterable[int] = ()) -> tirx.PrimFunc:
        """The PrimFunc ``FuseTIR`` makes of ``nodes`` (a node's own PrimFunc when alone); the
        values of the members it ``recomputes`` stay inside it.

        Raises
        ------
        EmitError
            The set is not convex, spans binding blocks, holds a node without a PrimFunc, or
            TVM's ``FuseTIR`` cannot fuse it.
        """
        members = self.ordered(nodes)
        recomputes = tuple(recomputes)
        if any(self.graph.nodes[n].func is None for n in members):
            raise EmitError("a node without a PrimFunc (an external call) cannot be fused")
        if len(members) == 1:
            return self.graph.nodes[members[0]].func
        return self.memo(("fused", self.signature(members, recomputes)),
                         lambda: fuse_nodes(self.mod, self.func_name, members, recomputes, self._references()))


def kernel_key(func: tirx.PrimFunc, plan) -> str:
    """The measurement-database key of a TIR kernel: a hash of its unscheduled fused function's
    structure (without tvm_ext's own attributes) and its plan. Equal for BERT's twelve identical
    layers and stable across runs; the report computes the same key for the built kernel."""
    if func.attrs is not None:
        for key in [str(k) for k in func.attrs.keys() if str(k).startswith("tvm_ext.") or str(k) == "global_symbol"]:
            func = func.without_attr(key)
    text = f"{tvm_ffi.structural_hash(func)}|{plan_to_text(plan)}"
    return hashlib.sha1(text.encode()).hexdigest()[:24]


def fuse_nodes(mod: tvm.IRModule, func_name: str, nodes: Sequence[int], recomputes: Sequence[int] = (),
               refs: _References | None = None) -> tirx.PrimFunc:
    """Fuse the call bindings ``nodes`` of ``mod[func_name]`` into one PrimFunc, in a module of
    their own (see :func:`subgraph_module`).

    Raises
    ------
    EmitError
        The nodes span several binding blocks, or ``FuseTIR`` fails on them or returns an
        ill-formed function.
    """
    sub = subgraph_module(mod, func_name, nodes, recomputes, refs)
    fused, given = emit_groups(sub, [list(range(len(nodes)))], func_name="main", names=["fused_candidate"])
    try:
        fused = relax.transform.FuseTIR()(fused)
    except TVM_ERRORS as err:  # e.g. two views of one value with different buffer types
        first = (str(err).strip().splitlines() or [""])[0]
        raise EmitError(f"TVM's FuseTIR cannot fuse these {len(nodes)} nodes: {first[:200]}") from None
    func = fused[given[0]]
    params = list(func.params)
    if any(a.same_as(b) for i, a in enumerate(params) for b in params[i + 1:]):
        # one value read through two views (e.g. reshapes) can come out as one buffer in two params
        raise EmitError(f"TVM's FuseTIR made an ill-formed function of these {len(nodes)} nodes "
                        "(one buffer bound to two parameters)")
    return func


class _References(NamedTuple):
    """Which variables each binding of a Relax function reads, and who reads each variable."""

    sites: list[tuple[int, int]]                      # (block, binding) of each call node
    of: dict[tuple[int, int], list]                   # (block, binding) -> variables it reads
    readers: dict[Any, set[tuple[int, int]]]          # variable -> (block, binding) reading it
    returned: set                                     # variables the function's body returns


def references(func: relax.Function) -> _References:
    """:class:`_References` of ``func``: every candidate set of a model is cut out of the same
    function, and walking all its bindings for each one made fusing a set linear in the model's
    size, so a :class:`SelectionContext` computes them once and hands them to
    :func:`subgraph_module`."""
    of: dict[tuple[int, int], list] = {}
    readers: dict[Any, set[tuple[int, int]]] = {}
    for bi, block in enumerate(func.body.blocks):
        for k, binding in enumerate(block.bindings):
            of[(bi, k)] = var_refs(binding.value)
            for r in of[(bi, k)]:
                readers.setdefault(r, set()).add((bi, k))
    return _References(call_bindings(func), of, readers, set(var_refs(func.body.body)))


def subgraph_module(mod: tvm.IRModule, func_name: str, nodes: Sequence[int],
                    recomputes: Sequence[int] = (), refs: _References | None = None) -> tvm.IRModule:
    """A module whose ``main`` holds only the call bindings ``nodes`` of ``mod[func_name]`` (and
    the tuple bindings between them), with every outside value as a parameter and every value
    read outside the set as an output, except the values of ``recomputes`` (computed here for
    the set only); the PrimFuncs they call come along.

    Raises
    ------
    EmitError
        The nodes span several binding blocks.
    """
    func = mod[func_name]
    refs = refs or references(func)     # ``refs``: :func:`references` of ``mod[func_name]``, computed once
    sites = refs.sites
    where = {sites[n][0] for n in nodes}
    if len(where) != 1:
        raise EmitError(f"nodes {list(nodes)} span binding blocks {sorted(where)}")
    block_index = where.pop()
    block = func.body.blocks[block_index]
    chosen = {sites[n][1] for n in nodes}
    kept: list = []
    kept_at: dict[tuple[int, int], None] = {}      # (block, binding) of each kept binding, in order
    defined: set = set()
    for k, binding in enumerate(block.bindings):
        read = refs.of[(block_index, k)]
        if k in chosen or (not isinstance(binding.value, relax.Call) and read and all(r in defined for r in read)):
            kept.append(binding)
            kept_at[(block_index, k)] = None
            defined.add(binding.var)
    internal = [block.bindings[sites[n][1]].var for n in recomputes]
    # a value read by a binding outside the set, or returned, escapes
    escaping = [b.var for b in kept if (b.var in refs.returned or not refs.readers.get(b.var, set()) <= kept_at.keys())
                and not any(b.var.same_as(v) for v in internal)] or [kept[-1].var]
    # an alias of a value that escapes too is not returned again (as in emission: ``emit_groups``)
    inside_reads = {r for at in kept_at for r in refs.of[at]}
    twice = {b.var for b in kept if isinstance(b.value, relax.Var) and b.value in escaping and b.var in escaping
             and b.var not in inside_reads}
    escaping = [v for v in escaping if v not in twice]
    mapping: dict = {}
    params: list = []
    for at in kept_at:
        for r in refs.of[at]:
            if r not in defined and r not in mapping:
                mapping[r] = relax.Var(r.name, r.ty)
                params.append(mapping[r])
    # values read outside become block outputs (plain Vars); the function returns them as a tuple
    for var in escaping:
        mapping[var] = relax.Var(var.name, var.ty)
    for var in internal:    # recomputed here, for the set only: never an output of the block
        mapping[var] = relax.DataflowVar(var.name, var.ty)
    rebind = Rebind(mapping)
    bindings = [relax.VarBinding(mapping.get(b.var, b.var), rebind.visit_expr(b.value)) for b in kept]
    result = relax.Tuple([mapping[v] for v in escaping])
    body = relax.SeqExpr([relax.DataflowBlock(bindings)], result)
    main = relax.Function(params, body, relax.TupleType([v.ty for v in escaping]), True).with_attr(
        "global_symbol", "main")
    callees = {}
    for binding in kept:
        value = binding.value
        if isinstance(value, relax.Call) and isinstance(value.args[0] if value.args else None, tvm.ir.GlobalVar):
            callees[value.args[0]] = mod[value.args[0]]
    return tvm.IRModule({**callees, tvm.ir.GlobalVar("main"): main})


__all__ = ["SelectionContext", "fuse_nodes", "kernel_key", "subgraph_module"]
