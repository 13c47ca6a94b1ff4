"""One logging path: the ``wheelhouse`` logger, named steps, streamed commands, transfer progress.

The library logs through child loggers of ``wheelhouse`` (:func:`get`) and never prints; the entry
points (tasks.py, noxfile.py) call :func:`configure` once, which sends every line to stderr:

- :class:`Steps` names the phases of a long command: a header line, and at the end its duration.
  On GitHub Actions each step is folded between ``::group::`` and ``::endgroup::`` (cibuildwheel's
  logger is the model), so a build log reads as one line per step until a step is opened.
- :func:`report_error` writes a one-line error: ``error: ...``, or on GitHub Actions an
  ``::error::`` annotation, which the run's summary shows.
- :func:`stream` runs a long command (a torch install, ``uv python install``, ``git fetch``, an sdist
  download) with its output shown as it comes, line by line, and keeps the last lines for the
  one-line error; ``\\r``-redrawn progress lines (git's) are shown at most every few seconds.
- :class:`TransferProgress` reports uploads and downloads: a bar on a terminal, and a line per tenth
  (in MiB) in CI logs or whenever stderr is not a terminal.

Secrets: every line written passes :func:`redact`, which masks the credentials of URLs
(``https://user:token@host`` becomes ``https://***@host``); the GitHub store masks its token itself
(:func:`mask`).
"""

from __future__ import annotations

import collections
import logging
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from ci.base.errors import WheelhouseError

ROOT = "wheelhouse"
MIB = 1024 * 1024
URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@]+@")


def get(area: str) -> logging.Logger:
    """The logger of one part of the library, e.g. ``get("build")`` is ``wheelhouse.build``."""
    return logging.getLogger(f"{ROOT}.{area}")


def redact(text: str) -> str:
    """``text`` with the user and password of every URL in it masked."""
    return URL_USERINFO.sub(r"\1***@", text)


def printable(text: str) -> str:
    """``text`` with every character that does not print (terminal escapes, newlines, other control and
    format characters) written as its Python escape (``\\x1b``, ``\\n``, ``\\u202e``): a value read from a file
    or a server cannot colour, move or clear the terminal, nor add a line of its own."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in text)


MIN_MASKED_LENGTH = 8
"""Shorter values are not masked by :func:`mask`: a test token ``t`` would mask every ``t`` of the output
(real tokens are 40 characters or more)."""


def mask(text: str, secret: str | None) -> str:
    """``text`` with every occurrence of ``secret`` (a token, a password) replaced by ``***``."""
    return text.replace(secret, "***") if secret and len(secret) >= MIN_MASKED_LENGTH else text


def _escape(text: str) -> str:
    """A workflow command's data, escaped as GitHub's runner reads it."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


class _Formatter(logging.Formatter):
    """Plain lines; steps and errors as GitHub Actions workflow commands when ``github_actions``."""

    def __init__(self, github_actions: bool) -> None:
        super().__init__("%(message)s")
        self.github_actions = github_actions

    def format(self, record: logging.LogRecord) -> str:
        text = redact(super().format(record))
        kind = getattr(record, "wheelhouse", None)
        if kind == "step-start":
            return f"::group::{_escape(text)}" if self.github_actions else f"--- {text}"
        if kind == "step-end":
            return f"{text}\n::endgroup::" if self.github_actions else f"--- {text}"
        if kind == "error":
            return f"::error::{_escape(text)}" if self.github_actions else f"error: {text}"
        return text


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is at the time of each line (test runners swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> IO[str]:
        return sys.stderr

    @stream.setter
    def stream(self, _value: IO[str]) -> None:
        pass


def configure(*, github_actions: bool = False, stream: IO[str] | None = None,
              level: int = logging.INFO) -> logging.Handler:
    """Send the ``wheelhouse`` logger's lines to ``stream`` (stderr); once per process (a second call
    replaces the first handler). Returns the handler."""
    logger = logging.getLogger(ROOT)
    for old in [h for h in logger.handlers if getattr(h, "wheelhouse", False)]:
        logger.removeHandler(old)
    handler: logging.Handler = logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    handler.wheelhouse = True  # type: ignore[attr-defined]
    handler.setFormatter(_Formatter(github_actions))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    return handler


def out(text: str) -> None:
    """A command's result on stdout (a path, a JSON document), for the program or person that runs it; every
    other line goes to the logger (stderr). The one writer of stdout in the library."""
    sys.stdout.write(f"{text}\n")
    sys.stdout.flush()


def report_error(message: str, logger: logging.Logger | None = None) -> None:
    """One error line: ``error: <message>``, an ``::error::`` annotation on GitHub Actions."""
    (logger or logging.getLogger(ROOT)).error(message, extra={"wheelhouse": "error"})


class Steps:
    """Named steps of one long command, each ended with its duration.

    ``start(title)`` ends the step before it; ``close()`` (or leaving the ``with`` block) ends the last
    one, as failed when an exception is on its way out, so that an error line comes after the group
    it belongs to.
    """

    def __init__(self, logger: logging.Logger | None = None, clock=time.monotonic) -> None:
        self.logger = logger or logging.getLogger(ROOT)
        self._clock = clock
        self._title: str | None = None
        self._key: str | None = None
        self._started = 0.0
        self._first_start: float | None = None
        self._took: dict[str, float] = {}

    def start(self, title: str, *, key: str | None = None) -> None:
        """Begin a step; ``key`` names it in :meth:`durations` (unkeyed steps are only logged)."""
        self.close()
        self._title, self._key, self._started = title, key, self._clock()
        if self._first_start is None:
            self._first_start = self._started
        self.logger.info(title, extra={"wheelhouse": "step-start"})

    def close(self, ok: bool = True) -> None:
        if self._title is None:
            return
        took = self._clock() - self._started
        if self._key is not None:
            self._took[self._key] = took
        self.logger.info(f"{self._title}: {'done in' if ok else 'failed after'} {took:.1f}s",
                         extra={"wheelhouse": "step-end"})
        self._title = None

    def durations(self) -> dict[str, float]:
        """Seconds per keyed step, the running one up to now, and ``total`` since the first step began."""
        now = self._clock()
        took = dict(self._took)
        if self._title is not None and self._key is not None:
            took[self._key] = now - self._started
        took["total"] = 0.0 if self._first_start is None else now - self._first_start
        return took

    def __enter__(self) -> Steps:
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        self.close(ok=exc_type is None)


@dataclass(frozen=True)
class Streamed:
    """What a streamed command left: its exit status and its last lines of output."""

    returncode: int
    tail: tuple[str, ...]

    @property
    def last_line(self) -> str:
        return self.tail[-1] if self.tail else "no output"

    def text(self) -> str:
        return "\n".join(self.tail)


def stream(cmd: Sequence[str], *, env: dict[str, str] | None = None, cwd: Path | None = None,
           logger: logging.Logger | None = None, keep: int = 40, redraw_every: float = 5.0,
           clock=time.monotonic) -> Streamed:
    """Run ``cmd`` with stdout and stderr merged, logging each line as it arrives (indented).

    A line ended by ``\\r`` alone is a progress bar redrawing itself: it is shown at most every
    ``redraw_every`` seconds; the line that finishes it (ended by ``\\n``) is always shown.
    """
    logger = logger or get("run")
    tail: collections.deque[str] = collections.deque(maxlen=keep)
    last_redraw = float("-inf")
    redrawn = False
    try:
        process = subprocess.Popen(list(cmd), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    except OSError as exc:
        return Streamed(127, (f"{cmd[0]}: {exc.strerror or exc}",))
    output = cast(IO[bytes], process.stdout)
    pending = b""
    with process:
        while chunk := output.read1(1 << 16):  # type: ignore[attr-defined]
            pending += chunk
            held = b"\r" if pending.endswith(b"\r") else b""  # it may be the first half of \r\n
            *segments, pending = re.split(rb"(\r\n|\r|\n)", pending[:len(pending) - len(held)])
            pending += held
            for text, sep in zip(segments[::2], segments[1::2], strict=True):
                line = text.decode("utf-8", "replace").rstrip()
                if not line:
                    continue
                if redrawn and tail:
                    tail.pop()  # a redrawn line is replaced by the next one
                tail.append(line)
                redrawn = sep == b"\r"
                if redrawn:
                    if clock() - last_redraw < redraw_every:
                        continue
                    last_redraw = clock()
                logger.info("  %s", line)
        line = pending.decode("utf-8", "replace").strip()
        if line:
            tail.append(line)
            logger.info("  %s", line)
    return Streamed(process.returncode, tuple(tail))


def run_streamed(cmd: Sequence[str], what: str, *, env: dict[str, str] | None = None, cwd: Path | None = None,
                 hint: str = "", logger: logging.Logger | None = None) -> Streamed:
    """:func:`stream`, then on a non-zero exit one line: ``could not <what>: <last output line>[; hint]``
    (``hint``: what to do about it, or what was run)."""
    result = stream(cmd, env=env, cwd=cwd, logger=logger)
    if result.returncode != 0:
        raise WheelhouseError(redact(f"could not {what}: {result.last_line[:300]}" + (f"; {hint}" if hint else "")))
    return result


class TransferProgress:
    """``progress(label, done, total)`` for uploads and downloads.

    ``bar``: a tqdm bar per label (on a terminal); otherwise one line per tenth, in MiB (KiB below
    one MiB): ``upload x.whl: 30% (120.0 of 400.0 MiB)``. A transfer that starts again (a retry) starts over.
    """

    def __init__(self, *, bar: bool = False, logger: logging.Logger | None = None, stream: IO[str] | None = None) -> None:
        self.bar = bar
        self.logger = logger or get("transfer")
        self._stream = stream
        self._state: dict[str, tuple[int, int]] = {}
        self._bars: dict[str, Any] = {}

    def __call__(self, label: str, done: int, total: int) -> None:
        label = redact(label)
        if self.bar:
            self._draw(label, done, total)
            return
        decile = min(10, done * 10 // total) if total else 10
        before = self._state.get(label)
        if before is not None and done >= before[1] and decile == before[0]:
            self._state[label] = (decile, done)
            return
        self._state[label] = (decile, done)
        unit, size = ("MiB", MIB) if total >= MIB else ("KiB", 1024)
        self.logger.info(f"{label}: {decile * 10}% ({done / size:.1f} of {total / size:.1f} {unit})")

    def _draw(self, label: str, done: int, total: int) -> None:
        from tqdm import tqdm

        bar = self._bars.get(label)
        if bar is not None and done < bar.n:  # a retry starts the transfer over
            bar.close()
            bar = None
        if bar is None:
            bar = self._bars[label] = tqdm(total=total, desc=label, unit="B", unit_scale=True, unit_divisor=1024,
                                           file=self._stream or sys.stderr, leave=True, dynamic_ncols=True)
        bar.update(done - bar.n)
        if total and done >= total:
            bar.close()
            del self._bars[label]
