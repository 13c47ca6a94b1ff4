"""Git mirrors: our git source path unchanged against a mirror that git's own insteadOf points to.

Upstream repositories here are local bare repos standing for GitHub ones; the
component and its submodule are named by their https://github.com URLs, as in
versions.yaml, and reach us only through ``url.<mirror>.insteadOf``. The mirror
itself is made by tests/gpu/make_source_bundles.py, as for the GPU machine.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from ci.building import sources
from ci.model.versions import REPO_ROOT

SCRIPT = REPO_ROOT / "tests" / "gpu" / "make_source_bundles.py"
_spec = importlib.util.spec_from_file_location("make_source_bundles", SCRIPT)
bundles = sys.modules.setdefault("make_source_bundles", importlib.util.module_from_spec(_spec))
_spec.loader.exec_module(bundles)


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always",
                           *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _commit_all(repo: Path, message: str) -> str:
    _git("add", "-A", cwd=repo)
    _git("commit", "-qm", message, cwd=repo)
    return _git("rev-parse", "HEAD", cwd=repo)


@pytest.fixture
def upstream(tmp_path) -> dict:
    """example/app (tag v1) with submodule third-party/big -> example/big, whose docs/ blob is absent."""
    work = tmp_path / "work"
    big = work / "big"
    (big / "include" / "big").mkdir(parents=True)
    (big / "docs").mkdir()
    _git("init", "-q", "-b", "main", cwd=big)
    (big / "include" / "big" / "big.h").write_text("#define BIG 1\n")
    (big / "LICENSE").write_text("licence\n")
    (big / "docs" / "figure.png").write_bytes(b"\x89PNG not carried")
    _commit_all(big, "big: first")
    big_old = _git("rev-parse", "HEAD", cwd=big)
    (big / "include" / "big" / "big.h").write_text("#define BIG 2\n")
    big_commit = _commit_all(big, "big: second")

    snapshots = tmp_path / "snapshots" / "example"
    snapshots.mkdir(parents=True)
    _git("clone", "-q", "--bare", str(big), str(snapshots / "big.git"), cwd=tmp_path)
    # A snapshot that lacks a blob, as real snapshots can: drop docs/figure.png's object.
    blob = _git("rev-parse", f"{big_commit}:docs/figure.png", cwd=big)
    _drop_object(snapshots / "big.git", blob)

    app = work / "app"
    app.mkdir()
    _git("init", "-q", "-b", "main", cwd=app)
    (app / "setup.py").write_text("app\n")
    _commit_all(app, "app: first")
    _add_submodule(app, "third-party/big", "https://github.com/example/big.git", big_commit)
    _git("commit", "-qm", "app: with big", cwd=app)
    app_commit = _git("rev-parse", "HEAD", cwd=app)
    _git("tag", "-a", "v1", "-m", "v1", cwd=app)
    _git("clone", "-q", "--bare", str(app), str(snapshots / "app.git"), cwd=tmp_path)
    return {"snapshots": tmp_path / "snapshots", "app": app_commit, "big": big_commit, "big_old": big_old,
            "blob": blob}


def _add_submodule(repo: Path, path: str, url: str, commit: str) -> None:
    """A gitlink plus its .gitmodules entry, without cloning anything (the URL is not reachable)."""
    (repo / ".gitmodules").write_text(f'[submodule "{path}"]\n\tpath = {path}\n\turl = {url}\n')
    _git("update-index", "--add", "--cacheinfo", f"160000,{commit},{path}", cwd=repo)
    _git("add", ".gitmodules", cwd=repo)


def _drop_object(bare: Path, sha: str) -> None:
    """Repack the repository's objects, less ``sha``, into one pack; drop every other object file."""
    old = [p for p in (bare / "objects").glob("*/*") if p.parent.name != "info"]
    objects = _git("cat-file", "--batch-all-objects", "--batch-check=%(objectname)", cwd=bare).split()
    keep = "".join(f"{o}\n" for o in objects if o != sha)
    subprocess.run(["git", "pack-objects", "-q", str(bare / "objects" / "pack" / "pack")], cwd=bare, input=keep,
                   text=True, check=True, capture_output=True)
    for path in old:
        path.unlink()
    result = subprocess.run(["git", "cat-file", "-e", sha], cwd=bare, capture_output=True)
    assert result.returncode != 0


def _versions(tmp_path: Path, ref: str) -> Path:
    path = tmp_path / "versions.yaml"
    path.write_text(f"""\
build_matrix:
  - {{arch: x86_64, cuda: "13.0", python: "3.12", torch: "2.11.0", cxx11_abi: "TRUE"}}
components:
  app:
    source: {{git: "https://github.com/example/app.git", submodules: true}}
    ref: "{ref}"
    builder: fixture
    wheel_packages: [app]
    runs_on: ubuntu-24.04
""")
    return path


@pytest.fixture(params=["GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM"])
def mirror_config(request, tmp_path, monkeypatch):
    """Point https://github.com/ at ``tmp_path/mirror`` through git's own configuration, as the README says.

    Both the user's and the system's configuration count: a firewalled site sets its mirror system-wide.
    """
    mirror = tmp_path / "mirror"
    config = tmp_path / "gitconfig"
    subprocess.run(["git", "config", "--file", str(config), f"url.{mirror.as_uri()}/.insteadOf",
                    "https://github.com/"], check=True)
    subprocess.run(["git", "config", "--file", str(config), "protocol.file.allow", "always"], check=True)
    monkeypatch.setenv(request.param, str(config))
    return mirror


def test_mirror_serves_the_component_and_its_trimmed_submodule_through_insteadof(upstream, tmp_path, mirror_config,
                                                                                 monkeypatch):
    monkeypatch.setitem(bundles.TRIM_RULES, "example/big", ("include",))
    # The app must be rewritten (its submodule is trimmed): the versions file pins the rewrite.
    with pytest.raises(bundles.BundleError, match="pin that id as the ref and pass --upstream app="):
        bundles.build(_versions(tmp_path, "v1"), mirror_config, snapshot_root=upstream["snapshots"], snapshots={},
                      upstream={})
    rewritten = bundles.MirrorBuilder({}, upstream["snapshots"], tmp_path / "scratch").serve(
        "example/app", upstream["app"]).commit
    assert rewritten != upstream["app"]
    with pytest.raises(bundles.BundleError, match=f"mirror serves {upstream['app'][:12]} as {rewritten}; write"):
        bundles.build(_versions(tmp_path, "1" * 40), mirror_config, snapshot_root=upstream["snapshots"],
                      snapshots={}, upstream={"app": upstream["app"]})
    # Deterministic: the same snapshots give the same ids, so a versions file can pin them.
    served = dict(bundles.build(_versions(tmp_path, rewritten), mirror_config, snapshot_root=upstream["snapshots"],
                                snapshots={}, upstream={"app": upstream["app"]}))["app"]
    assert served.commit == rewritten
    assert served.submodules[0].upstream == upstream["big"] != served.submodules[0].commit

    url = "https://github.com/example/app.git"
    checkout = sources.fetch_git(url, rewritten, tmp_path / "cache", submodules=True, component="app")
    assert checkout.revision == rewritten
    assert (checkout.path / "setup.py").read_text() == "app\n"
    assert (checkout.path / "third-party/big/include/big/big.h").read_text() == "#define BIG 2\n"  # the gitlink's commit
    assert (checkout.path / "third-party/big/LICENSE").is_file()
    assert not (checkout.path / "third-party/big/docs").exists()  # trimmed away: its blob was never there
    message = _git("log", "-1", "--format=%B", cwd=checkout.path / "third-party/big")
    assert f"Wheelhouse-trimmed-from: example/big@{upstream['big']}" in message
    # Shallow: the mirror holds the served commits and nothing older.
    old = subprocess.run(["git", "cat-file", "-e", upstream["big_old"]], cwd=mirror_config / "example" / "big.git")
    assert old.returncode != 0


def test_a_snapshot_that_lacks_a_blob_a_build_needs_is_one_line(upstream, tmp_path, mirror_config):
    with pytest.raises(bundles.BundleError) as info:
        bundles.build(_versions(tmp_path, "v1"), mirror_config, snapshot_root=upstream["snapshots"], snapshots={},
                      upstream={})
    assert str(info.value) == (f"example/big@{upstream['big'][:12]}: the snapshot lacks 1 file(s), e.g. docs/figure.png; "
                               "add a TRIM_RULES entry for example/big that leaves them out")


def test_unchanged_upstream_commits_keep_their_ids_and_tags_resolve(tmp_path, mirror_config):
    """Without submodules or trims the mirror serves upstream's own commit, and its tag name resolves."""
    work = tmp_path / "plain"
    work.mkdir()
    _git("init", "-q", "-b", "main", cwd=work)
    (work / "setup.py").write_text("v1\n")
    first = _commit_all(work, "v1")
    (work / "setup.py").write_text("v2\n")
    second = _commit_all(work, "v2")
    _git("tag", "-a", "v2", "-m", "v2", cwd=work)
    snapshots = tmp_path / "snapshots" / "example"
    snapshots.mkdir(parents=True)
    _git("clone", "-q", "--bare", str(work), str(snapshots / "app.git"), cwd=tmp_path)

    rows = dict(bundles.build(_versions(tmp_path, "v2"), mirror_config, snapshot_root=tmp_path / "snapshots",
                              snapshots={}, upstream={}))
    assert rows["app"].commit == second
    url = "https://github.com/example/app.git"
    assert sources.resolve_ref(url, "v2") == second
    checkout = sources.fetch_git(url, "v2", tmp_path / "cache", submodules=True, component="app")
    assert checkout.revision == second and (checkout.path / "setup.py").read_text() == "v2\n"
    assert subprocess.run(["git", "cat-file", "-e", first], cwd=mirror_config / "example" / "app.git").returncode != 0


def test_snapshots_are_found_in_either_layout_by_the_mirror_and_the_tests_alike(tmp_path, monkeypatch):
    """``<owner>/<name>.git`` or ``<owner>+<name>/repo``: the mirror builder and the tests that read a real tree
    (tests/upstream_snapshots.py) look in the same two places; a snapshot in neither is one line naming both."""
    sys.path.insert(0, str(REPO_ROOT / "tests"))
    import upstream_snapshots

    (tmp_path / "example" / "app.git").mkdir(parents=True)
    (tmp_path / "example+lib" / "repo").mkdir(parents=True)
    monkeypatch.setenv("WHEELHOUSE_SNAPSHOTS", str(tmp_path))
    builder = bundles.MirrorBuilder({}, tmp_path, tmp_path / "out")
    assert builder.snapshot("example/app") == upstream_snapshots.find("example/app") == tmp_path / "example" / "app.git"
    assert builder.snapshot("example/lib") == upstream_snapshots.find("example/lib") == tmp_path / "example+lib" / "repo"
    assert upstream_snapshots.find("example/none") is None
    with pytest.raises(bundles.BundleError, match=r"^no snapshot of example/none: pass --snapshot example/none=PATH "):
        builder.snapshot("example/none")
    monkeypatch.delenv("WHEELHOUSE_SNAPSHOTS")
    assert upstream_snapshots.find("example/app") is None
