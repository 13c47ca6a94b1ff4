"""The processes a build leaves running, found and ended before anything is compared after it.

A build's code can start a process that detaches (forks twice, ``setsid``) and outlives the build: without
this, it could change the interpreter after the before/after comparison and the next command with a token would
run its code. For the length of the build this process is the *child subreaper* of its descendants (Linux
``PR_SET_CHILD_SUBREAPER``): an orphaned descendant becomes its child instead of init's, so when the build is done
every process it left running is a child of this one, which ends (``SIGKILL``) and reaps it. Children this
process had before the build are left alone.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Iterator

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_ROUNDS = 100
"""Sweeps at most: each kills what the previous left (a process forking as fast as it can is caught within a few)."""


def _prctl(option: int, value: object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, value, 0, 0, 0))


def children(pid: int, *, running: bool = False) -> set[int]:
    """The processes whose parent is ``pid`` (read from /proc); with ``running``, not those that have exited and
    wait to be reaped (zombies)."""
    found = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as fp:
                fields = fp.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid and not (running and fields[0] == b"Z"):
            found.add(int(entry))
    return found


@contextlib.contextmanager
def adopted() -> Iterator[list[int]]:
    """Adopt the block's orphaned descendants; on leaving it, end every one still running and reap it. The list
    yielded is filled, on leaving, with the ids of the processes ended."""
    ended: list[int] = []
    if not sys.platform.startswith("linux"):
        yield ended
        return
    was = ctypes.c_int(0)
    _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(was))
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    own = os.getpid()
    kept = children(own)
    try:
        yield ended
    finally:
        for _ in range(_ROUNDS):
            left = children(own) - kept
            if not left:
                break
            running = children(own, running=True) & left  # the others have exited: only reaped
            for pid in running:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for pid in left:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, 0)
            ended += sorted(running)
        _prctl(_PR_SET_CHILD_SUBREAPER, was.value)
