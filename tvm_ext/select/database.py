"""One store of measurements for every technique: JSON lines, keyed by (key, device, dtype).

Each line is one :class:`Record`::

    {"key": "gemm_b1_m256_n512_k128_rc", "device": "h100", "dtype": "float16->float16",
     "generator": "cutlass", "latency_s": 1.25e-05, "config": {...}, "source": "cutlass profiler",
     "date": "2026-11-24T18:00:00+00:00"}

``key`` is a workload key (a library generator's problem description, e.g. CUTLASS's GEMM shape)
or the structural hash of a kernel's PrimFunc; ``config`` is what was measured (a library kernel
configuration, or a plan as JSON). :meth:`Database.best` gives the fastest record of a key;
:meth:`Database.records` all of them (the learned cost model trains on those). No pickle: the
file is text, diffable, and committed databases make builds reproducible without a GPU.

Example
-------
>>> db = Database("measurements.jsonl")
>>> db.add(Record("gemm_b1_m128_n256_k64_rc", "h100", "float16->float16", "cutlass", 3.2e-6, {"api": "2x"}))
>>> db.best("gemm_b1_m128_n256_k64_rc", "h100", "float16->float16").latency_s
3.2e-06
"""
from __future__ import annotations

import datetime
import functools
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from ..errors import TvmExtError

#: Environment variable naming the database file the pipelines read by default.
DATABASE_ENV = "TVM_EXT_DATABASE"
#: The measurements the package ships (``<device>.jsonl``: per-kernel GPU times, the records of
#: ``bench/measurements/`` of the repository), read by every build.
PACKAGED_MEASUREMENTS_DIR = Path(__file__).resolve().parent.parent / "hardware" / "measurements"


class DatabaseError(TvmExtError):
    """A database file holds a line that is not a valid record."""


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class Record:
    """One measurement (see the module docstring)."""

    key: str
    device: str
    dtype: str
    generator: str
    latency_s: float
    config: Mapping[str, Any] = field(default_factory=dict)
    source: str = ""
    date: str = field(default_factory=_now)

    def __post_init__(self) -> None:
        if not (self.latency_s > 0.0):
            raise ValueError(f"latency_s must be positive, got {self.latency_s!r}")

    @property
    def index(self) -> tuple[str, str, str]:
        """The lookup key ``(key, device, dtype)``."""
        return (self.key, self.device, self.dtype)

    def to_json(self) -> str:
        """One line of JSON."""
        return json.dumps({"key": self.key, "device": self.device, "dtype": self.dtype, "generator": self.generator,
                           "latency_s": self.latency_s, "config": dict(self.config), "source": self.source,
                           "date": self.date}, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> "Record":
        """Parse one line (raises ValueError/KeyError/TypeError when malformed)."""
        data = json.loads(line)
        return cls(key=str(data["key"]), device=str(data["device"]), dtype=str(data["dtype"]),
                   generator=str(data["generator"]), latency_s=float(data["latency_s"]),
                   config=dict(data.get("config") or {}), source=str(data.get("source", "")),
                   date=str(data.get("date", "")))


class Database:
    """A JSON-lines file of :class:`Record` (created on the first :meth:`add`); a missing file is
    an empty database. :meth:`read` adds another file's records to the index (the path None: a
    read-only union of files).

    Raises
    ------
    DatabaseError
        A line of the file is not a valid record (the message names file and line).
    """

    def __init__(self, path: str | os.PathLike[str] | None):
        self.path = Path(path) if path is not None else None
        self._records: dict[tuple[str, str, str], list[Record]] = {}
        if self.path is not None:
            self.read(self.path)

    def read(self, path: str | os.PathLike[str]) -> None:
        """Add the records of another file to the index (not to :attr:`path`); a missing file adds none."""
        path = Path(path)
        if not path.exists():
            return
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            if not line.strip():
                continue
            try:
                self._keep(Record.from_json(line))
            except (ValueError, KeyError, TypeError) as err:
                raise DatabaseError(f"{path}:{number}: bad record: {err}") from err

    def _keep(self, record: Record) -> None:
        self._records.setdefault(record.index, []).append(record)

    def __len__(self) -> int:
        """Number of distinct ``(key, device, dtype)``."""
        return len(self._records)

    def __iter__(self) -> Iterator[Record]:
        """Every record."""
        for records in self._records.values():
            yield from records

    def records(self, key: str, device: str, dtype: str) -> list[Record]:
        """All records of one index, in file order."""
        return list(self._records.get((key, device, dtype), ()))

    def best(self, key: str, device: str, dtype: str) -> Record | None:
        """The fastest record of one index, or None."""
        found = self._records.get((key, device, dtype))
        return min(found, key=lambda r: r.latency_s) if found else None

    def add(self, record: Record) -> None:
        """Append ``record`` to the file and the index.

        Raises
        ------
        DatabaseError
            The database has no file (a read-only union such as :func:`shipped_database`).
        """
        if self.path is None:
            raise DatabaseError("this database is read-only (it has no file to append to)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(record.to_json() + "\n")
        self._keep(record)


def default_database() -> Database | None:
    """The database named by ``$TVM_EXT_DATABASE``, or None when the variable is unset."""
    path = os.environ.get(DATABASE_ENV)
    return Database(path) if path else None


@functools.lru_cache(maxsize=4)
def shipped_database(directory: str | os.PathLike[str] = PACKAGED_MEASUREMENTS_DIR) -> Database:
    """Every record the package ships (``*.jsonl`` of ``directory``), read once, read-only."""
    directory = Path(directory)
    db = Database(None)
    for path in sorted(directory.glob("*.jsonl")):
        db.read(path)
    return db


__all__ = ["DATABASE_ENV", "PACKAGED_MEASUREMENTS_DIR", "Database", "DatabaseError", "Record", "default_database",
           "shipped_database"]
