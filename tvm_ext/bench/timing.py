"""Timing: CUDA events (or synchronized host timers), warm-up, rotating inputs, medians.

:func:`measure` runs ``call(set_index)`` ``warmup`` times untimed, then ``runs`` times timed,
cycling through the input sets so repeated runs do not read one buffer out of the cache.

* :class:`EventTimer` records a CUDA event pair around every run on the legacy default
  stream (the stream TVM and torch launch on unless told otherwise) through the CUDA
  runtime library already loaded in the process (ctypes; no torch needed). Runs are
  queued back to back and read after one final synchronization, so host overhead shows
  only where the GPU would otherwise wait for it.
* :class:`HostTimer` synchronizes the device before and after each run and reads
  ``time.perf_counter`` (CPU targets, or a GPU process without the CUDA runtime library).

Clocks are left as they are: nothing here changes GPU settings.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from ..errors import BenchError


@dataclass(frozen=True)
class Stats:
    """Summary of the timed runs of one measurement (milliseconds)."""

    median_ms: float
    min_ms: float
    max_ms: float
    mean_ms: float
    runs: int

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> "Stats":
        """Statistics of ``samples_ms`` (at least one sample)."""
        if not samples_ms:
            raise BenchError("no timed runs to summarize")
        return cls(statistics.median(samples_ms), min(samples_ms), max(samples_ms),
                   statistics.fmean(samples_ms), len(samples_ms))


def _loaded_library(stem: str) -> str | None:
    """Path of a shared library with ``stem`` in its name already mapped into this process."""
    maps = Path("/proc/self/maps")
    if not maps.is_file():
        return None
    for line in maps.read_text().splitlines():
        path = line.split()[-1] if line.split() else ""
        if stem in Path(path).name:
            return path
    return None


class CudaRuntime:
    """The few CUDA runtime calls the harness needs, through ctypes.

    Uses the ``libcudart`` already loaded in the process (by TVM's CUDA runtime or torch),
    so events live in the same context and stream as the kernels they time.

    Raises
    ------
    BenchError
        No CUDA runtime library is loaded or can be found.
    """

    def __init__(self, path: str | None = None):
        path = path or _loaded_library("libcudart.so") or ctypes.util.find_library("cudart")
        if path is None:
            raise BenchError("no CUDA runtime library (libcudart) is loaded or installed")
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as err:
            raise BenchError(f"cannot load the CUDA runtime library {path}: {err}") from None
        self.path = path
        self.lib.cudaGetErrorString.restype = ctypes.c_char_p

    def check(self, code: int, what: str) -> None:
        """Raise on a non-zero CUDA error code."""
        if code != 0:
            message = self.lib.cudaGetErrorString(code).decode(errors="replace")
            raise BenchError(f"{what} failed: CUDA error {code} ({message})")

    def event(self) -> ctypes.c_void_p:
        """A new timing event."""
        handle = ctypes.c_void_p()
        self.check(self.lib.cudaEventCreate(ctypes.byref(handle)), "cudaEventCreate")
        return handle

    def record(self, event: ctypes.c_void_p) -> None:
        """Record ``event`` on the legacy default stream."""
        self.check(self.lib.cudaEventRecord(event, None), "cudaEventRecord")

    def elapsed_ms(self, start: ctypes.c_void_p, end: ctypes.c_void_p) -> float:
        """Milliseconds between two completed events."""
        value = ctypes.c_float()
        self.check(self.lib.cudaEventSynchronize(end), "cudaEventSynchronize")
        self.check(self.lib.cudaEventElapsedTime(ctypes.byref(value), start, end), "cudaEventElapsedTime")
        return float(value.value)

    def destroy(self, event: ctypes.c_void_p) -> None:
        """Free an event."""
        self.check(self.lib.cudaEventDestroy(event), "cudaEventDestroy")

    def synchronize(self) -> None:
        """Wait for all work on the device."""
        self.check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def last_error(self) -> None:
        """Raise if a kernel launch left an error."""
        self.check(self.lib.cudaGetLastError(), "kernel launch (cudaGetLastError)")

    def profiler_start(self) -> None:
        """Start collecting for an attached profiler (``ncu --profile-from-start off``)."""
        self.check(self.lib.cudaProfilerStart(), "cudaProfilerStart")

    def profiler_stop(self) -> None:
        """Stop collecting for an attached profiler."""
        self.check(self.lib.cudaProfilerStop(), "cudaProfilerStop")

    def driver_version(self) -> str:
        """The CUDA version the driver supports, e.g. ``"13.0"``."""
        value = ctypes.c_int()
        self.check(self.lib.cudaDriverGetVersion(ctypes.byref(value)), "cudaDriverGetVersion")
        return f"{value.value // 1000}.{value.value % 1000 // 10}"


class EventTimer:
    """CUDA-event timing of ``runs`` runs (see the module docstring)."""

    name = "cuda-events"

    def __init__(self, cuda: CudaRuntime, runs: int):
        self.cuda = cuda
        self.starts = [cuda.event() for _ in range(runs)]
        self.ends = [cuda.event() for _ in range(runs)]

    def before(self) -> None:
        """Called once before the timed runs."""
        self.cuda.synchronize()

    def start(self, i: int) -> None:
        """Mark the start of run ``i``."""
        self.cuda.record(self.starts[i])

    def stop(self, i: int) -> None:
        """Mark the end of run ``i``."""
        self.cuda.record(self.ends[i])

    def results(self) -> list[float]:
        """Milliseconds per run (frees the events)."""
        try:
            self.cuda.synchronize()
            self.cuda.last_error()
            return [self.cuda.elapsed_ms(s, e) for s, e in zip(self.starts, self.ends)]
        finally:
            for ev in self.starts + self.ends:
                self.cuda.destroy(ev)


class HostTimer:
    """Synchronized host timing: ``sync(); t0; run; sync(); t1`` per run."""

    name = "host-sync"

    def __init__(self, sync: Callable[[], None], runs: int):
        self.sync = sync
        self.samples = [0.0] * runs
        self._t0 = 0.0

    def before(self) -> None:
        """Called once before the timed runs."""
        self.sync()

    def start(self, i: int) -> None:
        """Mark the start of run ``i``."""
        self.sync()
        self._t0 = time.perf_counter()

    def stop(self, i: int) -> None:
        """Mark the end of run ``i``."""
        self.sync()
        self.samples[i] = (time.perf_counter() - self._t0) * 1e3

    def results(self) -> list[float]:
        """Milliseconds per run."""
        return list(self.samples)


def measure(call: Callable[[int], object], n_sets: int, warmup: int, runs: int,
            make_timer: Callable[[int], EventTimer | HostTimer],
            prepare: Callable[[int], None] | None = None) -> list[float]:
    """Time ``runs`` calls after ``warmup`` untimed ones, rotating over ``n_sets`` input sets.

    ``call(k)`` runs the model on input set ``k``; whatever it returns is dropped at once.
    ``prepare(k)``, if given, runs before each call outside the timed region (copying set
    ``k`` into the static input buffers of a captured CUDA graph, for example).

    Returns
    -------
    list of float
        Milliseconds of each timed run, in order.
    """
    if runs < 1 or n_sets < 1 or warmup < 0:
        raise BenchError(f"need runs >= 1, input sets >= 1, warmup >= 0 (got {runs}, {n_sets}, {warmup})")
    for i in range(warmup):
        if prepare is not None:
            prepare(i % n_sets)
        call(i % n_sets)
    timer = make_timer(runs)
    timer.before()
    for i in range(runs):
        k = (warmup + i) % n_sets
        if prepare is not None:
            prepare(k)
        timer.start(i)
        call(k)
        timer.stop(i)
    return timer.results()


__all__ = ["Stats", "CudaRuntime", "EventTimer", "HostTimer", "measure"]
