"""GitHub Releases as a :class:`~ci.store.model.ReleaseStore`, on top of :class:`ci.store.github_api.GitHubAPI`.

Releases, tags and assets live here; requests, retries, pacing, pagination and the token live in the
API adapter. Uploading an asset converges from whatever a crash, a retried request or a concurrent
peer left: :class:`Seen` names each state the store can observe and :data:`CONVERGE` the one action
each takes (the fault tests run every entry).

Dry run: ``GitHubStore(..., dry_run=True)`` reads as usual but records each change it would make
instead of making it; ``store.plan`` is the list of lines, e.g.
``POST /repos/o/r/releases {"tag_name": "v1", "name": "...", "make_latest": "false"}``.
"""

from __future__ import annotations

import enum
import json
import logging
import mimetypes
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

from ci.base.digest import sha256_file
from ci.base.errors import RemoteError
from ci.store.github_api import GitHubAPI
from ci.store.http import ProgressFn, Response, RetryPolicy
from ci.store.model import Asset, Release, newest_by_name

_SAFE_NAME = re.compile(r"[A-Za-z0-9_+-]([A-Za-z0-9._+-]*[A-Za-z0-9_+-])?")
"""Names GitHub keeps as they are (see tests/github_server/names.py for the evidence)."""
MAX_ASSET_BYTES = 2 * 1024**3
"""GitHub: "Each file included in a release must be under 2 GiB" (a file of exactly 2 GiB was refused)."""
MAX_ASSETS_PER_RELEASE = 1000
"""GitHub: "Up to 1000 release assets may be associated with a single release" (enforced since July 2025)."""
LISTING_CAP = 10_000
"""Results GitHub serves from one listing (``per_page`` x pages)."""
CLOBBER_SUFFIX = ".clobber-"
"""Temporary assets of a safe clobber are named ``<name>.clobber-<hex>``; index builders skip them."""


class GitHubStore:
    """Releases of one GitHub repository.

    Args:
        repo: ``owner/name``.
        token, api_url, retry, sleep, clock, seed, progress, logger, timeout, upload_timeout, write_gap:
            the :class:`~ci.store.github_api.GitHubAPI` the store talks through (see there).
        dry_run: record changes in :attr:`plan` instead of making them.
    """

    def __init__(self, repo: str, *, token: str, api_url: str = "https://api.github.com",
                 retry: RetryPolicy | None = None, sleep: Callable[[float], None] = time.sleep,
                 clock: Callable[[], float] = time.time, seed: int | None = None,
                 progress: ProgressFn | None = None, logger: logging.Logger | None = None,
                 dry_run: bool = False, timeout: float = 60.0, upload_timeout: float = 900.0,
                 write_gap: float = 1.0) -> None:
        self.api = GitHubAPI(repo, token=token, api_url=api_url, retry=retry, sleep=sleep, clock=clock, seed=seed,
                             progress=progress, logger=logger, timeout=timeout, upload_timeout=upload_timeout,
                             write_gap=write_gap)
        self.owner, self.name = self.api.owner, self.api.name
        self.description = f"github:{repo}"
        self.root: Path | None = None  # a remote store: no directory of its own
        self.dry_run = dry_run
        self.plan: list[str] = []
        self.rename_onto_taken: bool | None = None
        """Whether the server lets a PATCH rename an asset onto a taken name (learned on first clobber)."""
        self._dry_releases: dict[str, dict[str, Any]] = {}

    def close(self) -> None:
        self.api.close()

    def __enter__(self) -> GitHubStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GitHubStore({self.owner}/{self.name!s}, api_url={self.api.api_url!r}, dry_run={self.dry_run})"

    @property
    def stats(self) -> dict[str, int]:
        """Retries made so far: ``retries`` and one count per reason."""
        return self.api.stats

    def fetch(self, asset: Asset) -> Iterator[bytes]:
        """The bytes of an asset from its public download URL, in chunks (the index hashes assets that
        have no digest this way), through the store's client and without the token."""
        return self.api.stream_public(asset.url)

    def get_public(self, url: str) -> bytes | None:
        """The bytes at a public URL (the published site's files) without the token; None on 404."""
        return self.api.get_public(url)

    def rehearsed_calls(self) -> list[str] | None:
        """The API calls a dry run recorded instead of making them (None when this is not a dry run)."""
        return self.plan if self.dry_run else None

    def record_change(self, line: str) -> None:
        self.plan.append(self.api.scrub(line))
        self.api.debug(f"dry run: {line}")

    # ---- records ----------------------------------------------------------------------------------
    def _release(self, r: dict[str, Any]) -> Release:
        return Release(tag=r["tag_name"], title=r.get("name") or "", body=r.get("body") or "",
                       draft=bool(r.get("draft")), assets=tuple(_to_asset(a) for a in r.get("assets") or ()),
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
        for resp in self.api.paged(f"list releases of {self.owner}/{self.name}", "repos.list_releases", per_page=100):
            if resp.status == 422 and "only the first" in resp.message().lower():
                capped = True
                break
            if resp.status != 200:
                raise self.api.fail(f"list releases of {self.owner}/{self.name}", resp)
            out.extend(resp.json() or [])
        if capped or len(out) >= LISTING_CAP:
            out += self._releases_past_the_cap({r.get("tag_name") for r in out if not r.get("draft")})
        return out

    def _releases_past_the_cap(self, listed: set[str | None]) -> list[dict[str, Any]]:
        self.api.info(f"list releases of {self.owner}/{self.name}: past GitHub's listing cap; reading the rest by tag")
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
        resp = self.api.call(f"get release {tag}", "repos.get_release_by_tag", tag=tag)
        if resp.status == 404:
            return self._dry_releases.get(tag)
        if resp.status != 200:
            raise self.api.fail(f"get release {tag}", resp)
        return resp.json()

    def get_release(self, tag: str) -> Release | None:
        raw = self._get_raw(tag)
        return self._release(raw) if raw else None

    def list_assets(self, release_id: int) -> list[dict[str, Any]]:
        """Every asset of a release: the first page as GitHub serves it (30; a release rarely has
        more), then each Link ``next`` page."""
        out: list[dict[str, Any]] = []
        for resp in self.api.paged(f"list assets of release {release_id}", "repos.list_release_assets",
                               release_id=release_id):
            if resp.status != 200:
                raise self.api.fail(f"list assets of release {release_id}", resp)
            out.extend(resp.json() or [])
        return out

    def get_release_json(self, tag: str) -> dict[str, Any] | None:
        """The published release of ``tag`` as GitHub's JSON (None when missing)."""
        return self._get_raw(tag)

    def get_asset(self, asset_id: int) -> dict[str, Any] | None:
        resp = self.api.call(f"get asset {asset_id}", "repos.get_release_asset", asset_id=asset_id)
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise self.api.fail(f"get asset {asset_id}", resp)
        return resp.json()

    def read_asset(self, tag: str, name: str, *, asset: Asset | None = None) -> bytes:
        if asset is not None and asset.name == name and isinstance(asset.id, int) and asset.state == "uploaded":
            aid: int | str | None = asset.id  # from a listing the caller already made: no second lookup of the release
        else:
            raw = self._get_raw(tag)
            if raw is None:
                raise RemoteError(f"release {tag} not found in {self.owner}/{self.name}: publish it first or fix the tag")
            match = newest_by_name(_to_asset(a) for a in raw.get("assets") or () if a.get("state") == "uploaded")
            if name not in match or raw.get("id") is None:
                raise RemoteError(f"asset {name} not found in release {tag}: upload it first or fix the name")
            aid = match[name].id
        resp = self.api.call(f"download {name} from {tag}", "repos.get_release_asset", asset_id=aid,
                          headers_={"Accept": "application/octet-stream"})
        if resp.status != 200:
            raise self.api.fail(f"download {name} from {tag}", resp)
        return resp.body

    # ---- low-level changes (dry-run aware) ------------------------------------------------------
    def _change(self, what: str, line: str, op: str, **kwargs: Any) -> Response | None:
        """A mutating call: recorded in dry-run mode (returns None), else made with retries."""
        if self.dry_run:
            self.record_change(line)
            return None
        self.api.debug(line)
        return self.api.call(what, op, write=True, **kwargs)

    def update_asset(self, asset_id: int, *, name: str | None = None, label: str | None = None) -> Response | None:
        body = {k: v for k, v in (("name", name), ("label", label)) if v is not None}
        return self._change(f"update asset {asset_id}", f"PATCH {self.api.repo_path}/releases/assets/{asset_id} "
                            f"{json.dumps(body)}", "repos.update_release_asset", asset_id=asset_id, **body)

    def delete_asset_id(self, asset_id: int) -> None:
        """Delete one asset by id; 404 (already gone, e.g. a retried DELETE) is fine."""
        resp = self._change(f"delete asset {asset_id}", f"DELETE {self.api.repo_path}/releases/assets/{asset_id}",
                            "repos.delete_release_asset", asset_id=asset_id)
        if resp is not None and resp.status not in (204, 404):
            raise self.api.fail(f"delete asset {asset_id}", resp)

    def upload_file(self, release: dict[str, Any], path: Path, name: str, *, label: str | None = None) -> Response | None:
        """One POST of ``path`` as ``name`` to the release's ``upload_url`` (retried on transient failures;
        the caller handles 422). Returns None in dry-run mode."""
        upload_url = re.sub(r"\{[^}]*\}$", "", release.get("upload_url") or "")
        query = f"name={quote(name, safe='')}" + (f"&label={quote(label, safe='')}" if label is not None else "")
        url = f"{upload_url}?{query}"
        if self.dry_run or not upload_url:
            size = path.stat().st_size
            self.record_change(f"POST {urlsplit(url).path}?{query} ({size} bytes, sha256:{sha256_file(path)})")
            return None
        ctype = mimetypes.guess_type(name)[0] or "application/octet-stream"
        if name.endswith(".whl"):
            ctype = "application/zip"
        self.api.debug(f"POST {urlsplit(url).path}?{query}")
        return self.api.upload(url, path, ctype, label=f"upload {name}")

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
                                    f"PATCH {self.api.repo_path}/releases/{draft['id']} {json.dumps(fields)}",
                                    "repos.update_release", release_id=draft["id"],
                                    body_={"make_latest": "false"}, **fields)
                if resp is None:
                    return self._release({**draft, **fields})
                if resp.status == 200:
                    return self._release(resp.json())
                if resp.status != 422:
                    raise self.api.fail(f"publish draft release {tag}", resp)
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
            resp = self._change(f"update release {tag}", f"PATCH {self.api.repo_path}/releases/{raw['id']} "
                                f"{json.dumps(fields)}", "repos.update_release", release_id=raw["id"],
                                **fields)
            if resp is None:
                return self._release({**raw, **fields})
            if resp.status != 200:
                raise self.api.fail(f"update release {tag}", resp)
            raw = resp.json()
        return self._release(raw)

    def _create_release(self, tag: str, title: str, body: str, target: str | None) -> dict[str, Any] | None:
        fields: dict[str, Any] = {"tag_name": tag, "name": title, "body": body, "draft": False, "prerelease": False}
        if target:
            fields["target_commitish"] = target
        line = f"POST {self.api.repo_path}/releases {json.dumps({**fields, 'make_latest': 'false'})}"
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
            for attempt in range(1, self.api.retrier.policy.attempts + 1):
                raw = self._get_raw(tag)
                if raw is not None:
                    return raw
                self.api.retrier.sleep(self.api.retrier.backoff(attempt))
            return None
        raise self.api.fail(f"create release {tag}", resp, "check that the tag name is valid")

    def delete_release(self, tag: str) -> None:
        raw = self._get_raw(tag)
        if raw is not None and raw.get("id") is not None:
            resp = self._change(f"delete release {tag}", f"DELETE {self.api.repo_path}/releases/{raw['id']}",
                                "repos.delete_release", release_id=raw["id"])
            if resp is not None and resp.status not in (204, 404):
                raise self.api.fail(f"delete release {tag}", resp)
        resp = self._change(f"delete tag {tag}", f"DELETE {self.api.repo_path}/git/refs/tags/{tag}",
                            "git.delete_ref", ref=f"tags/{tag}")
        if resp is not None and resp.status not in (204, 404, 422):  # 422: "Reference does not exist"
            raise self.api.fail(f"delete tag {tag}", resp)

    def tag_commit(self, tag: str) -> str | None:
        """The commit the git tag ``tag`` points at (annotated tags dereferenced), or None."""
        resp = self.api.call(f"get tag {tag}", "git.get_ref", ref=f"tags/{tag}")
        if resp.status == 404:
            return None
        if resp.status != 200:
            raise self.api.fail(f"get tag {tag}", resp)
        obj = (resp.json() or {}).get("object") or {}
        for _ in range(8):  # a tag of a tag of ... a commit
            if obj.get("type") != "tag":
                break
            inner = self.api.call(f"get tag object {obj.get('sha')}", "git.get_tag", tag_sha=obj.get("sha"))
            if inner.status != 200:
                raise self.api.fail(f"get tag object {obj.get('sha')} of {tag}", inner)
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
        resp = self._change(f"retag {old_tag} to {new_tag}", f"PATCH {self.api.repo_path}/releases/{old['id']} "
                            f"{json.dumps(fields)}", "repos.update_release", release_id=old["id"], **fields)
        if resp is None:
            return self._release({**old, **fields})
        if resp.status != 200:
            raise self.api.fail(f"retag {old_tag} to {new_tag}", resp)
        return self._release(resp.json())

    # ---- git tags ------------------------------------------------------------------------------------
    def list_tag_names(self) -> list[str]:
        """Every git tag of the repository (``GET /git/matching-refs/tags``, following Link ``next``).

        A release moved by :meth:`retag_release` or deleted through the web UI leaves its git tag
        behind; the maintenance tasks use this to find such leftovers."""
        out: list[str] = []
        for resp in self.api.paged(f"list tags of {self.owner}/{self.name}", "git.list_matching_refs", ref="tags"):
            if resp.status != 200:
                raise self.api.fail(f"list tags of {self.owner}/{self.name}", resp)
            for ref in resp.json() or []:
                name = str(ref.get("ref") or "")
                if name.startswith("refs/tags/"):
                    out.append(name.removeprefix("refs/tags/"))
        return out

    def delete_tag(self, tag: str) -> None:
        """Delete the git tag ``tag`` (not a release); a missing tag is not an error."""
        resp = self._change(f"delete tag {tag}", f"DELETE {self.api.repo_path}/git/refs/tags/{tag}",
                            "git.delete_ref", ref=f"tags/{tag}")
        if resp is not None and resp.status not in (204, 404, 422):  # 422: "Reference does not exist"
            raise self.api.fail(f"delete tag {tag}", resp)

    # ---- assets --------------------------------------------------------------------------------------
    def delete_asset(self, tag: str, name: str) -> None:
        raw = self._get_raw(tag)
        if raw is None:
            return
        for a in raw.get("assets") or ():
            if a["name"] == name:
                self.delete_asset_id(a["id"])

    def upload_asset(self, tag: str, path: Path, *, name: str | None = None, clobber: bool = False,
                     label: str | None = None) -> Asset:
        """Upload ``path`` as ``name``; idempotent, safe to run concurrently for different names.

        Each round observes the asset ``name`` (a :class:`Seen`) and takes the action :data:`CONVERGE`
        gives it, until an action returns the asset: a leftover incomplete upload is deleted, the same
        bytes are kept, different bytes are refused unless ``clobber`` (then replaced safely, see
        :meth:`_Upload.clobber`), and a 422 ``already_exists`` on upload (a retried upload whose first
        attempt was stored, a starter left by a dropped connection, or a concurrent peer) reads the
        assets again.

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
        job = _Upload(self, tag, raw, path, name, digest, label, clobber, list(raw.get("assets") or ()))
        for _ in range(3 * self.api.retrier.policy.attempts):
            done = job.step(job.observe())
            if done is not None:
                return done
        raise RemoteError(f"upload {name} to {tag} did not converge (the asset keeps changing): "
                          "another job may be uploading it; re-run when it is done")


class Seen(enum.Enum):
    """What an upload observes: the asset of its name, then, when it replaces it, the rename's answer."""

    FREE = "no asset holds the name"
    TEMP_HOLDS_BYTES = "no asset holds the name; a temporary asset an interrupted clobber left holds these bytes"
    INCOMPLETE = "the newest asset of the name is an incomplete upload (starter or open)"
    SAME = "the newest asset of the name holds these bytes"
    DIFFERS = "the newest asset of the name holds other bytes, and clobber is not asked"
    DIFFERS_CLOBBER = "the newest asset of the name holds other bytes, and clobber is asked"
    RENAME_ACCEPTED = "the server renamed the new bytes' temporary asset onto the name the old asset holds"
    RENAME_REFUSED = "the server refuses a rename onto a taken name (any 422, now or on an earlier clobber)"
    RENAME_FAILED = "the rename onto the taken name failed otherwise"


@dataclass
class _Upload:
    """One :meth:`GitHubStore.upload_asset` call: what it uploads and what it last saw of the release."""

    store: GitHubStore
    tag: str
    release: dict[str, Any]
    path: Path
    name: str
    digest: str
    label: str | None
    clobber_asked: bool
    assets: list[dict[str, Any]]
    temp: dict[str, Any] | None = None
    """The temporary asset that holds the new bytes (an interrupted clobber's, or this clobber's)."""
    temp_name: str = ""
    old: dict[str, Any] | None = None
    """The asset a clobber replaces."""
    renamed: dict[str, Any] | None = None
    rename_error: RemoteError | None = field(default=None, repr=False)

    def step(self, seen: Seen) -> Asset | None:
        """The action for ``seen``: the asset when done, None to observe again."""
        self.store.api.debug(f"upload {self.name} to {self.tag}: {seen.name}: {seen.value}")
        return CONVERGE[seen](self)

    # ---- observing -------------------------------------------------------------------------------
    def _named(self) -> list[dict[str, Any]]:
        """The assets of the name, oldest first (the newest upload is the one served)."""
        return sorted((a for a in self.assets if a["name"] == self.name), key=lambda a: a["id"])

    def _is_temp(self, asset: dict[str, Any]) -> bool:
        return bool(asset["name"].startswith(self.name + CLOBBER_SUFFIX))

    def observe(self) -> Seen:
        same = self._named()
        if not same:
            self.temp = next((a for a in self.assets if self._is_temp(a) and a.get("state") == "uploaded"
                              and a.get("digest") == self.digest), None)
            return Seen.FREE if self.temp is None else Seen.TEMP_HOLDS_BYTES
        newest = same[-1]
        if newest.get("state") != "uploaded":
            return Seen.INCOMPLETE
        if newest.get("digest") == self.digest:
            return Seen.SAME
        return Seen.DIFFERS_CLOBBER if self.clobber_asked else Seen.DIFFERS

    def _rename_onto_taken(self) -> Seen:
        """Rename the temporary asset onto the name the old asset still holds, unless the server is known
        to refuse that; whether it does is undocumented, so the first answer is remembered."""
        store = self.store
        if store.rename_onto_taken is False or self.temp is None:
            return Seen.RENAME_REFUSED
        try:
            resp = store.update_asset(self.temp["id"], name=self.name)
        except RemoteError as exc:
            self.rename_error = exc
            return Seen.RENAME_FAILED
        if resp is None:  # only a dry run answers None, and a dry run renames nothing
            raise RuntimeError(f"rename {self.temp_name} to {self.name}: no response outside a dry run")
        if resp.status == 422:  # refused, whatever the code: names are unique here
            store.rename_onto_taken = False
            return Seen.RENAME_REFUSED
        if resp.status != 200:
            self.rename_error = store.api.fail(f"rename {self.temp_name} to {self.name}", resp)
            return Seen.RENAME_FAILED
        store.rename_onto_taken = True
        self.renamed = resp.json()
        return Seen.RENAME_ACCEPTED

    # ---- actions (the values of CONVERGE) --------------------------------------------------------
    def upload(self) -> Asset | None:
        """Upload to the free name; a 422 ``already_exists`` reads the assets again."""
        store = self.store
        self._check_free_slot(f"{self.name} cannot be added")
        resp = store.upload_file(self.release, self.path, self.name, label=self.label)
        if resp is None:  # dry run
            return Asset(self.name, self.path.stat().st_size, "", self.digest, "uploaded")
        if resp.status == 201:
            done = self._check_uploaded(resp.json(), self.name)
            self._cleanup_temps(self.assets)
            return done
        if resp.status == 422 and "already_exists" in resp.error_codes():
            self.assets = store.list_assets(self.release["id"])
            return None
        raise store.api.fail(f"upload {self.name} to {self.tag}", resp)

    def finish_interrupted_clobber(self) -> Asset | None:
        """A clobber killed after deleting the old asset leaves only its temporary asset: rename that into
        place instead of uploading again (if a peer took the name meanwhile, upload as usual)."""
        temp = self.temp
        assert temp is not None, "observe() found it"
        resp = self.store.update_asset(temp["id"], name=self.name)
        if resp is None or resp.status != 200:
            return self.upload()
        self.store.api.info(f"renamed {temp['name']} to {self.name}: finished a replacement an earlier run left "
                            "halfway")
        done = self._check_uploaded(resp.json(), self.name)
        self._cleanup_temps([a for a in self.assets if a["id"] != temp["id"]])
        return done

    def delete_incomplete(self) -> Asset | None:
        """Delete the leftover of a failed upload, then look again."""
        newest = self._named()[-1]
        self.store.api.info(f"deleting leftover {newest.get('state')} asset {self.name} of a failed upload")
        self.store.delete_asset_id(newest["id"])
        self.assets = [a for a in self.assets if a["id"] != newest["id"]]
        return None

    def keep(self) -> Asset:
        """Nothing to upload; drop older duplicates (only an interrupted clobber on a lenient server leaves
        them) and temporary assets of an earlier clobber."""
        *older, newest = self._named()
        for dup in older:
            self.store.delete_asset_id(dup["id"])
        self._cleanup_temps(self.assets)
        return _to_asset(newest)

    def refuse(self) -> Asset:
        have = self._named()[-1].get("digest") or "no digest (uploaded before June 2025)"
        raise RemoteError(f"asset {self.name} in release {self.tag} differs ({have}, local file {self.digest}): "
                          "replace it on purpose (invoke release: --replace; restore-wheels: --clobber), "
                          "or bump the version")

    def clobber(self) -> Asset:
        """Replace the asset while the old bytes keep being served.

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

        A crash before (3) of the fallback leaves a temporary asset next to the intact old one; a crash
        between the delete and the rename leaves only the temporary asset (``name`` is missing until the
        next run, which renames that asset into place without uploading again). A failed first rename
        deletes the temporary asset (the old one is intact); a failed rename after the delete uploads
        straight to the free name, and only if that fails too is the temporary asset kept, as the one
        copy of the new bytes, for the next run to rename.
        """
        store = self.store
        self.old = self._named()[-1]
        self._check_free_slot(f"replacing {self.name} safely needs one free slot for the new bytes while the old "
                              "ones keep serving")
        hex_part = "<hex>" if store.dry_run else f"{store.api.rng.getrandbits(32):08x}"
        self.temp_name = f"{self.name}{CLOBBER_SUFFIX}{hex_part}"
        self.temp = self._upload_temp()
        if self.temp is None:  # dry run
            store.record_change(f"PATCH {store.api.repo_path}/releases/assets/<new> {json.dumps({'name': self.name})}")
            store.record_change(f"DELETE {store.api.repo_path}/releases/assets/{self.old['id']}")
            return Asset(self.name, self.path.stat().st_size, self.old.get("browser_download_url") or "", self.digest,
                         "uploaded")
        done = self.step(self._rename_onto_taken())
        assert done is not None, "every rename action ends the upload"
        self._cleanup_temps(self.assets)
        return done

    def delete_old(self) -> Asset:
        """The new bytes hold the name beside the old ones: delete the old asset."""
        assert self.old is not None and self.renamed is not None, "set by clobber()"
        self.store.delete_asset_id(self.old["id"])
        return self._check_uploaded(self.renamed, self.name)

    def delete_old_then_rename(self) -> Asset:
        """Names are unique: delete the old asset, then rename at once (the window is this one round trip);
        if that rename fails, the name is free: upload straight to it, then drop the temporary asset."""
        store = self.store
        assert self.old is not None and self.temp is not None, "set by clobber()"
        store.delete_asset_id(self.old["id"])
        resp = store.update_asset(self.temp["id"], name=self.name)
        if resp is None:  # only a dry run answers None, and a dry run renames nothing
            raise RuntimeError(f"rename {self.temp_name} to {self.name}: no response outside a dry run")
        if resp.status == 200:
            return self._check_uploaded(resp.json(), self.name)
        store.api.info(f"rename {self.temp_name} to {self.name} refused (HTTP {resp.status}); uploading {self.name} "
                       "directly")
        direct = store.upload_file(self.release, self.path, self.name, label=self.label)
        if direct is None or direct.status != 201:
            raise store.api.fail(f"upload {self.name} to replace the deleted old asset (re-run to finish: the next "
                                 f"run renames {self.temp_name} into place)", direct or resp)
        store.delete_asset_id(self.temp["id"])
        return self._check_uploaded(direct.json(), self.name)

    def drop_temp_and_fail(self) -> Asset:
        """The old asset is intact: leave no temporary asset behind, and report the rename's failure."""
        assert self.temp is not None and self.rename_error is not None, "set by _rename_onto_taken()"
        try:
            self.store.delete_asset_id(self.temp["id"])
        except RemoteError as exc:  # the rename's failure is what gets reported
            self.store.api.info(f"could not delete temporary asset {self.temp['id']} ({exc}); the next run deletes it")
        raise self.rename_error

    # ---- helpers ---------------------------------------------------------------------------------
    def _upload_temp(self) -> dict[str, Any] | None:
        """Upload under the fresh temporary name, coping with 422/starters left by dropped attempts."""
        store = self.store
        for _ in range(3 * store.api.retrier.policy.attempts):
            resp = store.upload_file(self.release, self.path, self.temp_name, label=self.label)
            if resp is None:
                return None
            if resp.status == 201:
                self._check_uploaded(resp.json(), self.temp_name)
                return resp.json()
            if resp.status == 422 and "already_exists" in resp.error_codes():
                for a in store.list_assets(self.release["id"]):
                    if a["name"] == self.temp_name:
                        if a.get("state") == "uploaded" and a.get("digest") == self.digest:
                            return a
                        store.delete_asset_id(a["id"])
                continue
            raise store.api.fail(f"upload {self.temp_name}", resp)
        raise RemoteError(f"upload of temporary asset {self.temp_name} did not converge: re-run")

    def _check_free_slot(self, what: str) -> None:
        if len(self.assets) >= MAX_ASSETS_PER_RELEASE:
            raise RemoteError(f"release {self.tag} holds {len(self.assets)} assets, GitHub's limit per release is "
                              f"{MAX_ASSETS_PER_RELEASE}: {what}; delete assets no index needs, or split the release")

    def _cleanup_temps(self, assets: list[dict[str, Any]]) -> None:
        """Delete temporary assets of an interrupted earlier clobber of the name."""
        for a in assets:
            if self._is_temp(a):
                self.store.delete_asset_id(a["id"])

    def _check_uploaded(self, asset: dict[str, Any], name: str) -> Asset:
        if asset.get("name") != name:
            self.store.delete_asset_id(asset["id"])
            raise RemoteError(f"GitHub stored asset {name!r} as {asset.get('name')!r} (it renames some characters): "
                              "rename the file to use only letters, digits, '.', '_', '-', '+'")
        if asset.get("digest") not in (None, self.digest):
            self.store.delete_asset_id(asset["id"])
            raise RemoteError(f"asset {name} arrived corrupted ({asset.get('digest')} != {self.digest}): re-run the "
                              "upload")
        return _to_asset(asset)


CONVERGE: dict[Seen, Callable[[_Upload], Asset | None]] = {
    Seen.FREE: _Upload.upload,
    Seen.TEMP_HOLDS_BYTES: _Upload.finish_interrupted_clobber,
    Seen.INCOMPLETE: _Upload.delete_incomplete,
    Seen.SAME: _Upload.keep,
    Seen.DIFFERS: _Upload.refuse,
    Seen.DIFFERS_CLOBBER: _Upload.clobber,
    Seen.RENAME_ACCEPTED: _Upload.delete_old,
    Seen.RENAME_REFUSED: _Upload.delete_old_then_rename,
    Seen.RENAME_FAILED: _Upload.drop_temp_and_fail,
}
"""Observed state -> action: the whole of an upload's convergence (tests/test_github_convergence.py runs each entry)."""


def _to_asset(a: dict[str, Any]) -> Asset:
    return Asset(name=a["name"], size=int(a.get("size") or 0), url=a.get("browser_download_url") or "",
                 digest=a.get("digest"), state=a.get("state") or "uploaded", id=a.get("id"))
