"""Device memory of an emulated launch: poisoned storages, per-lane registers, access logs, races.

Every byte of shared memory, of a kernel's outputs and of its workspaces starts as ``0xFF`` (a
NaN in every float type, -1 in every signed integer) and is tracked as uninitialised until
written, so a read before the write is a finding, as compute-sanitizer's initcheck reports it.
Accesses to shared and global memory are logged per thread (or per block) and checked for races
at each barrier: two threads touching one address between two barriers, one of them writing, is
a hazard, as racecheck reports it, unless no order of the two could change what is stored or
read (every value written, read or there before is the same: TVM's allreduce lowering has every
thread store back the value it just read).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

POISON = 0xFF
#: Races reported per storage and barrier interval at most (more only add noise).
RACES_PER_INTERVAL = 4


@dataclass(frozen=True)
class Finding:
    """One problem the emulation found.

    ``kind``: about correctness ``race``, ``uninitialised``, ``out_of_bounds``, ``barrier``,
    ``shuffle``, ``grid_barrier``, ``assert``, ``mismatch``, ``reduction``, ``co_residency``; about
    cost (:data:`~tvm_ext.checks.work.PERFORMANCE_KINDS`) ``recompute``, ``spill``.
    """

    kind: str
    message: str


class Storage:
    """One allocation: bytes (``lanes`` copies for registers), an init map, an access log."""

    def __init__(self, name: str, nbytes: int, scope: str, *, initialised: bool, lanes: int = 1,
                 itemsize: int = 1) -> None:
        self.name, self.scope, self.itemsize = name, scope, itemsize
        #: Bytes of the allocation (``nbytes`` is that rounded up to 8 for typed views).
        self.exact_bytes = int(nbytes)
        self.nbytes = -(-max(int(nbytes), 1) // 8) * 8
        self.lanes = lanes
        self.data = np.full(self.nbytes * lanes, POISON, dtype=np.uint8)
        self.init = None if initialised or scope == "local" else np.zeros(self.nbytes, dtype=bool)
        #: Read-only inputs are not logged (no race without a write) until something stores to them.
        self.logged = scope != "local" and not (initialised and scope == "global")
        self._views: dict = {}

    @classmethod
    def global_tensor(cls, name: str, array: np.ndarray, *, initialised: bool) -> Storage:
        """A kernel argument in global memory holding ``array`` (poisoned instead when not ``initialised``)."""
        st = cls(name, array.nbytes, "global", initialised=initialised, itemsize=array.dtype.itemsize)
        if initialised:
            st.data[:array.nbytes] = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        return st

    def view(self, dtype: np.dtype) -> np.ndarray:
        """The bytes as a flat array of ``dtype`` (shared memory: writes through it land in the bytes)."""
        found = self._views.get(dtype)
        if found is None:
            found = self._views[dtype] = self.data.view(dtype)
        return found


class Record(NamedTuple):
    """Accesses of one statement execution: byte address, actor (thread or block), write, the
    value stored or read, the value there before a store, global sequence number, statement."""

    addr: np.ndarray
    actor: np.ndarray
    write: bool | np.ndarray
    value: np.ndarray
    old: np.ndarray
    seq: int | np.ndarray
    stmt: int | np.ndarray


@dataclass(frozen=True)
class Race:
    """Two accesses of one address by different actors between two barriers, one a write."""

    storage: str
    element: int
    write_stmt: int
    other_stmt: int
    other_writes: bool
    actors: tuple[int, int]


def _field(records: list[Record], name: str, dtype, sizes: list[int]) -> np.ndarray:
    values = [getattr(r, name) for r in records]
    if all(np.ndim(v) == 0 for v in values):
        return np.repeat(np.asarray(values, dtype=dtype), sizes)
    return np.concatenate([np.full(n, v, dtype=dtype) if np.ndim(v) == 0 else np.asarray(v, dtype=dtype)
                           for v, n in zip(values, sizes)])


def _concat(records: list[Record]):
    sizes = [r.addr.size for r in records]
    return tuple(_field(records, name, dtype, sizes) for name, dtype in
                 (("addr", np.int64), ("actor", np.int64), ("write", bool), ("value", np.uint64), ("old", np.uint64),
                  ("seq", np.int64), ("stmt", np.int64)))


def races(storage: Storage, records: list[Record], limit: int = RACES_PER_INTERVAL) -> list[Race]:
    """The hazards among ``records`` (one barrier interval of one storage), at most ``limit``."""
    if not records:
        return []
    addr, actor, write, value, old, seq, stmt = _concat(records)
    order = np.lexsort((seq, addr))
    a = addr[order]
    starts = np.flatnonzero(np.r_[True, a[1:] != a[:-1]])
    ends = np.r_[starts[1:], a.size]
    w = write[order]
    act = actor[order]
    candidates = np.flatnonzero(np.logical_or.reduceat(w, starts)
                                & (np.minimum.reduceat(act, starts) != np.maximum.reduceat(act, starts)))
    if not candidates.size:
        return []
    v = value[order]
    before = np.where(w, old[order], v)
    low = np.minimum.reduceat(np.minimum(v, before), starts)
    high = np.maximum.reduceat(np.maximum(v, before), starts)
    candidates = candidates[low[candidates] != high[candidates]]
    found: list[Race] = []
    for g in candidates:
        idx = order[starts[g]:ends[g]]
        race = _hazard(idx, actor, write, value, old)
        if race is not None:
            i, j = race
            found.append(Race(storage.name, int(addr[i]) // max(storage.itemsize, 1), int(stmt[i]), int(stmt[j]),
                              bool(write[j]), (int(actor[i]), int(actor[j]))))
            if len(found) >= limit:
                break
    return found


def _hazard(idx: np.ndarray, actor, write, value, old) -> tuple[int, int] | None:
    """(a write, an access by another actor) if some order of the accesses ``idx`` (one address,
    in execution order) changes what is stored or read; else None."""
    first = idx[0]
    before = old[first] if write[first] else value[first]
    seen: set = set()
    wrote: set = set()
    writer = None
    for i in idx:
        seen.add(int(value[i]))
        if write[i]:
            wrote.add(int(actor[i]))
            writer = i if writer is None else writer
        elif int(actor[i]) not in wrote:
            seen.add(int(before))
    if len(seen) <= 1 or writer is None:
        return None
    other = next((i for i in idx if actor[i] != actor[writer]), None)
    return None if other is None else (int(writer), int(other))


def summarise(records: list[Record], block: int) -> Record | None:
    """A block's accesses of one global storage in one interval as one record with the block as
    actor (for races between blocks): each distinct (address, write, value) once."""
    if not records:
        return None
    addr, _, write, value, old, seq, stmt = _concat(records)
    keys = np.stack([addr.astype(np.uint64), write.astype(np.uint64), value])
    _, keep = np.unique(keys, axis=1, return_index=True)
    keep.sort()
    return Record(addr[keep], np.full(keep.size, block, dtype=np.int64), write[keep], value[keep], old[keep],
                  seq[keep], stmt[keep])


__all__ = ["POISON", "Finding", "Race", "Record", "Storage", "races", "summarise"]
