"""Failpoints: named places where a test makes the process die or an I/O step fail once.

`DRAFTSMITH_FAILPOINTS="extract.shard=kill,generate.server=fail-once"` arms them; unset (always,
outside tests) they cost one dictionary lookup. They let the recovery tests crash a stage at a
known point instead of racing a timer.
"""

from __future__ import annotations

import os
import signal

ENV = "DRAFTSMITH_FAILPOINTS"
_fired: set[str] = set()


class InjectedFailure(OSError):
    """A transient failure raised by an armed `fail-once` failpoint."""


def armed() -> dict[str, str]:
    spec = os.environ.get(ENV, "")
    pairs = (item.split("=", 1) for item in spec.split(",") if "=" in item)
    return {name.strip(): action.strip() for name, action in pairs}


def failpoint(name: str) -> None:
    """Die (`kill`: SIGKILL, no cleanup) or raise once (`fail-once`) here when armed."""
    action = armed().get(name)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "fail-once" and name not in _fired:
        _fired.add(name)
        raise InjectedFailure(f"failpoint {name}: injected transient failure")
