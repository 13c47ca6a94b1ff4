"""One publish at a time into a site directory, and the one that waits is told which run holds it.

Two ``publish-index`` (or ``prune --apply``) runs into one directory interleaved their renames and writes;
the site ended consistent, but the second run failed blaming the directory ("cannot write the site … No such
file or directory"). A publish into a directory now holds an exclusive ``flock`` on
``.<site name>.wheelhouse-publish.lock`` beside the site (not in it: the site's files are what a publish
lists and replaces) from before it reads the published site until it has written the new one. The holder
writes who it is into the lock file (process id, command line, start time); a second publish does not wait:
it stops at once, naming that run. The kernel drops the lock when its holder exits, killed or not, so a
lock file left behind never blocks anyone.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from ci.base import log
from ci.base.errors import WheelhouseError

SUFFIX = ".wheelhouse-publish.lock"
_MAX_HOLDER_BYTES = 4096


def lock_file(site: Path) -> Path:
    return site.parent / f".{site.name}{SUFFIX}"


def _holder_line() -> bytes:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    command = log.redact(shlex.join([Path(sys.argv[0]).name, *sys.argv[1:]])) if sys.argv else "python"
    return json.dumps({"pid": os.getpid(), "command": command, "started": started}).encode()


HOLDER_PATIENCE_S = 2.0
"""How long a refused run waits for the holder to write its line (it takes the lock, then writes)."""


def _describe_holder(fd: int) -> str:
    """Who holds the lock, as its holder wrote it; a holder that has not written yet is still a holder."""
    deadline = time.monotonic() + HOLDER_PATIENCE_S
    while True:
        try:
            raw = json.loads(os.pread(fd, _MAX_HOLDER_BYTES, 0) or b"{}")
            pid, command, started = int(raw["pid"]), str(raw["command"]), str(raw["started"])
        except (ValueError, KeyError, TypeError, OSError):
            if time.monotonic() < deadline:
                time.sleep(0.05)
                continue
            return "a run that has not said which yet"
        return f"process {pid}, `{log.printable(command)}`, started {log.printable(started)}"


@contextlib.contextmanager
def held(site: Path) -> Iterator[None]:
    """Hold the publish lock of ``site`` for the block; WheelhouseError naming the holder when another run has
    it, or when the lock cannot be made where the site's directory would be."""
    path = lock_file(site)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise WheelhouseError(f"cannot write the site to {site} ({exc.strerror}); name a writable directory") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise WheelhouseError(
                f"{site}: another publish is writing this site ({_describe_holder(fd)}); let it finish, then run "
                "this again (it publishes the same store's releases)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, _holder_line(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
