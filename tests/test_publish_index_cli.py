"""invoke publish-index end to end: a store's releases to a gh-pages branch and to a Pages artifact."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from wheel_factory import build_wheel

from ci.store.local import LocalStore

REPO = Path(__file__).resolve().parent.parent


def _invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", "publish-index", *args], cwd=REPO, capture_output=True,
                          text=True, env={k: v for k, v in os.environ.items() if not k.startswith("WHEELHOUSE_")})


def test_publish_to_a_branch_twice_makes_one_commit_and_writes_an_artifact(tmp_path):
    store = LocalStore(tmp_path / "store")
    store.ensure_release("demo-1.0-py3.12-torch2.13.0", "demo 1.0 - cu13.0.2 py3.12 torch2.13.0", "")
    wheel = build_wheel(tmp_path / "dist", {"demo_pkg/__init__.py": b""}, tags="cp312-cp312-linux_x86_64")
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
    page = subprocess.run(["git", "--git-dir", str(bare), "show", "gh-pages:cu130/torch2.13/simple/demo-pkg/index.html"],
                          capture_output=True, text=True, check=True).stdout
    assert f"{wheel.name}#sha256=" in page

    artifact = tmp_path / "_site"
    result = _invoke("--store", str(store.root), "--pages-artifact", str(artifact), "--base-url", "https://o.github.io/r")
    assert result.returncode == 0, result.stderr
    assert (artifact / "simple" / "demo-pkg" / "index.html").read_text() == page
