"""ci.publish.pages: git branch (bare repository over file://), Pages artifact and plain directory publishing."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

from ci.base.errors import RemoteError, UsageError, WheelhouseError
from ci.publish.index import CACHE_FILE
from ci.publish.pages import (
    ArtifactTarget,
    DirectoryTarget,
    GitBranchTarget,
    default_world,
    index_target,
    origin_url,
    publish_index,
    sync_tree,
)
from ci.publish.site_marker import MARKER_FILE
from ci.store.model import Asset, Release

BASE = "https://owner.github.io/repo"
DL = "https://example.invalid/releases/download"
DEFAULT = "cu130/torch2.13"
CU129_CHANGED = ("cu129/torch2.13/index.html", "cu129/torch2.13/pylock.flash-attn.toml",
                 "cu129/torch2.13/simple/flash-attn/index.html", "cu129/torch2.13/wheelhouse-world.json")
"""What one more wheel in cu129/torch2.13 changes there: its package page, the world's page, record and lock."""


def _asset(tag: str, name: str, *, digest: bool = True, aid: int = 1) -> Asset:
    data = f"{tag}/{name}".encode()
    return Asset(
        name, len(data), f"{DL}/{tag}/{name}", f"sha256:{hashlib.sha256(data).hexdigest()}" if digest else None, id=aid
    )


def _fetch_counter():
    calls: list[str] = []

    def fetch(asset: Asset):
        calls.append(asset.name)
        yield asset.url.removeprefix(DL + "/").encode()

    return fetch, calls


def releases(extra_cu129: bool = False, digest: bool = True) -> list[Release]:
    a = Release(
        "apex-v1-py3.11-torch2.13.0",
        "apex v1 - cu13.0.2 py3.11 torch2.13.0",
        assets=(_asset("apex-v1", "apex-0.1-cp311-cp311-linux_x86_64.whl", digest=digest),),
    )
    f = Release(
        "flash-attn-v2-py3.11-torch2.13.0",
        "flash-attn v2 - cu12.9.1 py3.11 torch2.13.0",
        assets=(_asset("fa-v2", "flash_attn-2.8.3-cp311-cp311-linux_x86_64.whl", digest=digest, aid=2),),
    )
    rels = [a, f]
    if extra_cu129:
        rels.append(
            Release(
                "flash-attn-v2-py3.12-torch2.13.0",
                "flash-attn v2 - cu12.9.1 py3.12 torch2.13.0",
                assets=(_asset("fa-v2-312", "flash_attn-2.8.3-cp312-cp312-linux_x86_64.whl", digest=digest, aid=3),),
            )
        )
    return rels


def git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def bare(tmp_path) -> tuple[Path, str]:
    remote = tmp_path / "pages.git"
    git("init", "--quiet", "--bare", str(remote))
    return remote, remote.as_uri()


def _count(remote: Path, branch: str = "gh-pages") -> int:
    return int(git("--git-dir", str(remote), "rev-list", "--count", branch))


def _publish_git(url: str, rels: list[Release], **kw):
    with GitBranchTarget(url) as target:
        return publish_index(rels, target, base_url=BASE, default_world=DEFAULT, **kw)


# --------------------------------------------------------------------------- git


def test_git_publish_commits_once_and_is_idempotent(bare):
    remote, url = bare
    first = _publish_git(url, releases())
    assert first.result.commit and _count(remote) == 1
    assert "cu130/torch2.13/simple/apex/index.html" in first.result.changes.added
    files = git("--git-dir", str(remote), "ls-tree", "-r", "--name-only", "gh-pages").split()
    assert ".nojekyll" in files and CACHE_FILE in files and "simple/apex/index.html" in files

    again = _publish_git(url, releases())
    assert again.result.commit is None and again.result.changes.empty and _count(remote) == 1


def test_git_change_in_one_world_touches_only_that_world(bare):
    remote, url = bare
    _publish_git(url, releases())
    outcome = _publish_git(url, releases(extra_cu129=True))
    assert outcome.result.commit and _count(remote) == 2
    changed = git("--git-dir", str(remote), "diff", "--name-only", "gh-pages~1", "gh-pages").split()
    # the package page of that world, and the landing page and the marker whose link counts moved
    assert changed == [*CU129_CHANGED, "index.html", MARKER_FILE]


def test_git_dry_run_reports_and_writes_nothing(bare):
    remote, url = bare
    _publish_git(url, releases())
    plan = _publish_git(url, releases(extra_cu129=True), dry_run=True)
    assert plan.result.dry_run and plan.result.commit is None
    assert plan.result.changes.changed == (*CU129_CHANGED, "index.html", MARKER_FILE)
    assert plan.result.changes.added == () and plan.result.changes.removed == ()
    assert _count(remote) == 1


def test_git_replaces_foreign_content_only_with_force_and_keeps_history(bare, tmp_path):
    remote, url = bare
    seed = tmp_path / "seed"
    git("init", "--quiet", str(seed))
    git("checkout", "--quiet", "-b", "gh-pages", cwd=seed)
    (seed / "stale.html").write_text("old site")
    git("add", ".", cwd=seed)
    git("-c", "user.name=x", "-c", "user.email=x@x", "commit", "--quiet", "-m", "old", cwd=seed)
    git("push", "--quiet", url, "gh-pages", cwd=seed)
    with pytest.raises(WheelhouseError, match="holds no published site"):
        _publish_git(url, releases())
    assert _count(remote) == 1
    with GitBranchTarget(url, force=True) as target:
        outcome = publish_index(releases(), target, base_url=BASE, default_world=DEFAULT)
    assert outcome.result.changes.removed == ("stale.html",)
    assert _count(remote) == 2
    assert "stale.html" not in git("--git-dir", str(remote), "ls-tree", "-r", "--name-only", "gh-pages")


def test_git_digest_cache_survives_between_runs(bare):
    remote, url = bare
    fetch, calls = _fetch_counter()
    first = _publish_git(url, releases(digest=False), fetch=fetch)
    assert len(calls) == 2 and first.summary.fetches == 2 and first.warnings == ()
    fetch2, calls2 = _fetch_counter()
    second = _publish_git(url, releases(digest=False), fetch=fetch2)
    assert calls2 == [] and second.result.commit is None and _count(remote) == 1


def test_git_concurrent_publish_is_rejected_then_converges(bare):
    remote, url = bare
    _publish_git(url, releases())
    with GitBranchTarget(url) as slow, GitBranchTarget(url) as fast:
        slow.worktree()
        publish_index(releases(extra_cu129=True), fast, base_url=BASE, default_world=DEFAULT)
        with pytest.raises(RemoteError, match="run publish again"):
            publish_index(releases(), slow, base_url="http://127.0.0.1:1", default_world=DEFAULT)
    rerun = _publish_git(
        url,
        releases(),
    )
    assert rerun.result.commit and _count(remote) == 3


def test_git_errors_never_show_credentials():
    secret = "ghs_" + "A1b2C3" * 4
    target = GitBranchTarget(f"https://x-access-token:{secret}@127.0.0.1:1/owner/repo.git")
    assert secret not in target.description
    with pytest.raises(RemoteError) as info, target:
        target.worktree()
    assert secret not in str(info.value) and "\n" not in str(info.value)


# --------------------------------------------------------------------------- directories


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        p.relative_to(root).as_posix(): (p.stat().st_ino, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()
    }


def _age(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(10**18, 10**18))


def test_directory_target_rewrites_only_changed_files(tmp_path):
    dest = tmp_path / "index"
    first = publish_index(releases(), DirectoryTarget(dest), base_url=dest.as_uri(), default_world=DEFAULT)
    assert not first.result.changes.changed and (dest / "simple" / "apex" / "index.html").exists()
    _age(dest)
    before = _snapshot(dest)
    same = publish_index(releases(), DirectoryTarget(dest), base_url=dest.as_uri(), default_world=DEFAULT)
    assert same.result.changes.empty and _snapshot(dest) == before

    plan = publish_index(
        releases(extra_cu129=True), DirectoryTarget(dest), base_url=dest.as_uri(), default_world=DEFAULT, dry_run=True
    )
    assert set(plan.result.changes.changed) == {*CU129_CHANGED, "index.html", MARKER_FILE}
    assert _snapshot(dest) == before

    publish_index(releases(extra_cu129=True), DirectoryTarget(dest), base_url=dest.as_uri(), default_world=DEFAULT)
    after = _snapshot(dest)
    touched = {rel for rel in before if after[rel] != before[rel]}
    assert touched == {*CU129_CHANGED, "index.html", MARKER_FILE}

    # a world that disappears stays, archived (PEP 792): its pages without links, its lock files gone
    publish_index(releases()[:1], DirectoryTarget(dest), base_url=dest.as_uri(), default_world=DEFAULT,
                  allow_shrink=True)
    archived = (dest / "cu129" / "torch2.13" / "simple" / "flash-attn" / "index.html").read_text()
    assert '<meta name="pypi:project-status" content="archived">' in archived and "<a " not in archived
    assert not (dest / "cu129" / "torch2.13" / "pylock.flash-attn.toml").exists()


def test_artifact_target_swaps_whole_tree_and_keeps_unchanged_files(tmp_path):
    dest = tmp_path / "_site"
    publish_index(releases(), ArtifactTarget(dest), base_url=BASE, default_world=DEFAULT)
    assert not any(p.is_symlink() for p in dest.rglob("*"))
    _age(dest)
    before = _snapshot(dest)
    dir_inode = dest.stat().st_ino
    same = publish_index(releases(), ArtifactTarget(dest), base_url=BASE, default_world=DEFAULT)
    assert same.result.changes.empty and dest.stat().st_ino == dir_inode and _snapshot(dest) == before

    changed = publish_index(releases(extra_cu129=True), ArtifactTarget(dest), base_url=BASE, default_world=DEFAULT)
    assert dest.stat().st_ino != dir_inode  # a new tree, renamed into place
    after = _snapshot(dest)
    touched = {rel for rel in before if after[rel] != before[rel]}
    assert (
        touched == set(changed.result.changes.changed)
        == {*CU129_CHANGED, "index.html", MARKER_FILE}
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["_site"]  # no staging or backup left behind


def test_symlinks_in_a_site_are_refused(tmp_path):
    for target in (DirectoryTarget, ArtifactTarget):
        site = tmp_path / target.__name__
        publish_index(releases(), target(site), base_url=BASE, default_world=DEFAULT)
        (site / "link.html").symlink_to(site / "index.html")
        with pytest.raises(WheelhouseError, match="symlink"):
            publish_index(releases(), target(site), base_url=BASE, default_world=DEFAULT)
    with pytest.raises(WheelhouseError, match="symlink"):
        sync_tree({"index.html": b"x"}, tmp_path / "DirectoryTarget", previous=None)


def test_corrupt_published_cache_is_rebuilt_with_a_warning(tmp_path):
    dest = tmp_path / "index"
    publish_index([], DirectoryTarget(dest), base_url=BASE, default_world=DEFAULT)
    (dest / CACHE_FILE).write_text("{broken")
    fetch, calls = _fetch_counter()
    outcome = publish_index(
        releases(digest=False), DirectoryTarget(dest), base_url=BASE, default_world=DEFAULT, fetch=fetch
    )
    assert len(calls) == 2
    assert any("is not a digest cache" in w for w in outcome.warnings)
    assert b'"assets"' in (dest / CACHE_FILE).read_bytes()


# --- where the index goes: the policy publish-index and prune --apply share ----------------------------


def test_index_target_of_a_local_store_is_its_site_directory_at_a_file_url(tmp_path):
    store = tmp_path / "store"
    (store / "releases").mkdir(parents=True)
    target, url = index_target(store_root=store, github_repo=None)
    assert isinstance(target, DirectoryTarget) and target.path == store / "site"
    assert url == (store / "site").resolve().as_uri()
    target, url = index_target(store_root=store, github_repo=None, pages_artifact=tmp_path / "_site")
    assert isinstance(target, ArtifactTarget) and url == (tmp_path / "_site").resolve().as_uri()


def test_index_target_of_a_github_store_is_named_and_read_at_its_pages_url(tmp_path):
    assert index_target(store_root=None, github_repo="owner/repo") is None  # nothing named: the caller says what to name
    target, url = index_target(store_root=None, github_repo="owner/repo", out=tmp_path / "site")
    assert isinstance(target, DirectoryTarget) and url == BASE
    target, url = index_target(store_root=None, github_repo="owner/repo", push_branch="gh-pages", remote="/srv/site.git",
                               base_url="https://mirror.example/wheels")
    assert isinstance(target, GitBranchTarget) and url == "https://mirror.example/wheels"


def test_push_branch_without_remote_uses_origin_and_says_when_there_is_none(tmp_path):
    checkout = tmp_path / "checkout"
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    with pytest.raises(UsageError) as info:
        index_target(store_root=None, github_repo="owner/repo", push_branch="gh-pages", repo_root=checkout)
    assert str(info.value) == f"--push-branch: {checkout} has no git remote 'origin'; name the remote with --remote URL"
    assert info.value.exit_code == 2
    subprocess.run(["git", "-C", str(checkout), "remote", "add", "origin", "/srv/site.git"], check=True)
    assert origin_url(checkout) == "/srv/site.git"


def test_default_world_is_the_first_matrix_rows_unless_chosen():
    from ci.model.versions import load

    versions = load()
    assert default_world(versions) == "cu130/torch2.13"
    assert default_world(versions, "cu129/torch2.13") == "cu129/torch2.13"
