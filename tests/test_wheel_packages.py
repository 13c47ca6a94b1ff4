"""What a component may publish is decided by versions.yaml: its wheel_packages (else its own name), and a
wheel's file name must be its METADATA's name and version. Enforced at the end of a build and by a release;
the .metadata a release uploads is made from the wheel, never taken from the build output."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from build_records import write_record
from wheel_factory import build_wheel

from ci.base.errors import CheckFailed
from ci.building import job
from ci.formats.metadata import extract_metadata
from ci.model import matrix, wheel_packages
from ci.model.versions import load
from ci.publish import release
from ci.store.local import LocalStore

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"
TAGS = "py3-none-linux_x86_64"


def fixture_row():
    versions = load(FIXTURE_VERSIONS)
    (row,) = matrix.expand(versions)
    return versions, row


def fake_build(dist: Path, wheels: list[tuple[str, str]], *, metadata_version: str | None = None) -> list[Path]:
    """What a build of the fixture row leaves in ``dist``: wheels of these (name, version), each with the
    .metadata the build wrote, and a build record whose checks passed. ``metadata_version``: the Version
    the wheels' METADATA says instead (a file name that lies about its wheel)."""
    _, row = fixture_row()
    out = dist / row.world
    made = []
    for name, version in wheels:
        wheel = build_wheel(out, {f"{name}/__init__.py": b""}, name=name, version=metadata_version or version,
                            tags=TAGS)
        if metadata_version:
            wheel = wheel.rename(wheel.with_name(f"{name}-{version}-{TAGS}.whl"))
        else:
            extract_metadata(wheel, out)
        made.append(wheel)
    write_record(dist, row, made)
    return made


def test_a_component_publishes_its_wheel_packages_for_each_arch_else_its_own_name(tmp_path):
    path = tmp_path / "versions.yaml"
    arm_row = '\n  - {arch: aarch64, cuda: cpu, python: "3.11", torch: "2.13.0", cxx11_abi: "TRUE"}'
    path.write_text(FIXTURE_VERSIONS.read_text().replace("torch_index: default}", "torch_index: default}" + arm_row)
                    + """
  flashinfer:
    source: {path: tests/fixtures/fixture_ext}
    ref: "1.0"
    builder: fixture
    wheel_packages: [flashinfer-python, Flashinfer_Cubin]
    runs_on: ubuntu-24.04
    arch_overrides:
      aarch64: {wheel_packages: [flashinfer.jit_cache]}
  deep-gemm:
    source: {path: tests/fixtures/fixture_ext}
    ref: "1.0"
    builder: fixture
    runs_on: ubuntu-24.04
""")
    assert wheel_packages.by_component(load(path)) == {
        "wheelhouse-fixture": {"wheelhouse-fixture"},
        "flashinfer": {"flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache"},  # PEP 503, every arch
        "deep-gemm": {"deep-gemm"},  # no wheel_packages: its own name, nothing else
    }
    assert wheel_packages.allowed("flashinfer", ["flashinfer.python"]) == {"flashinfer-python"}
    assert wheel_packages.refusal("deep-gemm", "deep-gemm", {"deep-gemm"}) is None


def invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS)}, timeout=120)


def test_release_refuses_a_wheel_of_another_project_before_uploading_anything(tmp_path):
    fake_build(tmp_path / "dist", [("wheelhouse_fixture", "0.1.0"), ("torch", "99.0")])
    done = invoke("release", "--component", "wheelhouse-fixture", "--dist", str(tmp_path / "dist"),
                  "--store", str(tmp_path / "store"))
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines()[-1] == (
        f"error: torch-99.0-{TAGS}.whl: project 'torch' is not one component wheelhouse-fixture publishes "
        "(wheelhouse-fixture: components.wheelhouse-fixture.wheel_packages in versions.yaml, or the component's "
        "own name when it lists none); a component publishes only its own wheels: fix its build, or list the "
        "project in its wheel_packages")
    assert not (tmp_path / "store" / "releases").exists() or LocalStore(tmp_path / "store").list_releases() == []


def test_release_refuses_a_wheel_whose_file_name_is_not_its_metadata(tmp_path):
    versions, row = fixture_row()
    fake_build(tmp_path / "dist", [("wheelhouse_fixture", "0.1.0")], metadata_version="99.0")
    with pytest.raises(CheckFailed) as refused:
        release.plan(versions, row, tmp_path / "dist")
    assert str(refused.value) == (f"wheelhouse_fixture-0.1.0-{TAGS}.whl: METADATA Version '99.0' does not match "
                                  "the filename; rebuild the wheel")


def test_release_uploads_the_metadata_of_the_wheel_not_the_one_the_build_wrote(tmp_path):
    versions, row = fixture_row()
    (wheel,) = fake_build(tmp_path / "dist", [("wheelhouse_fixture", "0.1.0")])
    sidecar = wheel.with_name(wheel.name + ".metadata")
    sidecar.write_bytes(sidecar.read_bytes() + b"Requires-Dist: evil-dependency-confusion\n")
    store = LocalStore(tmp_path / "store")
    release.apply(release.plan(versions, row, tmp_path / "dist"), store)
    with zipfile.ZipFile(wheel) as zf:
        own = zf.read("wheelhouse_fixture-0.1.0.dist-info/METADATA")
    assert store.read_asset(row.release_tag, sidecar.name) == own
    assert b"evil" not in own

    sidecar.unlink()  # a build output without the sidecar: the release still has it, unchanged
    release.apply(release.plan(versions, row, tmp_path / "dist"), store)
    assert store.read_asset(row.release_tag, sidecar.name) == own


def test_a_build_whose_wheel_is_another_project_fails_with_one_line_and_leaves_dist_empty(tmp_path):
    """Upstream's setup.py names the wheel: transformer_engine 99.0 from the fixture component."""
    versions, row = fixture_row()
    source = tmp_path / "upstream"
    (source / "torch_shadow").mkdir(parents=True)
    (source / "torch_shadow" / "__init__.py").write_text("")
    (source / "setup.py").write_text('from setuptools import setup\n'
                                     'setup(name="transformer_engine", version="99.0", packages=["torch_shadow"])\n')
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", reuse_env=True,
                                 source=source, run_checks=False)
    with pytest.raises(CheckFailed) as refused:
        job.run(versions, row, options)
    assert str(refused.value) == (
        f"{row.label}: transformer_engine-99.0-py3-none-any.whl: project 'transformer-engine' is not one component "
        "wheelhouse-fixture publishes (wheelhouse-fixture: components.wheelhouse-fixture.wheel_packages in "
        "versions.yaml, or the component's own name when it lists none); a component publishes only its own "
        "wheels: fix its build, or list the project in its wheel_packages")
    assert not (tmp_path / "dist").exists()
