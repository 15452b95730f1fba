"""A process pool that survives crashing and hanging tasks: TVM's ``PopenPoolExecutor`` plus crash reasons.

``multiprocessing.Pool`` breaks when a worker segfaults (TVM code generation can abort the
process) and cannot stop a task that hangs. TVM's :class:`tvm.support.popen_pool.PopenPoolExecutor`
does both: each task runs in a fresh-interpreter worker (``python -m tvm.exec.popen_worker``,
never a fork of a process with TVM's thread pool), a task past ``timeout`` is cut off and its
worker killed, and a worker that dies is reported (``ChildProcessError``) and replaced.

What it lacks, and the reasons for :class:`IsolatedPool`:

* *why* a worker died: the executor's workers share one stderr, so a crash comes back as
  "Subprocess terminated" with nothing to tell a segfault in one op's codegen from an abort
  in another's. Here every task writes its stdout/stderr to a log of its own (with
  ``faulthandler`` on), and a crash is reported with the last lines of that log
  (``Fatal Python error: Segmentation fault``, TVM's fatal message, a traceback);
* the parent's ``sys.path``: a worker is a new ``python -m`` process, so a module the parent
  found on a path added at run time (pytest's rootdir, a script's ``sys.path.insert``) would
  not import there, or another installed copy of ``tvm_ext`` would (``import tvm`` in the
  worker loads the installed one through the ``tvm.backends`` entry point, before any task or
  initializer runs). The executor cannot set a worker's environment, so while the pool is
  open ``PYTHONPATH`` in ``os.environ`` starts with the parent's ``sys.path`` (restored by
  :meth:`IsolatedPool.close`): workers see the modules the parent sees, as with
  ``multiprocessing``'s spawn.

Limits inherited from the executor: the timeout is measured inside the worker (a timer
thread), so it needs the hung code to release the GIL (a Python timer thread keeps running
through a long ``tvm.compile``, so TVM's calls do); and a
worker's exit code is not reported (a worker killed without a word, e.g. by the OOM killer,
shows as "no output").
"""
from __future__ import annotations

import faulthandler
import functools
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tvm.support.popen_pool import PopenPoolExecutor, StatusKind

#: How much of a task's log is read: its start (a fatal error's first line) and its end.
_HEAD_BYTES = 65536
_TAIL_BYTES = 4000


@dataclass
class TaskOutcome:
    """What became of one task: ``value`` if it returned, else ``failure`` and ``message``."""

    index: int
    task: Any
    value: Any = None
    failure: str | None = None  # "timeout" or "crash" (the worker died, or the task raised)
    message: str = ""
    seconds: float = 0.0


def _run_logged(fn: Callable[[Any], Any], job: tuple[Any, str]) -> tuple[Any, float]:
    """Worker side: ``fn(task)`` with stdout/stderr sent to the job's log; returns the value and its seconds.

    The start time goes to ``<log>.start`` so that a crash can be timed too.
    """
    task, log_path = job
    Path(log_path + ".start").write_text(repr(time.time()))
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    faulthandler.enable()
    start = time.perf_counter()
    value = fn(task)
    return value, time.perf_counter() - start


def _read_log(path: Path) -> str:
    """The start and the end of a task's log (the whole log when it is short)."""
    try:
        with open(path, "rb") as f:
            data = f.read(_HEAD_BYTES)
            size = f.seek(0, os.SEEK_END)
            if size > len(data):
                f.seek(max(len(data), size - _TAIL_BYTES))
                data += b"\n" + f.read()
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", "replace").strip()


def _seconds_since_start(log: Path) -> float:
    try:
        return max(0.0, time.time() - float(Path(str(log) + ".start").read_text()))
    except (FileNotFoundError, ValueError):  # the worker died before the task started
        return 0.0


def _last_words(tail: str) -> str:
    lines = [ln.strip() for ln in tail.splitlines() if ln.strip()]
    fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
    return fatal[0] if fatal else (lines[-1] if lines else "no output")


class IsolatedPool:
    """Run ``fn(task)`` for many tasks in ``jobs`` worker processes.

    Parameters
    ----------
    fn : callable
        A module-level function (workers import it by name); its return value must be picklable.
    jobs : int
        Number of worker processes (>= 1).
    timeout : float, optional
        Seconds one task may take before it is cut off and its worker killed.
    """

    def __init__(self, fn: Callable[[Any], Any], jobs: int = 1, timeout: float | None = None):
        if jobs < 1:
            raise ValueError(f"jobs must be >= 1, got {jobs}")
        self.fn, self.jobs, self.timeout = fn, jobs, timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="tvm_ext_pool_")
        self._saved_pythonpath = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([p for p in sys.path if p] + [self._saved_pythonpath or ""])
        self._executor = PopenPoolExecutor(max_workers=jobs, timeout=timeout)

    def __enter__(self) -> IsolatedPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop all workers, remove their logs and restore ``PYTHONPATH``."""
        self._executor.shutdown(wait=True)
        self._tmp.cleanup()
        if self._saved_pythonpath is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = self._saved_pythonpath

    def map(self, tasks: Iterable[Any]) -> Iterator[TaskOutcome]:
        """Yield one :class:`TaskOutcome` per task, in task order."""
        tasks = list(tasks)
        logs = [Path(self._tmp.name) / f"task_{i}.log" for i in range(len(tasks))]
        calls = self._executor.map_with_error_catching(functools.partial(_run_logged, self.fn),
                                                       [(t, str(log)) for t, log in zip(tasks, logs)])
        for index, (task, log, result) in enumerate(zip(tasks, logs, calls)):
            yield self._outcome(index, task, log, result)
            for path in (log, Path(str(log) + ".start")):
                path.unlink(missing_ok=True)

    def _outcome(self, index: int, task: Any, log: Path, result: Any) -> TaskOutcome:
        if result.status == StatusKind.COMPLETE:
            value, seconds = result.value
            return TaskOutcome(index, task, value=value, seconds=seconds)
        seconds = _seconds_since_start(log)
        if result.status == StatusKind.TIMEOUT:
            return TaskOutcome(index, task, failure="timeout", seconds=seconds,
                               message=f"no result after {self.timeout:g} s; worker killed")
        if isinstance(result.value, ChildProcessError):  # the worker died
            message = f"worker died: {_last_words(_read_log(log))}"
        else:  # the task raised; the executor sends back its traceback as the message
            message = _last_words(str(result.value))
        return TaskOutcome(index, task, failure="crash", seconds=seconds, message=message)
