"""Shared fixtures (the repository root, a built fixture-extension wheel) and the workers' scheduling hook."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from made_once import one_maker

if importlib.util.find_spec("xdist"):  # the GPU machine's kernel tests run in one process, xdist or not
    from worker_scheduling import pytest_xdist_make_scheduler  # noqa: F401  (a hook: one module shares a worker)

# the GitHub-compatible test server as the `github_server` fixture
pytest_plugins = ["tests.github_server.pytest_plugin"]

# Commands the tests run against the test server write without GitHub's one-second gap (pacing has
# its own tests on a fake clock); in-process stores are given a sleep that does not wait.
os.environ.setdefault("WHEELHOUSE_WRITE_GAP", "0")

REPO = Path(__file__).resolve().parent.parent
FIXTURE_EXT = REPO / "tests" / "fixtures" / "fixture_ext"
CACHE = REPO / ".cache" / "tests"


def _tree_digest(root: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "build" not in p.parts and "egg-info" not in str(p)):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def fixture_wheel() -> Path:
    """The fixture extension built against the test interpreter's torch (2.13 CPU).

    Cached under .cache/ by source digest and torch version: the compile takes
    about 40 s on two cores and its result only changes with the sources.
    """
    import torch

    key = f"{_tree_digest(FIXTURE_EXT)}-torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}"
    out = CACHE / "fixture-wheel" / key
    with one_maker(out):
        return _built_fixture_wheel(out)


def _built_fixture_wheel(out: Path) -> Path:
    wheels = sorted(out.glob("*.whl"))
    if not wheels:
        staging = out.with_suffix(".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        work = staging / "src"
        shutil.copytree(FIXTURE_EXT, work, ignore=shutil.ignore_patterns("build", "*.egg-info"))
        subprocess.run(
            [sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-q", "-w", str(staging), str(work)],
            check=True,
        )
        shutil.rmtree(work)
        staging.rename(out)
        wheels = sorted(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]
