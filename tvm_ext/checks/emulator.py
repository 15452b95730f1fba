"""Run a lowered CUDA kernel on the CPU with the GPU's semantics, adversarially.

One thread block runs at a time as a vector of its threads (``block.mask`` says which take the
current branch); warps are the 32-thread segments of that vector, which is what shuffles and
``__activemask`` see. Blocks run in an adversarial order (reversed by default, or shuffled), so a
block that reads what a lower-numbered block writes, without a grid barrier between, reads
poison. A kernel with grid barriers keeps every block alive: each runs to its next grid barrier,
then the next block, then all go on. Between two barriers every shared and global access is
logged; at the barrier the interval's races are reported (:func:`tvm_ext.checks.memory.races`),
per block for threads and per grid interval for blocks. A shuffle whose mask names a lane that
does not execute it is a finding; a value read from such a lane is poison.

Large grids without grid barriers are sampled (``max_blocks``, 16 by default: first, last and evenly spread
blocks); the report says how many blocks ran.

Example
-------
>>> result = emulate_launch(launch, storages, order="reversed")
>>> result.findings
[]
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
import tvm_ffi
from tvm import tirx

from ..analysis.work import Work
from .memory import POISON, Finding, Race, Record, Storage, races, summarise
from .tir_expr import is_sync
from .tir_stmt import BufferView, compile_kernel, thread_extents
from .values import bits
from .wmma import TensorCoreOps

WARP = 32
_AXES = ("x", "y", "z")


class DeviceMemory:
    """Loads and stores through buffer views, with bounds, init and access-log bookkeeping."""

    def load(self, view: BufferView, index, b: BlockRun, stmt: int, lanes: int = 1):
        flat, rows = self._address(view, index, b, stmt, lanes)
        out = np.zeros((b.threads,) if lanes == 1 else (b.threads, lanes), dtype=view.dtype)
        if flat is not None:
            out[rows] = b.read(view.storage, view.dtype, flat, _actors(rows, flat), stmt)
        return out

    def store(self, view: BufferView, index, value, b: BlockRun, stmt: int, lanes: int = 1) -> None:
        flat, rows = self._address(view, index, b, stmt, lanes)
        if flat is None:
            return
        shape = (b.threads,) if lanes == 1 else (b.threads, lanes)
        values = np.broadcast_to(np.asarray(value).astype(view.dtype, copy=False), shape)[rows]
        b.write(view.storage, view.dtype, flat, values, _actors(rows, flat), stmt)

    @staticmethod
    def _address(view: BufferView, index, b: BlockRun, stmt: int, lanes: int):
        """Scalar element indices ``(rows, lanes)`` (or ``(rows,)``) of the active threads' access
        and those threads; out-of-bounds lanes are reported and left out."""
        per_index = max(lanes // view.lanes, 1)        # index lanes: a vector element is one index
        rows = b.rows()
        if not rows.size:
            return None, rows
        idx = np.asarray(index, dtype=np.int64)
        if idx.shape[:1] == (b.threads,):
            idx = idx[rows]
        else:   # uniform over the threads
            idx = np.broadcast_to(idx, (rows.size,) if per_index == 1 else (rows.size, per_index))
        outside = (idx < 0) | (idx >= view.size)
        if outside.any():
            bad = int(idx[outside].ravel()[0])
            b.report(Finding("out_of_bounds", f"'{view.name}[{bad}]' is outside its {view.size} elements: "
                                              f"{b.launch.text(stmt)}"), key=("oob", view.name, stmt))
            keep = ~outside if per_index == 1 else ~outside.any(axis=1)
            rows, idx = rows[keep], idx[keep]
            if not rows.size:
                return None, rows
        if view.lanes > 1:      # vector-typed buffer: each element is view.lanes scalars
            idx = (idx[..., None] * view.lanes + np.arange(view.lanes)).reshape(rows.size, lanes)
        flat = view.offset + idx
        st = view.storage
        if st.lanes > 1:        # registers: one copy per thread
            per = st.nbytes // view.dtype.itemsize
            flat = flat + (rows * per if lanes == 1 else (rows * per)[:, None])
        return flat, rows


class WarpOps:
    """``__activemask``, ``__shfl*_sync`` and the tensor-core fragment operations over the warps
    of a block vector."""

    tensor_core = TensorCoreOps()

    @staticmethod
    def _active_bits(b: BlockRun) -> np.ndarray:
        lane = b.tid % WARP
        contrib = np.where(b.mask, np.left_shift(np.uint64(1), lane.astype(np.uint64)), np.uint64(0))
        return np.add.reduceat(contrib, np.arange(0, b.threads, WARP))

    def activemask(self, b: BlockRun) -> np.ndarray:
        return self._active_bits(b)[b.tid // WARP].astype(np.uint32)

    def shuffle(self, b: BlockRun, mode: str, mask, value, arg, width, stmt: int):
        """``__shfl*_sync``: a lane the mask names must execute the shuffle (else a finding, as
        synccheck reports it); a value read from a lane that does not execute it is undefined on
        the GPU, so it reads as poison here (TVM's allreduce lowering reads such lanes into results
        it then discards; a kernel that uses one shows as a wrong output)."""
        lane, warp = b.tid % WARP, b.tid // WARP
        width = int(width)
        arg = np.broadcast_to(np.asarray(arg, dtype=np.int64), lane.shape)
        if mode == "idx":
            src = (lane - lane % width) + arg % width
        elif mode == "down":
            src = np.where(lane % width + arg < width, lane + arg, lane)
        else:
            src = np.where(lane % width >= arg, lane - arg, lane)
        active = self._active_bits(b)[warp]
        named = np.broadcast_to(np.asarray(mask, dtype=np.uint64), lane.shape)
        outside = b.mask & ((named & ~active) != 0)
        if outside.any():
            t = int(np.flatnonzero(outside)[0])
            b.report(Finding("shuffle", f"thread {t}'s shuffle mask names lanes that do not execute it: "
                                        f"{b.launch.text(stmt)}"), key=("shfl", stmt))
        src_bit = np.left_shift(np.uint64(1), src.astype(np.uint64))
        absent = ((active & src_bit) == 0) | ((named & src_bit) == 0)
        values = np.asarray(value)
        if values.ndim == 0:
            values = np.broadcast_to(values, lane.shape)
        src_tid = np.clip(warp * WARP + src, 0, b.threads - 1)
        out = values[src_tid]
        if absent.any():
            out = out.copy()
            out[absent] = _poison(out.dtype)
        return out


def _actors(rows: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """The thread of each element of an access (``flat`` is ``(rows,)`` or ``(rows, lanes)``)."""
    return np.repeat(rows, flat.shape[1]) if flat.ndim == 2 else rows


def _poison(dtype: np.dtype):
    """The poison value of ``dtype``: every byte 0xFF (NaN for floats, -1 for signed integers)."""
    return np.frombuffer(bytes([POISON]) * dtype.itemsize, dtype=dtype)[0]


@dataclass
class LaunchResult:
    """What one emulated launch found."""

    blocks: int
    blocks_run: int
    findings: list[Finding] = field(default_factory=list)
    races: list[Race] = field(default_factory=list)
    #: Transcendentals and global loads the launch executes (counted over the blocks run, scaled to the grid).
    work: Work = field(default_factory=Work)


class EmulationTimeout(Exception):
    """The emulation of a launch ran past its time limit (the kernel is listed unchecked)."""


class WorkOverBudget(Exception):
    """The launch executes more work than its budget (a recomputation blow-up); emulation stopped."""

    def __init__(self, work: Work) -> None:
        super().__init__("over its work budget")
        self.work = work


class LaunchState:
    """State of one launch shared by its blocks: statement texts, findings, inter-block summaries."""

    def __init__(self, texts: list[str], budget: Work | None = None, seconds: float | None = None) -> None:
        self.texts, self.findings, self.races = texts, [], []
        self.seen: set = set()
        self.seq = 0
        self.summaries: dict = {}
        self.transcendentals = self.global_loads = 0
        self.budget = budget
        #: Blocks of the grid per block run so far (scales the counts to the launch).
        self.scale = 1.0
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def count(self, transcendentals: int = 0, global_loads: int = 0) -> None:
        """Executed work of the lanes that ran a statement (stops the launch once over budget:
        one block of a blow-up can run for minutes)."""
        self.transcendentals += transcendentals
        self.global_loads += global_loads
        if self.over_budget(self.scale):
            raise WorkOverBudget(Work(self.transcendentals * self.scale, self.global_loads * self.scale))
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise EmulationTimeout(f"the emulation ran past its {self.seconds:g} s")

    def over_budget(self, scale: float) -> bool:
        """Whether the work so far, ``scale``-d to the whole grid, exceeds the budget."""
        b = self.budget
        return b is not None and ((b.transcendentals > 0 and self.transcendentals * scale > b.transcendentals)
                                  or (b.global_loads > 0 and self.global_loads * scale > b.global_loads))

    def text(self, stmt: int) -> str:
        return self.texts[stmt] if 0 <= stmt < len(self.texts) else "?"

    def report(self, finding: Finding, key=None) -> None:
        key = key or (finding.kind, finding.message)
        if key not in self.seen:
            self.seen.add(key)
            self.findings.append(finding)

    def add_races(self, found: list[Race], between: str) -> None:
        for race in found:
            key = ("race", race.storage, race.write_stmt, race.other_stmt)
            if key in self.seen:
                continue
            self.races.append(race)
            self.report(Finding("race", f"{between} {race.actors[0]} and {race.actors[1]} both access "
                                        f"'{race.storage}[{race.element}]' between two barriers: "
                                        f"{self.text(race.write_stmt)}  /  {self.text(race.other_stmt)}"), key=key)

    def end_grid_interval(self) -> None:
        for storage, records in self.summaries.items():
            self.add_races(races(storage, records), "blocks")
        self.summaries.clear()


class BlockRun:
    """One thread block in flight: its environment, mask, shared memory, registers and log."""

    def __init__(self, launch: LaunchState, nslots: int, block: int, grid: tuple, dims: tuple) -> None:
        self.launch, self.block = launch, block
        self.env: list = [None] * nslots
        self.threads = int(np.prod(dims))
        self.tid = np.arange(self.threads)
        self.mask = np.ones(self.threads, dtype=bool)
        self._rows_of, self._rows = None, np.arange(0)
        bx, by, _ = dims
        self._index = {"threadIdx.x": self.tid % bx, "threadIdx.y": (self.tid // bx) % by,
                       "threadIdx.z": self.tid // (bx * by)}
        gx, gy, _ = grid
        self._index.update({"blockIdx.x": block % gx, "blockIdx.y": (block // gx) % gy, "blockIdx.z": block // (gx * gy)})
        self.shared: dict = {}
        self.local: dict = {}
        self.log: dict[Storage, list[Record]] = {}

    def rows(self) -> np.ndarray:
        """Indices of the active threads (cached per mask)."""
        if self._rows_of is not self.mask:
            self._rows_of, self._rows = self.mask, np.flatnonzero(self.mask)
        return self._rows

    def index_of(self, tag: str):
        return self._index[tag]

    def report(self, finding: Finding, key=None) -> None:
        self.launch.report(finding, key)

    def arrive(self, kind: str, stmt: int) -> None:
        if kind in ("block", "grid") and not self.mask.all():
            self.report(Finding("barrier", f"block {self.block}: a {'grid' if kind == 'grid' else '__syncthreads'} "
                                           f"barrier reached by {int(self.mask.sum())} of {self.threads} threads: "
                                           f"{self.launch.text(stmt)}"), key=("barrier", stmt))

    def read(self, st: Storage, dtype: np.dtype, flat: np.ndarray, actor: np.ndarray, stmt: int) -> np.ndarray:
        """Elements ``flat`` of ``st`` read by ``actor`` (one per element): counted, checked for
        initialisation, logged."""
        values = st.view(dtype)[flat]
        if st.scope == "global":
            self.launch.count(global_loads=flat.size)
        starts = flat * dtype.itemsize
        if st.init is not None and not st.init[starts].all():
            bad = int(starts[~st.init[starts]].ravel()[0]) // dtype.itemsize
            self.report(Finding("uninitialised", f"'{st.name}[{bad}]' is read before anything writes it: "
                                                 f"{self.launch.text(stmt)}"), key=("init", st.name, stmt))
        if st.logged:
            self._log(st, starts, actor, False, bits(values), bits(values), stmt)
        return values

    def write(self, st: Storage, dtype: np.dtype, flat: np.ndarray, values: np.ndarray, actor: np.ndarray,
              stmt: int) -> None:
        """``values`` stored at elements ``flat`` of ``st`` by ``actor``: marked initialised, logged
        (an input written is logged from then on)."""
        if not st.logged and st.scope == "global":
            st.logged = True
        data = st.view(dtype)
        old = data[flat].copy()
        data[flat] = values
        starts = flat * dtype.itemsize
        if st.init is not None:
            for k in range(dtype.itemsize):
                st.init[starts + k] = True
        if st.logged:
            self._log(st, starts, actor, True, bits(values), bits(old), stmt)

    def _log(self, st: Storage, starts, actor, write: bool, values, old, stmt: int) -> None:
        self.launch.seq += 1
        self.log.setdefault(st, []).append(Record(starts.ravel(), actor, write, values.ravel(), old.ravel(),
                                                  self.launch.seq, stmt))

    def end_interval(self) -> None:
        """A barrier: races among this block's threads, global accesses summarised for blocks."""
        for st, records in self.log.items():
            self.launch.add_races(races(st, records), "threads")
            if st.scope == "global":
                summary = summarise(records, self.block)
                if summary is not None:
                    self.launch.summaries.setdefault(st, []).append(summary)
        self.log.clear()


def block_order(count: int, order: str, max_blocks: int | None, seed: int = 0) -> list[int]:
    """Which blocks run, in which order: ``reversed``, ``shuffled`` or ``forward``; at most
    ``max_blocks`` of them (first, last, evenly spread between)."""
    ids = np.arange(count)
    if max_blocks is not None and count > max_blocks:
        ids = np.unique(np.linspace(0, count - 1, max_blocks).round().astype(int))
    if order == "reversed":
        return [int(i) for i in ids[::-1]]
    if order == "shuffled":
        return [int(i) for i in np.random.default_rng(seed).permutation(ids)]
    return [int(i) for i in ids]


def _dims(extents: dict[str, int], prefix: str) -> tuple[int, int, int]:
    return tuple(int(extents.get(f"{prefix}.{a}", 1)) for a in _AXES)


def emulate_launch(func, storages: list, *, order: str = "reversed", max_blocks: int | None = 16,
                   seed: int = 0, budget: Work | None = None, seconds: float | None = None) -> LaunchResult:
    """Run device kernel ``func`` (lowered TIR) once; ``storages`` are its arguments in order
    (:class:`Storage` for pointers, ints for scalars).

    A kernel with a grid barrier runs every block (a sample would leave the barrier waiting).

    Raises
    ------
    Unemulated
        The kernel uses an intrinsic, a storage scope or a construct the emulator does not model.
    WorkOverBudget
        The work executed so far, scaled to the grid, exceeds ``budget``.
    EmulationTimeout
        The emulation ran longer than ``seconds``.
    """
    run, is_gen, compiler = compile_kernel(func, DeviceMemory(), WarpOps())
    extents = thread_extents(func)
    grid, dims = _dims(extents, "blockIdx"), _dims(extents, "threadIdx")
    total = int(np.prod(grid))
    launch = LaunchState(compiler.texts, budget, seconds)
    cooperative = is_gen and any(kind == "grid" for kind in _sync_kinds(func))
    ids = block_order(total, order, None if cooperative else max_blocks, seed)
    params = [compiler.slot(p) for p in func.params]

    def start(block: int):
        b = BlockRun(launch, len(compiler.slots), block, grid, dims)
        for slot, st in zip(params, storages):
            b.env[slot] = (st, 0) if isinstance(st, Storage) else st
        return b, (run(b) if is_gen else _plain(run, b))

    if not cooperative:     # the counts are scaled to the grid as the blocks run (the budget is checked in count)
        for done, i in enumerate(ids, 1):
            launch.scale = total / done
            _to_grid_barrier(*start(i))
        launch.end_grid_interval()
    else:
        alive = [start(i) for i in ids]
        while alive:
            parked = [(b, g) for b, g in alive if _to_grid_barrier(b, g)]
            if parked and len(parked) != len(alive):
                launch.report(Finding("grid_barrier", f"{len(parked)} of {len(alive)} blocks wait at a grid barrier "
                                                      "the others never reach (a deadlock on the GPU)"))
            launch.end_grid_interval()
            alive = parked if len(parked) == len(alive) else []
    scale = total / max(len(ids), 1)
    return LaunchResult(total, len(ids), launch.findings, launch.races,
                        Work(launch.transcendentals * scale, launch.global_loads * scale))


def _plain(run, b):
    run(b)
    return iter(())


def _to_grid_barrier(b: BlockRun, gen) -> bool:
    """Run block ``b`` to its next grid barrier (True) or to its end (False)."""
    for kind, _ in gen:
        if kind == "block":
            b.end_interval()
        elif kind == "grid":
            b.end_interval()
            return True
    b.end_interval()
    return False


def _sync_kinds(func) -> set[str]:
    kinds: set[str] = set()
    tvm_ffi.structural_walk(func.body, (tirx.Evaluate, lambda s: kinds.add(is_sync(s) or "")))
    return kinds


__all__ = ["DeviceMemory", "EmulationTimeout", "LaunchResult", "WarpOps", "WorkOverBudget", "block_order",
           "emulate_launch"]
