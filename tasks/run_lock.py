"""One run per run directory: the pipeline and every stage flow hold `runs/<name>/.lock` while they work.

A second run of the same config fails at once, naming the holder (pid, host, start time), so a reply is
never bought twice by two runs racing on one journal. The lock is an OS file lock (flock): it dies with
its process, so a killed run never blocks the next one; the holder it recorded is then reported as taken
over. Within one process the lock is re-entrant (the pipeline holds it while its stage flows run).
"""

from __future__ import annotations

import fcntl
import functools
import inspect
import json
import logging
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

from tasks.config import RunConfig

log = logging.getLogger(__name__)

_held: dict[str, list[int]] = {}  # lock path -> [fd, depth]
_guard = threading.Lock()


class RunLocked(RuntimeError):
    """The run directory is in use by another live run."""


def _describe(holder: dict) -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(holder.get("started", 0)))
    return f"pid {holder.get('pid')} on {holder.get('host')}, started {started} ({holder.get('command', '?')})"


def _read(fd: int) -> dict:
    raw = os.pread(fd, 4096, 0)
    try:
        return json.loads(raw) if raw.strip() else {}
    except ValueError:
        return {"pid": "?", "host": "?", "command": raw[:80].decode(errors="replace")}


def _acquire(path: Path, run_dir: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _read(fd)
        os.close(fd)
        raise RunLocked(
            f"{run_dir} is in use by another run: {_describe(holder)}; wait for it to finish, or stop it "
            "(a killed run releases the lock by itself)"
        ) from None
    previous = _read(fd)
    if previous:  # released by the OS, never by its run: that run was killed
        log.warning("%s: took over the lock of a run that ended without releasing it (%s)", run_dir, _describe(previous))
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(), "command": " ".join(sys.argv)[:200]}
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps(holder).encode(), 0)
    return fd


@contextmanager
def run_lock(config: RunConfig):
    """Hold the run directory's lock (re-entrant in this process); RunLocked when another run holds it."""
    path = (config.run_dir / ".lock").resolve()
    key = str(path)
    with _guard:
        if key in _held:
            _held[key][1] += 1
        else:
            _held[key] = [_acquire(path, config.run_dir), 1]
    try:
        yield
    finally:
        with _guard:
            entry = _held[key]
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                os.ftruncate(entry[0], 0)  # an empty lock file: released in order
                fcntl.flock(entry[0], fcntl.LOCK_UN)
                os.close(entry[0])


def holds_run_lock(fn):
    """For a flow whose first parameter is the RunConfig: the body runs holding that run's lock."""

    @functools.wraps(fn)
    def locked(config: RunConfig, *args, **kwargs):
        with run_lock(config):
            return fn(config, *args, **kwargs)

    locked.__signature__ = inspect.signature(fn, eval_str=True)  # types resolved where `fn` was written
    return locked
