"""Progress lines in the run log at a steady cadence, for the stages that work in a loop (shards, train steps).

The stage counts what it finished; a daemon thread writes one line every `every` seconds, finished or not:
`<stage>: 3/8 shards, 0.42 shards/s, ETA 12 s; <what it is doing or waiting on>`. The thread runs in a copy of
the caller's context, so inside a Prefect run its lines reach that run's log (`tasks` is an extra logger).
"""

from __future__ import annotations

import contextvars
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)
LOG_EVERY_S = 15.0


def rate_and_eta(done: int, total: int, seconds: float, unit: str) -> str:
    """'0.42 shards/s, ETA 12 s', or the ETA as unknown before the first one finished."""
    rate = done / max(seconds, 1e-9)
    left = total - done
    eta = f"ETA {left / rate:.0f} s" if rate > 0 else "ETA unknown (none finished yet)"
    return f"{rate:.2f} {unit}/s, {eta}"


class ProgressLog:
    """`with ProgressLog("train", 200, "steps", note=...) as progress: ... progress.advance()`."""

    def __init__(self, stage: str, total: int, unit: str, note: Callable[[], str] | None = None, every: float = LOG_EVERY_S):
        self.stage, self.total, self.unit, self.every = stage, total, unit, every
        self.note = note
        self.done = 0
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def advance(self, n: int = 1) -> None:
        self.done += n

    def line(self) -> str:
        text = f"{self.stage}: {self.done}/{self.total} {self.unit}, "
        text += rate_and_eta(self.done, self.total, time.monotonic() - self.started, self.unit)
        note = self.note() if self.note else ""
        return f"{text}; {note}" if note else text

    def _tick(self) -> None:
        while not self._stop.wait(self.every):
            log.info(self.line())

    def __enter__(self) -> ProgressLog:
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._tick,), name=f"{self.stage}-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        log.info(self.line())
