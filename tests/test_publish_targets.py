"""Publishing never destroys what is not ours: foreign or overlapping target directories are refused,
a store that is not there is an error, an index that would lose most of its links needs a flag, and a
directory target is updated add-first, remove-last."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_factory import build_wheel

from ci import pages
from ci.errors import WheelhouseError
from ci.pages import ArtifactTarget, DirectoryTarget, publish_index
from ci.store.local import LocalStore
from ci.store.model import Asset, Release
from tests.crash_points import kill_at_every_step

REPO = Path(__file__).resolve().parent.parent
WORLD = "cpu/torch2.13"
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"


def _invoke(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHEELHOUSE_")}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          env={**env, "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS)})


def _store_with_one_wheel(root: Path, tmp_path: Path) -> LocalStore:
    store = LocalStore(root)
    tag = "wheelhouse-fixture-0.1.0-py3.11-torch2.13.0"
    store.ensure_release(tag, "wheelhouse-fixture 0.1.0 - cucpu py3.11 torch2.13.0", "")
    wheel = build_wheel(tmp_path / "dist", {"wheelhouse_fixture/__init__.py": b""}, name="wheelhouse_fixture",
                        version="0.1.0", tags="cp311-cp311-linux_x86_64")
    store.upload_asset(tag, wheel)
    return store


def _mine(root: Path) -> dict[str, bytes]:
    (root / "sub").mkdir(parents=True)
    (root / ".git").mkdir()
    files = {"notes.txt": b"precious\n", "sub/important.dat": b"data\n", ".git/config": b"[core]\n"}
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    return files


def test_publish_refuses_a_directory_of_someone_elses_files(tmp_path: Path) -> None:
    store = _store_with_one_wheel(tmp_path / "store", tmp_path)
    mine = tmp_path / "mine"
    files = _mine(mine)
    for flag in ("--out", "--pages-artifact"):
        result = _invoke("publish-index", "--store", str(store.root), flag, str(mine))
        assert result.returncode == 1, result.stdout
        assert result.stderr.strip().splitlines() == [
            f"error: {mine} is not empty and holds no published site (no digests.json): publishing would delete "
            "its files; name a new or empty directory, or the directory of an earlier publish"]
        assert {p.relative_to(mine).as_posix(): p.read_bytes() for p in mine.rglob("*") if p.is_file()} == files
    result = _invoke("prune", "--store", str(store.root), "--apply", "--out", str(mine))
    assert result.returncode == 1 and "is not empty and holds no published site" in result.stderr
    assert sorted(p.relative_to(mine).as_posix() for p in mine.rglob("*") if p.is_file()) == sorted(files)


def test_publish_refuses_the_store_and_the_repository(tmp_path: Path) -> None:
    store = _store_with_one_wheel(tmp_path / "st", tmp_path)
    result = _invoke("publish-index", "--store", str(store.root), "--out", str(store.root))
    assert result.returncode == 1
    assert "is or contains the release store" in result.stderr and len(result.stderr.splitlines()) == 1
    assert len(store.list_releases()[0].assets) == 1 and (store.root / "releases").is_dir()
    with pytest.raises(WheelhouseError, match="inside the release store's releases/"):
        DirectoryTarget(store.root / "releases" / "x", store_root=store.root)
    # the repository (and any folder above it): never published into, whatever it holds
    for path in (REPO, REPO.parent):
        with pytest.raises(WheelhouseError, match="is or contains the repository"):
            DirectoryTarget(path)
        with pytest.raises(WheelhouseError, match="is or contains the repository"):
            ArtifactTarget(path)
    # the store's own site folder, and a new folder, are fine
    DirectoryTarget(store.root / "site", store_root=store.root)
    ArtifactTarget(tmp_path / "new" / "_site", store_root=store.root)


def test_our_site_keeps_a_git_folder_and_updates(tmp_path: Path) -> None:
    store = _store_with_one_wheel(tmp_path / "store", tmp_path)
    site = tmp_path / "site"
    assert _invoke("publish-index", "--store", str(store.root), "--out", str(site)).returncode == 0
    (site / ".git").mkdir()
    (site / ".git" / "HEAD").write_text("ref: refs/heads/gh-pages\n")
    result = _invoke("publish-index", "--store", str(store.root), "--out", str(site), "--base-url", "https://o.github.io/r")
    assert result.returncode == 0, result.stderr
    assert (site / ".git" / "HEAD").read_text() == "ref: refs/heads/gh-pages\n"


def test_a_missing_store_is_an_error_and_the_live_index_stays(tmp_path: Path) -> None:
    store = _store_with_one_wheel(tmp_path / "store", tmp_path)
    site = tmp_path / "site"
    assert _invoke("publish-index", "--store", str(store.root), "--out", str(site)).returncode == 0
    before = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    for task in (("publish-index", "--out", str(site)), ("prune", "--apply", "--out", str(site)),
                 ("migrate-tags", "--apply")):
        result = _invoke(*task, "--store", str(tmp_path / "stroe"))
        assert result.returncode == 1, task
        assert result.stderr.strip() == (
            f"error: local store {tmp_path / 'stroe'} does not exist (no releases/ folder): check --store / "
            "WHEELHOUSE_STORE; a store is created by its first `invoke release`")
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} == before


def test_an_index_that_loses_most_links_needs_allow_shrink(tmp_path: Path) -> None:
    store = _store_with_one_wheel(tmp_path / "store", tmp_path)
    site = tmp_path / "site"
    assert _invoke("publish-index", "--store", str(store.root), "--out", str(site)).returncode == 0
    page = site / WORLD / "simple" / "wheelhouse-fixture" / "index.html"
    before = page.read_bytes()
    empty = tmp_path / "empty"
    (empty / "releases").mkdir(parents=True)  # an existing store that holds nothing (e.g. the wrong one)
    result = _invoke("publish-index", "--store", str(empty), "--out", str(site))
    assert result.returncode == 1
    assert "would drop 1 of the 1 wheel links" in result.stderr and "--allow-shrink" in result.stderr
    assert page.read_bytes() == before
    result = _invoke("publish-index", "--store", str(empty), "--out", str(site), "--allow-shrink")
    assert result.returncode == 0, result.stderr
    assert not page.exists()


def _releases(prefix: str, n: int) -> list[Release]:
    out = []
    for i in range(n):
        name = f"{prefix}{i}-1.0-py3-none-any.whl"
        out.append(Release(f"{prefix}{i}-1.0-py3.11-torch2.13.0", f"{prefix}{i} 1.0 - cucpu py3.11 torch2.13.0",
                           assets=(Asset(name, 1, f"https://example.invalid/{name}",
                                         "sha256:" + hashlib.sha256(name.encode()).hexdigest(), id=i),)))
    return out


def test_directory_target_killed_at_every_step_never_lists_a_missing_page(tmp_path: Path) -> None:
    """Replacing a package of a world: at no moment does a world listing name a page that is gone."""
    site = tmp_path / "site"
    base = site.as_uri()

    def prepare(k: int) -> None:
        shutil.rmtree(site, ignore_errors=True)
        publish_index(_releases("old", 3), DirectoryTarget(site), base_url=base, default_world=WORLD)

    def check(k: int) -> None:
        for listing in site.glob("**/simple/index.html"):
            text = listing.read_text()
            for package in ("old0", "old1", "old2", "new0", "new1", "new2"):
                if f'href="{package}/"' in text:
                    assert (listing.parent / package / "index.html").is_file(), (k, listing, package)

    steps = kill_at_every_step(
        lambda: publish_index(_releases("old", 2) + _releases("new", 2), DirectoryTarget(site), base_url=base,
                              default_world=WORLD),
        [(pages, "_atomic_copy"), (pathlib.Path, "unlink")], prepare=prepare, check=check)
    print(f"directory target: killed at each of {steps} steps; no listing named a missing page")
    assert steps > 12


def test_artifact_target_killed_at_every_step_recovers_on_the_next_run(tmp_path: Path) -> None:
    site = tmp_path / "_site"

    def prepare(k: int) -> None:
        shutil.rmtree(tmp_path, ignore_errors=True)
        tmp_path.mkdir()
        publish_index(_releases("old", 3), ArtifactTarget(site), base_url="https://o.github.io/r", default_world=WORLD)

    def check(k: int) -> None:
        publish_index(_releases("old", 2) + _releases("new", 2), ArtifactTarget(site), base_url="https://o.github.io/r",
                      default_world=WORLD)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["_site"], k  # no backup or staging tree left
        assert (site / WORLD / "simple" / "new1" / "index.html").is_file(), k

    steps = kill_at_every_step(
        lambda: publish_index(_releases("old", 2) + _releases("new", 2), ArtifactTarget(site),
                              base_url="https://o.github.io/r", default_world=WORLD),
        [(pages.os, "rename"), (pages.shutil, "copyfile"), (pages.os, "link")], prepare=prepare, check=check)
    print(f"artifact target: killed at each of {steps} steps; every next run recovered")
    assert steps > 4
