"""The GitHub REST API as one adapter: authentication, token scrubbing, retries, pacing, pagination and streaming.

JSON endpoints go through ghapi's generated operations (``GhApi(gh_host=api_url)``); uploads are
streamed from disk (ghapi's ``upload_file`` reads the whole file into memory). Every request -- API
calls, uploads, asset and artifact downloads, public URLs -- goes through one HTTP client
(:attr:`GitHubAPI.http`), which honours HTTP_PROXY / HTTPS_PROXY / NO_PROXY. Every call is retried by
:class:`ci.store.http.Retrier`; content-creating calls are paced by :class:`ci.store.http.WritePacer`.

Nothing here reads the environment: the entry point passes the token and API URL. The token never
appears in a message, log line, progress label or repr. What the answers mean (releases, assets,
artifacts) is for the callers: :mod:`ci.store.github` and :mod:`ci.store.artifacts`.
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ci.base import log
from ci.base.errors import RemoteError
from ci.store.http import (
    ProgressFn,
    Response,
    Retrier,
    RetryPolicy,
    TransientError,
    WritePacer,
    stream_get,
    stream_upload,
)

API_VERSION = "2022-11-28"
MAX_PAGES = 10_000
"""Pages one listing may take before the Link header is taken for a loop."""
CHUNK = 1 << 20


def _lower(headers: Any) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in headers.items()}


def _next_query(link: str) -> dict[str, str] | None:
    """The query parameters of the ``rel="next"`` URL of a Link header, or None on the last page."""
    for part in link.split(","):
        m = re.search(r'<([^>]*)>\s*;\s*rel="?next"?', part.strip())
        if m:
            return {k: v[0] for k, v in parse_qs(urlsplit(m.group(1)).query).items()}
    return None


def _page_kwargs(params: dict[str, Any]) -> dict[str, Any]:
    """ghapi keyword arguments for a page query (unknown parameters go through ``query_``)."""
    kw: dict[str, Any] = {k: int(v) for k, v in params.items() if k in ("per_page", "page")}
    extra = {k: v for k, v in params.items() if k not in ("per_page", "page")}
    if extra:
        kw["query_"] = extra
    return kw


class GitHubAPI:
    """One GitHub repository's REST API, with the token kept out of every message.

    Args:
        repo: ``owner/name``.
        token: a token with ``contents: write`` (never logged).
        api_url: the REST API root (``https://api.github.com``, a GHES ``https://host/api/v3``, or a test server).
        retry: attempts and backoff; ``sleep``/``clock``/``seed`` make waiting testable.
        write_gap: seconds between content-creating requests (see :class:`ci.store.http.WritePacer`,
            which also keeps to GitHub's 80 per minute and 500 per hour).
        progress: ``progress(label, done, total)`` during uploads and downloads.
        logger: receives one warning per retry and per wait (what, why, how long), one info line per
            notable repair, and one debug line per change (default: the ``wheelhouse.github`` logger).
    """

    def __init__(self, repo: str, *, token: str, api_url: str = "https://api.github.com",
                 retry: RetryPolicy | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.time, seed: int | None = None,
                 progress: ProgressFn | None = None, logger: logging.Logger | None = None,
                 timeout: float = 60.0, upload_timeout: float = 900.0, write_gap: float = 1.0) -> None:
        from ghapi.core import GhApi  # deferred: importing ghapi builds its endpoint table

        owner, sep, name = repo.partition("/")
        if not sep or not owner or not name or "/" in name:
            raise RemoteError(f"GitHub repository {repo!r} is not of the form owner/name: fix the repository setting")
        if not token:
            raise RemoteError("no GitHub token: set GITHUB_TOKEN (or GH_TOKEN) to a token with contents: write")
        self.owner, self.name = owner, name
        self.api_url = api_url.rstrip("/")
        self.repo_path = f"/repos/{owner}/{name}"
        self._token = token
        self._progress = progress
        self.log = logger = logger or log.get("github")
        self.upload_timeout = upload_timeout
        self.rng = random.Random(seed)
        self.retrier = Retrier(policy=retry or RetryPolicy(), sleep=sleep, clock=clock, rng=self.rng,
                               logger=logger, scrub=self.scrub)
        self.pacer = WritePacer(min_interval=write_gap, clock=clock, sleep=sleep,
                                log=lambda line: logger.warning(self.scrub(line)))
        # authenticate=False: GhApi would otherwise read GITHUB_TOKEN / GITHUB_JWT_TOKEN itself.
        api = GhApi(owner=owner, repo=name, gh_host=self.api_url, authenticate=False, sync=True, timeout=timeout)
        api.headers["Authorization"] = f"token {token}"  # the transport shares this dict
        api.headers["X-GitHub-Api-Version"] = API_VERSION
        api.transport.retries = 0  # retries (and their sleeps) are ours
        # One pooled client (keep-alive) instead of a new connection per call; it drops the
        # Authorization header on cross-host redirects (asset downloads go to object storage).
        import httpx2

        self.http = httpx2.Client(timeout=timeout, follow_redirects=True)  # trust_env: the proxy variables
        api.transport.client = self.http
        self._ghapi = api

    def close(self) -> None:
        self._ghapi.transport.close()

    def __repr__(self) -> str:
        return f"GitHubAPI({self.owner}/{self.name!s}, api_url={self.api_url!r})"

    @property
    def stats(self) -> dict[str, int]:
        """Retries made so far: ``retries`` and one count per reason."""
        return dict(self.retrier.stats)

    # ---- messages ---------------------------------------------------------------------------------
    def scrub(self, text: str) -> str:
        return log.mask(text, self._token)

    def info(self, msg: str) -> None:
        self.log.info(self.scrub(msg))

    def debug(self, msg: str) -> None:
        self.log.debug(self.scrub(msg))

    def fail(self, what: str, resp: Response, fix: str = "") -> RemoteError:
        """The one-line error for an answer ``what`` cannot use (the token never in it)."""
        msg = resp.message()
        details = resp.error_messages()
        if resp.status == 422 and details:  # e.g. code "custom": "file_count limited to 1000 assets"
            return RemoteError(self.scrub(f"{what}: HTTP 422 {'; '.join(details)}: GitHub refused it "
                                          "(a limit or a validation rule); fix the cause, re-running will not help"))
        hint = fix or {
            401: "the token is invalid or expired: set GITHUB_TOKEN to a valid token",
            403: "the token lacks permission: it needs contents: write on the repository",
            404: f"repository {self.owner}/{self.name} not found or not visible to the token",
        }.get(resp.status, "see GitHub's status page and re-run")
        return RemoteError(self.scrub(f"{what}: HTTP {resp.status}{(' ' + msg) if msg else ''}; {hint}"))

    # ---- JSON operations --------------------------------------------------------------------------
    def call(self, what: str, op: str, *, write: bool = False, **kwargs: Any) -> Response:
        """One ghapi operation (``group.name``) with retries; returns the final answer, any status.
        ``write``: a content-creating request, paced (each attempt)."""
        from fasttransport.errors import APIError

        group, _, fname = op.partition(".")
        fn = getattr(getattr(self._ghapi, group), fname)

        def attempt() -> Response:
            if write:
                self.pacer.wait(what)
            try:
                r = fn(raw_=True, **kwargs)
            except APIError as e:
                if e.response is not None:
                    return Response(e.response.status_code, _lower(e.response.headers), e.response.content)
                if e.retryable:
                    raise TransientError(e.error_type or "connection error") from None
                raise RemoteError(self.scrub(f"{what}: {e.error_type or 'request failed'}: check api_url "
                                             f"{self.api_url} and the network")) from None
            return Response(r.status_code, _lower(r.headers), r.content)

        return self.retrier.run(what, attempt)

    def paged(self, what: str, op: str, *, per_page: int | None = None, **kwargs: Any) -> Iterator[Response]:
        """Each page of a listing through the ghapi operation ``op`` (``group.name``), with retries: the
        first page (``per_page`` items when given, else GitHub's default), then each Link
        ``rel="next"`` page, so N items take ceil(N/per_page) requests and nothing is asked after
        the last page (ghapi's ``paged`` asks one empty page more). A non-200 answer is yielded and
        ends the listing; the caller decides what it means."""
        params: dict[str, Any] | None = {"per_page": per_page, "page": 1} if per_page else {}
        seen: set[tuple[tuple[str, str], ...]] = set()
        while params is not None:
            key = tuple(sorted((k, str(v)) for k, v in params.items()))
            if key in seen or len(seen) >= MAX_PAGES:
                raise RemoteError(f"{what}: the Link header points back to a page already read, or past "
                                  f"{MAX_PAGES} pages; check api_url")
            seen.add(key)
            resp = self.call(f"{what} (page {params.get('page', len(seen))})", op, **kwargs, **_page_kwargs(params))
            yield resp
            if resp.status != 200:
                return
            params = _next_query(resp.headers.get("link", ""))

    # ---- streaming --------------------------------------------------------------------------------
    def _auth_headers(self) -> dict[str, str]:
        """The headers of a request made outside ghapi (uploads, authenticated downloads)."""
        return {"Authorization": f"token {self._token}", "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION, "User-Agent": "wheelhouse"}

    def upload(self, url: str, path: Path, content_type: str, *, label: str) -> Response:
        """One streamed, paced POST of ``path`` to ``url`` (an ``upload_url``), retried on transient failures."""
        headers = {**self._auth_headers(), "Content-Type": content_type}

        def attempt() -> Response:
            self.pacer.wait(label)
            return stream_upload(self.http, url, path, headers, label=label, progress=self._progress,
                                 timeout=self.upload_timeout)

        return self.retrier.run(label, attempt)

    def download(self, path: str, dest: Path, *, what: str, label: str, total: int = 0,
                 timeout: float | None = None) -> tuple[Response, str]:
        """GET ``path`` (under the API URL, with the token) into ``dest``, streamed, with retries.

        Redirects are followed and the client drops the token when one leaves the API's host (an
        artifact's zip is served from signed storage). Returns the final answer (with its body when
        it is not a 200) and the sha256 hex of the bytes written (``""`` unless 200)."""
        digest = ""

        def attempt() -> Response:
            nonlocal digest
            resp, digest = stream_get(self.http, f"{self.api_url}{path}", self._auth_headers(), dest, label=label,
                                      total=total, progress=self._progress, timeout=timeout or self.upload_timeout)
            return resp

        resp = self.retrier.run(what, attempt)
        return resp, digest if resp.status == 200 else ""

    def stream_public(self, url: str) -> Iterator[bytes]:
        """The bytes at a public URL (an asset's download URL), in chunks, without the token."""
        import httpx2

        try:
            with self.http.stream("GET", url, timeout=self.upload_timeout) as resp:
                if resp.status_code != 200:
                    raise RemoteError(f"download {url}: HTTP {resp.status_code}")
                yield from resp.iter_raw(CHUNK)
        except httpx2.TransportError as exc:
            raise RemoteError(f"download {url}: {type(exc).__name__}; check the network") from None

    def get_public(self, url: str) -> bytes | None:
        """The bytes at a public URL (e.g. the published site's ``digests.json``) without the token; None
        when it answers 404."""
        import httpx2

        try:
            resp = self.http.get(url, timeout=60.0)
        except httpx2.TransportError as exc:
            raise RemoteError(f"GET {url}: {type(exc).__name__}") from None
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise RemoteError(f"GET {url}: HTTP {resp.status_code}")
        return resp.content
