"""Drive many requests through the client: fixed worker pool, journal before counting, clean stops."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from tasks.generate.client import ChatClient
from tasks.generate.journal import JournalWriter

log = logging.getLogger(__name__)
SYNC_EVERY_S = 0.2  # how often a partial journal batch is checked for its max delay


@dataclass
class RunTally:
    """What one run did (this run only; the journal holds earlier runs)."""

    done: int = 0
    failed: int = 0
    cost: float = 0.0
    stopped: str | None = None  # out_of_credits | budget
    stop_detail: str = ""
    unsent: int = 0
    errors: dict[str, int] = field(default_factory=dict)

    def add(self, later: RunTally) -> None:
        """Take in a later round of the same run (its cost already counts this one's)."""
        self.done, self.failed, self.unsent = self.done + later.done, self.failed + later.failed, self.unsent + later.unsent
        self.cost, self.stopped, self.stop_detail = later.cost, later.stopped, later.stop_detail
        for kind, n in later.errors.items():
            self.errors[kind] = self.errors.get(kind, 0) + n


async def run_requests(
    prompts: Iterable[dict],
    client: ChatClient,
    journal: JournalWriter,
    concurrency: int,
    budget_usd: float | None = None,
    spent_usd: float = 0.0,
    on_record: Callable[[dict], None] | None = None,
) -> RunTally:
    """Send every prompt; journal each outcome; stop asking on 402 or when the budget is spent."""
    tally = RunTally(cost=spent_usd)
    pending = iter(prompts)
    stop = asyncio.Event()
    if budget_usd is not None and spent_usd >= budget_usd:
        tally.stopped, tally.stop_detail = "budget", f"spent ${spent_usd:.4f} of ${budget_usd:.4f} in earlier runs"
        stop.set()

    async def worker() -> None:
        for prompt in pending:
            if stop.is_set():
                tally.unsent += 1
                continue
            record = await client.complete(prompt)
            if record["status"] == "stopped":
                # Not journaled: the request was not served, so a rerun (with credits) asks again.
                tally.stopped, tally.stop_detail = record["kind"], record["detail"]
                tally.unsent += 1
                stop.set()
                continue
            journal.append(record)
            if record["status"] == "done":
                tally.done += 1
                tally.cost += record.get("cost") or 0.0
                if budget_usd is not None and tally.cost >= budget_usd and not stop.is_set():
                    tally.stopped, tally.stop_detail = "budget", f"spent ${tally.cost:.4f} of ${budget_usd:.4f}"
                    stop.set()
            else:
                tally.failed += 1
                tally.errors[record["kind"]] = tally.errors.get(record["kind"], 0) + 1
            if on_record is not None:
                on_record(record)

    async def syncer() -> None:
        while True:
            await asyncio.sleep(SYNC_EVERY_S)
            journal.sync_if_due()

    sync_task = asyncio.create_task(syncer())
    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
    finally:
        sync_task.cancel()
        journal.sync()
    if tally.stopped:
        log.warning("generation stopped (%s): %s; %d prompts not sent", tally.stopped, tally.stop_detail, tally.unsent)
    return tally
