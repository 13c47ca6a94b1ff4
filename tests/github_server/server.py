"""A GitHub-compatible HTTP server for tests and benchmarks (the releases subset we use).

Two stdlib ``ThreadingHTTPServer`` instances: the API host and the uploads host (GitHub serves
uploads from ``uploads.github.com``; releases carry an absolute ``upload_url`` pointing there). The
uploads host also serves the signed "object storage" URLs that asset downloads redirect to, so a
download crosses hosts as it does on GitHub.

Semantics follow GitHub's REST reference (see ``tests/github_server/__init__.py`` for the list):
Link pagination, drafts listed but not found by tag, 422 ``already_exists`` for duplicate tags and
asset names, ``starter`` assets left by failed uploads, ``sha256:`` digests, primary and secondary
rate limits, and injectable faults (5xx, dropped connections, slow answers).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import re
import secrets
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from .names import normalize_asset_name
from .state import ArtifactRec, AssetRec, ReleaseRec, RepoState, ServerState

DOCS = "https://docs.github.com/rest"
SECONDARY_MESSAGE = ("You have exceeded a secondary rate limit. Please wait a few minutes before you try again. "
                     "If you reach out to GitHub Support for help, please include the request ID.")


@dataclass
class FaultConfig:
    """Random faults, drawn per request from a seeded RNG.

    ``rate`` is the probability that a request gets a fault; the kind is drawn with ``weights``.
    Kinds: ``500``/``502``/``503`` (error status), ``drop`` (close the connection without an answer),
    ``secondary`` (403 or 429 with ``retry-after`` drawn from ``retry_after``), ``slow`` (answer after
    ``slow_s``). For mutating requests a fraction ``after_apply`` of 5xx/drop faults strike after the
    change was made (the gateway failed, the backend did not): clients must converge, not duplicate.
    On uploads a ``drop`` reads part of the body first and leaves a ``starter`` asset, and a 502 after
    the body leaves one too (GitHub documents both); so does a 500 drawn ``after_apply`` (observed).
    """

    rate: float = 0.2
    seed: int = 0
    weights: dict[str, float] = field(default_factory=lambda: {
        "500": 1, "502": 1, "503": 1, "drop": 2, "secondary": 1.5, "slow": 0.5})
    retry_after: tuple[int, ...] = (0, 1)
    slow_s: float = 0.02
    after_apply: float = 0.3
    exclude: tuple[str, ...] = ("GET /rate_limit",)


@dataclass
class _Resp:
    status: int
    body: bytes | dict | list | None = None
    headers: dict[str, str] = field(default_factory=dict)


class _Drop(Exception):
    """Close the connection without answering."""


_ROUTES: list[tuple[str, str, str, str]] = [
    # (role, method, regex, template)
    ("api", "GET", r"/rate_limit", "/rate_limit"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/releases", "/repos/{owner}/{repo}/releases"),
    ("api", "POST", r"/repos/([^/]+)/([^/]+)/releases", "/repos/{owner}/{repo}/releases"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/releases/latest", "/repos/{owner}/{repo}/releases/latest"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/releases/tags/(.+)", "/repos/{owner}/{repo}/releases/tags/{tag}"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/releases/assets/(\d+)", "/repos/{owner}/{repo}/releases/assets/{asset_id}"),
    ("api", "PATCH", r"/repos/([^/]+)/([^/]+)/releases/assets/(\d+)", "/repos/{owner}/{repo}/releases/assets/{asset_id}"),
    ("api", "DELETE", r"/repos/([^/]+)/([^/]+)/releases/assets/(\d+)", "/repos/{owner}/{repo}/releases/assets/{asset_id}"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/releases/(\d+)/assets", "/repos/{owner}/{repo}/releases/{release_id}/assets"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/releases/(\d+)", "/repos/{owner}/{repo}/releases/{release_id}"),
    ("api", "PATCH", r"/repos/([^/]+)/([^/]+)/releases/(\d+)", "/repos/{owner}/{repo}/releases/{release_id}"),
    ("api", "DELETE", r"/repos/([^/]+)/([^/]+)/releases/(\d+)", "/repos/{owner}/{repo}/releases/{release_id}"),
    ("api", "DELETE", r"/repos/([^/]+)/([^/]+)/git/refs/tags/(.+)", "/repos/{owner}/{repo}/git/refs/tags/{tag}"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/git/matching-refs/(.*)", "/repos/{owner}/{repo}/git/matching-refs/{ref}"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/git/ref/tags/(.+)", "/repos/{owner}/{repo}/git/ref/tags/{tag}"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/actions/runs/(\d+)/artifacts",
     "/repos/{owner}/{repo}/actions/runs/{run_id}/artifacts"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/actions/artifacts/(\d+)", "/repos/{owner}/{repo}/actions/artifacts/{artifact_id}"),
    ("api", "GET", r"/repos/([^/]+)/([^/]+)/actions/artifacts/(\d+)/([^/]+)",
     "/repos/{owner}/{repo}/actions/artifacts/{artifact_id}/{archive_format}"),
    ("api", "GET", r"/([^/]+)/([^/]+)/releases/download/([^/]+)/([^/]+)", "/{owner}/{repo}/releases/download/{tag}/{name}"),
    ("uploads", "POST", r"/repos/([^/]+)/([^/]+)/releases/(\d+)/assets", "/repos/{owner}/{repo}/releases/{release_id}/assets"),
    ("uploads", "GET", r"/_objects/(\d+)/([^/]+)", "/_objects/{asset_id}/{name}"),
    ("uploads", "GET", r"/_artifacts/(\d+)", "/_artifacts/{artifact_id}"),
]
_COMPILED = [(role, m, re.compile(rx + r"/?"), t) for role, m, rx, t in _ROUTES]
_NO_AUTH = {"/{owner}/{repo}/releases/download/{tag}/{name}", "/_objects/{asset_id}/{name}", "/_artifacts/{artifact_id}"}
_MUTATING = {"POST", "PATCH", "DELETE", "PUT"}


def _validation(resource: str, field_: str, code: str = "already_exists") -> _Resp:
    return _Resp(422, {"message": "Validation Failed",
                       "errors": [{"resource": resource, "code": code, "field": field_}],
                       "documentation_url": DOCS, "status": "422"})


def _limit(field_: str, message: str) -> _Resp:
    """GitHub's answer to an upload past a release limit (code ``custom``, with a message)."""
    return _Resp(422, {"message": "Validation Failed",
                       "errors": [{"resource": "ReleaseAsset", "code": "custom", "field": field_, "message": message}],
                       "documentation_url": DOCS, "status": "422"})


def _not_found() -> _Resp:
    return _Resp(404, {"message": "Not Found", "documentation_url": DOCS, "status": "404"})


class GitHubTestServer:
    """The server pair plus the knobs tests turn. Use as a context manager or ``start()``/``stop()``.

    Attributes: ``api_url``, ``uploads_url``, ``token``, ``state`` (:class:`ServerState`),
    ``counters`` (Counter of ``"METHOD /template"``), ``fault_counts`` (Counter of fault kinds),
    ``log`` (list of ``(host role, method, path, sorted query names, status)``).
    """

    def __init__(self, *, token: str = "test-token", host: str = "127.0.0.1", api_port: int = 0,
                 uploads_port: int = 0, faults: FaultConfig | None = None, rate_limit: int = 5000,
                 clock: Callable[[], float] = time.time, keep_bytes: bool = True, keep_log: bool = True) -> None:
        self.token = token
        self.host = host
        self.clock = clock
        self.state = ServerState(clock)
        self.counters: Counter[str] = Counter()
        self.fault_counts: Counter[str] = Counter()
        self.faults_by_endpoint: Counter[str] = Counter()
        """``"<kind> METHOD /template"`` -> count."""
        self.log: list[tuple[str, str, str, tuple[str, ...], int]] = []
        self.keep_log = keep_log
        self.keep_bytes = keep_bytes
        self._faults = faults
        self._rng = random.Random(faults.seed if faults else 0)
        self._meta = threading.Lock()
        self._secondary_queue: list[tuple[int, int]] = []
        self.rate_limit = rate_limit
        self._rate_remaining = rate_limit
        self._rate_reset = int(clock()) + 3600
        self._signatures: dict[int, str] = {}
        self.content_limits: tuple[int, int] | None = None
        """(per minute, per hour) for content-creating requests (POST/PATCH/PUT/DELETE), GitHub's
        secondary limits are (80, 500); None (the default) enforces none. Past one: 403 with
        ``retry-after``, counted in ``fault_counts["content-limit"]``."""
        self.write_times: list[float] = []
        """Server-clock time of every content-creating request that was let through."""
        self._servers: list[ThreadingHTTPServer] = []
        self._threads: list[threading.Thread] = []
        self._ports = (api_port, uploads_port)
        self.api_url = ""
        self.uploads_url = ""

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> GitHubTestServer:
        for role, port in zip(("api", "uploads"), self._ports, strict=True):
            handler = type(f"{role.title()}Handler", (_Handler,), {"gh": self, "role": role})
            srv = ThreadingHTTPServer((self.host, port), handler)
            srv.daemon_threads = True
            srv.request_queue_size = 128
            self._servers.append(srv)
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True,
                                 name=f"github-test-{role}")
            t.start()
            self._threads.append(t)
        self.api_url = f"http://{self.host}:{self._servers[0].server_address[1]}"
        self.uploads_url = f"http://{self.host}:{self._servers[1].server_address[1]}"
        self.state.api_url = self.api_url
        self.state.uploads_url = self.uploads_url
        self.state.web_url = self.api_url  # browser_download_url is served by the API host
        return self

    def stop(self) -> None:
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        for t in self._threads:
            t.join(timeout=5)
        self._servers.clear()
        self._threads.clear()

    def __enter__(self) -> GitHubTestServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- knobs ----------------------------------------------------------------------------------
    def set_faults(self, faults: FaultConfig | None) -> None:
        with self._meta:
            self._faults = faults
            self._rng = random.Random(faults.seed if faults else 0)

    def inject_secondary(self, count: int = 1, *, status: int = 403, retry_after: int = 1) -> None:
        """The next ``count`` authenticated requests get a secondary rate limit answer."""
        with self._meta:
            self._secondary_queue.extend([(status, retry_after)] * count)

    def exhaust_primary(self, reset_in: float = 1.0) -> None:
        """Use up the primary rate limit; it refills ``reset_in`` seconds from now (server clock)."""
        with self._meta:
            self._rate_remaining = 0
            self._rate_reset = int(self.clock() + reset_in + 0.999)

    def reset_counters(self) -> None:
        with self._meta:
            self.counters.clear()
            self.fault_counts.clear()
            self.faults_by_endpoint.clear()
            self.log.clear()

    def requests(self, role: str | None = None) -> list[tuple[str, str, tuple[str, ...]]]:
        """Logged requests as (method, path, query names), optionally of one host role."""
        with self._meta:
            return [(m, p, q) for r, m, p, q, _ in self.log if role is None or r == role]

    # ---- seeding (delegates) -------------------------------------------------------------------
    def seed_release(self, tag: str, *, repo: str = "o/r", **kw: object) -> ReleaseRec:
        owner, name = repo.split("/")
        return self.state.seed_release(owner, name, tag, **kw)  # type: ignore[arg-type]

    def seed_bulk(self, n_releases: int, assets_per_release: int, *, repo: str = "o/r", **kw: object) -> None:
        owner, name = repo.split("/")
        self.state.seed_bulk(owner, name, n_releases, assets_per_release, **kw)  # type: ignore[arg-type]

    def seed_artifact(self, run_id: int, name: str, data: bytes, *, repo: str = "o/r", **kw: object) -> ArtifactRec:
        owner, rname = repo.split("/")
        return self.state.seed_artifact(owner, rname, run_id, name, data, **kw)  # type: ignore[arg-type]

    def tags(self, repo: str = "o/r") -> set[str]:
        """The repository's git tags (a moved or deleted release leaves its tag)."""
        return set(self.tag_commits(repo))

    def tag_commits(self, repo: str = "o/r") -> dict[str, str]:
        """Git tag -> commit sha."""
        owner, name = repo.split("/")
        with self.state.lock:
            r = self.state.repo(owner, name, create=False)
            return dict(r.tags) if r else {}

    def snapshot(self, repo: str = "o/r") -> dict[str, dict[str, tuple[str | None, str]]]:
        owner, name = repo.split("/")
        return self.state.snapshot(owner, name)

    # ---- rate limit bookkeeping ----------------------------------------------------------------
    def _rate_headers(self) -> dict[str, str]:
        return {"x-ratelimit-limit": str(self.rate_limit), "x-ratelimit-remaining": str(self._rate_remaining),
                "x-ratelimit-used": str(self.rate_limit - self._rate_remaining),
                "x-ratelimit-reset": str(self._rate_reset), "x-ratelimit-resource": "core"}

    def _charge(self) -> bool:
        """Count one request against the primary limit; False when exhausted."""
        with self._meta:
            now = self.clock()
            if now >= self._rate_reset:
                self._rate_remaining = self.rate_limit
                self._rate_reset = int(now) + 3600
            if self._rate_remaining <= 0:
                return False
            self._rate_remaining -= 1
            return True

    def _content_limit(self) -> int | None:
        """Seconds until one more content-creating request is allowed, or None (and it is counted)."""
        with self._meta:
            now = self.clock()
            if self.content_limits is not None:
                per_minute, per_hour = self.content_limits
                minute = [t for t in self.write_times if now - t < 60]
                hour = [t for t in self.write_times if now - t < 3600]
                waits = []
                if len(minute) >= per_minute:
                    waits.append(minute[-per_minute] + 60 - now)
                if len(hour) >= per_hour:
                    waits.append(hour[-per_hour] + 3600 - now)
                if waits:
                    self.fault_counts["content-limit"] += 1
                    return max(1, int(max(waits) + 0.999))
            self.write_times.append(now)
            return None

    def _draw_fault(self, key: str) -> tuple[str | None, bool, int]:
        """(kind, after_apply, retry_after) for this request."""
        with self._meta:
            if self._secondary_queue:
                status, ra = self._secondary_queue.pop(0)
                self.fault_counts[f"secondary-{status}"] += 1
                return f"secondary-{status}", False, ra
            f = self._faults
            if f is None or key in f.exclude or self._rng.random() >= f.rate:
                return None, False, 0
            kinds = list(f.weights)
            kind = self._rng.choices(kinds, weights=[f.weights[k] for k in kinds])[0]
            after = self._rng.random() < f.after_apply
            ra = self._rng.choice(f.retry_after)
            if kind == "secondary":
                kind = f"secondary-{self._rng.choice((403, 429))}"
            self.fault_counts[kind] += 1
            self.faults_by_endpoint[f"{kind}{'-after' if after else ''} {key}"] += 1
            return kind, after, ra


class _Handler(BaseHTTPRequestHandler):
    gh: GitHubTestServer
    role: str
    protocol_version = "HTTP/1.1"
    server_version = "GitHub.com"
    sys_version = ""

    def log_message(self, format: str, *args: object) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in separate writes; without this, Nagle's algorithm and the
        # peer's delayed ACK add ~40 ms to every keep-alive answer.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PATCH(self) -> None:
        self._dispatch("PATCH")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    # ---- plumbing ----------------------------------------------------------------------------
    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _json_body(self) -> dict:
        raw = self._body()
        try:
            data = json.loads(raw or b"{}")
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise _BadRequest()
        return data

    def _send(self, resp: _Resp, extra: dict[str, str]) -> None:
        body = resp.body
        if isinstance(body, (dict, list)):
            payload = json.dumps(body).encode()
            ctype = "application/json; charset=utf-8"
        else:
            payload = body or b""
            ctype = resp.headers.pop("content-type", "application/octet-stream" if payload else "")
        self.send_response(resp.status)
        headers = {**extra, **resp.headers}
        if ctype and resp.status != 204:
            headers["content-type"] = ctype
        headers["x-github-media-type"] = "github.v3; format=json"
        headers["x-github-request-id"] = secrets.token_hex(8).upper()
        for k, v in headers.items():
            self.send_header(k, v)
        if resp.status != 204:
            self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if resp.status != 204 and self.command != "HEAD":
            self.wfile.write(payload)

    def _drop(self) -> None:
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _dispatch(self, method: str) -> None:  # noqa: C901 - GitHub's checks in the order GitHub applies them
        gh = self.gh
        url = urlsplit(self.path)
        query = parse_qs(url.query, keep_blank_values=True)
        for role, m, rx, template in _COMPILED:  # noqa: B007 - the matching route's template is used below
            if role != self.role or m != method:
                continue
            match = rx.fullmatch(url.path)
            if match:
                break
        else:
            if method in ("POST", "PATCH", "PUT"):
                self._body()
            self._finish(method, url.path, query, "?", _not_found(), {})
            return
        key = f"{method} {template}"
        args = [unquote(g) for g in match.groups()]
        with gh._meta:
            gh.counters[key] += 1
        extra: dict[str, str] = {}
        if template not in _NO_AUTH:
            auth = self.headers.get("Authorization", "")
            scheme, _, tok = auth.partition(" ")
            if scheme.lower() not in ("token", "bearer") or tok.strip() != gh.token:
                if method in ("POST", "PATCH", "PUT"):
                    self._body()
                self._finish(method, url.path, query, key, _Resp(401, {
                    "message": "Bad credentials", "documentation_url": DOCS, "status": "401"}), {})
                return
            if template != "/rate_limit" and not gh._charge():
                if method in ("POST", "PATCH", "PUT"):
                    self._body()
                with gh._meta:
                    extra = gh._rate_headers()
                self._finish(method, url.path, query, key, _Resp(403, {
                    "message": "API rate limit exceeded for user ID 1.",
                    "documentation_url": "https://docs.github.com/rest/overview/rate-limits-for-the-rest-api",
                    "status": "403"}), extra)
                return
            with gh._meta:
                extra = gh._rate_headers()
            if method in _MUTATING:
                wait = gh._content_limit()
                if wait is not None:
                    if method in ("POST", "PATCH", "PUT"):
                        self._body()
                    self._finish(method, url.path, query, key, _Resp(403, {
                        "message": SECONDARY_MESSAGE, "documentation_url": DOCS, "status": "403"},
                        {"retry-after": str(wait)}), extra)
                    return
        kind, after, retry_after = gh._draw_fault(key)
        if kind == "slow":
            time.sleep(gh._faults.slow_s if gh._faults else 0.02)
            kind = None
        is_upload = template == "/repos/{owner}/{repo}/releases/{release_id}/assets" and self.role == "uploads"
        if kind and not (after and method in _MUTATING) and not is_upload:
            if method in ("POST", "PATCH", "PUT"):
                self._body()
            self._fault(method, url.path, query, key, kind, retry_after, extra)
            return
        handler = getattr(self, "_h_" + re.sub(r"[\W_]+", "_", f"{method}{template}").strip("_"))
        try:
            if is_upload:
                resp = handler(*args, query=query, fault=kind, after=after, retry_after=retry_after)
            else:
                resp = handler(*args, query=query)
        except _BadRequest:
            resp = _Resp(400, {"message": "Problems parsing JSON", "documentation_url": DOCS, "status": "400"})
        except _Drop:
            self._log(method, url.path, query, 0)
            self._drop()
            return
        if kind and not is_upload:  # after the change was applied
            self._fault(method, url.path, query, key, kind, retry_after, extra)
            return
        self._finish(method, url.path, query, key, resp, extra)

    def _fault(self, method: str, path: str, query: dict, key: str, kind: str, retry_after: int,
               extra: dict[str, str]) -> None:
        if kind == "drop":
            self._log(method, path, query, 0)
            self._drop()
            return
        if kind.startswith("secondary"):
            status = int(kind.split("-")[1])
            self._finish(method, path, query, key, _Resp(status, {
                "message": SECONDARY_MESSAGE,
                "documentation_url": "https://docs.github.com/free-pro-team@latest/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits",
                "status": str(status)}, {"retry-after": str(retry_after)}), extra)
            return
        status = int(kind)
        body: dict | bytes = {"message": "Server Error", "status": str(status)} if status == 500 else b""
        if status != 500:
            resp = _Resp(status, b"<html><body><h1>" + str(status).encode() + b"</h1></body></html>",
                         {"content-type": "text/html"})
        else:
            resp = _Resp(status, body)
        self._finish(method, path, query, key, resp, extra)

    def _log(self, method: str, path: str, query: dict, status: int) -> None:
        gh = self.gh
        if gh.keep_log:
            with gh._meta:
                gh.log.append((self.role, method, path, tuple(sorted(query)), status))

    def _finish(self, method: str, path: str, query: dict, key: str, resp: _Resp, extra: dict[str, str]) -> None:
        self._log(method, path, query, resp.status)
        try:
            self._send(resp, extra)
        except OSError:
            self.close_connection = True

    # ---- helpers -----------------------------------------------------------------------------
    def _repo(self, owner: str, name: str) -> RepoState:
        repo = self.gh.state.repo(owner, name)
        assert repo is not None
        return repo

    def _paginate(self, items: list, query: dict, path: str, *, cap: int | None = None) -> _Resp:
        """One page of ``items`` with GitHub's Link header. ``cap``: results past it are refused with
        GitHub's 422 (the release listing's is 10,000)."""
        try:
            per_page = max(1, min(100, int(query.get("per_page", ["30"])[0] or 30)))
            page = max(1, int(query.get("page", ["1"])[0] or 1))
        except ValueError:
            per_page, page = 30, 1
        if cap is not None and (page - 1) * per_page >= cap:
            return _Resp(422, {"message": f"Only the first {cap} results are available.",
                               "documentation_url": DOCS + "/releases/releases#list-releases", "status": "422"})
        total = len(items)  # the Link header still offers the page past the cap (that page answers 422)
        last = max(1, -(-total // per_page))
        chunk = items[(page - 1) * per_page: page * per_page]
        base = self.gh.api_url + path
        other = {k: v[0] for k, v in query.items() if k not in ("page", "per_page")}

        def link(p: int) -> str:
            return base + "?" + urlencode({**other, "per_page": per_page, "page": p})

        rels = []
        if page > 1:
            rels.append(f'<{link(page - 1)}>; rel="prev"')
        if page < last:
            rels.append(f'<{link(page + 1)}>; rel="next"')
            rels.append(f'<{link(last)}>; rel="last"')
        if page > 1:
            rels.append(f'<{link(1)}>; rel="first"')
        headers = {"link": ", ".join(rels)} if rels else {}
        return _Resp(200, chunk, headers)

    # ---- API handlers -------------------------------------------------------------------------
    def _h_GET_rate_limit(self, *, query: dict) -> _Resp:
        gh = self.gh
        with gh._meta:
            core = {"limit": gh.rate_limit, "remaining": gh._rate_remaining,
                    "reset": gh._rate_reset, "used": gh.rate_limit - gh._rate_remaining}
        search = {"limit": 30, "remaining": 30, "reset": core["reset"], "used": 0}
        graphql = {"limit": 5000, "remaining": 5000, "reset": core["reset"], "used": 0}
        return _Resp(200, {"resources": {"core": core, "search": search, "graphql": graphql}, "rate": core})

    def _h_GET_repos_owner_repo_releases(self, owner: str, name: str, *, query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo = self._repo(owner, name)
            rels = list(repo.releases.values())[::-1]
            resp = self._paginate(rels, query, f"/repos/{owner}/{name}/releases", cap=st.listing_cap)
            if resp.status == 200:
                resp.body = [st.release_json(repo, r) for r in resp.body]  # type: ignore[union-attr]
        return resp

    def _h_POST_repos_owner_repo_releases(self, owner: str, name: str, *, query: dict) -> _Resp:
        data = self._json_body()
        st = self.gh.state
        tag = data.get("tag_name")
        if not isinstance(tag, str) or not tag:
            return _validation("Release", "tag_name", "missing_field")
        with st.lock:
            repo = self._repo(owner, name)
            draft = bool(data.get("draft", False))
            if not draft and st.published_by_tag(repo, tag) is not None:
                return _validation("Release", "tag_name")
            now = st.now()
            rel = ReleaseRec(st.new_release_id(), tag, data.get("name") or tag, data.get("body") or "",
                             draft=draft, prerelease=bool(data.get("prerelease", False)),
                             target_commitish=data.get("target_commitish") or "main",
                             created_at=now, updated_at=now, published_at=None if draft else now)
            repo.releases[rel.id] = rel
            if not draft:
                repo.tags.setdefault(tag, st.commit_for(repo, rel.target_commitish))
            return _Resp(201, st.release_json(repo, rel),
                         {"location": f"{st.api_url}/repos/{owner}/{name}/releases/{rel.id}"})

    def _h_GET_repos_owner_repo_releases_latest(self, owner: str, name: str, *, query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo = self._repo(owner, name)
            cands = [r for r in repo.releases.values() if not r.draft and not r.prerelease]
            if not cands:
                return _not_found()
            return _Resp(200, st.release_json(repo, cands[-1]))

    def _h_GET_repos_owner_repo_releases_tags_tag(self, owner: str, name: str, tag: str, *, query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo = self._repo(owner, name)
            rel = st.published_by_tag(repo, tag)
            return _Resp(200, st.release_json(repo, rel)) if rel else _not_found()

    def _release(self, owner: str, name: str, rid: str) -> tuple[RepoState, ReleaseRec | None]:
        repo = self._repo(owner, name)
        return repo, repo.releases.get(int(rid))

    def _h_GET_repos_owner_repo_releases_release_id(self, owner: str, name: str, rid: str, *, query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo, rel = self._release(owner, name, rid)
            return _Resp(200, st.release_json(repo, rel)) if rel else _not_found()

    def _h_PATCH_repos_owner_repo_releases_release_id(self, owner: str, name: str, rid: str, *, query: dict) -> _Resp:
        data = self._json_body()
        st = self.gh.state
        with st.lock:
            repo, rel = self._release(owner, name, rid)
            if rel is None:
                return _not_found()
            new_tag = data.get("tag_name", rel.tag_name)
            draft = bool(data.get("draft", rel.draft))
            other = st.published_by_tag(repo, new_tag)
            if not draft and other is not None and other is not rel:
                return _validation("Release", "tag_name")
            rel.tag_name = new_tag
            for k in ("name", "body", "target_commitish"):
                if k in data and data[k] is not None:
                    setattr(rel, k, data[k])
            if "prerelease" in data:
                rel.prerelease = bool(data["prerelease"])
            if rel.draft and not draft:
                rel.published_at = st.now()
            rel.draft = draft
            if not draft:  # a missing tag is created at target_commitish ("unused if the tag exists")
                repo.tags.setdefault(new_tag, st.commit_for(repo, rel.target_commitish))
            rel.updated_at = st.now()
            return _Resp(200, st.release_json(repo, rel))

    def _h_DELETE_repos_owner_repo_releases_release_id(self, owner: str, name: str, rid: str, *, query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo, rel = self._release(owner, name, rid)
            if rel is None:
                return _not_found()
            del repo.releases[rel.id]
            return _Resp(204)

    def _h_GET_repos_owner_repo_releases_release_id_assets(self, owner: str, name: str, rid: str, *,
                                                           query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo, rel = self._release(owner, name, rid)
            if rel is None:
                return _not_found()
            resp = self._paginate(list(rel.assets.values()), query, f"/repos/{owner}/{name}/releases/{rid}/assets")
            resp.body = [st.asset_json(repo, rel, a) for a in resp.body]  # type: ignore[union-attr]
            return resp

    def _asset(self, owner: str, name: str, aid: str) -> tuple[RepoState, ReleaseRec | None, AssetRec | None]:
        repo = self._repo(owner, name)
        found = self.gh.state.find_asset(repo, int(aid))
        return (repo, *found) if found else (repo, None, None)

    def _h_GET_repos_owner_repo_releases_assets_asset_id(self, owner: str, name: str, aid: str, *,
                                                          query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo, rel, a = self._asset(owner, name, aid)
            if a is None or rel is None:
                return _not_found()
            if "application/octet-stream" in (self.headers.get("Accept") or ""):
                return _Resp(302, b"", {"location": self._object_url(a)})
            return _Resp(200, st.asset_json(repo, rel, a))

    def _h_PATCH_repos_owner_repo_releases_assets_asset_id(self, owner: str, name: str, aid: str, *,
                                                            query: dict) -> _Resp:
        data = self._json_body()
        st = self.gh.state
        with st.lock:
            repo, rel, a = self._asset(owner, name, aid)
            if a is None or rel is None:
                return _not_found()
            if "name" in data and isinstance(data["name"], str):
                new = normalize_asset_name(data["name"])
                clash = any(o.name == new and o.id != a.id for o in rel.assets.values())
                if clash and st.rename_onto_existing == "reject-custom":
                    return _validation("ReleaseAsset", "name", "custom")
                if clash and st.rename_onto_existing == "reject-bare":
                    return _Resp(422, {"message": "Validation Failed", "documentation_url": DOCS, "status": "422"})
                if clash and st.rename_onto_existing != "allow":
                    return _validation("ReleaseAsset", "name")
                a.name = new
            if "label" in data and isinstance(data["label"], str):
                a.label = data["label"]
            a.updated_at = st.now()
            return _Resp(200, st.asset_json(repo, rel, a))

    def _h_DELETE_repos_owner_repo_releases_assets_asset_id(self, owner: str, name: str, aid: str, *,
                                                             query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            _repo, rel, a = self._asset(owner, name, aid)
            if a is None or rel is None:
                return _not_found()
            del rel.assets[a.id]
            return _Resp(204)

    def _h_DELETE_repos_owner_repo_git_refs_tags_tag(self, owner: str, name: str, tag: str, *, query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo = self._repo(owner, name)
            if tag not in repo.tags:
                return _Resp(422, {"message": "Reference does not exist",
                                   "documentation_url": DOCS + "/git/refs#delete-a-reference", "status": "422"})
            del repo.tags[tag]
            return _Resp(204)

    def _h_GET_repos_owner_repo_git_matching_refs_ref(self, owner: str, name: str, ref: str, *, query: dict) -> _Resp:
        """Refs whose full name starts with ``refs/<ref>``; only tags exist here. Not paginated (GitHub
        documents no pagination for this endpoint)."""
        st = self.gh.state
        with st.lock:
            repo = self._repo(owner, name)
            prefix = f"refs/{ref}"
            return _Resp(200, [st.ref_json(repo, t) for t in sorted(repo.tags) if f"refs/tags/{t}".startswith(prefix)])

    def _h_GET_repos_owner_repo_git_ref_tags_tag(self, owner: str, name: str, tag: str, *, query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo = self._repo(owner, name)
            return _Resp(200, st.ref_json(repo, tag)) if tag in repo.tags else _not_found()

    # ---- actions artifacts ----------------------------------------------------------------------
    def _h_GET_repos_owner_repo_actions_runs_run_id_artifacts(self, owner: str, name: str, run_id: str, *,
                                                              query: dict) -> _Resp:
        """``{total_count, artifacts}`` with Link pagination (``per_page`` default 30, max 100),
        ``name`` filter and ``direction`` (default ``desc``: newest first)."""
        st = self.gh.state
        with st.lock:
            repo = self._repo(owner, name)
            items = [a for a in repo.artifacts.values() if a.run_id == int(run_id)]
            wanted = (query.get("name") or [None])[0]
            if wanted is not None:
                items = [a for a in items if a.name == wanted]
            if (query.get("direction") or ["desc"])[0] != "asc":
                items = items[::-1]
            resp = self._paginate(items, query, f"/repos/{owner}/{name}/actions/runs/{run_id}/artifacts")
            resp.body = {"total_count": len(items),
                         "artifacts": [st.artifact_json(repo, a) for a in resp.body]}  # type: ignore[union-attr]
            return resp

    def _h_GET_repos_owner_repo_actions_artifacts_artifact_id(self, owner: str, name: str, aid: str, *,
                                                              query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo = self._repo(owner, name)
            a = repo.artifacts.get(int(aid))
            return _Resp(200, st.artifact_json(repo, a)) if a else _not_found()

    def _h_GET_repos_owner_repo_actions_artifacts_artifact_id_archive_format(self, owner: str, name: str, aid: str,
                                                                             fmt: str, *, query: dict) -> _Resp:
        st, gh = self.gh.state, self.gh
        with st.lock:
            repo = self._repo(owner, name)
            a = repo.artifacts.get(int(aid))
            if a is None or fmt != "zip":
                return _not_found()
            if a.expired:
                return _Resp(410, {"message": "Artifact has expired", "documentation_url": DOCS, "status": "410"})
            if not st.artifact_redirect:
                return _Resp(200, a.data, {"content-type": "application/zip",
                                           "content-disposition": f"attachment; filename={a.name}.zip"})
        with gh._meta:
            sig = gh._signatures.setdefault(-a.id, secrets.token_hex(8))
        return _Resp(302, b"", {"location": f"{gh.uploads_url}/_artifacts/{a.id}?sig={sig}"})

    def _h_GET_artifacts_artifact_id(self, aid: str, *, query: dict) -> _Resp:
        gh, st = self.gh, self.gh.state
        if self.headers.get("Authorization"):
            return _Resp(400, b"<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed"
                              b"</Message></Error>", {"content-type": "application/xml"})
        with gh._meta:
            ok = gh._signatures.get(-int(aid)) == (query.get("sig") or [""])[0]
        if not ok:
            return _Resp(403, b"<Error><Code>AccessDenied</Code></Error>", {"content-type": "application/xml"})
        with st.lock:
            for repo in st.repos.values():
                a = repo.artifacts.get(int(aid))
                if a is not None:
                    return _Resp(200, a.data, {"content-type": "application/zip"})
        return _Resp(404, b"<Error><Code>NoSuchKey</Code></Error>", {"content-type": "application/xml"})

    def _h_GET_owner_repo_releases_download_tag_name(self, owner: str, name: str, tag: str, aname: str, *,
                                                      query: dict) -> _Resp:
        st = self.gh.state
        with st.lock:
            repo = self._repo(owner, name)
            rel = st.published_by_tag(repo, tag)
            if rel is None:
                return _not_found()
            # Several assets of one name can exist only with rename_onto_existing="allow"; serve the newest
            # (highest id), the rule of ci.store.model.newest_by_name.
            matches = [a for a in rel.assets.values() if a.name == aname and a.state == "uploaded"]
            if not matches:
                return _not_found()
            return _Resp(302, b"", {"location": self._object_url(max(matches, key=lambda a: a.id))})

    def _object_url(self, a: AssetRec) -> str:
        gh = self.gh
        with gh._meta:
            sig = gh._signatures.setdefault(a.id, secrets.token_hex(8))
        return f"{gh.uploads_url}/_objects/{a.id}/{quote(a.name)}?sig={sig}"

    # ---- uploads host -----------------------------------------------------------------------------
    def _h_GET_objects_asset_id_name(self, aid: str, aname: str, *, query: dict) -> _Resp:
        gh, st = self.gh, self.gh.state
        if self.headers.get("Authorization"):
            # Like the object store behind GitHub's redirects: a second credential is refused.
            return _Resp(400, b"<Error><Code>InvalidArgument</Code><Message>Only one auth mechanism allowed"
                              b"</Message></Error>", {"content-type": "application/xml"})
        with gh._meta:
            ok = gh._signatures.get(int(aid)) == (query.get("sig") or [""])[0]
        if not ok:
            return _Resp(403, b"<Error><Code>AccessDenied</Code></Error>", {"content-type": "application/xml"})
        with st.lock:
            for repo in st.repos.values():
                found = st.find_asset(repo, int(aid))
                if found:
                    a = found[1]
                    a.download_count += 1
                    data = a.data if a.data is not None else b"\0" * a.size
                    return _Resp(200, data, {"content-type": "application/octet-stream",
                                             "content-disposition": f"attachment; filename={a.name}"})
        return _Resp(404, b"<Error><Code>NoSuchKey</Code></Error>", {"content-type": "application/xml"})

    def _h_POST_repos_owner_repo_releases_release_id_assets(self, owner: str, name: str, rid: str, *, query: dict,  # noqa: C901 - one endpoint's documented cases, in order
                                                            fault: str | None, after: bool = False,
                                                            retry_after: int = 1) -> _Resp:
        gh, st = self.gh, self.gh.state
        length_h = self.headers.get("Content-Length")
        if length_h is None:
            return _Resp(411, {"message": "Length Required", "status": "411"})
        length = int(length_h)
        raw_name = (query.get("name") or [""])[0]
        label = (query.get("label") or [""])[0]
        ctype = self.headers.get("Content-Type") or ""

        def drain() -> None:
            left = length
            while left > 0:
                chunk = self.rfile.read(min(left, 1 << 16))
                if not chunk:
                    break
                left -= len(chunk)

        if fault and (fault.startswith("secondary") or fault == "503" or (fault == "500" and not after)):
            drain()  # refused before anything was stored
            if fault.startswith("secondary"):
                status = int(fault.split("-")[1])
                return _Resp(status, {"message": SECONDARY_MESSAGE, "documentation_url": DOCS, "status": str(status)},
                             {"retry-after": str(retry_after)})
            return _Resp(int(fault), b"", {"content-type": "text/html"})
        if not raw_name:
            drain()
            return _validation("ReleaseAsset", "name", "missing_field")
        if not ctype:
            drain()
            return _Resp(422, {"message": "Bad Content-Type header value", "status": "422"})
        aname = normalize_asset_name(raw_name)
        with st.lock:
            repo, rel = self._release(owner, name, rid)
            if rel is None:
                asset = None
            elif any(a.name == aname for a in rel.assets.values()):
                asset = "conflict"
            elif length > st.max_asset_size:
                asset = _limit("size", f"size must be less than or equal to {st.max_asset_size}")
            elif len(rel.assets) >= st.max_assets:
                asset = _limit("file_count", f"file_count limited to {st.max_assets} assets")
            else:
                asset = AssetRec(st.new_asset_id(), rel.id, aname, label, ctype, 0, None, st.incomplete_state,
                                 created_at=st.now(), updated_at=st.now())
                rel.assets[asset.id] = asset
        if asset is None:
            drain()
            return _not_found()
        if asset == "conflict":
            drain()
            return _validation("ReleaseAsset", "name")
        if isinstance(asset, _Resp):
            drain()
            return asset
        assert isinstance(asset, AssetRec)
        sha = hashlib.sha256()
        parts: list[bytes] = []
        left = length if not (fault == "drop" and not after) else length // 2
        while left > 0:
            chunk = self.rfile.read(min(left, 1 << 16))
            if not chunk:
                raise _Drop()  # the client went away: the starter asset stays behind
            sha.update(chunk)
            if gh.keep_bytes:
                parts.append(chunk)
            left -= len(chunk)
        if fault == "drop" and not after:
            raise _Drop()  # dropped mid-upload: the starter asset stays behind
        if fault == "502":
            return _Resp(502, b"", {"content-type": "text/html"})  # the starter asset stays behind
        if fault == "500":  # after the body (seen on GitHub: "Error creating asset temp dir"): a starter stays
            return _Resp(500, {"message": "Server Error", "status": "500"})
        with st.lock:
            if asset.id not in rel.assets:  # type: ignore[union-attr]
                return _Resp(500, {"message": "Server Error", "status": "500"})
            asset.size = length
            asset.digest = f"sha256:{sha.hexdigest()}"
            asset.data = b"".join(parts) if gh.keep_bytes else None
            asset.state = "uploaded"
            asset.updated_at = st.now()
            resp = _Resp(201, st.asset_json(repo, rel, asset))  # type: ignore[arg-type]
        if fault == "drop":
            raise _Drop()  # stored, but the answer is lost
        return resp


class _BadRequest(Exception):
    pass
