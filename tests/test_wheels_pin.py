"""The torch pin: decided by ELF, written into METADATA by the raw-copy writer, set in versions.yaml."""

from __future__ import annotations

import json
import shutil
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from stamp_helpers import FIXTURE_VERSIONS, fixture_facts, linked_shared_object
from wheel_factory import build_wheel, host_shared_object

from ci.base.errors import CheckFailed, ConfigError
from ci.building.stamp import stamp_wheel
from ci.checks import pin
from ci.checks.check import check_wheels
from ci.formats.archive import open_wheel
from ci.formats.metadata import extract_metadata
from ci.formats.record import check_record
from ci.model import fingerprint, matrix
from ci.model.versions import SCHEMA_PATH, load

UPSTREAM = (
    b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\nRequires-Dist: numpy\n"
    b"Requires-Dist: torch>=2.0; platform_system != \"Darwin\"\nRequires-Dist: einops\n"
    b"Requires-Dist: torch[opt]; extra == \"test\"\nProvides-Extra: test\n\nRequires-Dist: torch (the description)\n"
)


@pytest.fixture(scope="module")
def facts() -> dict:
    return fixture_facts()


def _metadata(wheel: Path) -> bytes:
    with open_wheel(wheel) as archive:
        return archive.read_small(f"{archive.dist_info}/METADATA")


# --- the METADATA rewrite --------------------------------------------------------------------------


def test_upstream_torch_requirements_give_way_to_one_pin():
    pinned = pin.pinned_metadata(UPSTREAM, "==2.13.*", "pkg.whl")
    assert pinned == (
        b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0\nRequires-Dist: numpy\n"
        b"Requires-Dist: torch==2.13.*\nRequires-Dist: einops\n"
        b"Requires-Dist: torch[opt]==2.13.*; extra == \"test\"\nProvides-Extra: test\n\n"
        b"Requires-Dist: torch (the description)\n"  # the body is not a header
    )
    assert pin.pinned_metadata(pinned, "==2.13.*", "pkg.whl") == pinned  # the same bytes again
    assert pin.torch_pin_of(pinned) == "==2.13.*"
    assert pin.torch_pin_of(UPSTREAM) is None  # a requirement with a marker pins nothing


def test_a_wheel_without_a_torch_requirement_gets_one_after_its_requirements():
    crlf = b"Metadata-Version: 2.1\r\nName: pkg\r\nVersion: 1.0\r\nRequires-Dist: numpy\r\nSummary: x\r\n\r\nbody"
    assert pin.pinned_metadata(crlf, "==2.13.0", "pkg.whl") == (
        b"Metadata-Version: 2.1\r\nName: pkg\r\nVersion: 1.0\r\nRequires-Dist: numpy\r\n"
        b"Requires-Dist: torch==2.13.0\r\nSummary: x\r\n\r\nbody")
    bare = b"Metadata-Version: 2.1\nName: pkg\nVersion: 1.0"
    assert pin.pinned_metadata(bare, "==2.13.*", "pkg.whl") == bare + b"\nRequires-Dist: torch==2.13.*\n"


def test_a_malformed_torch_requirement_is_one_line():
    with pytest.raises(CheckFailed, match=r"^pkg\.whl: METADATA Requires-Dist 'torch >=>= 2' is not a valid "
                                          r"requirement \(.*\); rebuild the wheel$"):
        pin.pinned_metadata(b"Name: pkg\nRequires-Dist: torch >=>= 2\n", "==2.13.*", "pkg.whl")


def test_the_pin_modes_and_the_local_labels_that_satisfy_them():
    assert pin.torch_specifier("2.13.0", "minor") == "==2.13.*"
    assert pin.torch_specifier("2.13.0", "exact") == "==2.13.0"
    assert pin.torch_specifier("2.13.0", "none") is None
    minor, exact = SpecifierSet("==2.13.*"), SpecifierSet("==2.13.0")
    assert all(version in minor for version in ("2.13.0", "2.13.0+cu130", "2.13.1+cpu"))
    assert "2.13.0+cu130" in exact and "2.13.1" not in exact
    assert "2.14.0" not in minor and "2.12.1+cu130" not in minor
    schema = json.loads(SCHEMA_PATH.read_text())["$defs"]["settings"]["properties"]["torch_pin"]
    assert tuple(schema["enum"]) == pin.PIN_MODES and schema["default"] == "minor"


# --- the ELF decision and the rewrite of real wheels -----------------------------------------------


def test_a_wheel_whose_extension_links_torch_is_pinned_with_record_valid(tmp_path, fixture_wheel, facts):
    """The fixture's _C needs libc10/libtorch_cpu/libtorch_python: pinned, RECORD valid, checks pass,
    every member but METADATA and RECORD copied byte for byte, and the .metadata sidecar says the same."""
    wheel = tmp_path / fixture_wheel.name
    shutil.copyfile(fixture_wheel, wheel)
    result = stamp_wheel(wheel, torch_version="2.13.0", pin_mode="minor", facts=facts)
    assert result.links_torch and result.torch_pin == "==2.13.*"
    assert pin.read_torch_pin(wheel) == "==2.13.*"
    assert b"\nRequires-Dist: torch==2.13.*\n" in _metadata(wheel)
    with open_wheel(wheel) as archive:
        assert check_record(archive) == []
    with zipfile.ZipFile(fixture_wheel) as before, zipfile.ZipFile(wheel) as after:
        old = {i.filename: (i.CRC, i.compress_size, i.date_time) for i in before.infolist()}
        new = {i.filename: (i.CRC, i.compress_size, i.date_time) for i in after.infolist()}
    changed = {name for name in old if old[name] != new[name]}
    assert changed == {"wheelhouse_fixture-0.1.0.dist-info/METADATA", "wheelhouse_fixture-0.1.0.dist-info/RECORD"}
    report = check_wheels([wheel], torch_target=sys.executable, pythons=["3.11"])
    assert report.ok, report.problems
    sidecar = extract_metadata(wheel, tmp_path / "index")
    assert sidecar.path.read_bytes() == _metadata(wheel) and pin.torch_pin_of(sidecar.path.read_bytes()) == "==2.13.*"


def test_the_pin_follows_the_elf_not_the_name(tmp_path, facts):
    """A shared object that NEEDs libtorch* is pinned whatever it is called; a host .so that only
    references a c10 symbol without linking torch, and a pure-Python wheel, keep upstream's torch line."""
    upstream = ["numpy", "torch>=2.0"]
    links = linked_shared_object(tmp_path / "so", "libtorch_cpu.so")
    assert pin.torch_libraries_needed(links) == ("libtorch_cpu.so",)
    assert pin.torch_libraries_needed(host_shared_object()) == ()
    linked = build_wheel(tmp_path / "a", {"pkg/kernels.so": links.read_bytes()}, name="pkg", requires=upstream)
    unlinked = build_wheel(tmp_path / "b", {"pkg/_C.so": host_shared_object().read_bytes()}, name="pkg",
                           requires=upstream)
    pure = build_wheel(tmp_path / "c", name="pkg", tags="py3-none-any", requires=upstream)
    for wheel in (unlinked, pure):
        before = _metadata(wheel)
        result = stamp_wheel(wheel, torch_version="2.13.0", pin_mode="minor", facts=facts)
        assert (result.links_torch, result.torch_pin) == (False, None)
        assert _metadata(wheel) == before and b"Requires-Dist: torch>=2.0\n" in before
    result = stamp_wheel(linked, torch_version="2.13.0", pin_mode="exact", facts=facts)
    assert (result.links_torch, result.torch_pin) == (True, "==2.13.0")
    assert _metadata(linked).endswith(b"Requires-Dist: numpy\nRequires-Dist: torch==2.13.0\n")
    with open_wheel(linked) as archive:
        assert check_record(archive) == []


def test_torch_pin_none_keeps_upstreams_requirements(tmp_path, facts):
    links = linked_shared_object(tmp_path / "so", "libc10.so")
    wheel = build_wheel(tmp_path, {"pkg/kernels.so": links.read_bytes()}, name="pkg", requires=["torch"])
    before = _metadata(wheel)
    result = stamp_wheel(wheel, torch_version="2.13.0", pin_mode="none", facts=facts)
    assert (result.links_torch, result.torch_pin) == (True, None)
    assert _metadata(wheel) == before


# --- the setting ----------------------------------------------------------------------------------


def _versions_with(tmp_path: Path, lines: str) -> Path:
    path = tmp_path / "versions.yaml"
    path.write_text(FIXTURE_VERSIONS.read_text().replace("    max_jobs: 2\n", "    max_jobs: 2\n" + lines))
    return path


def test_torch_pin_is_set_per_component_and_per_arch_and_is_a_build_input(tmp_path):
    (row,) = matrix.expand(load(FIXTURE_VERSIONS))
    assert row.settings.torch_pin == "minor"  # the schema's default
    (exact,) = matrix.expand(load(_versions_with(tmp_path, "    torch_pin: exact\n")))
    assert exact.settings.torch_pin == "exact"
    (override,) = matrix.expand(load(_versions_with(
        tmp_path, "    torch_pin: exact\n    arch_overrides:\n      x86_64: {torch_pin: none}\n")))
    assert override.settings.torch_pin == "none"
    fingerprints = {fingerprint.fingerprint(fingerprint.build_config(r, "abc")) for r in (row, exact, override)}
    assert len(fingerprints) == 3  # METADATA says it, so another pin is another wheel


def test_a_misspelt_torch_pin_is_one_line(tmp_path):
    with pytest.raises(ConfigError) as error:
        load(_versions_with(tmp_path, "    torch_pin: minr\n"))
    assert str(error.value) == ("versions.yaml: components.wheelhouse-fixture.torch_pin: string 'minr' is not allowed "
                                "(did you mean 'minor'?); use one of: minor, exact, none")
