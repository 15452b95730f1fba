"""A process pool that survives crashing and hanging tasks.

``multiprocessing.Pool`` breaks when a worker segfaults (TVM code generation can abort the
process) and cannot stop one task that hangs. :class:`IsolatedPool` runs each task in a
long-lived worker process, kills the worker when its task passes the time limit, replaces
workers that die, and reports such tasks as ``"timeout"`` or ``"crash"`` with the last
lines the worker wrote to stderr (Python tracebacks, ``faulthandler`` dumps, TVM's own
fatal messages). Workers are started with ``spawn`` so they never inherit a forked TVM
thread pool.
"""
from __future__ import annotations

import faulthandler
import logging
import multiprocessing as mp
import os
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any

from ..errors import TvmExtError

logger = logging.getLogger(__name__)

_TAIL_BYTES = 4000
_READY = "__ready__"
_START_TIMEOUT = 300.0


@dataclass
class TaskOutcome:
    """What became of one task: ``value`` if it returned, else ``failure`` and ``message``."""

    index: int
    task: Any
    value: Any = None
    failure: str | None = None  # "timeout" or "crash"
    message: str = ""
    seconds: float = 0.0


def _worker_main(conn: Connection, fn: Callable[[Any], Any], log_path: str) -> None:
    """Worker loop: stdout/stderr go to ``log_path``, truncated before every task."""
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    faulthandler.enable()
    conn.send(_READY)
    while True:
        task = conn.recv()
        if task is None:
            return
        os.ftruncate(2, 0)
        os.lseek(2, 0, os.SEEK_SET)
        conn.send(fn(task))


class _Worker:
    def __init__(self, ctx: Any, fn: Callable[[Any], Any], log_dir: Path, number: int):
        self.log_path = log_dir / f"worker_{number}.log"
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=_worker_main, args=(child, fn, str(self.log_path)), daemon=True)
        self.process.start()
        child.close()
        self.current: tuple[int, Any] | None = None
        self.started = 0.0
        self.ready = False

    def wait_ready(self) -> None:
        """Block until the worker has started (imports done), so start-up is not task time."""
        if not self.conn.poll(_START_TIMEOUT):
            raise TvmExtError(f"worker process did not start within {_START_TIMEOUT:g} s")
        try:
            message = self.conn.recv()
        except EOFError:
            raise TvmExtError(f"worker process failed to start: {self.log_tail()[-500:]}") from None
        if message != _READY:
            raise TvmExtError(f"worker process sent {message!r} instead of its ready signal")
        self.ready = True

    def submit(self, index: int, task: Any) -> None:
        self.current = (index, task)
        self.started = time.monotonic()
        self.conn.send(task)

    def log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - _TAIL_BYTES))
                return f.read().decode("utf-8", "replace").strip()
        except FileNotFoundError:
            return ""

    def stop(self, kill: bool = False) -> None:
        if kill:
            self.process.kill()
        elif self.process.is_alive():
            try:
                self.conn.send(None)
            except (BrokenPipeError, OSError):
                self.process.kill()
        self.process.join(timeout=10)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class IsolatedPool:
    """Run ``fn(task)`` for many tasks in ``jobs`` worker processes.

    Parameters
    ----------
    fn : callable
        A picklable (module-level) function; its return value must be picklable.
    jobs : int
        Number of worker processes (>= 1).
    timeout : float, optional
        Seconds one task may take before its worker is killed.
    """

    def __init__(self, fn: Callable[[Any], Any], jobs: int = 1, timeout: float | None = None):
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        self.fn, self.jobs, self.timeout = fn, jobs, timeout
        self._ctx = mp.get_context("spawn")
        self._tmp = tempfile.TemporaryDirectory(prefix="tvm_ext_pool_")
        self._spawned = 0
        self._workers: list[_Worker] = []

    def _spawn(self) -> _Worker:
        self._spawned += 1
        return _Worker(self._ctx, self.fn, Path(self._tmp.name), self._spawned)

    def __enter__(self) -> IsolatedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop all workers and remove their logs."""
        for w in self._workers:
            w.stop(kill=w.current is not None)
        self._workers.clear()
        self._tmp.cleanup()

    def _retire(self, worker: _Worker) -> None:
        """Kill a crashed or hung worker; a new one starts only if tasks remain."""
        worker.stop(kill=True)
        self._workers.remove(worker)

    def imap_unordered(self, tasks: Iterable[Any]) -> Iterator[TaskOutcome]:
        """Yield one :class:`TaskOutcome` per task, in completion order."""
        pending = deque(enumerate(tasks))
        while pending or any(w.current for w in self._workers):
            busy_count = sum(w.current is not None for w in self._workers)
            while len(self._workers) < min(self.jobs, len(pending) + busy_count):
                self._workers.append(self._spawn())  # start them all, then wait
            for w in self._workers:
                if not w.ready:
                    w.wait_ready()
            for w in self._workers:
                if w.current is None and pending:
                    w.submit(*pending.popleft())
            busy = [w for w in self._workers if w.current is not None]
            wait([w.conn for w in busy] + [w.process.sentinel for w in busy], timeout=self._wait_time(busy))
            for w in busy:
                outcome = self._collect(w)
                if outcome is not None:
                    yield outcome

    def _wait_time(self, busy: list[_Worker]) -> float | None:
        if self.timeout is None:
            return None
        now = time.monotonic()
        return max(0.0, min(w.started + self.timeout - now for w in busy)) + 0.01

    def _collect(self, w: _Worker) -> TaskOutcome | None:
        index, task = w.current
        elapsed = time.monotonic() - w.started
        if w.conn.poll():
            try:
                value = w.conn.recv()
            except EOFError:  # the worker died before answering
                return self._crashed(w, elapsed)
            w.current = None
            return TaskOutcome(index, task, value=value, seconds=elapsed)
        if not w.process.is_alive():
            return self._crashed(w, elapsed)
        if self.timeout is not None and elapsed > self.timeout:
            w.current = None
            self._retire(w)
            return TaskOutcome(index, task, failure="timeout", seconds=elapsed,
                               message=f"no result after {self.timeout:g} s; worker killed")
        return None

    def _crashed(self, w: _Worker, elapsed: float) -> TaskOutcome:
        index, task = w.current
        w.process.join(timeout=5)
        code, tail = w.process.exitcode, w.log_tail()
        w.current = None
        self._retire(w)
        logger.debug("worker died (exit code %s) on task %r", code, task)
        return TaskOutcome(index, task, failure="crash", seconds=elapsed, message=_crash_message(code, tail))


def _crash_message(exit_code: int | None, tail: str) -> str:
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
    last = fatal[0] if fatal else (lines[-1] if lines else "no output")
    return f"worker exited with code {exit_code}: {last}"
