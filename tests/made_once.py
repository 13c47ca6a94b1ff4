"""What the tests make once and keep under .cache/ (a built wheel, a venv, a download), made by one test worker
while the others wait for it: parallel workers would otherwise make it at once, each into the other's files."""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def one_maker(path: Path) -> Iterator[None]:
    """Hold the lock of ``path`` (a file or folder under .cache/) while the caller checks for it and makes it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.parent / f".{path.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
