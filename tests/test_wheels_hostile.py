"""Crafted wheels cannot stall or exhaust the checks: each runs under a timeout and a memory limit.

The budgets are limits, not measurements (benchmarks/hostile.py measures): the old fatbin scan spent
155 s on the 2 KB flood wheel and the old symbol reader 698 MB on the 64 MiB .dynsym.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_factory import host_shared_object

from tests import hostile_wheels

REPO = Path(__file__).resolve().parent.parent
TIME_BUDGET_S = 60
MEMORY_LIMIT = 1 << 30  # address space of the whole check process, interpreter included


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


@pytest.fixture(scope="module")
def stand_in_torch(tmp_path_factory) -> Path:
    """A torch directory whose one library is a small real ELF: the torch side costs nothing here."""
    torch = tmp_path_factory.mktemp("torch") / "torch"
    (torch / "lib").mkdir(parents=True)
    (torch / "__init__.py").write_text("")
    (torch / "lib" / "libc10.so").write_bytes(host_shared_object().read_bytes())
    return torch


def check_wheel(wheel: Path, *args: str) -> subprocess.CompletedProcess:
    """invoke check-wheel, killed past the time budget (a TimeoutExpired fails the test)."""
    return subprocess.run([sys.executable, "-m", "invoke", "check-wheel", str(wheel), *args], cwd=REPO,
                          capture_output=True, text=True, timeout=TIME_BUDGET_S, preexec_fn=_limit_memory)


@pytest.mark.parametrize("mib", [1, 4])
def test_fatbin_flood_is_scanned_in_linear_time(tmp_path, mib):
    result = check_wheel(hostile_wheels.fatbin_flood(tmp_path, mib))
    assert "Traceback" not in result.stderr
    assert result.returncode == 0, result.stdout + result.stderr  # no container, no sm_ string: no device code
    assert "CUDA cubins: none; PTX: none" in result.stdout


def test_back_to_back_empty_containers_are_scanned_in_linear_time(tmp_path):
    result = check_wheel(hostile_wheels.fatbin_empty_containers(tmp_path, 4))
    assert "Traceback" not in result.stderr
    assert result.returncode == 0, result.stdout + result.stderr


def test_dynsym_bomb_is_refused_in_one_line(tmp_path, stand_in_torch):
    result = check_wheel(hostile_wheels.dynsym_bomb(tmp_path, 64), "--torch", str(stand_in_torch))
    assert "Traceback" not in result.stderr and result.returncode == 1
    problems = [line for line in result.stdout.splitlines() if line.startswith("  - ")]
    assert problems == [f"  - demo_pkg-1.0-cp311-cp311-linux_x86_64.whl: {hostile_wheels.SO}: .dynsym holds 2796202 "
                        "symbols, more than any real library (1048576 at most); refusing it"]


def test_dynsym_under_the_cap_is_read_in_bounded_memory(tmp_path, stand_in_torch):
    # 699,050 undefined references to one c10 function: one needed symbol, reported missing
    result = check_wheel(hostile_wheels.dynsym_bomb(tmp_path, 16), "--torch", str(stand_in_torch))
    assert "Traceback" not in result.stderr and result.returncode == 1
    assert "1 torch symbol reference(s), 1 missing" in result.stdout
    assert "does not export: c10::Test()" in result.stdout


def test_overlapping_symbol_names_are_refused(tmp_path, stand_in_torch):
    result = check_wheel(hostile_wheels.overlapping_names(tmp_path), "--torch", str(stand_in_torch))
    assert "Traceback" not in result.stderr and result.returncode == 1
    assert "the names of one string table add up to more than 67108864 bytes, more than any real library's; " \
           "refusing it" in result.stdout


def test_section_offset_beyond_any_file_is_one_line(tmp_path):
    result = check_wheel(hostile_wheels.huge_section_offset(tmp_path))
    assert "Traceback" not in result.stderr and result.returncode == 1
    assert f"{hostile_wheels.SO}: truncated ELF file (wanted 64 bytes at offset 4611686018427387904)" in result.stdout
