"""The versions file is one for the whole flow: a release or an index made with another versions file than the
build's is one line naming WHEELHOUSE_VERSIONS, not a blame on the build (``no build record …/cu130/…; build
the row first``) nor a ``/simple/`` quietly re-pointed at an empty world."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from build_records import write_record
from index_helpers import REPO
from provenance_helpers import release_fixture
from stamp_helpers import fixture_row

from ci.flows.demo import FIXTURE_VERSIONS


def invoke(*args: str, versions: Path, store: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(versions)}
    if store is not None:
        env["WHEELHOUSE_STORE"] = str(store)
    env.pop("GITHUB_REPOSITORY", None)
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)


def cuda_versions(tmp: Path) -> Path:
    """The fixture's versions file with its one row a CUDA 13.0 row: another versions file of the same component."""
    path = tmp / "versions-cuda.yaml"
    path.write_text(FIXTURE_VERSIONS.read_text().replace("cuda: cpu", 'cuda: "13.0.2"'))
    return path


def test_a_release_with_another_versions_file_names_the_build_of_the_other_world(fixture_wheel, tmp_path):
    _, row = fixture_row()
    wheel = tmp_path / "dist" / row.world / fixture_wheel.name
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(fixture_wheel.read_bytes())
    built = write_record(tmp_path / "dist", row, [wheel])
    result = invoke("release", "--component", "wheelhouse-fixture", "--dist", str(tmp_path / "dist"), "--store",
                    str(tmp_path / "store"), versions=cuda_versions(tmp_path))
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr
    assert result.stderr == (
        f"error: no build record {tmp_path}/dist/cu130/torch2.13/{built.name.replace('-cpu-', '-cu130-')}, but {built} "
        "is one of another world: "
        "it was built with another versions file; set WHEELHOUSE_VERSIONS to that file for the release too\n")
    assert not (tmp_path / "store" / "releases").exists()


def test_an_index_with_another_versions_file_does_not_serve_an_empty_world_at_simple(fixture_wheel, tmp_path):
    store = release_fixture(fixture_wheel, tmp_path).store.root
    result = invoke("publish-index", versions=cuda_versions(tmp_path), store=store)
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr
    assert result.stderr == (
        "error: the world served at /simple/, cu130/torch2.13 (the first build_matrix row's, or --default-world), "
        "has no wheels in this store, which holds cpu/torch2.13: set WHEELHOUSE_VERSIONS to the versions file the "
        "store was built and released with, or pass --default-world cpu/torch2.13\n")
    assert not (store / "site").exists()
    chosen = invoke("publish-index", "--default-world", "cpu/torch2.13", versions=cuda_versions(tmp_path), store=store)
    assert chosen.returncode == 0, chosen.stderr
    assert invoke("publish-index", versions=FIXTURE_VERSIONS, store=store).returncode == 0
