"""auditwheel show/repair on the fixture wheel (torch libraries excluded)."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from wheel_factory import build_wheel

from ci.errors import CheckFailed
from ci.wheels.audit import audit_repair, audit_show


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
