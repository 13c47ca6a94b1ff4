"""Real upstream components built on this CPU machine through our sessions (slow; need a git mirror).

The sources come through our git path from a mirror that git's insteadOf puts in
GitHub's place, made by tests/gpu/make_source_bundles.py from local copies of
the upstream repositories:

    python tests/gpu/make_source_bundles.py --versions tests/fixtures/versions-device.yaml \\
        --snapshots DIR --out .device/mirror --upstream flash-mla=9241ae3... --upstream deep-gemm=54e2261...
    WHEELHOUSE_TEST_MIRROR=.device/mirror nox -s tests -- -m slow tests/test_real_builds.py

torch 2.13.0 comes from the package index (a CUDA 13.0 build, several GB) into
the row venv; nvcc 13.0 is this machine's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci.model.versions import REPO_ROOT

MIRROR = os.environ.get("WHEELHOUSE_TEST_MIRROR")
VERSIONS = REPO_ROOT / "tests" / "fixtures" / "versions-real-cpu.yaml"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.network,
    pytest.mark.skipif(not MIRROR, reason="set WHEELHOUSE_TEST_MIRROR to a mirror made by make_source_bundles.py"),
]


@pytest.fixture(scope="module")
def deep_gemm_bundle(tmp_path_factory) -> Path:
    """DeepGEMM built once, in bundle mode, for Pythons 3.11 and 3.12 against torch 2.13.0."""
    work = tmp_path_factory.mktemp("real")
    config = work / "gitconfig"
    mirror_url = Path(MIRROR).resolve().as_uri() + "/"
    subprocess.run(["git", "config", "--file", str(config), f"url.{mirror_url}.insteadOf", "https://github.com/"],
                   check=True)
    subprocess.run(["git", "config", "--file", str(config), "protocol.file.allow", "always"], check=True)
    env = {**os.environ, "GIT_CONFIG_GLOBAL": str(config), "WHEELHOUSE_VERSIONS": str(VERSIONS)}
    dist = work / "dist"
    subprocess.run([sys.executable, "-m", "nox", "-s", "build-deep-gemm-3.12", "--", "--dist", str(dist)],
                   cwd=REPO_ROOT, env=env, check=True)
    wheels = sorted(dist.glob("*/*/deep_gemm-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_real_deep_gemm_is_one_wheel_for_two_pythons(deep_gemm_bundle):
    assert "-cp311.cp312-cp311.cp312-" in deep_gemm_bundle.name, deep_gemm_bundle.name


def test_real_deep_gemm_passes_check_wheel_against_torch_213(deep_gemm_bundle):
    """Both Pythons have their _C, and each links only symbols torch 2.13 (the row venv's) exports."""
    venv_python = next((REPO_ROOT / ".cache" / "venvs").glob("py3.12-torch2.13.0-*/bin/python"))
    proc = subprocess.run([sys.executable, "-m", "invoke", "check-wheel", "--wheel", str(deep_gemm_bundle), "--torch",
                           str(venv_python), "--pythons", "3.11,3.12"], cwd=REPO_ROOT, capture_output=True, text=True)
    print(proc.stdout, proc.stderr)
    assert proc.returncode == 0
    assert "PASS" in proc.stdout
