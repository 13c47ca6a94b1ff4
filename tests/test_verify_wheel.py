"""`invoke verify-wheel`: a downloaded wheel against its release's manifest and provenance and its own SBOM,
offline. A good wheel is one line, exit 0; each difference one line naming it, exit 2; a bad input one
line, exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from provenance_helpers import Released, release_fixture
from wheel_factory import build_wheel

from ci.base.digest import sha256_file
from ci.building import sbom
from ci.checks import pin
from ci.formats.archive import open_wheel
from ci.formats.metadata import read_metadata
from ci.formats.rewrite import add_members

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def released(fixture_wheel, tmp_path_factory) -> Released:
    return release_fixture(fixture_wheel, tmp_path_factory.mktemp("released"))


def verify(*args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GITHUB_ACTIONS"}  # plain error lines, not annotations
    return subprocess.run([sys.executable, "-m", "invoke", "verify-wheel", *args], cwd=REPO, capture_output=True,
                          text=True, env=env)


def error_lines(result: subprocess.CompletedProcess) -> list[str]:
    return [line for line in result.stderr.splitlines() if line.strip()]


def copy_of(released: Released, tmp_path: Path) -> Path:
    wheel = tmp_path / released.wheel.name
    shutil.copyfile(released.wheel, wheel)
    return wheel


def test_a_good_wheel_is_one_line_and_exit_0(released):
    for where in (["--manifest", str(released.manifest)], ["--release", str(released.assets)]):
        result = verify("--wheel", str(released.wheel), *where)
        assert result.returncode == 0, result.stderr
        (line,) = result.stdout.splitlines()
        assert line.startswith(f"{released.wheel.name}: consistent with release {released.row.release_tag} "
                               f"(x86_64)'s manifest and its unsigned provenance statement: sha256 "
                               f"{sha256_file(released.wheel)[:12]}…, world cpu/torch2.13, torch pin torch==2.13.*")
        # the unsigned statement names a run, but nothing shows it is true: no "published by"
        assert line.endswith("; nothing here shows who published it (a release the publish workflow made carries "
                             "wheelhouse-provenance-x86_64.sigstore.json, signed)")
        assert "published by" not in line and result.stderr == ""


def test_changed_bytes_are_refused(released, tmp_path):
    wheel = copy_of(released, tmp_path)
    with open_wheel(wheel) as archive:
        readme = f"{archive.dist_info}/top_level.txt"
        assert readme in archive.names()
        original = archive.read_small(readme)
    add_members(wheel, wheel, {}, {readme: original + b"extra\n"})  # RECORD kept valid: only the digest tells
    result = verify("--wheel", str(wheel), "--release", str(released.assets))
    assert result.returncode == 2
    assert error_lines(result) == [
        f"error: {wheel.name}: sha256 {sha256_file(wheel)[:12]}… differs from release {released.row.release_tag}'s "
        f"manifest ({sha256_file(released.wheel)[:12]}…): the bytes changed after the release"]


def test_a_changed_torch_pin_is_refused_by_name(released, tmp_path):
    wheel = copy_of(released, tmp_path)
    with open_wheel(wheel) as archive:
        metadata_name = f"{archive.dist_info}/METADATA"
        metadata = read_metadata(archive)
    add_members(wheel, wheel, {}, {metadata_name: pin.pinned_metadata(metadata, "==2.14.*", wheel.name)})
    assert pin.read_torch_pin(wheel) == "==2.14.*"
    result = verify("--wheel", str(wheel), "--manifest", str(released.manifest))
    assert result.returncode == 2
    lines = error_lines(result)
    assert f"error: {wheel.name}: torch pin: METADATA requires torch==2.14.*, its SBOM records torch==2.13.*: " \
           "METADATA was changed after the build" in lines
    assert any(" differs from release " in line for line in lines)  # and the bytes, of course
    assert len(lines) == 2, lines


def test_a_changed_source_commit_in_the_sbom_is_refused_by_name(released, tmp_path):
    wheel = copy_of(released, tmp_path)
    document = sbom.read_document(wheel)
    source = next(c for c in document["components"] if c["bom-ref"] == "source")
    original = sbom.read_sbom(wheel).source_revision
    forged = "f" * 64
    for prop in source["properties"]:
        if prop["name"] == "wheelhouse:source_digest":
            prop["value"] = forged
    with open_wheel(wheel) as archive:
        member = f"{archive.dist_info}/{sbom.SBOM_NAME}"
    add_members(wheel, wheel, {}, {member: sbom.dumps(document)})
    assert sbom.read_sbom(wheel).source_revision == forged
    result = verify("--wheel", str(wheel), "--manifest", str(released.manifest))
    assert result.returncode == 2
    lines = error_lines(result)
    assert f"error: {wheel.name}: source commit: its SBOM says {forged}, release {released.row.release_tag}'s " \
           f"manifest says {original}" in lines
    assert len(lines) == 2, lines  # and the sha256


def test_a_provenance_that_disagrees_with_its_manifest_is_refused(released, tmp_path):
    assets = tmp_path / "assets"
    shutil.copytree(released.assets, assets)
    statement_path = assets / released.provenance.name
    statement = json.loads(statement_path.read_bytes())
    statement["subject"][0]["digest"]["sha256"] = "0" * 64
    statement["predicate"]["buildDefinition"]["externalParameters"]["fingerprint"] = "1" * 64
    statement_path.write_text(json.dumps(statement))
    result = verify("--wheel", str(released.wheel), "--release", str(assets))
    assert result.returncode == 2
    lines = error_lines(result)
    assert len(lines) == 2, lines
    assert lines[0].startswith(f"error: {released.wheel.name}: the provenance's sha256 000000000000… differs from "
                               "the manifest's")
    assert lines[1].startswith("error: build fingerprint: the provenance says 111111111111…, the manifest ")


def test_bad_inputs_are_one_line_exit_2(released, tmp_path):
    not_a_wheel = tmp_path / released.wheel.name
    not_a_wheel.write_bytes(b"not a zip")
    other = tmp_path / "other"
    other.mkdir()
    manifest = json.loads(released.manifest.read_bytes())
    manifest.update(release_tag="other-1.0-py3.11-torch2.13.0", wheels=[{"name": "x-1.0-py3-none-any.whl",
                                                                         "sha256": "0" * 64, "size": 1}])
    (other / released.manifest.name).write_text(json.dumps(manifest))
    deep = tmp_path / "deep"  # adversarial R9: json.loads recursed into a RecursionError traceback
    deep.mkdir()
    (deep / released.manifest.name).write_text('{"a":' * 100_000 + "1" + "}" * 100_000)
    (deep / released.provenance.name).write_text("[" * 100_000 + "]" * 100_000)
    no_statement = tmp_path / "no-statement"
    no_statement.mkdir()
    shutil.copyfile(released.manifest, no_statement / released.manifest.name)
    cases = {
        ("--wheel", str(tmp_path / "missing.whl"), "--manifest", str(released.manifest)):
            f"{tmp_path / 'missing.whl'}: no such file; name the downloaded wheel with --wheel",
        ("--wheel", str(not_a_wheel), "--manifest", str(released.manifest)):
            f"{not_a_wheel}: not a readable wheel (",
        ("--wheel", str(released.manifest), "--manifest", str(released.manifest)):
            f"{released.manifest}: not a wheel file name",
        ("--wheel", str(released.wheel), "--manifest", str(other / released.manifest.name)):
            f"{other / released.manifest.name}: the manifest of release other-1.0-py3.11-torch2.13.0 (x86_64) does not "
            f"list {released.wheel.name}; pass the manifest of the release the wheel came from",
        ("--wheel", str(released.wheel), "--release", str(other)):
            f"{other}: the manifests of release other-1.0-py3.11-torch2.13.0 do not list {released.wheel.name}",
        ("--wheel", str(released.wheel), "--manifest", str(no_statement / released.manifest.name)):
            f"{no_statement / released.provenance.name}: no such file; download wheelhouse-provenance-x86_64.sigstore.json "
            "(or, for a release made outside a workflow, wheelhouse-provenance-x86_64.intoto.json)",
        ("--wheel", str(released.wheel), "--manifest", str(released.manifest), "--provenance", str(released.manifest)):
            f"{released.manifest}: not an in-toto statement with an SLSA provenance v1 predicate",
        ("--wheel", str(released.wheel), "--manifest", str(deep / released.manifest.name)):
            f"{deep / released.manifest.name}: manifest is not JSON (nested more than 64 levels",
        ("--wheel", str(released.wheel), "--manifest", str(released.manifest), "--provenance",
         str(deep / released.provenance.name)):
            f"{deep / released.provenance.name}: not JSON (nested more than 64 levels",
        ("--wheel", str(released.wheel)): "name the wheel's release with exactly one of --manifest PATH or --release DIR",
        ("--manifest", str(released.manifest)): "name the wheel to check with --wheel PATH",
    }
    for args, expected in cases.items():
        result = verify(*args)
        lines = error_lines(result)
        assert result.returncode == 2 and len(lines) == 1, (args, result.stderr)
        assert lines[0].startswith("error: " + expected), (args, lines[0])
        assert result.stdout == ""


def test_verify_wheel_writes_nothing(released):
    before = sorted((p, p.stat().st_mtime_ns) for p in released.assets.parent.parent.rglob("*"))
    assert verify("--wheel", str(released.wheel), "--release", str(released.assets)).returncode == 0
    assert sorted((p, p.stat().st_mtime_ns) for p in released.assets.parent.parent.rglob("*")) == before


def test_a_wheel_without_its_sbom_is_refused_in_one_line(released, tmp_path):
    wheel = copy_of(released, tmp_path)
    stripped = tmp_path / "stripped" / wheel.name
    stripped.parent.mkdir()
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(stripped, "w") as target:
        for info in source.infolist():
            if not info.filename.endswith(sbom.SBOM_NAME):
                target.writestr(info, source.read(info.filename))
    result = verify("--wheel", str(stripped), "--manifest", str(released.manifest))
    assert result.returncode == 2
    lines = error_lines(result)
    assert len(lines) == 3 and lines[0].startswith(f"error: {wheel.name}: archive: ") and "which the wheel does not " \
        "hold" in lines[0], lines
    assert " differs from release " in lines[1]
    assert lines[2].startswith(f"error: {wheel.name}: has no wheelhouse_fixture-0.1.0.dist-info/{sbom.SBOM_NAME}")


def test_a_wheel_that_links_no_torch_keeps_upstreams_requirement_and_verifies(tmp_path):
    upstream = build_wheel(tmp_path / "upstream", {"wheelhouse_fixture/__init__.py": b""}, name="wheelhouse_fixture",
                           version="0.1.0", tags="py3-none-any", requires=["torch>=2.0"])
    released = release_fixture(upstream, tmp_path / "release")
    assert pin.read_torch_pin(released.wheel) == ">=2.0" and sbom.read_sbom(released.wheel).torch_pin is None
    result = verify("--wheel", str(released.wheel), "--release", str(released.assets))
    assert result.returncode == 0, result.stderr
    assert ", torch pin none, " in result.stdout
