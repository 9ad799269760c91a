"""Progress lines at a steady cadence, from their own thread, into the run log of the Prefect run around them."""

import asyncio
import re
import time

from tasks.progress_log import ProgressLog
from tasks.sharded import waiting_on


def test_lines_keep_coming_while_the_work_stalls_and_reach_the_flow_runs_log(prefect_harness):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler
    from prefect.runtime import flow_run

    @flow
    def stalls() -> str:
        with ProgressLog("train", 4, "steps", note=lambda: "loss 2.000", every=0.05) as progress:
            progress.advance()
            time.sleep(0.3)  # a slow step: the lines keep coming
            progress.advance(3)
        return flow_run.id

    run_id = stalls()

    async def messages() -> list[str]:
        await APILogHandler.aflush()
        async with get_client() as client:
            logs = await client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
            return [log.message for log in logs]

    lines = [m for m in asyncio.run(messages()) if m.startswith("train: ")]
    assert len(lines) >= 4, lines
    assert re.fullmatch(r"train: 1/4 steps, \d+\.\d\d steps/s, ETA \d+ s; loss 2\.000", lines[1]), lines
    assert lines[-1].startswith("train: 4/4 steps, ") and "ETA 0 s" in lines[-1]


def test_a_line_says_which_shards_it_waits_on():
    names = [f"part-{i:05d}-0000" for i in range(6)]
    assert waiting_on(names[:2]) == "waiting on part-00000-0000, part-00001-0000"
    assert waiting_on(names) == "waiting on part-00000-0000, part-00001-0000, part-00002-0000 and 3 more"
    assert waiting_on([]) == "all shards done"
    progress = ProgressLog("extract", 5, "shards")
    assert progress.line() == "extract: 0/5 shards, 0.00 shards/s, ETA unknown (none finished yet)"
