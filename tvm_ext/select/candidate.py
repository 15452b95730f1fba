"""Candidate kernels: what every generator proposes to the selector.

A :class:`Candidate` is a convex set of OpGraph nodes that one generator offers to compute as
one kernel (or one library call), with the plan it would build, the kernel's boundary tensors,
its work and global traffic, and its launch shape. The cost model prices candidates; the
selector picks a cover of the graph; the emitter turns the chosen ones into functions carrying
their plans.

Example
-------
>>> cand = Candidate.of(graph, (3, 4, 5), plan, global_bytes=2 ** 20,
...                     launch=LaunchShape(grid=132, threads=256), code_path=CodePath.SIMT)
>>> cand.generator, cand.inputs
('stitch', ('lv2', 'gamma', 'beta'))
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable

from ..graph import OpGraph, weighted_dtype
from .plan import Plan


class CodePath(str, enum.Enum):
    """How a kernel's arithmetic runs: the cost model prices each at its own efficiency."""

    #: CUDA cores, scalar or vector loads (elementwise, reductions).
    SIMT = "simt"
    #: CUDA cores running a contraction one output per thread, operands read from global memory
    #: (through L1) at every step, no register tiling: stitch's GEMM prologues, tile-graph kernels.
    SIMT_CONTRACTION = "simt_contraction"
    #: Tensor-core WMMA fragments, one 16x16 output fragment per warp at a time, operands staged
    #: whole per tile in shared memory, no pipelining: the GEMM stages of tile-graph kernels.
    WMMA_TILE = "wmma_tile"
    #: Tensor-core WMMA fragments in TVM's own tensorized schedules: dlight's Matmul rule (and the
    #: GEMM stages subprogram kernels build with it), operands staged through shared memory.
    WMMA = "wmma"
    #: Warp-level tensor-core MMA (``mma.sync``) of a library's pipelined kernels: CUTLASS 2.x.
    MMA_SYNC = "mma_sync"
    #: Hopper warp-group MMA fed by TMA: CUTLASS 3.x.
    WGMMA = "wgmma"


@dataclass(frozen=True)
class LaunchShape:
    """How one call of a kernel launches.

    Attributes
    ----------
    grid : int
        Thread blocks of the (largest) launch.
    threads : int
        Threads per block.
    shared_bytes : int
        Shared memory per block.
    registers : int or None
        Registers per thread when known (a register cap or a library's figure), else None.
    kernels : int
        Kernel launches one call makes (a dlight fallback may launch one per block).
    grid_syncs : int
        In-kernel grid barriers (cooperative launch).
    """

    grid: int
    threads: int
    shared_bytes: int = 0
    registers: int | None = None
    kernels: int = 1
    grid_syncs: int = 0

    def to_json(self) -> dict:
        """JSON-serialisable form."""
        return {"grid": self.grid, "threads": self.threads, "shared_bytes": self.shared_bytes,
                "registers": self.registers, "kernels": self.kernels, "grid_syncs": self.grid_syncs}

    @classmethod
    def from_json(cls, data: dict) -> "LaunchShape":
        """Inverse of :meth:`to_json`."""
        return cls(**{k: (None if v is None else int(v)) for k, v in dict(data).items()})


@dataclass(frozen=True)
class StageWork:
    """One stage of a multi-stage kernel, as the cost model reads it (the fields of a kernel).

    ``launch`` is the stage's own grid and block (its virtual blocks); it launches nothing.
    """

    flops: int
    global_bytes: int
    launch: LaunchShape
    code_path: CodePath = CodePath.SIMT
    dtype: str = "float32"
    unique_bytes: int = 0
    dram_bytes: int = 0

    def __post_init__(self) -> None:
        if self.unique_bytes <= 0:
            object.__setattr__(self, "unique_bytes", self.global_bytes)

    def to_json(self) -> dict:
        """JSON-serialisable form."""
        return {"flops": self.flops, "global_bytes": self.global_bytes, "launch": self.launch.to_json(),
                "code_path": self.code_path.value, "dtype": self.dtype, "unique_bytes": self.unique_bytes,
                "dram_bytes": self.dram_bytes}

    @classmethod
    def from_json(cls, data: dict) -> "StageWork":
        """Inverse of :meth:`to_json`."""
        return cls(int(data["flops"]), int(data["global_bytes"]), LaunchShape.from_json(data["launch"]),
                   CodePath(str(data["code_path"])),
                   str(data["dtype"]), int(data.get("unique_bytes", 0)), int(data.get("dram_bytes", 0)))


@dataclass(frozen=True)
class Candidate:
    """One kernel a generator proposes.

    Attributes
    ----------
    nodes : tuple of int
        OpGraph node indices (convex), in topological order.
    plan : Plan
        What the generator will build if the candidate is chosen.
    inputs, outputs : tuple of str
        Boundary tensors: read from and written to global memory.
    flops : int
        Floating-point work of one call.
    global_bytes : int
        Global-memory traffic of one call as the plan schedules it (boundary tensors plus the
        re-reads its tiling causes and the round trips of global workspaces).
    unique_bytes : int
        Distinct global bytes it touches (0 means ``global_bytes``): re-reads of them hit L2
        when they fit.
    dram_bytes : int
        Bytes one call moves to and from DRAM as its tiling and L2 make them, when the generator
        knows (0: the cost model decides from ``unique_bytes`` and ``global_bytes``).
    launch : LaunchShape
        Launch shape of one call.
    code_path : CodePath
        Where the arithmetic runs.
    dtype : str
        The dtype doing most of the work (for peak rates).
    provenance : str
        Why the generator proposed it (for reports).
    key : str
        The kernel's key in the measurement database (a workload key, or a hash of the fused
        function and its plan); '' when it cannot be measured.
    record_dtype : str
        The dtype part of its database key when it differs from ``dtype`` (CUTLASS keys name input
        and output dtypes, ``"float16->float32"``).
    recomputes : tuple of int
        Members it *recomputes*: it computes them for itself and writes them for nobody, even
        where nodes outside read them (another kernel computes them for those); see
        :mod:`tvm_ext.select.recompute`.
    stages : tuple of StageWork
        The stages of a multi-stage kernel (SOUFFLE's merged kernels), run one after another by
        the same resident blocks; empty for a single-stage kernel. The cost model prices each
        stage's compute and memory time and adds them up.
    """

    nodes: tuple[int, ...]
    plan: Plan
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    flops: int
    global_bytes: int
    launch: LaunchShape
    code_path: CodePath = CodePath.SIMT
    dtype: str = "float32"
    provenance: str = ""
    key: str = field(default="", compare=False)
    unique_bytes: int = 0
    record_dtype: str = ""
    dram_bytes: int = 0
    recomputes: tuple[int, ...] = ()
    stages: tuple["StageWork", ...] = ()

    def __post_init__(self) -> None:
        if self.unique_bytes <= 0:
            object.__setattr__(self, "unique_bytes", self.global_bytes)

    @property
    def database_dtype(self) -> str:
        """The dtype part of its measurement key."""
        return self.record_dtype or self.dtype

    @property
    def generator(self) -> str:
        """Name of the generator that proposed it (and builds it)."""
        return self.plan.generator

    @classmethod
    def of(cls, graph: OpGraph, nodes: Iterable[int], plan: Plan, *, launch: LaunchShape,
           global_bytes: int | None = None, unique_bytes: int = 0, code_path: CodePath = CodePath.SIMT,
           provenance: str = "", key: str = "", record_dtype: str = "", dram_bytes: int = 0,
           recomputes: Iterable[int] = (), stages: Iterable["StageWork"] = ()) -> "Candidate":
        """A candidate over ``nodes`` of ``graph``: boundary tensors, flops and dtype read from the graph.

        ``global_bytes`` defaults to the boundary tensors read and written once each.
        """
        members = tuple(graph.in_topological_order(nodes))
        recomputed = tuple(n for n in members if n in set(recomputes))
        inputs, outputs = boundary(graph, members, recomputed)
        moved = boundary_bytes(graph, members, recomputed)
        return cls(nodes=members, plan=plan, inputs=tuple(inputs), outputs=tuple(outputs),
                   flops=int(sum(graph.nodes[n].flops for n in members)),
                   global_bytes=int(moved if global_bytes is None else global_bytes), launch=launch,
                   code_path=code_path, dtype=dominant_dtype(graph, members), provenance=provenance, key=key,
                   unique_bytes=int(unique_bytes), record_dtype=record_dtype, dram_bytes=int(dram_bytes),
                   recomputes=recomputed, stages=tuple(stages))

    def describe(self) -> str:
        """One line: generator, node count and the plan summary."""
        return f"{self.generator} [{len(self.nodes)} nodes] {self.plan.summary()}"


def boundary(graph: OpGraph, members: Iterable[int], recomputes: Iterable[int] = ()) -> tuple[list[str], list[str]]:
    """Tensors a node set reads from and writes to global memory; the outputs of the nodes it
    ``recomputes`` are not written."""
    inputs, outputs = graph.boundary(members)
    kept = {t for n in recomputes for t in graph.nodes[n].outputs}
    return inputs, [t for t in outputs if t not in kept]


def boundary_bytes(graph: OpGraph, members: Iterable[int], recomputes: Iterable[int] = ()) -> int:
    """Bytes of the tensors a node set reads from and writes to global memory, once each (inputs
    as its members read them: :meth:`~tvm_ext.graph.OpGraph.read_bytes`)."""
    members = set(members)
    inputs, outputs = boundary(graph, members, recomputes)
    return int(sum(graph.read_bytes(t, members) for t in inputs) + sum(graph.tensors[t].nbytes for t in outputs))


def dominant_dtype(graph: OpGraph, members: Iterable[int]) -> str:
    """The floating-point output dtype carrying the most flops among ``members``, by the rule the
    report applies to a built kernel's blocks (:func:`~tvm_ext.graph.classify.weighted_dtype`)."""
    return weighted_dtype((graph.tensors[graph.nodes[n].outputs[0]].dtype, graph.nodes[n].flops)
                          for n in sorted(members) if graph.nodes[n].outputs)


__all__ = ["Candidate", "CodePath", "LaunchShape", "StageWork", "boundary", "boundary_bytes", "dominant_dtype"]
