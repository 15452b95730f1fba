"""Tuning results as JSON lines, keyed by (workload, dtype, arch). Never pickle.

One record per line::

    {"workload": "gemm_b1_m256_n512_k128_rc", "dtype": "float16->float16", "arch": "sm_80",
     "config": {...KernelConfig...}, "latency_us": 12.5, "device": "a100", "date": "2026-..."}

:meth:`Database.lookup` returns the fastest record for a key; later lines may add better ones.
Committed databases (``configs/cutlass/*.jsonl``) make builds reproducible without a GPU.
"""
from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from .config import KernelConfig
from .errors import CutlassDatabaseError


@dataclass(frozen=True)
class TuningRecord:
    """One measurement."""

    workload: str
    dtype: str
    arch: str
    config: KernelConfig
    latency_us: float
    device: str = ""
    date: str = field(default_factory=lambda: datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.workload, self.dtype, self.arch)

    def to_json(self) -> str:
        return json.dumps({"workload": self.workload, "dtype": self.dtype, "arch": self.arch,
                           "config": self.config.to_dict(), "latency_us": self.latency_us,
                           "device": self.device, "date": self.date}, sort_keys=True)

    @classmethod
    def from_json(cls, line: str) -> "TuningRecord":
        data = json.loads(line)
        return cls(workload=data["workload"], dtype=data["dtype"], arch=data["arch"],
                   config=KernelConfig.from_dict(data["config"]), latency_us=float(data["latency_us"]),
                   device=data.get("device", ""), date=data.get("date", ""))


def dtype_key(in_dtype: str, out_dtype: str) -> str:
    """The dtype part of a key, e.g. ``"float16->float32"``."""
    return f"{in_dtype}->{out_dtype}"


class Database:
    """A JSON-lines file of :class:`TuningRecord` (created on first :meth:`add`)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._best: dict[tuple[str, str, str], TuningRecord] = {}
        self._count = 0
        if self.path.exists():
            for number, line in enumerate(self.path.read_text().splitlines(), start=1):
                if not line.strip():
                    continue
                try:
                    self._keep(TuningRecord.from_json(line))
                except (ValueError, KeyError, TypeError) as err:
                    raise CutlassDatabaseError(f"{self.path}:{number}: bad record: {err}") from err

    def _keep(self, rec: TuningRecord) -> None:
        self._count += 1
        old = self._best.get(rec.key)
        if old is None or rec.latency_us < old.latency_us:
            self._best[rec.key] = rec

    def __len__(self) -> int:
        """Number of distinct keys."""
        return len(self._best)

    def __iter__(self) -> Iterator[TuningRecord]:
        return iter(self._best.values())

    def lookup(self, workload: str, dtype: str, arch: str) -> TuningRecord | None:
        """Fastest record for the key, or None."""
        return self._best.get((workload, dtype, arch))

    def add(self, record: TuningRecord) -> None:
        """Append a record to the file and the index."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.path.open("a") as fh:
            fh.write(record.to_json() + "\n")
        self._keep(record)
