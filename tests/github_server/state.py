"""In-memory model of the GitHub repositories the test server serves.

One lock guards everything; every request handler works on the model under it, so each request is
atomic, as a single GitHub API call is. Objects are rendered to GitHub's JSON shapes on demand.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

FIXED_TIME = "2025-01-01T00:00:00Z"


def iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


def user_json(api: str, web: str, login: str = "wheelhouse-bot", uid: int = 1) -> dict:
    u = f"{api}/users/{login}"
    return {
        "login": login, "id": uid, "node_id": "MDQ6VXNlcjE=", "avatar_url": f"{web}/avatars/u/{uid}?v=4",
        "gravatar_id": "", "url": u, "html_url": f"{web}/{login}", "followers_url": f"{u}/followers",
        "following_url": f"{u}/following{{/other_user}}", "gists_url": f"{u}/gists{{/gist_id}}",
        "starred_url": f"{u}/starred{{/owner}}{{/repo}}", "subscriptions_url": f"{u}/subscriptions",
        "organizations_url": f"{u}/orgs", "repos_url": f"{u}/repos", "events_url": f"{u}/events{{/privacy}}",
        "received_events_url": f"{u}/received_events", "type": "User", "user_view_type": "public",
        "site_admin": False,
    }


@dataclass
class AssetRec:
    id: int
    release_id: int
    name: str
    label: str
    content_type: str
    size: int = 0
    digest: str | None = None
    state: str = "starter"
    data: bytes | None = None
    created_at: str = FIXED_TIME
    updated_at: str = FIXED_TIME
    download_count: int = 0


@dataclass
class ReleaseRec:
    id: int
    tag_name: str
    name: str | None
    body: str | None
    draft: bool = False
    prerelease: bool = False
    target_commitish: str = "main"
    created_at: str = FIXED_TIME
    published_at: str | None = FIXED_TIME
    updated_at: str = FIXED_TIME
    assets: dict[int, AssetRec] = field(default_factory=dict)
    """Insertion-ordered (GitHub lists a release's assets oldest first)."""


@dataclass
class ArtifactRec:
    """A workflow-run artifact (the zip upload-artifact stored)."""

    id: int
    run_id: int
    name: str
    data: bytes
    digest: str | None
    expired: bool = False
    created_at: str = FIXED_TIME
    expires_at: str = "2025-04-01T00:00:00Z"
    head_branch: str = "main"
    head_sha: str = "0" * 40

    @property
    def size(self) -> int:
        return len(self.data)


def commit_sha(label: str) -> str:
    """A made-up commit id (40 hex) for the model's commits."""
    return hashlib.sha1(f"commit:{label}".encode()).hexdigest()


_SHA = re.compile(r"^[0-9a-f]{40}$")


@dataclass
class RepoState:
    owner: str
    name: str
    releases: dict[int, ReleaseRec] = field(default_factory=dict)
    """Insertion order = creation order; listings show newest first."""
    tags: dict[str, str] = field(default_factory=dict)
    """Git tag -> the commit it points at (lightweight tags)."""
    head: str = field(default_factory=lambda: commit_sha("main-0"))
    """The default branch's head commit; :meth:`ServerState.advance_head` moves it."""
    artifacts: dict[int, ArtifactRec] = field(default_factory=dict)
    """Workflow-run artifacts, insertion order = upload order."""


class ServerState:
    """Repositories, releases, assets and git tags, plus id counters; guarded by ``lock``."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.lock = threading.RLock()
        self.clock = clock
        self.repos: dict[tuple[str, str], RepoState] = {}
        self._next_release = 1000
        self._next_asset = 5000
        self.api_url = ""
        self.uploads_url = ""
        self.web_url = ""
        self._next_artifact = 9000
        self.artifact_redirect = True
        """``GET /actions/artifacts/{id}/zip``: 302 to a signed URL on the uploads host (GitHub's
        documented answer) or, when False, the zip bytes directly (200)."""
        self.rename_onto_existing = "reject"
        """What PATCH of an asset's name to a name another asset of the release holds does:
        ``reject`` (422 already_exists, the assumed GitHub behaviour: names are unique), ``reject-custom``
        (422 with code ``custom``), ``reject-bare`` (422 without ``errors``) or ``allow``. GitHub
        documents none of them."""
        self.max_asset_size = 2 * 1024**3
        """Largest upload accepted (GitHub: ``size must be less than or equal to 2147483648``)."""
        self.max_assets = 1000
        """Assets per release (GitHub: ``file_count limited to 1000 assets``)."""
        self.listing_cap = 10_000
        """Results the release listing serves (page 101 at 100 per page answers 422, as on GitHub)."""
        self.incomplete_state = "starter"
        """The ``state`` of an asset whose upload has not completed: ``starter`` (GitHub's prose) or
        ``open`` (the value its OpenAPI description lists)."""

    # ---- git model ---------------------------------------------------------------------------
    def commit_for(self, repo: RepoState, target: str | None) -> str:
        """Where GitHub creates a missing tag: a commit sha as given, any branch name -> the default
        branch head (this model has one branch)."""
        return target if target and _SHA.match(target) else repo.head

    def advance_head(self, owner: str, repo: str) -> str:
        """A new commit on the default branch; returns its sha."""
        with self.lock:
            r = self.repo(owner, repo)
            assert r is not None
            r.head = commit_sha(f"{r.head}+1")
            return r.head

    # ---- ids and lookup -------------------------------------------------------------------
    def new_release_id(self) -> int:
        self._next_release += 1
        return self._next_release

    def new_asset_id(self) -> int:
        self._next_asset += 1
        return self._next_asset

    def repo(self, owner: str, name: str, create: bool = True) -> RepoState | None:
        key = (owner.lower(), name.lower())
        if key not in self.repos and create:
            self.repos[key] = RepoState(owner, name)
        return self.repos.get(key)

    def now(self) -> str:
        return iso(self.clock())

    def find_asset(self, repo: RepoState, asset_id: int) -> tuple[ReleaseRec, AssetRec] | None:
        for rel in repo.releases.values():
            if asset_id in rel.assets:
                return rel, rel.assets[asset_id]
        return None

    def published_by_tag(self, repo: RepoState, tag: str) -> ReleaseRec | None:
        for rel in repo.releases.values():
            if rel.tag_name == tag and not rel.draft:
                return rel
        return None

    # ---- seeding ----------------------------------------------------------------------------
    def seed_release(self, owner: str, repo: str, tag: str, *, name: str | None = None, body: str = "",
                     draft: bool = False, prerelease: bool = False,
                     assets: list[tuple[str, bytes]] | None = None,
                     synthetic_assets: list[tuple[str, int, str | None]] | None = None,
                     release_id: int | None = None) -> ReleaseRec:
        """Add one release. ``assets`` holds (name, bytes); ``synthetic_assets`` (name, size, digest)
        without bytes (downloads then return zero bytes of that size)."""
        with self.lock:
            r = self.repo(owner, repo)
            assert r is not None
            rid = release_id if release_id is not None else self.new_release_id()
            rel = ReleaseRec(rid, tag, name if name is not None else tag, body, draft=draft, prerelease=prerelease,
                             published_at=None if draft else FIXED_TIME)
            r.releases[rid] = rel
            if not draft:
                r.tags.setdefault(tag, r.head)
            for aname, data in assets or ():
                self.add_asset(rel, aname, data)
            for aname, size, digest in synthetic_assets or ():
                aid = self.new_asset_id()
                rel.assets[aid] = AssetRec(aid, rid, aname, "", "application/octet-stream", size, digest, "uploaded")
            return rel

    def add_asset(self, rel: ReleaseRec, name: str, data: bytes, *, state: str = "uploaded", label: str = "",
                  content_type: str = "application/octet-stream", digest: str | None | bool = True,
                  asset_id: int | None = None) -> AssetRec:
        with self.lock:
            aid = asset_id if asset_id is not None else self.new_asset_id()
            dg = f"sha256:{hashlib.sha256(data).hexdigest()}" if digest is True else (digest or None)
            a = AssetRec(aid, rel.id, name, label, content_type, len(data), dg, state, data)
            rel.assets[aid] = a
            return a

    def seed_bulk(self, owner: str, repo: str, n_releases: int, assets_per_release: int, *,
                  asset_size: int = 1024, tag_format: str = "bench-{i:05d}") -> None:
        """Fast bulk seeding (no bytes kept): ``n_releases`` x ``assets_per_release`` synthetic assets
        whose digest is that of ``asset_size`` zero bytes (what a download returns)."""
        digest = "sha256:" + hashlib.sha256(b"\0" * asset_size).hexdigest()
        with self.lock:
            r = self.repo(owner, repo)
            assert r is not None
            for i in range(n_releases):
                tag = tag_format.format(i=i)
                rid = self.new_release_id()
                rel = ReleaseRec(rid, tag, tag, f"release {i}")
                for j in range(assets_per_release):
                    aid = self.new_asset_id()
                    rel.assets[aid] = AssetRec(aid, rid, f"pkg{j}-{i}.0-cp312-cp312-linux_x86_64.whl", "",
                                               "application/octet-stream", asset_size, digest, "uploaded")
                r.releases[rid] = rel
                r.tags.setdefault(tag, r.head)

    def seed_artifact(self, owner: str, repo: str, run_id: int, name: str, data: bytes, *, expired: bool = False,
                      digest: str | None | bool = True, created_at: str | None = None,
                      artifact_id: int | None = None) -> ArtifactRec:
        """Add one artifact of workflow run ``run_id``; ``digest=True`` is the sha256 of ``data``,
        a string is stored as given (a wrong one simulates corruption), None means no digest
        (upload-artifact before v4)."""
        with self.lock:
            r = self.repo(owner, repo)
            assert r is not None
            if artifact_id is None:
                self._next_artifact += 1
                artifact_id = self._next_artifact
            dg = f"sha256:{hashlib.sha256(data).hexdigest()}" if digest is True else (digest or None)
            rec = ArtifactRec(artifact_id, run_id, name, data, dg, expired, created_at or FIXED_TIME,
                              head_sha=hashlib.sha1(str(run_id).encode()).hexdigest())
            r.artifacts[artifact_id] = rec
            return rec

    def artifact_json(self, repo: RepoState, a: ArtifactRec) -> dict:
        base = f"{self.api_url}/repos/{repo.owner}/{repo.name}/actions/artifacts/{a.id}"
        return {
            "id": a.id, "node_id": f"MDg6QXJ0aWZhY3Q{a.id}", "name": a.name, "size_in_bytes": a.size,
            "url": base, "archive_download_url": f"{base}/zip", "expired": a.expired, "digest": a.digest,
            "created_at": a.created_at, "updated_at": a.created_at, "expires_at": a.expires_at,
            "workflow_run": {"id": a.run_id, "repository_id": 42, "head_repository_id": 42,
                             "head_branch": a.head_branch, "head_sha": a.head_sha},
        }

    def ref_json(self, repo: RepoState, tag: str) -> dict:
        base = f"{self.api_url}/repos/{repo.owner}/{repo.name}/git"
        sha = repo.tags[tag]
        return {"ref": f"refs/tags/{tag}", "node_id": f"REF_{sha[:12]}", "url": f"{base}/refs/tags/{tag}",
                "object": {"type": "commit", "sha": sha, "url": f"{base}/commits/{sha}"}}

    # ---- snapshots for tests ----------------------------------------------------------------
    def snapshot(self, owner: str, repo: str) -> dict[str, dict[str, tuple[str | None, str]]]:
        """{tag: {asset name: (digest, state)}} of every release (drafts under ``draft:<tag>``)."""
        with self.lock:
            r = self.repo(owner, repo, create=False)
            if r is None:
                return {}
            out: dict[str, dict[str, tuple[str | None, str]]] = {}
            for rel in r.releases.values():
                key = rel.tag_name if not rel.draft else f"draft:{rel.tag_name}"
                out[key] = {a.name: (a.digest, a.state) for a in rel.assets.values()}
            return out

    # ---- JSON rendering -----------------------------------------------------------------------
    def asset_json(self, repo: RepoState, rel: ReleaseRec, a: AssetRec) -> dict:
        api, web = self.api_url, self.web_url
        return {
            "url": f"{api}/repos/{repo.owner}/{repo.name}/releases/assets/{a.id}",
            "id": a.id, "node_id": f"RA_{a.id:08d}", "name": a.name, "label": a.label,
            "uploader": user_json(api, web), "content_type": a.content_type, "state": a.state,
            "size": a.size, "digest": a.digest, "download_count": a.download_count,
            "created_at": a.created_at, "updated_at": a.updated_at,
            "browser_download_url": f"{web}/{repo.owner}/{repo.name}/releases/download/{rel.tag_name}/{a.name}",
        }

    def release_json(self, repo: RepoState, rel: ReleaseRec) -> dict:
        api, web, up = self.api_url, self.web_url, self.uploads_url
        base = f"{api}/repos/{repo.owner}/{repo.name}"
        html_tag = rel.tag_name if not rel.draft else f"untagged-{rel.id:x}"
        return {
            "url": f"{base}/releases/{rel.id}",
            "assets_url": f"{base}/releases/{rel.id}/assets",
            "upload_url": f"{up}/repos/{repo.owner}/{repo.name}/releases/{rel.id}/assets{{?name,label}}",
            "html_url": f"{web}/{repo.owner}/{repo.name}/releases/tag/{html_tag}",
            "id": rel.id, "author": user_json(api, web), "node_id": f"RE_{rel.id:08d}",
            "tag_name": rel.tag_name, "target_commitish": rel.target_commitish, "name": rel.name,
            "draft": rel.draft, "immutable": False, "prerelease": rel.prerelease,
            "created_at": rel.created_at, "updated_at": rel.updated_at, "published_at": rel.published_at,
            "assets": [self.asset_json(repo, rel, a) for a in rel.assets.values()],
            "tarball_url": f"{base}/tarball/{rel.tag_name}", "zipball_url": f"{base}/zipball/{rel.tag_name}",
            "body": rel.body,
        }
