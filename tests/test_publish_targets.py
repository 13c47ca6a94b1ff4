"""Publishing never destroys what is not ours: foreign or overlapping target directories are refused,
a store that is not there is an error, an index that would lose most of its links needs a flag, and a
directory target is updated add-first, remove-last."""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_factory import build_wheel

from ci.base.errors import WheelhouseError
from ci.publish import pages
from ci.publish.pages import ArtifactTarget, DirectoryTarget, publish_index
from ci.store.local import LocalStore
from ci.store.model import Asset, Release
from tests.crash_points import kill_at_every_step, run_killed_at

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


@pytest.fixture
def bare_remote(tmp_path: Path) -> Path:
    remote = tmp_path / "pages.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    return remote


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
            f"error: {mine} is not empty and holds no published site (no wheelhouse-site.json): publishing would delete "
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
    store.delete_release(store.list_releases()[0].tag)  # the store now lists nothing (e.g. emptied by mistake)
    result = _invoke("publish-index", "--store", str(store.root), "--out", str(site))
    assert result.returncode == 1
    assert "would drop 1 of the 1 wheel links" in result.stderr and "--allow-shrink" in result.stderr
    assert page.read_bytes() == before
    result = _invoke("publish-index", "--store", str(store.root), "--out", str(site), "--allow-shrink")
    assert result.returncode == 0, result.stderr
    # the world and its component stay on the site, archived (PEP 792), without a link
    assert '<meta name="pypi:project-status" content="archived">' in page.read_text() and "<a " not in page.read_text()


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
        [(pages, "_atomic_write"), (pathlib.Path, "unlink")], prepare=prepare, check=check)
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
        [(pages.os, "rename"), (pathlib.Path, "write_bytes"), (pages.os, "link")], prepare=prepare, check=check)
    print(f"artifact target: killed at each of {steps} steps; every next run recovered")
    assert steps > 4


# --- a site is ours only by the marker we write (N9, N13), its file list bounds what a publish removes ----


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_a_stray_digests_json_does_not_make_a_directory_ours(tmp_path: Path) -> None:
    store = _store_with_one_wheel(tmp_path / "store", tmp_path)
    for flag, name in (("--out", "proj"), ("--pages-artifact", "proj2")):
        proj = tmp_path / name
        (proj / "src").mkdir(parents=True)
        (proj / "src" / "main.c").write_text("code\n")
        (proj / "digests.json").write_text("{}\n")  # some other tool's, or ours emptied
        before = _tree(proj)
        for extra in ((), ("--adopt",)):
            result = _invoke("publish-index", "--store", str(store.root), flag, str(proj), *extra)
            assert result.returncode == 1, (flag, extra, result.stdout)
            assert result.stderr.strip() == (
                f"error: {proj} is not empty and holds no published site (no wheelhouse-site.json): publishing "
                "would delete its files; name a new or empty directory, or the directory of an earlier publish")
            assert _tree(proj) == before


def test_a_publish_removes_only_files_an_earlier_publish_wrote(tmp_path: Path) -> None:
    """A nested .git, and any file the marker does not list, stay; a removed world's lock file goes (its pages
    stay, archived)."""
    store = _store_with_one_wheel(tmp_path / "store", tmp_path)
    site = tmp_path / "site"
    assert _invoke("publish-index", "--store", str(store.root), "--out", str(site)).returncode == 0
    marker = json.loads((site / "wheelhouse-site.json").read_text())
    assert marker["store"] == str(store.root) and marker["links"] == 1
    assert sorted(marker["files"]) == sorted(set(_tree(site)) - {"wheelhouse-site.json"})
    assert (site / WORLD / "pylock.wheelhouse-fixture.toml").is_file()
    mine = {"docs/.git/config": b"[core]\n", "docs/notes.md": b"notes\n", "CNAME": b"wheels.example\n",
            f"{WORLD}/simple/README.txt": b"mine\n"}
    for rel, data in mine.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_bytes(data)
    store.delete_release(store.list_releases()[0].tag)
    result = _invoke("publish-index", "--store", str(store.root), "--out", str(site), "--allow-shrink")
    assert result.returncode == 0, result.stderr
    left = _tree(site)
    assert {rel: left.get(rel) for rel in mine} == mine
    assert not (site / WORLD / "pylock.wheelhouse-fixture.toml").exists()
    assert "<a " not in (site / WORLD / "simple" / "wheelhouse-fixture" / "index.html").read_text()
    assert json.loads((site / "wheelhouse-site.json").read_text())["links"] == 0


def test_a_site_published_before_the_marker_is_adopted(tmp_path: Path) -> None:
    """Index pages and our digests.json only: adopted as it is. With other files too: only with --adopt, and
    those files are kept."""
    store = _store_with_one_wheel(tmp_path / "store", tmp_path)
    site = tmp_path / "site"
    assert _invoke("publish-index", "--store", str(store.root), "--out", str(site)).returncode == 0
    (site / "wheelhouse-site.json").unlink()  # what an earlier version published
    result = _invoke("publish-index", "--store", str(store.root), "--out", str(site))
    assert result.returncode == 0, result.stderr
    assert "adopted a site published before wheelhouse-site.json" in result.stderr
    assert (site / "wheelhouse-site.json").is_file()

    (site / "wheelhouse-site.json").unlink()
    (site / "README.md").write_text("mine\n")
    result = _invoke("publish-index", "--store", str(store.root), "--out", str(site))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: {site} holds a site published before wheelhouse-site.json and 1 file(s) no publish wrote "
        "(e.g. README.md): pass --adopt to publish over it (those files are kept), or move them away")
    result = _invoke("publish-index", "--store", str(store.root), "--out", str(site), "--adopt")
    assert result.returncode == 0, result.stderr
    assert (site / "README.md").read_text() == "mine\n" and (site / "wheelhouse-site.json").is_file()
    assert "README.md" not in json.loads((site / "wheelhouse-site.json").read_text())["files"]


def test_a_site_of_another_store_needs_force(tmp_path: Path) -> None:
    first = _store_with_one_wheel(tmp_path / "first", tmp_path)
    second = _store_with_one_wheel(tmp_path / "second", tmp_path / "b")
    site = tmp_path / "site"
    assert _invoke("publish-index", "--store", str(first.root), "--out", str(site)).returncode == 0
    before = _tree(site)
    result = _invoke("publish-index", "--store", str(second.root), "--out", str(site))
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: directory {site} holds the index of the store {first.root}, not of {second.root}: check --store / "
        "WHEELHOUSE_STORE (and --base-url); pass --force to publish over it")
    assert _tree(site) == before
    assert _invoke("publish-index", "--store", str(second.root), "--out", str(site), "--force").returncode == 0
    assert json.loads((site / "wheelhouse-site.json").read_text())["store"] == str(second.root)


def test_recovery_of_an_artifact_named_with_glob_characters_touches_only_its_own_leftovers(tmp_path: Path) -> None:
    store = _store_with_one_wheel(tmp_path / "store", tmp_path)
    parent = tmp_path / "par"
    for rel in (".keep.old-1/f", ".cache.new-x/g"):
        (parent / rel).parent.mkdir(parents=True)
        (parent / rel).write_text("mine\n")
    for name in ("*", "[a-z]*", "?"):
        result = _invoke("publish-index", "--store", str(store.root), "--pages-artifact", str(parent / name))
        assert result.returncode == 0, result.stderr
        assert (parent / ".keep.old-1" / "f").read_text() == "mine\n"
        assert (parent / ".cache.new-x" / "g").read_text() == "mine\n"


# --- a branch is replaced only when it holds our site or is new (N10) ------------------------------------


def _git(*args: str, cwd: Path | None = None) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout


def test_push_branch_refuses_a_branch_that_holds_no_site_and_the_default_branch(tmp_path: Path) -> None:
    store = _store_with_one_wheel(tmp_path / "store", tmp_path)
    project = tmp_path / "project"
    _git("init", "-q", "-b", "main", str(project))
    (project / "setup.py").write_text("print('project')\n")
    _git("add", ".", cwd=project)
    _git("commit", "-q", "-m", "project", cwd=project)
    bare = tmp_path / "bare.git"
    _git("clone", "-q", "--bare", str(project), str(bare))  # HEAD: main, the default branch
    _git("push", "-q", str(bare), "main:docs", cwd=project)  # another branch holding the project

    def publish(branch: str, *extra: str) -> subprocess.CompletedProcess:
        return _invoke("publish-index", "--store", str(store.root), "--push-branch", branch, "--remote", str(bare),
                       *extra)

    result = publish("docs")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: git {bare} branch docs is not empty and holds no published site (no wheelhouse-site.json): "
        "publishing would delete its files; name a new branch or the branch of an earlier publish, or pass --force "
        "to replace its tree (its history keeps it)")
    result = publish("main")
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: main is the default branch of {bare}: publishing would replace the project's files with the index; "
        "name a branch of its own such as gh-pages (or pass --force)")
    assert _git("--git-dir", str(bare), "ls-tree", "-r", "--name-only", "main").split() == ["setup.py"]
    assert _git("--git-dir", str(bare), "ls-tree", "-r", "--name-only", "docs").split() == ["setup.py"]

    assert publish("gh-pages").returncode == 0  # new: an orphan branch
    assert publish("gh-pages").returncode == 0  # ours now
    assert "wheelhouse-site.json" in _git("--git-dir", str(bare), "ls-tree", "--name-only", "gh-pages").split()
    assert publish("docs", "--force").returncode == 0
    assert "setup.py" not in _git("--git-dir", str(bare), "ls-tree", "-r", "--name-only", "docs").split()


# --- the shrink guard measures against the live site for a Pages artifact (N8) --------------------------


def test_a_fresh_pages_artifact_is_compared_with_the_live_site(tmp_path: Path) -> None:
    """CI builds the artifact in a fresh directory: the live site (read at --base-url, here over file://) says
    how many links it serves, and which store it indexes."""
    store = _store_with_one_wheel(tmp_path / "store", tmp_path)
    live = tmp_path / "live"
    base = ("--base-url", live.as_uri())
    assert _invoke("publish-index", "--store", str(store.root), "--pages-artifact", str(live), *base).returncode == 0
    other = tmp_path / "other"
    (other / "releases").mkdir(parents=True)
    result = _invoke("publish-index", "--store", str(other), "--pages-artifact", str(tmp_path / "run1" / "_site"), *base)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: the live site at {live.as_uri()} holds the index of the store {store.root}, not of {other}: check "
        "--store / WHEELHOUSE_STORE (and --base-url); pass --force to publish over it")

    store.delete_release(store.list_releases()[0].tag)  # the right store, but it lists nothing
    for run, live_has_marker in ((2, True), (3, False)):
        if not live_has_marker:  # a live site published before the marker: its landing page counts the links
            (live / "wheelhouse-site.json").unlink()
        artifact = tmp_path / f"run{run}" / "_site"
        result = _invoke("publish-index", "--store", str(store.root), "--pages-artifact", str(artifact), *base)
        assert result.returncode == 1, run
        assert result.stderr.strip() == (
            f"error: the new index would hold 0 wheel links where the live site at {live.as_uri()} serves 1 (a drop "
            "of more than 50%): check that the store (--store / WHEELHOUSE_STORE) is the right one; pass "
            "--allow-shrink if the drop is intended")
        assert not artifact.exists()
    result = _invoke("publish-index", "--store", str(store.root), "--pages-artifact", str(tmp_path / "run4" / "_site"),
                     *base, "--allow-shrink")
    assert result.returncode == 0, result.stderr


# --- a killed publish leaves nothing behind in $TMPDIR (earlier finding 20) ------------------------------


def test_a_killed_publish_leaves_no_copy_of_the_site_in_tmpdir(tmp_path: Path, bare_remote: Path) -> None:
    """The site is built in memory; a git target's clone left by a kill is removed by the next run (its
    process is gone)."""
    import tempfile

    tmp, site = tmp_path / "tmp", tmp_path / "site"
    tmp.mkdir()
    base = "https://o.github.io/r"
    rels = _releases("old", 2) + _releases("new", 2)
    saved = tempfile.tempdir
    tempfile.tempdir = str(tmp)
    try:
        def check(k: int) -> None:
            assert sorted(os.listdir(tmp)) == [], k
            publish_index(rels, DirectoryTarget(site), base_url=base, default_world=WORLD)  # the next run converges

        steps = kill_at_every_step(lambda: publish_index(rels, DirectoryTarget(site), base_url=base,
                                                         default_world=WORLD),
                                   [(pages.os, "replace")], prepare=lambda k: shutil.rmtree(site, ignore_errors=True),
                                   check=check)
        assert steps > 3

        def publish_to_branch() -> None:
            with pages.GitBranchTarget(str(bare_remote)) as target:
                publish_index(rels, target, base_url=base, default_world=WORLD)

        assert run_killed_at(1, publish_to_branch, [(pages.subprocess, "run")])  # just after its ls-remote
        assert [p.name.split("-")[:2] for p in tmp.iterdir()] == [["wheelhouse", "pages"]]
        publish_to_branch()
        assert sorted(os.listdir(tmp)) == []
    finally:
        tempfile.tempdir = saved


def test_a_directory_that_is_not_ours_is_refused_without_reading_its_tree(tmp_path: Path) -> None:
    """A mistyped --out such as $HOME: refused from its top level, not after a walk that meets its symlinks."""
    home = tmp_path / "home"
    (home / ".local" / "bin").mkdir(parents=True)
    (home / ".local" / "bin" / "tool").symlink_to("/bin/true")
    with pytest.raises(WheelhouseError, match=r"is not empty and holds no published site \(no wheelhouse-site"):
        DirectoryTarget(home)
