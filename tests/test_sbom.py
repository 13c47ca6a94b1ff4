"""The SBOM every wheel carries (PEP 770, CycloneDX 1.6): valid, complete, deterministic, read back."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
from stamp_helpers import FIXTURE_EXT, fixture_facts, fixture_row, validate_cyclonedx
from wheel_factory import NVCC, build_wheel, cuda_shared_object, record_hash, write_synthetic_elf

from ci.base.digest import sha256_file
from ci.base.errors import CheckFailed
from ci.building import sbom, sources, toolchain
from ci.building.stamp import stamp_wheel
from ci.formats.archive import open_wheel
from ci.formats.archs import CudaArch
from ci.formats.fatbin import scan_wheel_archs
from ci.formats.record import check_record
from ci.model.versions import REPO_ROOT

SBOM_MEMBER = "wheelhouse_fixture-0.1.0.dist-info/sboms/wheelhouse.cdx.json"


def _git(*args: str, cwd: Path) -> str:
    env = {**os.environ, "GIT_AUTHOR_DATE": "1700000000 +0000", "GIT_COMMITTER_DATE": "1700000000 +0000"}
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "protocol.file.allow=always",
                           *args], cwd=cwd, env=env, capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture(scope="module")
def facts() -> dict:
    return fixture_facts()


@pytest.fixture
def stamped(tmp_path, fixture_wheel, facts) -> Path:
    wheel = tmp_path / fixture_wheel.name
    shutil.copyfile(fixture_wheel, wheel)
    stamp_wheel(wheel, torch_version="2.13.0", pin_mode="minor", facts=facts)
    return wheel


def test_the_fixture_wheels_sbom_is_valid_cyclonedx_and_says_what_built_it(stamped, facts):
    document = sbom.read_document(stamped)
    validate_cyclonedx(document)
    with open_wheel(stamped) as archive:
        assert SBOM_MEMBER in archive.names() and check_record(archive) == []  # RECORD lists it
    summary = sbom.read_sbom(stamped)
    assert summary.source_kind == "path" and summary.source_location == "tests/fixtures/fixture_ext"
    assert summary.source_revision == sources.local_directory(FIXTURE_EXT).revision
    assert summary.torch == {"version": torch.__version__, "git_version": torch.version.git_version,
                             "cuda": "none", "cxx11_abi": str(torch.compiled_with_cxx11_abi()).lower()}
    assert summary.torch_pin == "torch==2.13.*"
    assert summary.fingerprint == facts["fingerprint"] and len(summary.fingerprint) == 64
    assert "versions" not in json.dumps(document)  # this checkout's commit and state stay out of the wheel
    (compiler,) = [c for c in document["formulation"][0]["components"] if c["bom-ref"] == "toolchain/CXX"]
    assert compiler["description"] == subprocess.run(["c++", "--version"], capture_output=True,
                                                     text=True).stdout.splitlines()[0]
    (shared,) = [c for c in document["components"] if c["type"] == "file"]
    assert shared["name"] == "wheelhouse_fixture/_C.cpython-311-x86_64-linux-gnu.so"
    assert {"name": "wheelhouse:links_torch", "value": "true"} in shared["properties"]


def test_the_sbom_names_no_path_of_the_build_machine_and_no_wall_clock(tmp_path, fixture_wheel, facts):
    """Two stamps of the same bytes in two directories at two times give one output; the timestamp is
    SOURCE_DATE_EPOCH (else the source commit's time), and no absolute path of this machine appears."""
    outputs = []
    for folder in ("a", "b"):
        wheel = tmp_path / folder / fixture_wheel.name
        wheel.parent.mkdir()
        shutil.copyfile(fixture_wheel, wheel)
        stamp_wheel(wheel, torch_version="2.13.0", pin_mode="minor", facts=facts)
        outputs.append(wheel.read_bytes())
    assert outputs[0] == outputs[1]
    text = json.dumps(sbom.read_document(tmp_path / "a" / fixture_wheel.name))
    for path in (str(REPO_ROOT), str(tmp_path), str(Path.home()), os.environ.get("TMPDIR", "/tmp")):
        assert path not in text
    assert "timestamp" not in text  # a directory source has no commit time, and no SOURCE_DATE_EPOCH was set
    with_epoch = fixture_facts({"PATH": "/usr/bin:/bin", "SOURCE_DATE_EPOCH": "1700000000"})
    document = sbom.document("pkg", "1.0", "pkg-1.0-py3-none-any.whl", with_epoch, (), None)
    assert document["metadata"]["timestamp"] == "2023-11-14T22:13:20Z"
    assert document["serialNumber"] == sbom.document("pkg", "1.0", "pkg-1.0-py3-none-any.whl", with_epoch, (),
                                                     None)["serialNumber"]
    validate_cyclonedx(document)


def test_a_git_source_names_its_commit_each_submodule_and_each_patch(tmp_path, monkeypatch):
    """A real git source with a submodule, fetched as builds fetch it: the SBOM has the URL and commit,
    each submodule's path and commit, the commit time as timestamp, and the patch's sha256."""
    sub, top = tmp_path / "sub", tmp_path / "top"
    for repo in (sub, top):
        repo.mkdir()
        _git("init", "-q", cwd=repo)
        (repo / "README").write_text(repo.name)
        _git("add", ".", cwd=repo)
        _git("commit", "-qm", "x", cwd=repo)
    _git("submodule", "add", "-q", sub.as_uri(), "third_party/sub", cwd=top)
    _git("commit", "-qm", "with submodule", cwd=top)
    # git refuses file:// submodules unless told (README, "Building offline or from a mirror")
    config = tmp_path / "gitconfig"  # the git of a build takes no GIT_CONFIG_* from its caller
    config.write_text("[protocol \"file\"]\n\tallow = always\n")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    checkout = sources.fetch_git(top.as_uri(), "HEAD", tmp_path / "cache", submodules=True)
    versions, row = fixture_row()
    row = dataclasses.replace(row, settings=dataclasses.replace(row.settings, patches=("patches/enable_deep_ep_sm80.py",)))
    interpreter = toolchain.verify(sys.executable, row)
    facts = sbom.build_facts(versions, row, checkout, interpreter, {"PATH": "/usr/bin:/bin"})
    document = sbom.document("pkg", "1.0", "pkg-1.0-py3-none-any.whl", facts, (), None)
    validate_cyclonedx(document)
    summary = sbom.summarize(document)
    assert (summary.source_kind, summary.source_location) == ("git", top.as_uri())
    assert summary.source_revision == _git("rev-parse", "HEAD", cwd=top)
    assert summary.submodules == {"third_party/sub": _git("rev-parse", "HEAD", cwd=sub)}
    patch = REPO_ROOT / "patches" / "enable_deep_ep_sm80.py"
    assert summary.patches == {"patches/enable_deep_ep_sm80.py": sha256_file(patch)}
    assert document["metadata"]["timestamp"] == "2023-11-14T22:13:20Z"  # the commit's time


def test_the_arch_list_in_the_sbom_equals_the_fatbin_scans(tmp_path, facts):
    """Per shared object, the cubin and PTX archs the SBOM lists are the fatbin scan's."""
    odd = tmp_path / "odd.so"
    blob = b"\0junk sm_86 more compute_90 junk\0"  # no container: the scan's regex fallback
    with open(odd, "wb") as out:
        write_synthetic_elf(out, [(".nv_fatbin", len(blob), [blob])])
    files = {"pkg/odd.so": odd.read_bytes(), "pkg/__init__.py": b""}
    if NVCC.is_file():
        files["pkg/libkernels.so"] = cuda_shared_object(("80", "90")).read_bytes()
    wheel = build_wheel(tmp_path / "w", files, name="pkg")
    stamp_wheel(wheel, torch_version="2.13.0", pin_mode="minor", facts=facts)
    scan = scan_wheel_archs(wheel, use_cuobjdump=False)
    summary = sbom.read_sbom(wheel)
    assert summary.archs == {m.member: (m.cubins, m.ptx) for m in scan.members}
    assert summary.cubin_archs == scan.cubin_archs and summary.ptx_archs == scan.ptx_archs
    assert summary.archs["pkg/odd.so"] == ((CudaArch(8, 6),), (CudaArch(9, 0),))
    if NVCC.is_file():
        assert summary.archs["pkg/libkernels.so"] == ((CudaArch(8, 0), CudaArch(9, 0)), ())
    validate_cyclonedx(sbom.read_document(wheel))


def test_an_sbom_auditwheel_wrote_stays_beside_ours(tmp_path, facts):
    theirs = b'{"bomFormat": "CycloneDX", "specVersion": "1.4", "version": 1}\n'
    wheel = build_wheel(tmp_path, {"pkg/__init__.py": b"", "pkg-1.0.dist-info/sboms/auditwheel.cdx.json": theirs},
                        name="pkg", tags="py3-none-any")
    stamp_wheel(wheel, torch_version="2.13.0", pin_mode="minor", facts=facts)
    stamp_wheel(wheel, torch_version="2.13.0", pin_mode="minor", facts=facts)  # again: replaced, not doubled
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        assert archive.read("pkg-1.0.dist-info/sboms/auditwheel.cdx.json") == theirs
        record = archive.read("pkg-1.0.dist-info/RECORD").decode()
        ours = archive.getinfo("pkg-1.0.dist-info/sboms/wheelhouse.cdx.json")
    assert names.count(ours.filename) == 1 and ours.external_attr >> 16 == 0o100644  # a document, not executable
    assert f"pkg-1.0.dist-info/sboms/auditwheel.cdx.json,{record_hash(theirs)},{len(theirs)}" in record
    with open_wheel(wheel) as archive:
        assert check_record(archive) == []


def test_a_wheel_without_our_sbom_is_one_line(tmp_path):
    wheel = build_wheel(tmp_path, name="pkg", tags="py3-none-any")
    with pytest.raises(CheckFailed, match=r"^pkg-1\.0-py3-none-any\.whl: has no pkg-1\.0\.dist-info/sboms/"
                                          r"wheelhouse\.cdx\.json; it was not built by this wheelhouse"):
        sbom.read_sbom(wheel)


def test_the_versions_commit_is_marked_outside_a_checkout(tmp_path):
    assert sbom.repository_state(tmp_path) == {"commit": "uncommitted", "dirty": True}


def test_nothing_of_the_checkout_but_the_build_inputs_reaches_the_wheels_bytes(tmp_path, fixture_wheel):
    """A re-release replaced a published wheel with other bytes because an unrelated file had been edited: the
    SBOM's versions_dirty flipped (302932 -> 302933 bytes). The same build stamped from a clean checkout, a dirty one
    and a later commit is one set of bytes; a changed build input (a builder helper) is another."""
    repo = tmp_path / "checkout"
    shutil.copytree(REPO_ROOT / "build_scripts", repo / "build_scripts")
    (repo / "notes.md").write_text("unrelated\n")

    def git(*args: str) -> None:
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo, check=True,
                       capture_output=True)

    git("init", "-q")
    git("add", "-A")
    git("commit", "-q", "-m", "first")
    versions, row = fixture_row()
    checkout = sources.local_directory(FIXTURE_EXT)
    interpreter = toolchain.verify(sys.executable, row)

    def stamped(state: str) -> bytes:
        facts = sbom.build_facts(versions, row, checkout, interpreter, {"PATH": "/usr/bin:/bin"}, repo_root=repo)
        wheel = tmp_path / state / fixture_wheel.name
        wheel.parent.mkdir()
        shutil.copyfile(fixture_wheel, wheel)
        stamp_wheel(wheel, torch_version="2.13.0", pin_mode="minor", facts=facts)
        return wheel.read_bytes()

    clean = stamped("clean")
    (repo / "notes.md").write_text("edited, not committed\n")
    dirty = stamped("dirty")
    git("commit", "-q", "-am", "second")
    later = stamped("later-commit")
    assert dirty == clean and later == clean
    (repo / "build_scripts" / "lib" / "env.sh").write_text((repo / "build_scripts" / "lib" / "env.sh").read_text() + "\n")
    assert stamped("build-input-changed") != clean  # what is a build input still reaches it, by the fingerprint
