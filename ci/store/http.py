"""Retries for remote calls, and a streaming upload over http.client.

:class:`Retrier` runs one attempt function until it returns an answer that is not transient,
sleeping between attempts: exponential backoff with jitter for 5xx answers and dropped or reset
connections; ``Retry-After`` for secondary rate limits; until ``x-ratelimit-reset`` when the primary
limit is used up. After a bounded number of attempts it raises :class:`ci.errors.RemoteError` with a
one-line message. ``sleep``, ``clock`` and the jitter RNG are injectable so that tests run fast.
"""

from __future__ import annotations

import http.client
import json
import logging
import random
import socket
import ssl
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

from ci.errors import RemoteError

ProgressFn = Callable[[str, int, int], None]
"""progress(label, bytes done, bytes total)."""


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8
    """Attempts per call, the first included."""
    base_delay: float = 1.0
    max_delay: float = 60.0
    secondary_default_wait: float = 60.0
    """Wait after a secondary rate limit that names no Retry-After (GitHub: "at least one minute")."""
    max_rate_limit_wait: float = 3600.0
    """Longest wait for a primary rate-limit reset; beyond it the call fails at once."""


@dataclass(frozen=True)
class Response:
    status: int
    headers: dict[str, str]
    """Lower-cased names."""
    body: bytes = b""

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    def error_codes(self) -> list[str]:
        """The ``code`` of each entry of a 422 body's ``errors`` list."""
        try:
            data = self.json()
        except ValueError:
            return []
        if not isinstance(data, dict):
            return []
        return [str(e.get("code")) for e in data.get("errors") or [] if isinstance(e, dict)]

    def error_messages(self) -> list[str]:
        """The ``message`` of each entry of a 422 body's ``errors`` list that has one."""
        try:
            data = self.json()
        except ValueError:
            return []
        if not isinstance(data, dict):
            return []
        return [str(e["message"]) for e in data.get("errors") or [] if isinstance(e, dict) and e.get("message")]

    def message(self) -> str:
        try:
            data = self.json()
        except ValueError:
            return ""
        return str(data.get("message", "")) if isinstance(data, dict) else ""


class TransientError(Exception):
    """A connection that failed without an HTTP answer (refused, reset, dropped, timed out)."""


@dataclass
class Retrier:
    policy: RetryPolicy = field(default_factory=RetryPolicy)
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.time
    rng: random.Random = field(default_factory=random.Random)
    logger: logging.Logger | None = None
    scrub: Callable[[str], str] = lambda s: s
    stats: Counter[str] = field(default_factory=Counter)
    """``retries`` in all and one count per reason (``5xx``, ``connection``, ``secondary``, ``primary``)."""

    def _backoff(self, attempt: int) -> float:
        cap = min(self.policy.max_delay, self.policy.base_delay * 2 ** (attempt - 1))
        return cap * (0.5 + 0.5 * self.rng.random())

    def classify(self, resp: Response, attempt: int) -> tuple[str, float] | None:
        """(reason, wait) when ``resp`` is worth another attempt, else None."""
        h = resp.headers
        if resp.status in (403, 429):
            retry_after = h.get("retry-after")
            if retry_after is not None:
                try:
                    return "secondary", max(0.0, float(retry_after))
                except ValueError:
                    return "secondary", self.policy.secondary_default_wait
            if h.get("x-ratelimit-remaining") == "0" and h.get("x-ratelimit-reset"):
                wait = max(0.0, float(h["x-ratelimit-reset"]) - self.clock()) + 1.0
                if wait > self.policy.max_rate_limit_wait:
                    raise RemoteError(
                        f"GitHub API rate limit used up until {time.strftime('%H:%M:%S', time.localtime(float(h['x-ratelimit-reset'])))}: "
                        "re-run after that time (every step is idempotent) or use a token with a higher limit")
                return "primary", wait
            if resp.status == 429 or "secondary rate limit" in resp.message().lower():
                return "secondary", max(self.policy.secondary_default_wait, self._backoff(attempt))
            return None
        if resp.status >= 500:
            return "5xx", self._backoff(attempt)
        return None

    def run(self, what: str, attempt_fn: Callable[[], Response]) -> Response:
        """Run ``attempt_fn`` until its answer is not transient; ``what`` names the call in messages."""
        last = ""
        for attempt in range(1, self.policy.attempts + 1):
            try:
                resp = attempt_fn()
            except TransientError as exc:
                reason, wait = "connection", self._backoff(attempt)
                last = f"connection failed: {exc}"
            else:
                verdict = self.classify(resp, attempt)
                if verdict is None:
                    return resp
                reason, wait = verdict
                last = f"HTTP {resp.status}" + (f" {resp.message()}" if resp.message() else "")
            if attempt == self.policy.attempts:
                break
            self.stats["retries"] += 1
            self.stats[reason] += 1
            if self.logger:
                self.logger.info(self.scrub(f"{what}: {last}; retry {attempt}/{self.policy.attempts - 1} in {wait:.1f}s"))
            self.sleep(wait)
        raise RemoteError(self.scrub(
            f"{what} failed after {self.policy.attempts} attempts ({last}): "
            "check the network and GitHub status, then re-run (every step is idempotent)"))


class _ProgressReader:
    """A file object whose reads report progress."""

    def __init__(self, f: Any, label: str, total: int, progress: ProgressFn | None) -> None:
        self._f, self._label, self._total, self._progress, self._done = f, label, total, progress, 0

    def read(self, n: int = -1) -> bytes:
        chunk = self._f.read(n)
        self._done += len(chunk)
        if self._progress and chunk:
            self._progress(self._label, self._done, self._total)
        return chunk


def stream_upload(url: str, path: Path, headers: dict[str, str], *, label: str, progress: ProgressFn | None = None,
                  timeout: float = 300.0, blocksize: int = 1 << 20) -> Response:
    """POST the bytes of ``path`` to ``url`` without reading the file into memory.

    Raises :class:`TransientError` when the connection fails before an answer arrives.
    """
    parts = urlsplit(url)
    target = parts.path + (f"?{parts.query}" if parts.query else "")
    size = path.stat().st_size
    conn: http.client.HTTPConnection
    if parts.scheme == "https":
        conn = http.client.HTTPSConnection(parts.hostname or "", parts.port, timeout=timeout,
                                           context=ssl.create_default_context(), blocksize=blocksize)
    else:
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=timeout, blocksize=blocksize)
    try:
        with path.open("rb") as f:
            body = _ProgressReader(f, label, size, progress)
            conn.request("POST", target, body=body, headers={**headers, "Content-Length": str(size)})  # type: ignore[arg-type]
            resp = conn.getresponse()
            data = resp.read()
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
    except (OSError, http.client.HTTPException, socket.timeout) as exc:
        raise TransientError(type(exc).__name__) from None
    finally:
        conn.close()
