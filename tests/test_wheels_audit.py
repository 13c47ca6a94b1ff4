"""auditwheel show/repair on the fixture wheel (torch libraries excluded)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from wheel_factory import build_wheel

from ci.base.errors import CheckFailed
from ci.checks.audit import audit_repair, audit_show


def test_show_fixture(fixture_wheel: Path) -> None:
    result = audit_show(fixture_wheel)
    assert result.classified
    assert result.consistent_tag == "linux_x86_64"  # libc10.so etc. are not in any manylinux policy
    assert result.best_tag is not None and result.best_tag.startswith("manylinux_2_")
    assert "\n" not in result.summary


def test_show_unclassifiable_is_reported(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, {"pkg/__init__.py": b""}, name="pkg", tags="py3-none-any")
    result = audit_show(wheel)
    assert not result.classified
    assert result.summary.startswith("auditwheel could not classify the wheel:")


def test_repair_fixture_excluding_torch(tmp_path: Path, fixture_wheel: Path) -> None:
    best = audit_show(fixture_wheel).best_tag
    repaired = audit_repair(fixture_wheel, tmp_path, plat=best)
    assert repaired.name == f"wheelhouse_fixture-0.1.0-cp311-cp311-{best}.whl"
    with zipfile.ZipFile(repaired) as zf:
        names = zf.namelist()
    assert not [n for n in names if ".libs/" in n], names  # nothing grafted: torch libs excluded
    with pytest.raises(CheckFailed, match="auditwheel repair to manylinux_2_5_x86_64 failed"):
        audit_repair(fixture_wheel, tmp_path / "old", plat="manylinux_2_5_x86_64")


@pytest.mark.parametrize("case", ["traversal", "symlink"])
def test_repair_refuses_an_archive_check_wheel_refuses(tmp_path: Path, case: str) -> None:
    """auditwheel would re-root a '../' member and turn a symlink into a file: the output would look safe."""
    from wheel_factory import host_shared_object

    so = {"demo_pkg/_C.cpython-311-x86_64-linux-gnu.so": host_shared_object().read_bytes()}
    wheel = build_wheel(tmp_path, {"demo_pkg/__init__.py": b"", **so})
    with zipfile.ZipFile(wheel) as zf:
        members = [(info, zf.read(info.filename)) for info in zf.infolist()]
    extra = zipfile.ZipInfo("../../../../tmp/escaped/escaped.txt" if case == "traversal" else "demo_pkg/link")
    if case == "symlink":
        extra.external_attr = 0o120777 << 16
    with zipfile.ZipFile(wheel, "w") as zf:
        for info, data in [*members, (extra, b"/etc/passwd")]:
            zf.writestr(info, data)
    reason = "contains a '..' path component" if case == "traversal" else "is a symbolic link"
    with pytest.raises(CheckFailed, match=reason):
        audit_repair(wheel, tmp_path / "out", plat="manylinux_2_28_x86_64")
    assert not (tmp_path / "out").exists()  # refused before auditwheel ran


def test_repair_failure_gives_auditwheels_reason(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, {"demo_pkg/__init__.py": b""})
    with pytest.raises(CheckFailed) as info:
        audit_repair(wheel, tmp_path / "out", plat="manylinux_2_28_x86_64")
    assert str(info.value) == (f"{wheel.name}: auditwheel repair to manylinux_2_28_x86_64 failed: This does not look "
                               "like a platform wheel, no ELF executable or shared library file (including compiled "
                               "Python C extension) found in the wheel archive")


def test_repair_of_a_missing_file_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(CheckFailed, match="no such file"):
        audit_repair(tmp_path / "demo_pkg-1.0-cp311-cp311-linux_x86_64.whl", tmp_path, plat="banana")


@pytest.mark.parametrize("case", ["no-record", "record-mismatch"])
def test_repair_refuses_a_wheel_whose_record_check_wheel_refuses(tmp_path: Path, case: str) -> None:
    """auditwheel reads RECORD to repack: without one it ended in its own FileNotFoundError traceback."""
    from wheel_factory import host_shared_object

    so = {"demo_pkg/_C.cpython-311-x86_64-linux-gnu.so": host_shared_object().read_bytes()}
    wheel = build_wheel(tmp_path, {"demo_pkg/__init__.py": b"", **so})
    with zipfile.ZipFile(wheel) as zf:
        members = [(info, zf.read(info.filename)) for info in zf.infolist()]
    with zipfile.ZipFile(wheel, "w") as zf:
        for info, data in members:
            if info.filename.endswith("/RECORD") and case == "no-record":
                continue
            zf.writestr(info, b"# changed\n" if info.filename.endswith("__init__.py") else data)
    with pytest.raises(CheckFailed) as info:
        audit_repair(wheel, tmp_path / "out", plat="manylinux_2_28_x86_64")
    if case == "no-record":
        assert str(info.value) == (f"{wheel.name}: has no demo_pkg-1.0.dist-info/RECORD; pip refuses a wheel without "
                                   "RECORD; rebuild the wheel (refusing to repair it)")
    else:
        assert str(info.value).startswith(f"{wheel.name}: member 'demo_pkg/__init__.py' does not match its RECORD hash")
    assert not (tmp_path / "out").exists()  # refused before auditwheel ran
