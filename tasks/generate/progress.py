"""Progress on the command line (rich), in Prefect (a progress artifact) and in the run log (a line every
LOG_EVERY_S: rows done of total, rows/s and tokens/s, ETA, cost so far, replies awaited), fed one record at a time."""

from __future__ import annotations

import asyncio
import logging
import statistics
import time
from collections import deque

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from tasks.progress_log import LOG_EVERY_S, rate_and_eta

log = logging.getLogger(__name__)
ARTIFACT_EVERY_S = 2.0  # Prefect API calls are ~30 ms each: update the artifact at most this often


def in_prefect_run() -> bool:
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


class GenerationProgress:
    """A rich progress bar plus a Prefect progress artifact (when inside a flow or task run)."""

    def __init__(self, total: int, key: str = "generate-progress", concurrency: int = 1):
        self.total = max(total, 1)
        self.done = 0
        self.failed = 0
        self.cost = 0.0
        self.tokens = 0
        self.concurrency = concurrency
        self.queued = deque(maxlen=50)  # seconds the last replies waited in the server's queue, where reported
        self.started = time.monotonic()
        self._last_push = 0.0
        self._artifact_id = None
        if in_prefect_run():
            from prefect.artifacts import create_progress_artifact

            self._artifact_id = create_progress_artifact(0.0, key=key, description="generate: requests finished")
        self._bar = Progress(
            TextColumn("generate"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[status]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._task = self._bar.add_task("generate", total=total, status="")

    def __enter__(self) -> GenerationProgress:
        self._bar.start()
        return self

    def __exit__(self, *exc) -> None:
        self._push(force=True)
        self._bar.stop()

    def add(self, more: int) -> None:
        """More requests to make (the next turns of conversations regenerated turn by turn)."""
        self.total += more
        self._bar.update(self._task, total=self.total)

    def update(self, record: dict) -> None:
        if record["status"] == "done":
            self.done += 1
            self.cost += record.get("cost") or 0.0
            self.tokens += record.get("completion_tokens") or 0
            if record.get("server_queue_s") is not None:
                self.queued.append(record["server_queue_s"])
        else:
            self.failed += 1
        status = f"failed {self.failed}  ${self.cost:.4f}"
        self._bar.update(self._task, completed=self.done + self.failed, status=status)
        self._push()

    def line(self) -> str:
        """One progress line for the run log."""
        finished, seconds = self.done + self.failed, max(time.monotonic() - self.started, 1e-9)
        left = self.total - finished
        waiting = f"awaiting {min(left, self.concurrency)} replies" if left else "all replies in"
        if left and self.queued:
            queued = statistics.median(self.queued)
            waiting += f", the last {len(self.queued)} waited {queued:.1f} s (median) in the server's queue"
        pace = f"{rate_and_eta(finished, self.total, seconds, 'rows')}, {self.tokens / seconds:.1f} tokens/s"
        return f"generate: {finished}/{self.total} rows ({self.failed} failed), {pace}, ${self.cost:.4f} so far; {waiting}"

    def log_line(self) -> None:
        log.info(self.line())  # `tasks` is one of Prefect's extra loggers: the line reaches the run log too

    async def log_every(self, seconds: float = LOG_EVERY_S) -> None:
        """Log a progress line every `seconds` until cancelled, replies arriving or not."""
        while True:
            await asyncio.sleep(seconds)
            self.log_line()

    def _push(self, force: bool = False) -> None:
        now = time.monotonic()
        if self._artifact_id is None or (not force and now - self._last_push < ARTIFACT_EVERY_S):
            return
        self._last_push = now
        from prefect.artifacts import update_progress_artifact

        try:
            update_progress_artifact(self._artifact_id, 100.0 * (self.done + self.failed) / self.total)
        except Exception as e:  # progress is cosmetic; never fail a paid-for run over it
            log.debug("progress artifact update failed: %s", e)
