"""Build progress as log records: which stage, which generator on which function, and how much of
its planning budget that generator spent.

The driver and the selection pass emit a :class:`ProgressEvent` at DEBUG level on the logger
:data:`PROGRESS_LOGGER`; a front end shows them (``tvm-ext inspect``'s bar names the stage and the
generator, and the budget share once it is done). :func:`listening` attaches a callback for the
duration of a block.

Example
-------
>>> with listening(lambda event: print(describe(event))):
...     tvm_ext.inspect.inspect("model.onnx")
graph: tilegraph on main
graph: tilegraph on main done, 12% of its planning budget
...
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

#: The logger the events go to (DEBUG level; :func:`listening` enables it while attached).
PROGRESS_LOGGER = "tvm_ext.progress"
_ATTR = "tvm_ext_progress"


@dataclass(frozen=True)
class ProgressEvent:
    """One step of a build.

    Attributes
    ----------
    stage : str
        ``graph``, ``schedule``, ``lower`` or ``build`` (with the re-selection round after the
        first: ``graph (round 2)``).
    generator, function : str or None
        The generator proposing candidates, and for which Relax function (graph stage only).
    share : float or None
        When the generator is done: the larger of the work and the seconds it spent over its
        budget's (0 for an unlimited budget); None at its start.
    seconds, work : float
        When the generator is done: the seconds it took to propose and the work units it charged.
    """

    stage: str
    generator: str | None = None
    function: str | None = None
    share: float | None = None
    seconds: float = 0.0
    work: float = 0.0


def describe(event: ProgressEvent) -> str:
    """One line for a progress bar."""
    text = event.stage
    if event.generator is not None:
        text += f": {event.generator}" + (f" on {event.function}" if event.function else "")
    if event.share is not None:
        text += f" done, {100 * event.share:.0f}% of its planning budget"
    return text


def emit(event: ProgressEvent) -> None:
    """Log ``event`` (a no-op unless someone listens)."""
    logger = logging.getLogger(PROGRESS_LOGGER)
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(describe(event), extra={_ATTR: event})


class _Forward(logging.Handler):
    def __init__(self, callback: Callable[[ProgressEvent], None]):
        super().__init__(logging.DEBUG)
        self.callback = callback

    def emit(self, record: logging.LogRecord) -> None:  # noqa: D102 - logging protocol
        event = getattr(record, _ATTR, None)
        if event is not None:
            self.callback(event)


@contextlib.contextmanager
def listening(callback: Callable[[ProgressEvent], None]) -> Iterator[None]:
    """Call ``callback`` with every :class:`ProgressEvent` emitted within the block (the records
    do not reach other handlers)."""
    logger = logging.getLogger(PROGRESS_LOGGER)
    handler = _Forward(callback)
    level, propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
        logger.propagate = propagate


__all__ = ["PROGRESS_LOGGER", "ProgressEvent", "describe", "emit", "listening"]
