"""Retries and write pacing for remote calls, and streaming uploads and downloads through one client.

:class:`Retrier` runs one attempt function until it returns an answer that is not transient,
sleeping between attempts: exponential backoff with jitter for 5xx answers and dropped or reset
connections; ``Retry-After`` for secondary rate limits; until ``x-ratelimit-reset`` when the primary
limit is used up. After a bounded number of attempts it raises :class:`ci.base.errors.RemoteError` with a
one-line message. ``sleep``, ``clock`` and the jitter RNG are injectable so that tests run fast.
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ci.base.errors import RemoteError

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

    def _errors(self) -> list[dict]:
        """The entries of a 422 body's ``errors`` list (none when the body is not such JSON)."""
        try:
            data = self.json()
        except ValueError:
            return []
        if not isinstance(data, dict):
            return []
        return [e for e in data.get("errors") or [] if isinstance(e, dict)]

    def error_codes(self) -> list[str]:
        """The ``code`` of each entry of a 422 body's ``errors`` list."""
        return [str(e.get("code")) for e in self._errors()]

    def error_messages(self) -> list[str]:
        """The ``message`` of each entry of a 422 body's ``errors`` list that has one."""
        return [str(e["message"]) for e in self._errors() if e.get("message")]

    def message(self) -> str:
        try:
            data = self.json()
        except ValueError:
            return ""
        return str(data.get("message", "")) if isinstance(data, dict) else ""


@dataclass
class WritePacer:
    """Spaces content-creating requests the way GitHub asks: at least ``min_interval`` seconds apart, at
    most ``per_minute`` in any 60 s and ``per_hour`` in any hour (its secondary limits: 80 and 500), so
    that a long release or maintenance run waits a little instead of meeting a secondary rate limit.

    ``clock``/``sleep`` are injectable (tests run on a fake clock). Waits imposed by the minute or hour
    budget are reported through ``log`` (what waits, how long, why); the one-second gaps are only
    counted in ``stats``."""

    min_interval: float = 1.0
    per_minute: int = 80
    per_hour: int = 500
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    log: Callable[[str], None] | None = None
    stats: Counter[str] = field(default_factory=Counter)
    """``writes``, ``gap_waits``, ``budget_waits`` and ``waited_ms`` in all."""
    _times: list[float] = field(default_factory=list)

    def wait(self, what: str) -> None:
        """Block until one more write may go out now; call right before each write attempt."""
        now = self.clock()
        self._times = [t for t in self._times if now - t < 3600.0]
        delay, why = 0.0, ""
        if self._times and self._times[-1] + self.min_interval - now > 0:
            delay = self._times[-1] + self.min_interval - now
        minute = [t for t in self._times if now - t < 60.0]
        if len(minute) >= self.per_minute and minute[-self.per_minute] + 60.0 - now > delay:
            delay = minute[-self.per_minute] + 60.0 - now
            why = f"{len(minute)} writes in the last minute (GitHub allows {self.per_minute})"
        if len(self._times) >= self.per_hour and self._times[-self.per_hour] + 3600.0 - now > delay:
            delay = self._times[-self.per_hour] + 3600.0 - now
            why = f"{len(self._times)} writes in the last hour (GitHub allows {self.per_hour})"
        if delay > 0:
            self.stats["budget_waits" if why else "gap_waits"] += 1
            self.stats["waited_ms"] += int(delay * 1000)
            if why and self.log:
                self.log(f"pacing writes: waiting {delay:.1f}s before {what}: {why}")
            self.sleep(delay)
            now = max(self.clock(), now + delay)
        self._times.append(now)
        self.stats["writes"] += 1


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

    def backoff(self, attempt: int) -> float:
        """The jittered wait before retry ``attempt`` (1-based), capped at the policy's max_delay."""
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
                return "secondary", max(self.policy.secondary_default_wait, self.backoff(attempt))
            return None
        if resp.status >= 500:
            return "5xx", self.backoff(attempt)
        return None

    def run(self, what: str, attempt_fn: Callable[[], Response]) -> Response:
        """Run ``attempt_fn`` until its answer is not transient; ``what`` names the call in messages."""
        last = ""
        for attempt in range(1, self.policy.attempts + 1):
            try:
                resp = attempt_fn()
            except TransientError as exc:
                reason, wait = "connection", self.backoff(attempt)
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
            if self.logger:  # a warning: every retry and every wait shows in a command's output
                self.logger.warning(self.scrub(f"{what}: {last}; retry {attempt}/{self.policy.attempts - 1} in {wait:.1f}s"))
            self.sleep(wait)
        raise RemoteError(self.scrub(
            f"{what} failed after {self.policy.attempts} attempts ({last}): "
            "check the network and GitHub status, then re-run (every step is idempotent)"))


def _file_chunks(path: Path, label: str, total: int, progress: ProgressFn | None,
                 blocksize: int) -> Iterator[bytes]:
    done = 0
    with path.open("rb") as f:
        while chunk := f.read(blocksize):
            done += len(chunk)
            if progress:
                progress(label, done, total)
            yield chunk


def stream_upload(client: Any, url: str, path: Path, headers: dict[str, str], *, label: str,
                  progress: ProgressFn | None = None, timeout: float = 300.0, blocksize: int = 1 << 20) -> Response:
    """POST the bytes of ``path`` to ``url`` through ``client`` (the store's one HTTP client, which
    honours HTTP(S)_PROXY / NO_PROXY), streamed from disk in ``blocksize`` pieces.

    Raises :class:`TransientError` when the connection fails before an answer arrives.
    """
    import httpx2

    size = path.stat().st_size
    try:
        resp = client.post(url, content=_file_chunks(path, label, size, progress, blocksize),
                           headers={**headers, "Content-Length": str(size)}, timeout=timeout)
        return Response(resp.status_code, {k.lower(): v for k, v in resp.headers.items()}, resp.content)
    except (httpx2.TransportError, OSError) as exc:
        raise TransientError(type(exc).__name__) from None


def stream_get(client: Any, url: str, headers: dict[str, str], dest: Path, *, label: str, total: int,
               progress: ProgressFn | None, timeout: float) -> tuple[Response, str]:
    """One GET through ``client`` (redirects followed; the client drops ``Authorization`` when a redirect
    leaves the origin); a 200 body is streamed into ``dest`` via a temporary file beside it.

    Returns the answer (body only for non-200 answers) and the sha256 hex of what was written.
    """
    import hashlib
    import os

    import httpx2

    part = dest.with_name(dest.name + ".part")
    try:
        with client.stream("GET", url, headers=headers, timeout=timeout) as resp:
            hdrs = {k.lower(): v for k, v in resp.headers.items()}
            if resp.status_code != 200:
                return Response(resp.status_code, hdrs, resp.read()), ""
            digest = hashlib.sha256()
            done = 0
            with part.open("wb") as out:
                for chunk in resp.iter_raw(1 << 20):
                    out.write(chunk)
                    digest.update(chunk)
                    done += len(chunk)
                    if progress:
                        progress(label, done, total or done)
        expected = hdrs.get("content-length")
        if expected is not None and int(expected) != done:
            raise TransientError(f"short read ({done} of {expected} bytes)")
        os.replace(part, dest)
        return Response(200, hdrs, b""), digest.hexdigest()
    except (httpx2.TransportError, OSError) as exc:
        raise TransientError(type(exc).__name__) from None
    finally:
        part.unlink(missing_ok=True)
