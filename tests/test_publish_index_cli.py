"""invoke publish-index end to end: a store's releases to a gh-pages branch and to a Pages artifact."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_factory import build_wheel

from ci.store.local import LocalStore

REPO = Path(__file__).resolve().parent.parent


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("WHEELHOUSE_")}


def _invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "publish-index", *args], cwd=REPO, capture_output=True,
                          text=True, env=_clean_env())


def test_publish_to_a_branch_twice_makes_one_commit_and_writes_an_artifact(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.ensure_release("demo-1.0-py3.12-torch2.13.0", "demo 1.0 - cu13.0.2 py3.12 torch2.13.0", "")
    wheel = build_wheel(tmp_path / "dist", {"demo/__init__.py": b""}, name="demo", tags="cp312-cp312-linux_x86_64")
    store.upload_asset("demo-1.0-py3.12-torch2.13.0", wheel)
    bare = tmp_path / "site.git"
    subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)

    for _ in range(2):
        result = _invoke("--store", str(store.root), "--push-branch", "gh-pages", "--remote", str(bare),
                         "--base-url", "https://owner.github.io/repo")
        assert result.returncode == 0, result.stderr
    commits = subprocess.run(["git", "--git-dir", str(bare), "rev-list", "--count", "gh-pages"], capture_output=True,
                             text=True, check=True).stdout.strip()
    assert commits == "1"  # the second publish found nothing to change
    assert "0 added, 0 changed, 0 removed" in result.stdout
    page = subprocess.run(["git", "--git-dir", str(bare), "show", "gh-pages:cu130/torch2.13/simple/demo/index.html"],
                          capture_output=True, text=True, check=True).stdout
    assert f"{wheel.name}#sha256=" in page

    artifact = tmp_path / "_site"
    result = _invoke("--store", str(store.root), "--pages-artifact", str(artifact), "--base-url", "https://o.github.io/r")
    assert result.returncode == 0, result.stderr
    assert (artifact / "simple" / "demo" / "index.html").read_text() == page


def test_a_github_store_named_by_store_publishes_under_its_pages_url(tmp_path):
    """`--store github:o/r` derives the base URL https://o.github.io/r as WHEELHOUSE_STORE=github:o/r does
    (it gave the file:// URL of ./site, the fallback for a store without a repository)."""
    from tests.github_server import GitHubTestServer

    with GitHubTestServer(token="test-token") as gh:
        rel = gh.seed_release("demo-1.0-py3.12-torch2.13.0", name="demo 1.0 - cu13.0.2 py3.12 torch2.13.0")
        gh.state.add_asset(rel, "demo-1.0-cp312-cp312-linux_x86_64.whl", b"wheel")
        env = {"WHEELHOUSE_API_URL": gh.api_url, "GITHUB_TOKEN": "test-token"}
        for how, extra_env in ((["--store", "github:o/r"], {}), ([], {"WHEELHOUSE_STORE": "github:o/r"})):
            site = tmp_path / f"site-{len(how)}"
            result = subprocess.run([sys.executable, "-m", "invoke", "publish-index", *how, "--out", str(site)],
                                    cwd=REPO, capture_output=True, text=True, timeout=120,
                                    env={**_clean_env(), **env, **extra_env})
            assert result.returncode == 0, result.stderr
            landing = (site / "index.html").read_text()
            assert "https://o.github.io/r/cu130/torch2.13/simple/" in landing
            assert "file://" not in landing


USAGE_ERRORS = {
    "two-targets": (["publish-index", "--out", "{tmp}/a", "--pages-artifact", "{tmp}/b"],
                    "--pages-artifact and --out: name one place to publish the index"),
    "remote-without-branch": (["publish-index", "--out", "{tmp}/a", "--remote", "/srv/site.git"],
                              "--remote names the git remote of --push-branch; add --push-branch BRANCH (e.g. gh-pages)"),
    "bad-base-url": (["publish-index", "--out", "{tmp}/a", "--base-url", "o.github.io/r"],
                     "base URL 'o.github.io/r' is not an http(s):// or file:// URL: pass e.g. "
                     "https://<owner>.github.io/<repo>"),
    "no-target": (["publish-index"], "publish-index: name --out, --pages-artifact or --push-branch for a GitHub store"),
    "prune-age": (["prune", "--older-than", "3months"],
                  "--older-than '3months': give a number and a unit, e.g. 90d, 12h or 2w"),
    "prune-no-target": (["prune", "--apply"], "prune --apply: name where to re-publish the index (--out, "
                                              "--pages-artifact or --push-branch) for a GitHub store"),
}


@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_a_usage_error_exits_2_before_the_store_is_read(case, tmp_path):
    """One line, exit status 2, and not one request to the store: a typo costs nothing and changes nothing."""
    from tests.github_server import GitHubTestServer

    args, message = USAGE_ERRORS[case]
    with GitHubTestServer(token="test-token") as gh:
        gh.seed_release("demo-1.0-py3.12-torch2.13.0", name="demo 1.0 - cu13.0.2 py3.12 torch2.13.0")
        gh.reset_counters()
        args = [arg.format(tmp=tmp_path) for arg in args]
        result = subprocess.run([sys.executable, "-m", "invoke", *args, "--store", "github:o/r"], cwd=REPO,
                                capture_output=True, text=True, timeout=60,
                                env={**_clean_env(), "WHEELHOUSE_API_URL": gh.api_url, "GITHUB_TOKEN": "test-token",
                                     "WHEELHOUSE_VERSIONS": str(REPO / "tests" / "fixtures" / "versions.yaml")})
        assert (result.returncode, result.stderr) == (2, f"error: {message}\n")
        assert sum(gh.counters.values()) == 0
    assert list(tmp_path.iterdir()) == []


def test_publish_index_leaves_out_a_wheel_its_components_versions_entry_does_not_name(tmp_path):
    """N1 through the task: a release of deep-ep (wheel_packages [deep-ep]) holding a torch wheel is indexed
    without it, with a warning naming the asset; its own wheel stays."""
    store = LocalStore(tmp_path / "store")
    tag = "deep-ep-3f601f7ac1c062c46502646ff04c535013bfca00-py3.12-torch2.13.0"
    store.ensure_release(tag, "deep-ep 3f601f7 - cu13.0.2 py3.12 torch2.13.0", "")
    for files, name in (({"deep_ep/__init__.py": b""}, "deep_ep"), ({"torch/__init__.py": b""}, "torch")):
        store.upload_asset(tag, build_wheel(tmp_path / name, files, name=name, version="1.2.1",
                                            tags="cp312-cp312-linux_x86_64"))
    result = _invoke("--store", str(store.root), "--out", str(tmp_path / "site"), "--base-url", "https://o.github.io/r")
    assert result.returncode == 0, result.stderr
    assert "warning: asset 'torch-1.2.1-cp312-cp312-linux_x86_64.whl'" in result.stderr
    assert "project 'torch' is not one component deep-ep publishes" in result.stderr
    world = tmp_path / "site" / "cu130" / "torch2.13" / "simple"
    assert sorted(p.name for p in world.iterdir() if p.is_dir()) == ["deep-ep"]
