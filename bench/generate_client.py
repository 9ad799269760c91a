"""Client throughput: draftsmith's generate client vs the official openai AsyncOpenAI + semaphore.

A local canned server answers every request after a fixed latency (1 s: LLM APIs take seconds), so
the ceiling is Little's law: concurrency / latency requests per second. Each client runs in its own
process, so its CPU time and peak memory are its own.

    .venv/bin/python bench/generate_client.py            # 1,000 requests at concurrency 64 and 256
    .venv/bin/python bench/generate_client.py --quick    # 200 requests

The tables land in bench/results/generate-client.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.publish import Table, save  # noqa: E402

PROMPT = "Explain, step by step, how a hash map handles collisions, with a short example. Row {i}."


def make_prompts(n: int) -> list[dict]:
    return [
        {
            "id": f"bench:{i}",
            "source": "bench",
            "tools": None,
            "messages": json.dumps([{"role": "user", "content": PROMPT.format(i=i)}]),
        }
        for i in range(n)
    ]


async def run_draftsmith(base_url: str, concurrency: int, prompts: list[dict]) -> int:
    from tasks.config import ApiConfig, RequestConfig
    from tasks.generate.client import ChatClient
    from tasks.generate.journal import JournalWriter
    from tasks.generate.runner import run_requests

    api = ApiConfig(base_url=base_url, provider="openai", concurrency=concurrency, max_retries=0)
    client = ChatClient(api, RequestConfig(max_tokens=64), "canned", "bench-key", base_url)
    with tempfile.TemporaryDirectory() as tmp, JournalWriter(Path(tmp) / "journal.jsonl") as journal:
        tally = await run_requests(prompts, client, journal, concurrency)
    await client.aclose()
    return tally.done


async def run_openai(base_url: str, concurrency: int, prompts: list[dict]) -> int:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="bench-key", max_retries=0)
    gate = asyncio.Semaphore(concurrency)

    async def one(prompt: dict) -> bool:
        async with gate:
            reply = await client.chat.completions.create(
                model="canned", messages=json.loads(prompt["messages"]), max_tokens=64, temperature=0.7
            )
            return bool(reply.choices)

    done = sum(await asyncio.gather(*(one(p) for p in prompts)))
    await client.close()
    return done


def worker(name: str, base_url: str, concurrency: int, n: int) -> None:
    """Measure one client in this process and print a JSON line."""
    import torch  # noqa: F401  (the stage imports torch too; keep the memory baselines comparable)

    prompts = make_prompts(n)
    run = run_draftsmith if name == "draftsmith" else run_openai
    asyncio.run(run(base_url, concurrency, prompts[: min(n, concurrency)]))  # warm-up: connections, imports
    before = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.perf_counter()
    done = asyncio.run(run(base_url, concurrency, prompts))
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"done": done, "rps": done / wall, "cpu_ms": 1000 * cpu / n, "rss_mb": after.ru_maxrss / 1024}))


def measure(name: str, base_url: str, concurrency: int, n: int) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        name,
        "--base-url",
        base_url,
        "--concurrency",
        str(concurrency),
        "--requests",
        str(n),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="200 requests instead of 1,000")
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=1.0, help="server latency in seconds")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--worker", choices=["draftsmith", "openai"], help=argparse.SUPPRESS)
    parser.add_argument("--base-url", help=argparse.SUPPRESS)
    args = parser.parse_args()
    n = 200 if args.quick else args.requests
    if args.worker:
        worker(args.worker, args.base_url, args.concurrency[0], n)
        return
    code = (
        f"import sys; sys.path.insert(0, {str(ROOT)!r}); from tests.support.faults import serve_forever; "
        f"serve_forever(0, {args.latency})"
    )
    server = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        base_url = f"http://127.0.0.1:{server.stdout.readline().strip()}/v1"
        rows = []
        for c in args.concurrency:
            rows.append(
                {
                    "concurrency": c,
                    "draftsmith": measure("draftsmith", base_url, c, n),
                    "openai": measure("openai", base_url, c, n),
                }
            )
    finally:
        server.terminate()
        server.wait()
    raw = {"requests": n, "latency_s": args.latency, "rows": rows}
    save("generate-client", client_tables(raw), raw=raw)


def client_tables(raw: dict) -> list[Table]:
    """Throughput against Little's-law limit, and CPU and memory per request, draftsmith beside the SDK."""
    latency = raw["latency_s"]
    title = f"{raw['requests']:,} requests, server latency {latency:g} s, canned replies"
    speed = Table(
        f"Throughput: {title}",
        ["concurrency", "limit r/s", "draftsmith r/s", "of limit", "SDK r/s", "of limit (SDK)", "draftsmith / SDK"],
        note="limit: concurrency / latency (Little's law); SDK: openai.AsyncOpenAI behind an asyncio.Semaphore.",
    )
    cost = Table(
        f"Cost per request: {title}",
        ["concurrency", "draftsmith CPU ms", "SDK CPU ms", "SDK / draftsmith CPU", "draftsmith peak MiB", "SDK peak MiB"],
    )
    for row in raw["rows"]:
        c, ours, sdk = row["concurrency"], row["draftsmith"], row["openai"]
        limit = c / latency
        speed.add(c, limit, ours["rps"], ours["rps"] / limit, sdk["rps"], sdk["rps"] / limit, ours["rps"] / sdk["rps"])
        cost.add(c, ours["cpu_ms"], sdk["cpu_ms"], sdk["cpu_ms"] / ours["cpu_ms"], ours["rss_mb"], sdk["rss_mb"])
    return [speed, cost]


if __name__ == "__main__":
    main()
