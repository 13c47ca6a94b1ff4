"""Python coverage: tags, SOABI suffixes and required Pythons agree."""

from __future__ import annotations

from pathlib import Path

import pytest
from wheel_factory import build_wheel

from ci.base.errors import ConfigError
from ci.checks.coverage import check_coverage, parse_pythons
from ci.formats.archive import open_wheel

SO = b"\x7fELF not really"
TWO = "cp311.cp312-cp311.cp312-linux_x86_64"


def _coverage(wheel: Path, pythons: str | None = None):
    with open_wheel(wheel) as archive:
        return check_coverage(archive, pythons)


def test_complete_two_python_wheel_passes(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": b"",
        "pkg/_C.cpython-311-x86_64-linux-gnu.so": SO,
        "pkg/_C.cpython-312-x86_64-linux-gnu.so": SO,
        "pkg/ops/_kernels.cpython-311-x86_64-linux-gnu.so": SO,
        "pkg/ops/_kernels.cpython-312-x86_64-linux-gnu.so": SO,
        "pkg/libhelper.so.1": SO,  # a library, not a module
    }
    result = _coverage(build_wheel(tmp_path, files, name="pkg", tags=TWO))
    assert result.ok, result.problems
    assert result.claimed_pythons == ("3.11", "3.12")
    assert result.stems == ("pkg/_C", "pkg/ops/_kernels")


def test_two_python_wheel_missing_one_module_names_that_python(tmp_path: Path) -> None:
    files = {
        "pkg/_C.cpython-311-x86_64-linux-gnu.so": SO,
        "pkg/_C.cpython-312-x86_64-linux-gnu.so": SO,
        "pkg/_ext.cpython-311-x86_64-linux-gnu.so": SO,
    }
    wheel = build_wheel(tmp_path, files, name="pkg", tags=TWO)
    result = _coverage(wheel)
    assert result.problems == (
        f"{wheel.name}: module pkg/_ext has no build for Python 3.12 "
        "(expected pkg/_ext.cpython-312-x86_64-linux-gnu.so)",
    )


def test_module_for_unclaimed_python_is_flagged(tmp_path: Path) -> None:
    files = {"pkg/_C.cpython-311-x86_64-linux-gnu.so": SO, "pkg/_C.cpython-312-x86_64-linux-gnu.so": SO}
    wheel = build_wheel(tmp_path, files, name="pkg", tags="cp311-cp311-linux_x86_64")
    assert _coverage(wheel).problems == (
        f"{wheel.name}: pkg/_C.cpython-312-x86_64-linux-gnu.so is built for Python 3.12 but the wheel tags "
        "claim 3.11; fix the tags or drop the module",
    )


def test_required_pythons(tmp_path: Path, fixture_wheel: Path) -> None:
    assert _coverage(fixture_wheel).ok
    assert _coverage(fixture_wheel, "3.11").ok
    problems = _coverage(fixture_wheel, "3.10,3.11").problems
    assert problems == (
        f"{fixture_wheel.name}: tags (cp311) do not claim Python 3.10, which is required; build for it",
        f"{fixture_wheel.name}: module wheelhouse_fixture/_C has no build for Python 3.10 "
        "(expected wheelhouse_fixture/_C.cpython-310-x86_64-linux-gnu.so)",
    )


def test_platform_mismatch_and_abi3(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path / "a", {"pkg/_C.cpython-311-aarch64-linux-gnu.so": SO}, name="pkg")
    (problem,) = _coverage(wheel).problems
    assert "is built for aarch64-linux-gnu but the platform tag names x86_64" in problem
    abi3 = build_wheel(tmp_path / "b", {"pkg/_C.abi3.so": SO}, name="pkg", tags="cp310-abi3-linux_x86_64")
    assert _coverage(abi3, "3.10").ok


def test_parse_pythons() -> None:
    assert parse_pythons("3.11, 3.10;cp312") == ("3.10", "3.11", "3.12")
    assert parse_pythons(["313"]) == ("3.13",)
    with pytest.raises(ConfigError, match="'three' is not a Python version"):
        parse_pythons("three")


def test_a_pure_python_wheel_serves_every_python_its_requires_python_admits(tmp_path: Path) -> None:
    """Megatron-Bridge: py3-none-any, no ELF at all, Requires-Python >=3.12,<3.13, built for the 3.12 rows."""
    pure = build_wheel(tmp_path / "a", {"megatron/bridge/__init__.py": b""}, name="megatron_bridge", version="0.5.2",
                       tags="py3-none-any", requires_python=">=3.12,<3.13")
    with open_wheel(pure) as archive:
        result = check_coverage(archive, "3.12", ">=3.12,<3.13")
        assert result.ok and result.claimed_pythons == ("3.12",)
        assert check_coverage(archive, "3.11,3.12", ">=3.12,<3.13").problems == (
            f"{pure.name}: its Requires-Python '>=3.12,<3.13' excludes Python 3.11, which this row builds for; "
            "fix python_versions in versions.yaml or the project's requires-python",
        )
    py310 = build_wheel(tmp_path / "b", {"pkg/__init__.py": b""}, name="pkg", tags="py310-none-any")
    assert _coverage(py310, "3.12").ok  # pip on 3.12 takes py310
    assert _coverage(py310, "3.9").problems[0].endswith("do not claim Python 3.9, which is required; build for it")
    abi3 = build_wheel(tmp_path / "c", {"pkg/_C.abi3.so": SO}, name="pkg", tags="cp39-abi3-linux_x86_64")
    assert _coverage(abi3, "3.12").ok  # cp39-abi3 serves 3.9 and later
