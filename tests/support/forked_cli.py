"""`draftsmith` runs forked from one process that has already imported what a run imports.

Each run is a process of its own (its own pid, run lock, failpoints and exit status; SIGKILL ends it alone), started
by `fork` from a parent that imported prefect, torch, transformers and great_expectations once, so a chain of short
runs does not pay ~15 s of imports per run. The parent is single-threaded when it forks (nothing is started on
import), and each child exits through the interpreter as `draftsmith` does, so Prefect's exit handlers still send
its logs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.pipeline_runs import ROOT

PARENT = r"""
import json, os, sys, threading
import great_expectations, torch, transformers  # what every run imports by its first gate
import flows.cli, flows.pipeline
assert threading.active_count() == 1, threading.enumerate()
print("ready", flush=True)
for line in sys.stdin:
    request = json.loads(line)
    sys.stdout.flush(), sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.environ.update(request["env"])
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(log, 1), os.dup2(log, 2), os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        sys.argv = ["draftsmith", *request["args"]]
        flows.cli.app(args=request["args"], prog_name="draftsmith")  # always ends in SystemExit
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status), flush=True)
"""


class ForkedCli:
    """A parent process with the imports done; `run` forks one `draftsmith ARGS` from it and waits for it."""

    def __init__(self, env: dict[str, str]):
        pipes = {"stdin": subprocess.PIPE, "stdout": subprocess.PIPE, "text": True}
        self.parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=ROOT, env=os.environ | env, **pipes)
        ready = self.parent.stdout.readline().strip()
        if ready != "ready":
            self.close()
            raise RuntimeError(f"the forking parent did not start (exit {self.parent.returncode}): {ready!r}")

    def run(self, args: list[str], log: Path, env: dict[str, str] | None = None) -> int:
        """Exit status of `draftsmith ARGS` with `env` added, its output in `log` (negative: killed by that signal)."""
        self.parent.stdin.write(json.dumps({"args": args, "log": str(log), "env": env or {}}) + "\n")
        self.parent.stdin.flush()
        status = self.parent.stdout.readline()
        if not status:
            raise RuntimeError(f"the forking parent ended (exit {self.parent.wait(60)}) during `draftsmith {' '.join(args)}`")
        return int(status)

    def close(self) -> None:
        if self.parent.stdin:
            self.parent.stdin.close()
        self.parent.wait(60)

    def __enter__(self) -> ForkedCli:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
