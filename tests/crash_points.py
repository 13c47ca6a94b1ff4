"""Kill a piece of work at every step, the way a SIGKILL would: in a forked child that calls
``os._exit`` at the k-th crash point, so no ``finally``, no ``with`` exit and no lock release runs
except what the death of the process itself does.

A crash point is the moment just before and just after each call of the named functions
(``(owner, attribute)`` pairs, patched in the child only).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any

KILLED = 137


def run_killed_at(k: int, action: Callable[[], Any], points: Iterable[tuple[Any, str]]) -> bool:
    """Run ``action`` in a child that dies at crash point ``k`` (0-based); True if it died there,
    False if the action finished before reaching point ``k``."""
    pid = os.fork()
    if pid == 0:  # the child: never returns
        code = 1
        try:
            seen = [0]

            def point() -> None:
                if seen[0] == k:
                    os._exit(KILLED)
                seen[0] += 1

            for owner, attr in points:
                original = getattr(owner, attr)

                def wrapped(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
                    point()
                    result = _original(*args, **kwargs)
                    point()
                    return result

                setattr(owner, attr, wrapped)
            action()
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    code = os.waitstatus_to_exitcode(status)
    assert code in (0, KILLED), f"the action failed in the child (exit status {code}) at crash point {k}"
    return code == KILLED


def kill_at_every_step(action: Callable[[], Any], points: Iterable[tuple[Any, str]], *, prepare: Callable[[int], Any],
                       check: Callable[[int], Any], limit: int = 200) -> int:
    """For k = 0, 1, ...: ``prepare(k)``, run ``action`` killed at point k, ``check(k)``; stop at the first k
    the action survives (it was checked too). Returns the number of crash points."""
    points = list(points)
    for k in range(limit):
        prepare(k)
        died = run_killed_at(k, action, points)
        check(k)
        if not died:
            return k
    raise AssertionError(f"the action still had crash points after {limit}")
