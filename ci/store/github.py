"""GitHub Releases as a :class:`~ci.store.model.ReleaseStore`.

JSON endpoints go through ghapi's generated operations (``GhApi(gh_host=api_url)``); uploads are
streamed from disk to the release's ``upload_url`` (ghapi's ``upload_file`` reads the whole file into
memory). Every request -- API calls, uploads, asset and artifact downloads -- goes through one HTTP
client (``self.http``), which honours HTTP_PROXY / HTTPS_PROXY / NO_PROXY. Every call is retried by
:class:`ci.store.http.Retrier`; content-creating calls are paced by :class:`ci.store.http.WritePacer`.

Nothing here reads the environment: the entry point passes the token and API URL. The token never
appears in a message, log line, progress label or repr.

Dry run: ``GitHubStore(..., dry_run=True)`` reads as usual but records each change it would make
instead of making it; ``store.plan`` is the list of lines, e.g.
``POST /repos/o/r/releases {"tag_name": "v1", "name": "...", "make_latest": "false"}``.
"""

from __future__ import annotations

import json
import logging
import mimetypes
import random
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

from ci import log
from ci.digest import sha256_file
from ci.errors import RemoteError
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
from ci.store.model import Asset, Release, newest_by_name

API_VERSION = "2022-11-28"
_SAFE_NAME = re.compile(r"[A-Za-z0-9_+-]([A-Za-z0-9._+-]*[A-Za-z0-9_+-])?")
"""Names GitHub keeps as they are (see tests/github_server/names.py for the evidence)."""
MAX_ASSET_BYTES = 2 * 1024**3
"""GitHub: "Each file included in a release must be under 2 GiB" (a file of exactly 2 GiB was refused)."""
MAX_ASSETS_PER_RELEASE = 1000
"""GitHub: "Up to 1000 release assets may be associated with a single release" (enforced since July 2025)."""
LISTING_CAP = 10_000
"""Results GitHub serves from one listing (``per_page`` x pages)."""
MAX_PAGES = 10_000
"""Pages one listing may take before the Link header is taken for a loop."""
CLOBBER_SUFFIX = ".clobber-"
"""Temporary assets of a safe clobber are named ``<name>.clobber-<hex>``; index builders skip them."""


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


class GitHubStore:
    """Releases of one GitHub repository.

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
        dry_run: record changes in :attr:`plan` instead of making them.
    """

    def __init__(self, repo: str, *, token: str, api_url: str = "https://api.github.com",
                 retry: RetryPolicy | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.time, seed: int | None = None,
                 progress: ProgressFn | None = None, logger: logging.Logger | None = None,
                 dry_run: bool = False, timeout: float = 60.0, upload_timeout: float = 900.0,
                 write_gap: float = 1.0) -> None:
        from ghapi.core import GhApi  # deferred: importing ghapi builds its endpoint table

        owner, sep, name = repo.partition("/")
        if not sep or not owner or not name or "/" in name:
            raise RemoteError(f"GitHub repository {repo!r} is not of the form owner/name: fix the repository setting")
        if not token:
            raise RemoteError("no GitHub token: set GITHUB_TOKEN (or GH_TOKEN) to a token with contents: write")
        self.owner, self.name = owner, name
        self.description = f"github:{repo}"
        self.api_url = api_url.rstrip("/")
        self.dry_run = dry_run
        self.plan: list[str] = []
        self._token = token
        self._progress = progress
        self._log = logger = logger or log.get("github")
        self._upload_timeout = upload_timeout
        self._rng = random.Random(seed)
        self._retrier = Retrier(policy=retry or RetryPolicy(), sleep=sleep, clock=clock, rng=self._rng,
                                logger=logger, scrub=self._scrub)
        self.pacer = WritePacer(min_interval=write_gap, clock=clock, sleep=sleep,
                                log=lambda line: logger.warning(self._scrub(line)))
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
        self._api = api
        self._rename_onto_taken: bool | None = None
        """Whether the server lets a PATCH rename an asset onto a taken name (learned on first clobber)."""
        self._dry_releases: dict[str, dict[str, Any]] = {}

    def close(self) -> None:
        self._api.transport.close()

    def __enter__(self) -> GitHubStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GitHubStore({self.owner}/{self.name!s}, api_url={self.api_url!r}, dry_run={self.dry_run})"

    @property
    def stats(self) -> dict[str, int]:
        """Retries made so far: ``retries`` and one count per reason."""
        return dict(self._retrier.stats)

    # ---- plumbing ---------------------------------------------------------------------------------
    def _scrub(self, text: str) -> str:
        return log.mask(text, self._token)

    def _info(self, msg: str) -> None:
        self._log.info(self._scrub(msg))

    def _debug(self, msg: str) -> None:
        self._log.debug(self._scrub(msg))

    def _call(self, what: str, op: str, *, write: bool = False, **kwargs: Any) -> Response:
        """One ghapi operation (``group.name``) with retries; returns the final answer, any status.
        ``write``: a content-creating request, paced (each attempt)."""
        from fasttransport.errors import APIError

        group, _, fname = op.partition(".")
        fn = getattr(getattr(self._api, group), fname)

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
                raise RemoteError(self._scrub(f"{what}: {e.error_type or 'request failed'}: check api_url "
                                              f"{self.api_url} and the network")) from None
            return Response(r.status_code, _lower(r.headers), r.content)

        return self._retrier.run(what, attempt)

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
            resp = self._call(f"{what} (page {params.get('page', len(seen))})", op, **kwargs, **_page_kwargs(params))
            yield resp
            if resp.status != 200:
                return
            params = _next_query(resp.headers.get("link", ""))

    def fail(self, what: str, resp: Response, fix: str = "") -> RemoteError:
        """The one-line error for an answer ``what`` cannot use (the token never in it)."""
        return self._fail(what, resp, fix)

    def _fail(self, what: str, resp: Response, fix: str = "") -> RemoteError:
        msg = resp.message()
        details = resp.error_messages()
        if resp.status == 422 and details:  # e.g. code "custom": "file_count limited to 1000 assets"
            return RemoteError(self._scrub(f"{what}: HTTP 422 {'; '.join(details)}: GitHub refused it "
                                           "(a limit or a validation rule); fix the cause, re-running will not help"))
        hint = fix or {
            401: "the token is invalid or expired: set GITHUB_TOKEN to a valid token",
            403: "the token lacks permission: it needs contents: write on the repository",
            404: f"repository {self.owner}/{self.name} not found or not visible to the token",
        }.get(resp.status, "see GitHub's status page and re-run")
        return RemoteError(self._scrub(f"{what}: HTTP {resp.status}{(' ' + msg) if msg else ''}; {hint}"))

    def _record(self, line: str) -> None:
        self.plan.append(self._scrub(line))
        self._debug(f"dry run: {line}")

    @property
    def _repo_path(self) -> str:
        return f"/repos/{self.owner}/{self.name}"

    # ---- records ----------------------------------------------------------------------------------
    @staticmethod
    def _asset(a: dict[str, Any]) -> Asset:
        return Asset(name=a["name"], size=int(a.get("size") or 0), url=a.get("browser_download_url") or "",
                     digest=a.get("digest"), state=a.get("state") or "uploaded", id=a.get("id"))

    def _release(self, r: dict[str, Any]) -> Release:
        return Release(tag=r["tag_name"], title=r.get("name") or "", body=r.get("body") or "",
                       draft=bool(r.get("draft")), assets=tuple(self._asset(a) for a in r.get("assets") or ()),
                       id=r.get("id"), created_at=r.get("published_at") or None)

    # ---- reads ------------------------------------------------------------------------------------
    def _raw_releases(self) -> list[dict[str, Any]]:
        """Every release: ``per_page=100``, following Link ``next``, drafts included.

        GitHub serves only the first 10,000 results of a listing (page 101 answers ``422 Only the first
        10000 results are available``; 1,000 has been seen without a token). Past that cap the
        listing is completed from the git tags: every tag no listed release holds is looked up by
        tag (one request each, only beyond the cap). Drafts have no tag, so drafts past the cap are
        not found."""
        out: list[dict[str, Any]] = []
        capped = False
        for resp in self.paged(f"list releases of {self.owner}/{self.name}", "repos.list_releases", per_page=100):
            if resp.status == 422 and "only the first" in resp.message().lower():
                capped = True
                break
            if resp.status != 200:
                raise self._fail(f"list releases of {self.owner}/{self.name}", resp)
            out.extend(resp.json() or [])
        if capped or len(out) >= LISTING_CAP:
            out += self._releases_past_the_cap({r.get("tag_name") for r in out if not r.get("draft")})
        return out

    def _releases_past_the_cap(self, listed: set[str | None]) -> list[dict[str, Any]]:
        self._info(f"list releases of {self.owner}/{self.name}: past GitHub's listing cap; reading the rest by tag")
        found = []
        for tag in self.list_tag_names():
            if tag in listed:
                continue
            raw = self._get_raw(tag)
            if raw is not None and raw.get("tag_name") == tag:  # None: a tag without a release
                found.append(raw)
        return found

    def list_releases(self) -> list[Release]:
        return [self._release(r) for r in self._raw_releases() if not r.get("draft")]

    def _get_raw(self, tag: str) -> dict[str, Any] | None:
        """The published release of ``tag`` (GitHub never returns drafts by tag)."""
        resp = self._call(f"get release {tag}", "repos.get_release_by_tag", tag=tag)
        if resp.status == 404:
            return self._dry_releases.get(tag)
        if resp.status != 200:
            raise self._fail(f"get release {tag}", resp)
        return resp.json()

    def get_release(self, tag: str) -> Release | None:
        raw = self._get_raw(tag)
        return self._release(raw) if raw else None

    def list_assets(self, release_id: int) -> list[dict[str, Any]]:
        """Every asset of a release: the first page as GitHub serves it (30; a release rarely has
        more), then each Link ``next`` page."""
        out: list[dict[str, Any]] = []
        for resp in self.paged(f"list assets of release {release_id}", "repos.list_release_assets",
                               release_id=release_id):
            if resp.status != 200:
                raise self._fail(f"list assets of release {release_id}", resp)
            out.extend(resp.json() or [])
        return out

    def get_release_json(self, tag: str) -> dict[str, Any] | None:
        """The published release of ``tag`` as GitHub's JSON (None when missing)."""
        return self._get_raw(tag)

    def get_asset(self, asset_id: int) -> dict[str, Any] | None:
        resp = self._call(f"get asset {asset_id}", "repos.get_release_asset", asset_id=asset_id)
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise self._fail(f"get asset {asset_id}", resp)
        return resp.json()

    def read_asset(self, tag: str, name: str, *, asset: Asset | None = None) -> bytes:
        if asset is not None and asset.name == name and isinstance(asset.id, int) and asset.state == "uploaded":
            aid: int | str | None = asset.id  # from a listing the caller already made: no second lookup of the release
        else:
            raw = self._get_raw(tag)
            if raw is None:
                raise RemoteError(f"release {tag} not found in {self.owner}/{self.name}: publish it first or fix the tag")
            match = newest_by_name(self._asset(a) for a in raw.get("assets") or () if a.get("state") == "uploaded")
            if name not in match or raw.get("id") is None:
                raise RemoteError(f"asset {name} not found in release {tag}: upload it first or fix the name")
            aid = match[name].id
        resp = self._call(f"download {name} from {tag}", "repos.get_release_asset", asset_id=aid,
                          headers_={"Accept": "application/octet-stream"})
        if resp.status != 200:
            raise self._fail(f"download {name} from {tag}", resp)
        return resp.body

    def fetch(self, asset: Asset) -> Iterator[bytes]:
        """The bytes of an asset from its public download URL, in chunks (the index hashes assets that
        have no digest this way), through the store's client and without the token."""
        import httpx2

        try:
            with self.http.stream("GET", asset.url, timeout=self._upload_timeout) as resp:
                if resp.status_code != 200:
                    raise RemoteError(f"download {asset.url}: HTTP {resp.status_code}")
                yield from resp.iter_raw(1 << 20)
        except httpx2.TransportError as exc:
            raise RemoteError(f"download {asset.url}: {type(exc).__name__}; check the network") from None

    def get_public(self, url: str) -> bytes | None:
        """The bytes at a public URL (e.g. the published site's ``digests.json``) through the store's
        client, without the token; None when it answers 404."""
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

    def _auth_headers(self) -> dict[str, str]:
        """The headers of a request the store makes outside ghapi (uploads, authenticated downloads)."""
        return {"Authorization": f"token {self._token}", "Accept": "application/vnd.github+json",
                "X-GitHub-Api-Version": API_VERSION, "User-Agent": "wheelhouse"}

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
                                      total=total, progress=self._progress, timeout=timeout or self._upload_timeout)
            return resp

        resp = self._retrier.run(what, attempt)
        return resp, digest if resp.status == 200 else ""

    # ---- low-level changes (dry-run aware) ------------------------------------------------------
    def _change(self, what: str, line: str, op: str, **kwargs: Any) -> Response | None:
        """A mutating call: recorded in dry-run mode (returns None), else made with retries."""
        if self.dry_run:
            self._record(line)
            return None
        self._debug(line)
        return self._call(what, op, write=True, **kwargs)

    def update_asset(self, asset_id: int, *, name: str | None = None, label: str | None = None) -> Response | None:
        body = {k: v for k, v in (("name", name), ("label", label)) if v is not None}
        return self._change(f"update asset {asset_id}", f"PATCH {self._repo_path}/releases/assets/{asset_id} "
                            f"{json.dumps(body)}", "repos.update_release_asset", asset_id=asset_id, **body)

    def delete_asset_id(self, asset_id: int) -> None:
        """Delete one asset by id; 404 (already gone, e.g. a retried DELETE) is fine."""
        resp = self._change(f"delete asset {asset_id}", f"DELETE {self._repo_path}/releases/assets/{asset_id}",
                            "repos.delete_release_asset", asset_id=asset_id)
        if resp is not None and resp.status not in (204, 404):
            raise self._fail(f"delete asset {asset_id}", resp)

    def upload_file(self, release: dict[str, Any], path: Path, name: str, *, label: str | None = None) -> Response | None:
        """One POST of ``path`` as ``name`` to the release's ``upload_url`` (retried on transient failures;
        the caller handles 422). Returns None in dry-run mode."""
        upload_url = re.sub(r"\{[^}]*\}$", "", release.get("upload_url") or "")
        query = f"name={quote(name, safe='')}" + (f"&label={quote(label, safe='')}" if label is not None else "")
        url = f"{upload_url}?{query}"
        if self.dry_run or not upload_url:
            size = path.stat().st_size
            self._record(f"POST {urlsplit(url).path}?{query} ({size} bytes, sha256:{sha256_file(path)})")
            return None
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if name.endswith(".whl"):
            ctype = "application/zip"
        headers = {**self._auth_headers(), "Content-Type": ctype}
        self._debug(f"POST {urlsplit(url).path}?{query}")
        def attempt() -> Response:
            self.pacer.wait(f"upload {name}")
            return stream_upload(self.http, url, path, headers, label=f"upload {name}", progress=self._progress,
                                 timeout=self._upload_timeout)

        return self._retrier.run(f"upload {name}", attempt)

    # ---- releases -----------------------------------------------------------------------------------
    def ensure_release(self, tag: str, title: str, body: str, *, target_commitish: str | None = None) -> Release:
        """Create the release (``make_latest: false``), or converge an existing one to title/body.

        A concurrent job may create the same tag first: the 422 ``already_exists`` answer is read as
        "fetch it and converge". A draft of that tag (invisible to get-by-tag) is published instead
        of creating a second release.
        """
        raw = self._get_raw(tag)
        if raw is None:
            draft = next((r for r in self._raw_releases() if r.get("draft") and r.get("tag_name") == tag), None)
            if draft is not None:
                fields = {"tag_name": tag, "name": title, "body": body, "draft": False}
                resp = self._change(f"publish draft release {tag}",
                                    f"PATCH {self._repo_path}/releases/{draft['id']} {json.dumps(fields)}",
                                    "repos.update_release", release_id=draft["id"],
                                    body_={"make_latest": "false"}, **fields)
                if resp is None:
                    return self._release({**draft, **fields})
                if resp.status == 200:
                    return self._release(resp.json())
                if resp.status != 422:
                    raise self._fail(f"publish draft release {tag}", resp)
                raw = self._get_raw(tag)  # published meanwhile by a peer
            else:
                raw = self._create_release(tag, title, body, target_commitish)
                if raw is not None and raw.get("id") is None:  # dry run
                    return self._release(raw)
        if raw is None:
            raise RemoteError(f"release {tag} exists (422 already_exists) but cannot be read: re-run; "
                              "if it persists, check the release in the GitHub UI")
        if (raw.get("name") or "") != title or (raw.get("body") or "") != body:
            fields = {"name": title, "body": body}
            resp = self._change(f"update release {tag}", f"PATCH {self._repo_path}/releases/{raw['id']} "
                                f"{json.dumps(fields)}", "repos.update_release", release_id=raw["id"],
                                **fields)
            if resp is None:
                return self._release({**raw, **fields})
            if resp.status != 200:
                raise self._fail(f"update release {tag}", resp)
            raw = resp.json()
        return self._release(raw)

    def _create_release(self, tag: str, title: str, body: str, target: str | None) -> dict[str, Any] | None:
        fields: dict[str, Any] = {"tag_name": tag, "name": title, "body": body, "draft": False, "prerelease": False}
        if target:
            fields["target_commitish"] = target
        line = f"POST {self._repo_path}/releases {json.dumps({**fields, 'make_latest': 'false'})}"
        resp = self._change(f"create release {tag}", line, "repos.create_release",
                            body_={"make_latest": "false"}, **fields)
        if resp is None:
            fake = {"tag_name": tag, "name": title, "body": body, "draft": False, "assets": [], "id": None,
                    "upload_url": ""}
            self._dry_releases[tag] = fake
            return fake
        if resp.status == 201:
            return resp.json()
        if resp.status == 422 and "already_exists" in resp.error_codes():
            # A concurrent job (or our own retried POST) created it; reads may lag a moment behind.
            for attempt in range(1, self._retrier.policy.attempts + 1):
                raw = self._get_raw(tag)
                if raw is not None:
                    return raw
                self._retrier.sleep(self._retrier._backoff(attempt))
            return None
        raise self._fail(f"create release {tag}", resp, "check that the tag name is valid")

    def delete_release(self, tag: str) -> None:
        raw = self._get_raw(tag)
        if raw is not None and raw.get("id") is not None:
            resp = self._change(f"delete release {tag}", f"DELETE {self._repo_path}/releases/{raw['id']}",
                                "repos.delete_release", release_id=raw["id"])
            if resp is not None and resp.status not in (204, 404):
                raise self._fail(f"delete release {tag}", resp)
        resp = self._change(f"delete tag {tag}", f"DELETE {self._repo_path}/git/refs/tags/{tag}",
                            "git.delete_ref", ref=f"tags/{tag}")
        if resp is not None and resp.status not in (204, 404, 422):  # 422: "Reference does not exist"
            raise self._fail(f"delete tag {tag}", resp)

    def tag_commit(self, tag: str) -> str | None:
        """The commit the git tag ``tag`` points at (annotated tags dereferenced), or None."""
        resp = self._call(f"get tag {tag}", "git.get_ref", ref=f"tags/{tag}")
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise self._fail(f"get tag {tag}", resp)
        obj = (resp.json() or {}).get("object") or {}
        for _ in range(8):  # a tag of a tag of ... a commit
            if obj.get("type") != "tag":
                break
            inner = self._call(f"get tag object {obj.get('sha')}", "git.get_tag", tag_sha=obj.get("sha"))
            if inner.status != 200:
                raise self._fail(f"get tag object {obj.get('sha')} of {tag}", inner)
            obj = (inner.json() or {}).get("object") or {}
        return obj.get("sha") if obj.get("type") == "commit" else None

    def retag_release(self, old_tag: str, new_tag: str) -> Release:
        """PATCH ``tag_name``, with ``target_commitish`` set to the old tag's commit: GitHub creates a
        missing tag at ``target_commitish``, which otherwise is the default branch's head at the time
        of the PATCH. The old git tag stays; download URLs move to the new tag."""
        old, new = self._get_raw(old_tag), self._get_raw(new_tag)
        if old is None and new is not None:
            return self._release(new)  # done before (idempotent re-run)
        if old is None:
            raise RemoteError(f"release {old_tag} not found in {self.owner}/{self.name}: nothing to retag; fix the tag")
        if new is not None:
            raise RemoteError(f"cannot retag {old_tag} to {new_tag}: release {new_tag} already exists; delete one of them")
        commit = self.tag_commit(old_tag)
        if commit is None:
            raise RemoteError(f"cannot retag {old_tag} to {new_tag}: the git tag {old_tag} is missing, so its commit is "
                              f"unknown; create the tag {old_tag} at the release's commit, then re-run")
        fields = {"tag_name": new_tag, "target_commitish": commit}
        resp = self._change(f"retag {old_tag} to {new_tag}", f"PATCH {self._repo_path}/releases/{old['id']} "
                            f"{json.dumps(fields)}", "repos.update_release", release_id=old["id"], **fields)
        if resp is None:
            return self._release({**old, **fields})
        if resp.status != 200:
            raise self._fail(f"retag {old_tag} to {new_tag}", resp)
        return self._release(resp.json())

    # ---- git tags ------------------------------------------------------------------------------------
    def list_tag_names(self) -> list[str]:
        """Every git tag of the repository (``GET /git/matching-refs/tags``, following Link ``next``).

        A release moved by :meth:`retag_release` or deleted through the web UI leaves its git tag
        behind; the maintenance tasks use this to find such leftovers."""
        out: list[str] = []
        for resp in self.paged(f"list tags of {self.owner}/{self.name}", "git.list_matching_refs", ref="tags"):
            if resp.status != 200:
                raise self._fail(f"list tags of {self.owner}/{self.name}", resp)
            for ref in resp.json() or []:
                name = str(ref.get("ref") or "")
                if name.startswith("refs/tags/"):
                    out.append(name.removeprefix("refs/tags/"))
        return out

    def delete_tag(self, tag: str) -> None:
        """Delete the git tag ``tag`` (not a release); a missing tag is not an error."""
        resp = self._change(f"delete tag {tag}", f"DELETE {self._repo_path}/git/refs/tags/{tag}",
                            "git.delete_ref", ref=f"tags/{tag}")
        if resp is not None and resp.status not in (204, 404, 422):  # 422: "Reference does not exist"
            raise self._fail(f"delete tag {tag}", resp)

    # ---- assets --------------------------------------------------------------------------------------
    def delete_asset(self, tag: str, name: str) -> None:
        raw = self._get_raw(tag)
        if raw is None:
            return
        for a in raw.get("assets") or ():
            if a["name"] == name:
                self.delete_asset_id(a["id"])

    def upload_asset(self, tag: str, path: Path, *, name: str | None = None, clobber: bool = False,  # noqa: C901 - the convergence cases of one upload, in the order its docstring gives them
                     label: str | None = None) -> Asset:
        """Upload ``path`` as ``name``; idempotent, safe to run concurrently for different names.

        - A leftover ``starter`` asset of that name (a failed upload) is deleted first.
        - An ``uploaded`` asset with the same sha256 digest: nothing to do.
        - A different digest (or none, for assets from before June 2025): RemoteError unless ``clobber``.
        - ``clobber``: see :meth:`_safe_clobber`.
        - A 422 ``already_exists`` on upload (a retried upload whose first attempt was stored, a
          starter left by a dropped connection, or a concurrent peer) lists the assets and resolves
          the same way.

        ``label`` (an extension of the protocol) sets GitHub's display label.
        """
        path = Path(path)
        name = name or path.name
        size = path.stat().st_size
        if size >= MAX_ASSET_BYTES:
            raise RemoteError(f"{name} is {size} bytes; GitHub takes release assets under 2 GiB ({MAX_ASSET_BYTES} "
                              "bytes): build fewer CUDA archs into one wheel, or split the package")
        if not _SAFE_NAME.fullmatch(name):
            raise RemoteError(f"asset name {name!r} has characters GitHub would rename (allowed: letters, digits, "
                              "'.', '_', '-', '+'; no leading or trailing '.'): rename the file")
        digest = f"sha256:{sha256_file(path)}"
        raw = self._get_raw(tag)
        if raw is None:
            raise RemoteError(f"release {tag} not found in {self.owner}/{self.name}: create it (ensure_release) first")
        assets = list(raw.get("assets") or ())
        for _ in range(3 * self._retrier.policy.attempts):
            same = sorted((a for a in assets if a["name"] == name), key=lambda a: a["id"])  # oldest first
            existing = same[-1] if same else None  # the newest upload is the one served
            if existing is None:
                recovered = self._finish_interrupted_clobber(assets, name, digest)
                if recovered is not None:
                    return recovered
                self._check_free_slot(tag, assets, f"{name} cannot be added")
                resp = self.upload_file(raw, path, name, label=label)
                if resp is None:
                    return Asset(name, path.stat().st_size, "", digest, "uploaded")
                if resp.status == 201:
                    done = self._check_uploaded(resp.json(), name, digest)
                    self._cleanup_temps(assets, name)
                    return done
                if resp.status == 422 and "already_exists" in resp.error_codes():
                    assets = self.list_assets(raw["id"])
                    continue
                raise self._fail(f"upload {name} to {tag}", resp)
            if existing.get("state") != "uploaded":
                self._info(f"deleting leftover {existing.get('state')} asset {name} of a failed upload")
                self.delete_asset_id(existing["id"])
                assets = [a for a in assets if a["id"] != existing["id"]]
                continue
            if existing.get("digest") == digest:
                for dup in same[:-1]:  # duplicates only come from an interrupted clobber on a lenient server
                    self.delete_asset_id(dup["id"])
                self._cleanup_temps(assets, name)
                return self._asset(existing)
            if not clobber:
                have = existing.get("digest") or "no digest (uploaded before June 2025)"
                raise RemoteError(f"asset {name} in release {tag} differs ({have}, local file {digest}): "
                                  "replace it on purpose (invoke release: drop --no-clobber; restore-wheels: --clobber), "
                                  "or bump the version")
            self._check_free_slot(tag, assets, f"replacing {name} safely needs one free slot for the new bytes "
                                               "while the old ones keep serving")
            done = self._safe_clobber(raw, existing, path, name, digest, label)
            self._cleanup_temps(assets, name)
            return done
        raise RemoteError(f"upload {name} to {tag} did not converge (the asset keeps changing): "
                          "another job may be uploading it; re-run when it is done")

    def _check_free_slot(self, tag: str, assets: list[dict[str, Any]], what: str) -> None:
        if len(assets) >= MAX_ASSETS_PER_RELEASE:
            raise RemoteError(f"release {tag} holds {len(assets)} assets, GitHub's limit per release is "
                              f"{MAX_ASSETS_PER_RELEASE}: {what}; delete assets no index needs, or split the release")

    def _finish_interrupted_clobber(self, assets: list[dict[str, Any]], name: str, digest: str) -> Asset | None:
        """A clobber killed after deleting the old asset leaves only its temporary asset: when that holds
        these very bytes, rename it into place instead of uploading again."""
        for a in assets:
            if (a["name"].startswith(name + CLOBBER_SUFFIX) and a.get("state") == "uploaded"
                    and a.get("digest") == digest):
                resp = self.update_asset(a["id"], name=name)
                if resp is None or resp.status != 200:
                    return None  # e.g. a peer took the name meanwhile: upload as usual
                self._info(f"renamed {a['name']} to {name}: finished a replacement an earlier run left halfway")
                done = self._check_uploaded(resp.json(), name, digest)
                self._cleanup_temps([t for t in assets if t["id"] != a["id"]], name)
                return done
        return None

    def _cleanup_temps(self, assets: list[dict[str, Any]], name: str) -> None:
        """Delete temporary assets of an interrupted earlier clobber of ``name``."""
        for a in assets:
            if a["name"].startswith(name + CLOBBER_SUFFIX):
                self.delete_asset_id(a["id"])

    def _check_uploaded(self, asset: dict[str, Any], name: str, digest: str) -> Asset:
        if asset.get("name") != name:
            self.delete_asset_id(asset["id"])
            raise RemoteError(f"GitHub stored asset {name!r} as {asset.get('name')!r} (it renames some characters): "
                              "rename the file to use only letters, digits, '.', '_', '-', '+'")
        if asset.get("digest") not in (None, digest):
            self.delete_asset_id(asset["id"])
            raise RemoteError(f"asset {name} arrived corrupted ({asset.get('digest')} != {digest}): re-run the upload")
        return self._asset(asset)

    def _upload_temp(self, raw: dict[str, Any], path: Path, tmp: str, digest: str, label: str | None) -> dict[str, Any] | None:
        """Upload under a fresh temporary name, coping with 422/starters left by dropped attempts."""
        for _ in range(3 * self._retrier.policy.attempts):
            resp = self.upload_file(raw, path, tmp, label=label)
            if resp is None:
                return None
            if resp.status == 201:
                self._check_uploaded(resp.json(), tmp, digest)
                return resp.json()
            if resp.status == 422 and "already_exists" in resp.error_codes():
                for a in self.list_assets(raw["id"]):
                    if a["name"] == tmp:
                        if a.get("state") == "uploaded" and a.get("digest") == digest:
                            return a
                        self.delete_asset_id(a["id"])
                continue
            raise self._fail(f"upload {tmp}", resp)
        raise RemoteError(f"upload of temporary asset {tmp} did not converge: re-run")

    def _safe_clobber(self, raw: dict[str, Any], old: dict[str, Any], path: Path, name: str, digest: str,
                      label: str | None) -> Asset:
        """Replace asset ``name`` while the old bytes keep being served.

        Order: (1) upload the new bytes as ``<name>.clobber-<hex>`` -- the old asset serves during the
        whole (long) upload; (2) PATCH the new asset's name to ``name``; (3) delete the old asset.

        Step (2) renames onto a name the old asset still holds. GitHub documents 422 ``already_exists``
        only for uploads; whether a rename onto a taken name is refused is undocumented. If it is
        accepted, there is no moment without ``name``: readers may see two ``uploaded`` assets named
        ``name`` (old and new, complete files) until step (3), one request later. If GitHub refuses it
        (422, which we assume is the likely answer), we fall back to (3) then (2): then a window of one
        API round trip (typically 0.1-0.5 s on github.com) remains in which ``name`` is missing and its
        download URL answers 404. GitHub has no atomic swap, so that window cannot be closed there; it
        replaces the 30-120 min gap of delete-then-upload. Readers (the index builder) must skip
        ``*.clobber-*`` names and, for duplicates, take the newest (highest id) uploaded asset.
        Any 422 to the first rename (GitHub documents no code for it) takes the fallback.

        A crash before (3) of the fallback leaves a temporary asset next to the intact old one; a crash
        between the delete and the rename leaves only the temporary asset (``name`` is missing until the
        next run, which renames that asset into place without uploading again). A failed first rename
        deletes the temporary asset (the old one is intact); a failed rename after the delete uploads
        straight to the free name, and only if that fails too is the temporary asset kept, as the one
        copy of the new bytes, for the next run to rename.
        """
        tmp = f"{name}{CLOBBER_SUFFIX}{self._rng.getrandbits(32):08x}" if not self.dry_run else f"{name}{CLOBBER_SUFFIX}<hex>"
        new = self._upload_temp(raw, path, tmp, digest, label)
        if new is None:  # dry run
            self._record(f"PATCH {self._repo_path}/releases/assets/<new> {json.dumps({'name': name})}")
            self._record(f"DELETE {self._repo_path}/releases/assets/{old['id']}")
            return Asset(name, path.stat().st_size, old.get("browser_download_url") or "", digest, "uploaded")
        resp = None
        if self._rename_onto_taken is not False:
            try:
                resp = self.update_asset(new["id"], name=name)
                if resp is None:  # only a dry run answers None, and it returned above
                    raise RuntimeError(f"rename {tmp} to {name}: no response outside a dry run")
                if resp.status not in (200, 422):
                    raise self._fail(f"rename {tmp} to {name}", resp)
            except RemoteError:
                self._drop_temp(new["id"])  # the old asset is intact: leave no temporary one behind
                raise
            if resp.status == 422:  # refused, whatever the code: names are unique here
                self._rename_onto_taken, resp = False, None
            else:
                self._rename_onto_taken = True
        if resp is not None:
            renamed = resp.json()
            self.delete_asset_id(old["id"])
            return self._check_uploaded(renamed, name, digest)
        # names are unique: delete, then rename at once (the window is this one round trip)
        self.delete_asset_id(old["id"])
        resp = self.update_asset(new["id"], name=name)
        if resp is None:  # only a dry run answers None, and it returned above
            raise RuntimeError(f"rename {tmp} to {name}: no response outside a dry run")
        if resp.status == 200:
            return self._check_uploaded(resp.json(), name, digest)
        # The name is free now: upload straight to it, then drop the temporary asset.
        self._info(f"rename {tmp} to {name} refused (HTTP {resp.status}); uploading {name} directly")
        direct = self.upload_file(raw, path, name, label=label)
        if direct is None or direct.status != 201:
            raise self._fail(f"upload {name} to replace the deleted old asset (re-run to finish: the next run "
                             f"renames {tmp} into place)", direct or resp)
        self.delete_asset_id(new["id"])
        return self._check_uploaded(direct.json(), name, digest)

    def _drop_temp(self, asset_id: int) -> None:
        """Delete a temporary asset on the way out of a failure (the failure is what gets reported)."""
        try:
            self.delete_asset_id(asset_id)
        except RemoteError as exc:
            self._info(f"could not delete temporary asset {asset_id} ({exc}); the next run deletes it")
