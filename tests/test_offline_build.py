"""Offline, a build whose git source cannot be reached stops before its toolchain is installed (a CUDA torch
venv is gigabytes), in one line naming the way out: a mirror (the README's section) or WHEELHOUSE_TORCH_INDEX;
the torch install's own failure names WHEELHOUSE_TORCH_INDEX too."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from index_helpers import REPO

from ci.flows.demo import FIXTURE_VERSIONS


def test_an_unreachable_git_source_stops_the_build_before_the_toolchain(tmp_path):
    versions = tmp_path / "versions.yaml"
    versions.write_text(FIXTURE_VERSIONS.read_text().replace(
        "source: {path: tests/fixtures/fixture_ext}", 'source: {git: "https://127.0.0.1:9/upstream/fixture.git"}'))
    cache = tmp_path / "cache"
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(versions), "WHEELHOUSE_CACHE": str(cache)}
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "nox", "-s", "build-wheelhouse-fixture-3.11", "--", "--dist",
                             str(tmp_path / "dist")], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode != 0, output
    assert "--- toolchain" not in output and not (cache / "venvs").exists(), output
    assert ("https://127.0.0.1:9/upstream/fixture.git cannot be reached (git ls-remote), so its sources cannot be "
            "fetched; nothing was installed: offline or behind a firewall, serve it from a mirror (the README's "
            "'Building offline or from a mirror'; WHEELHOUSE_TORCH_INDEX names a torch index), or build a checkout "
            "with --source DIR") in output
    assert took < 60, took  # no venv, no retries of the fetch


def test_the_torch_install_names_the_variable_for_another_index():
    source = (REPO / "ci" / "building" / "toolchain.py").read_text()
    assert "name another with WHEELHOUSE_TORCH_INDEX" in source and "Building offline or from a mirror" in source
    assert "### Building offline or from a mirror" in (REPO / "README.md").read_text()
