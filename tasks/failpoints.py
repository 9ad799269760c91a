"""Failpoints: named places where a test makes the process die or an I/O step fail once.

`DRAFTSMITH_FAILPOINTS="extract.shard=kill,generate.server=fail-once"` arms them; unset (always,
outside tests) they cost one dictionary lookup. `fire@N` (the N-th time the point is reached) and
`fire@N+` (that time and every time after) call the point's own `on_fire` action instead, e.g. killing
an engine. They let the recovery tests crash a stage at a known point instead of racing a timer.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

ENV = "DRAFTSMITH_FAILPOINTS"
_fired: set[str] = set()
_reached: dict[str, int] = {}


class InjectedFailure(OSError):
    """A transient failure raised by an armed `fail-once` failpoint."""


def armed() -> dict[str, str]:
    spec = os.environ.get(ENV, "")
    pairs = (item.split("=", 1) for item in spec.split(",") if "=" in item)
    return {name.strip(): action.strip() for name, action in pairs}


def failpoint(name: str, on_fire: Callable[[], None] | None = None) -> None:
    """Die (`kill`: SIGKILL, no cleanup), raise once (`fail-once`) or call `on_fire` (`fire@N`, `fire@N+`) here."""
    action = armed().get(name)
    if action is None:
        return
    if action.startswith("fire@") and on_fire is not None:
        _reached[name] = _reached.get(name, 0) + 1
        every = action.endswith("+")
        if _reached[name] == int(action[5:].rstrip("+")) or (every and _reached[name] > int(action[5:-1])):
            on_fire()
    elif action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "fail-once" and name not in _fired:
        _fired.add(name)
        raise InjectedFailure(f"failpoint {name}: injected transient failure")
