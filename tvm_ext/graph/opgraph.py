"""OpGraph: a read-only operator graph over a legalized Relax function.

One :class:`OpNode` per ``call_tir`` (or external / unlegalized call), one :class:`TensorInfo`
per tensor flowing between them. Calls of fused ``Primitive`` Relax functions (after
``FuseOps``) are expanded into their member nodes, which then carry the group's name, so
the same view serves before and after fusion. A fused function called from several places
gives one group per call site: ``f``, then ``f#1``, ``f#2`` ...

Example
-------
>>> mod = relax.transform.LegalizeOps()(mod)
>>> graph = OpGraph.from_module(mod)
>>> [n.func_name for n in graph.nodes]
['matmul', 'softmax', 'layer_norm']
"""
from __future__ import annotations

import enum
import functools
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable

import tvm
from tvm import relax, tirx

from .classify import OpClass, classify, func_flops, has_contraction
from .gather import gathered_reads

#: SOUFFLE's default: below this many flops per byte an operator is memory-intensive.
DEFAULT_INTENSITY_THRESHOLD = 3.0

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


class TensorKind(str, enum.Enum):
    """Where a tensor comes from and goes to."""

    INPUT = "input"
    CONSTANT = "constant"
    INTERMEDIATE = "intermediate"
    OUTPUT = "output"


@dataclass(frozen=True)
class TensorInfo:
    """A tensor edge of the graph."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: TensorKind
    producer: int | None
    consumers: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        """Size in bytes (sub-byte dtypes round up per element)."""
        return _num_elements(self.shape) * element_bytes(self.dtype)


@dataclass(frozen=True)
class OpNode:
    """One operator: a ``call_tir`` of a PrimFunc, or an opaque call."""

    index: int
    name: str
    func_name: str
    func: tirx.PrimFunc | None
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    pattern: int | None
    op_class: OpClass
    flops: int
    bytes_read: int
    bytes_written: int
    memory_intensive: bool
    group: str | None = None
    #: (tensor, bytes) for inputs the node only gathers from (data-dependent indices): it reads at
    #: most that many bytes of them (:func:`~tvm_ext.graph.gather.gathered_reads`); every other
    #: input is read whole.
    gathered: tuple[tuple[str, int], ...] = ()
    #: The Relax call this node was legalized from (``R.matmul(x, w)``), when the graph was built
    #: with the pre-legalization function (``OpGraph.from_module(..., origin=...)``); else None.
    origin: relax.Call | None = field(default=None, compare=False)

    @functools.cached_property
    def contracts(self) -> bool:
        """Whether its PrimFunc has a contraction block (:func:`~tvm_ext.graph.classify.has_contraction`;
        asked tens of thousands of times while planning BERT-base, 4.7 s uncached)."""
        return self.func is not None and has_contraction(self.func)

    @property
    def arithmetic_intensity(self) -> float:
        """Flops per byte of unfused global traffic."""
        moved = self.bytes_read + self.bytes_written
        return self.flops / moved if moved else 0.0

    def reads(self, tensor: str, nbytes: int) -> int:
        """Bytes of input ``tensor`` (``nbytes`` in all) this node reads."""
        return min(nbytes, dict(self.gathered).get(tensor, nbytes))


@dataclass
class _Builder:
    mod: tvm.IRModule
    threshold: float
    nodes: list[dict] = field(default_factory=list)
    tensors: dict[str, dict] = field(default_factory=dict)
    names: dict = field(default_factory=dict)  # relax Var -> tensor name, or tuple of names
    group_uses: dict = field(default_factory=dict)  # fused function name -> call sites expanded so far
    origins: dict = field(default_factory=dict)  # binding var -> its pre-legalization value

    def unique(self, hint: str, also_taken: frozenset[str] | set[str] = frozenset()) -> str:
        """``hint``, suffixed ``_k`` if a tensor (or a name in ``also_taken``) has it already."""
        name, k = hint or "t", 0
        while name in self.tensors or name in also_taken:
            k += 1
            name = f"{hint}_{k}"
        return name

    def new_tensor(self, hint: str, ty, kind: TensorKind, producer: int | None) -> str:
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise ValueError(f"OpGraph needs static tensor types; '{hint}' has type {ty}")
        dims = []
        for dim in ty.shape.values:
            if not isinstance(dim, tirx.IntImm):
                raise ValueError(f"OpGraph needs static shapes; '{hint}' has dimension {dim}")
            dims.append(int(dim.value))
        name = self.unique(hint)
        self.tensors[name] = {"shape": tuple(dims), "dtype": str(ty.dtype), "kind": kind,
                              "producer": producer, "consumers": []}
        return name

    def operand(self, expr) -> tuple[str, ...]:
        """Tensor names an argument expression stands for."""
        if isinstance(expr, relax.Var):
            if expr not in self.names:
                raise ValueError(f"variable '{expr.name}' is used before it is defined")
            got = self.names[expr]
            return got if isinstance(got, tuple) else (got,)
        if isinstance(expr, tvm.ir.Constant):
            if not isinstance(expr.ty, relax.TensorType):
                return ()
            return (self.new_tensor("const", expr.ty, TensorKind.CONSTANT, None),)
        if not isinstance(expr.ty, (relax.TensorType, relax.TupleType)):
            return ()  # shapes, prim values, strings: no tensor data flows through them
        if isinstance(expr, relax.Tuple):
            return tuple(n for f in expr.fields for n in self.operand(f))
        raise ValueError(f"unsupported operand {type(expr).__name__} in OpGraph")

    def bind_outputs(self, var, ty, producer: int) -> tuple[str, ...]:
        if not isinstance(ty, (relax.TensorType, relax.TupleType)):
            self.names[var] = ()  # e.g. shape_of: a node with no tensor output
            return ()
        if isinstance(ty, relax.TupleType):
            outs = tuple(self.new_tensor(f"{var.name}.{i}", f, TensorKind.INTERMEDIATE, producer)
                         for i, f in enumerate(ty.fields))
            self.names[var] = outs
        else:
            outs = (self.new_tensor(var.name, ty, TensorKind.INTERMEDIATE, producer),)
            self.names[var] = outs[0]
        return outs

    def add_node(self, var, func_name: str, func, args: tuple[str, ...], ty, group: str | None) -> None:
        index = len(self.nodes)
        outs = self.bind_outputs(var, ty, index)
        pattern = None
        if func is not None and func.attrs is not None and "op_pattern" in func.attrs:
            pattern = int(func.attrs["op_pattern"])
        op_class = classify(func, pattern)
        flops = func_flops(func) if func is not None else 0
        gathered = _gathered(func, args, self.tensors)
        read = sum(min(self.tensor_bytes(t), gathered.get(t, self.tensor_bytes(t))) for t in dict.fromkeys(args))
        written = sum(self.tensor_bytes(t) for t in outs)
        moved = read + written
        intensity = flops / moved if moved else 0.0
        self.nodes.append(dict(index=index, name=outs[0].split(".")[0] if outs else self.unique(var.name, {n["name"] for n in self.nodes}), func_name=func_name, func=func,
                               inputs=args, outputs=outs, pattern=pattern, op_class=op_class,
                               flops=flops, bytes_read=read, bytes_written=written,
                               memory_intensive=op_class != OpClass.OPAQUE and intensity < self.threshold,
                               group=group, gathered=tuple(gathered.items()),
                               origin=self.origins.get(var) if group is None else None))
        for t in dict.fromkeys(args):
            self.tensors[t]["consumers"].append(index)

    def tensor_bytes(self, name: str) -> int:
        t = self.tensors[name]
        return _num_elements(t["shape"]) * element_bytes(t["dtype"])

    def visit_function(self, func: relax.Function, group: str | None) -> tuple[str, ...]:
        body = func.body
        for block in body.blocks:
            for binding in block.bindings:
                self.visit_binding(binding.var, binding.value, group)
        return self.operand(body.body)

    def visit_binding(self, var, value, group: str | None) -> None:
        if not isinstance(value, relax.Call) and not isinstance(var.ty, (relax.TensorType, relax.TupleType)):
            self.names[var] = ()  # a shape / prim value binding
        elif isinstance(value, (relax.Var, relax.Tuple, tvm.ir.Constant)):
            names = self.operand(value)
            self.names[var] = names if isinstance(value, relax.Tuple) else names[0]
        elif isinstance(value, relax.TupleGetItem):
            self.names[var] = self.operand(value.tuple_value)[value.index]
        elif isinstance(value, relax.Call) and value.op.same_as(_CALL_TIR):
            gvar = value.args[0]
            self.add_node(var, gvar.name_hint, self.mod[gvar], self.operand(value.args[1]), var.ty, group)
        elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.GlobalVar):
            callee = self.mod[value.op]
            if isinstance(callee, relax.Function) and _is_primitive(callee):
                self.expand_group(var, value.op.name_hint, callee, value.args)
            else:
                self.opaque(var, value.op.name_hint, value, group)
        elif isinstance(value, relax.Call):
            self.opaque(var, _op_name(value), value, group)
        else:
            raise ValueError(f"unsupported binding value {type(value).__name__} for '{var.name}'")

    def expand_group(self, var, name: str, callee: relax.Function, args) -> None:
        # One group per call site: a fused function called twice gives "f" and "f#1".
        uses = self.group_uses.get(name, 0)
        self.group_uses[name] = uses + 1
        group = name if uses == 0 else f"{name}#{uses}"
        for param, arg in zip(callee.params, args):
            got = self.operand(arg)
            self.names[param] = got if isinstance(param.ty, relax.TupleType) else got[0]
        result = self.visit_function(callee, group)
        self.names[var] = result if isinstance(var.ty, relax.TupleType) else result[0]

    def opaque(self, var, name: str, call, group: str | None) -> None:
        args = tuple(n for a in call.args if isinstance(a, (relax.Var, tvm.ir.Constant, relax.Tuple))
                     for n in self.operand(a))
        self.add_node(var, name, None, args, var.ty, group)


def _gathered(func: tirx.PrimFunc | None, args: tuple[str, ...], tensors: dict) -> dict[str, int]:
    """Bytes of each argument ``func`` only gathers from (its parameters follow ``args`` in order);
    an argument passed twice, once read whole, is read whole."""
    if func is None:
        return {}
    bound = gathered_reads(func)
    out: dict[str, int] = {}
    for k, t in enumerate(args):
        if k not in bound:
            out[t] = -1
        elif out.get(t, 0) >= 0:
            out[t] = out.get(t, 0) + bound[k] * element_bytes(tensors[t]["dtype"])
    return {t: b for t, b in out.items() if b >= 0}


def _is_primitive(func: relax.Function) -> bool:
    return func.attrs is not None and "Primitive" in func.attrs and bool(func.attrs["Primitive"])


def _op_name(call: relax.Call) -> str:
    op = call.op
    if isinstance(op, tvm.ir.Op):
        if op.name in ("relax.call_dps_packed", "relax.call_pure_packed") and call.args:
            first = call.args[0]
            return str(getattr(first, "global_symbol", first))
        return op.name
    return getattr(op, "name_hint", type(op).__name__)


def _num_elements(shape: Iterable[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def element_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (sub-byte types round up).

    Examples
    --------
    >>> element_bytes("float16")
    2
    """
    return _element_bytes(str(dtype))


@functools.cache
def _element_bytes(dtype: str) -> int:
    t = tvm.runtime.DataType(dtype)
    return max(1, (t.bits * max(1, t.lanes) + 7) // 8)


class OpGraph:
    """Operator graph of one Relax function; see the module docstring."""

    def __init__(self, nodes: Iterable[OpNode], tensors: Iterable[TensorInfo]):
        self.nodes: tuple[OpNode, ...] = tuple(nodes)
        self.tensors: dict[str, TensorInfo] = {t.name: t for t in tensors}
        self._producers = tuple(tuple(sorted({p for p in (self.tensors[t].producer for t in n.inputs)
                                              if p is not None})) for n in self.nodes)
        self._consumers = tuple(tuple(sorted({c for t in n.outputs for c in self.tensors[t].consumers}))
                                for n in self.nodes)
        self._position: dict[int, int] | None = None
        self._order: tuple[int, ...] | None = None
        self._boundaries: dict[frozenset[int], tuple[tuple[str, ...], tuple[str, ...]]] = {}

    @classmethod
    def from_module(cls, mod: tvm.IRModule, func_name: str = "main",
                    intensity_threshold: float = DEFAULT_INTENSITY_THRESHOLD,
                    origin: relax.Function | None = None) -> "OpGraph":
        """Build the graph of ``mod[func_name]`` (legalized; fused or not).

        ``origin`` is the same function before legalization: ``LegalizeOps`` keeps the binding
        variables, so each node gets the Relax call it came from as :attr:`OpNode.origin`
        (library generators match their patterns on it).
        """
        if func_name not in [gv.name_hint for gv in mod.get_global_vars()]:
            raise KeyError(f"module has no function '{func_name}'")
        func = mod[func_name]
        if not isinstance(func, relax.Function):
            raise TypeError(f"'{func_name}' is not a Relax function")
        b = _Builder(mod, intensity_threshold)
        if origin is not None:
            b.origins = {bd.var: bd.value for block in origin.body.blocks for bd in block.bindings}
        for param in func.params:
            if isinstance(param.ty, relax.TensorType):
                b.names[param] = b.new_tensor(param.name, param.ty, TensorKind.INPUT, None)
        for out in b.visit_function(func, None):
            if b.tensors[out]["kind"] == TensorKind.INTERMEDIATE:
                b.tensors[out]["kind"] = TensorKind.OUTPUT
        tensors = [TensorInfo(name=n, shape=t["shape"], dtype=t["dtype"], kind=t["kind"],
                              producer=t["producer"], consumers=tuple(t["consumers"]))
                   for n, t in b.tensors.items()]
        return cls((OpNode(**n) for n in b.nodes), tensors)

    def __len__(self) -> int:
        return len(self.nodes)

    def node(self, key: int | str) -> OpNode:
        """A node by index or by name."""
        if isinstance(key, int):
            return self.nodes[key]
        for n in self.nodes:
            if n.name == key:
                return n
        raise KeyError(f"no node named '{key}'")

    def producers(self, index: int) -> list[int]:
        """Indices of the nodes producing the inputs of node ``index``."""
        return list(self._producers[index])

    def consumers(self, index: int) -> list[int]:
        """Indices of the nodes reading the outputs of node ``index``."""
        return list(self._consumers[index])

    def topological_order(self) -> list[int]:
        """Node indices, producers before consumers (Kahn's algorithm, stable; computed once, the
        graph's structure does not change)."""
        if self._order is None:
            self._order = tuple(self._kahn())
        return list(self._order)

    def _kahn(self) -> list[int]:
        indegree = {n.index: len(self.producers(n.index)) for n in self.nodes}
        ready = deque(sorted(i for i, d in indegree.items() if d == 0))
        order: list[int] = []
        while ready:
            i = ready.popleft()
            order.append(i)
            for c in self.consumers(i):
                indegree[c] -= 1
                if indegree[c] == 0:
                    ready.append(c)
        if len(order) != len(self.nodes):
            raise ValueError("OpGraph has a cycle")
        return order

    def _positions(self) -> dict[int, int]:
        if self._position is None:
            self._position = {n: k for k, n in enumerate(self.topological_order())}
        return self._position

    def in_topological_order(self, members: Iterable[int]) -> list[int]:
        """``members`` (valid node indices) in topological order, without duplicates: a sort of the
        set, not a scan of the graph (tile enumeration orders the same small groups many times)."""
        pos = self._positions()
        return sorted(set(members), key=pos.__getitem__)

    def is_convex(self, members: Iterable[int]) -> bool:
        """True if no path leaves the node set and re-enters it.

        Only nodes before the set's last member in topological order can lead back into it, so
        the search stops there (linear in the span of the set, not in the graph)."""
        inside = set(members)
        if not inside:
            return True
        pos = self._positions()
        last = max(pos[m] for m in inside)
        frontier = deque(c for m in inside for c in self._consumers[m] if c not in inside and pos[c] < last)
        seen = set(frontier)
        while frontier:
            i = frontier.popleft()
            for c in self._consumers[i]:
                if c in inside:
                    return False
                if c not in seen and pos[c] < last:
                    seen.add(c)
                    frontier.append(c)
        return True

    def read_bytes(self, tensor: str, readers: Iterable[int]) -> int:
        """Bytes of ``tensor`` that ``readers`` (nodes consuming it) read from global memory, once:
        all of it, unless every reader only gathers from it (then at most what they gather)."""
        full = self.tensors[tensor].nbytes
        return min(full, sum(self.nodes[r].reads(tensor, full) for r in readers if tensor in self.nodes[r].inputs))

    def boundary_bytes(self, members: Iterable[int]) -> int:
        """Bytes a node set reads from and writes to global memory: each boundary input as its
        members read it (:meth:`read_bytes`), each escaping output once."""
        inside = set(members)
        inputs, outputs = self.boundary(inside)
        return (sum(self.read_bytes(t, inside) for t in inputs)
                + sum(self.tensors[t].nbytes for t in outputs))

    def boundary(self, members: Iterable[int]) -> tuple[list[str], list[str]]:
        """External input tensors and escaping output tensors of a node set (remembered per set:
        tile planning asks for the same groups' boundaries hundreds of thousands of times)."""
        inside = frozenset(members)
        if inside not in self._boundaries:
            inputs = [t for m in sorted(inside) for t in self.nodes[m].inputs
                      if self.tensors[t].producer not in inside]
            outputs = [t for m in sorted(inside) for t in self.nodes[m].outputs
                       if self.tensors[t].kind == TensorKind.OUTPUT
                       or any(c not in inside for c in self.tensors[t].consumers)]
            self._boundaries[inside] = (tuple(dict.fromkeys(inputs)), tuple(dict.fromkeys(outputs)))
        inputs, outputs = self._boundaries[inside]
        return list(inputs), list(outputs)

    def groups(self) -> dict[str, list[int]]:
        """Fused groups (from ``FuseOps``) by name; ungrouped nodes form singleton groups."""
        out: dict[str, list[int]] = {}
        for n in self.nodes:
            out.setdefault(n.group or n.name, []).append(n.index)
        return out
