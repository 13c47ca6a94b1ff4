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
from wheel_factory import build_wheel, host_shared_object

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
    return subprocess.run([sys.executable, "-m", "invoke", "check-wheel", "--wheel", str(wheel), *args], cwd=REPO,
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


def test_many_fatbin_floods_are_refused_by_their_ratio(tmp_path):
    """The report's N16 at 1/16 of its size: 8 members of 16 MiB of magics, 128 MiB from a 130 KB wheel.

    Every check is linear in the bytes it reads; the ratio cap bounds those bytes by the wheel's size.
    """
    wheel = hostile_wheels.fatbin_flood_members(tmp_path, 16, 8)
    result = check_wheel(wheel)
    assert "Traceback" not in result.stderr and result.returncode == 1
    problems = [line for line in result.stdout.splitlines() if line.startswith("  - ")]
    size = wheel.stat().st_size
    total = 8 * len(hostile_wheels.elf([(".nv_fatbin", hostile_wheels.SHT_PROGBITS, b"\0" * (16 << 20), 0, 0)]))
    total += sum(len(data) for data in _small_members(wheel))
    assert problems == [f"  - {wheel.name}: its members add up to {total} bytes uncompressed from {size} bytes "
                        f"({total // size}:1), more than any real wheel (100:1 at most; a decompression bomb); "
                        "refusing it"]


def _small_members(wheel: Path) -> list[bytes]:
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        return [zf.read(info) for info in zf.infolist() if not info.filename.endswith(".so")]


def test_symbol_tables_under_the_cap_do_not_multiply_per_member(tmp_path, stand_in_torch):
    """The report's N17: 4 members of 100,000 distinct missing c10 symbols each. Compared as they are read
    (memory does not grow with the members), and reported as the first few names and a count, not megabytes."""
    result = check_wheel(hostile_wheels.distinct_torch_symbols(tmp_path, 4, 100_000), "--torch", str(stand_in_torch))
    assert "Traceback" not in result.stderr and result.returncode == 1
    assert "400000 torch symbol reference(s), 400000 missing" in result.stdout
    problems = [line for line in result.stdout.splitlines() if line.startswith("  - ")]
    assert len(problems) == 4
    for k, line in enumerate(problems):
        member = hostile_wheels.SO.replace("_C", f"_C{k}")
        assert line == (f"  - demo_pkg-1.0-cp311-cp311-linux_x86_64.whl: {member} needs 100000 symbol(s) that torch "
                        f"(torch at {stand_in_torch}) does not export: c10::X00000000(); c10::X00000001(); "
                        "c10::X00000002(); c10::X00000003(); c10::X00000004() (and 99995 more); "
                        "rebuild against that torch")


def test_fatbin_headers_beyond_the_wheels_budget_are_refused_once(tmp_path):
    """Valid container and entry headers each cost a step: one wheel may read a bounded number of them,
    and the refusal is said once, not once per member after it."""
    from ci.base.errors import CheckFailed
    from ci.formats.archive import open_wheel
    from ci.formats.elf import ElfFile
    from ci.formats.fatbin import MAX_FATBIN_HEADERS, HeaderBudget, scan_elf

    assert HeaderBudget().limit == MAX_FATBIN_HEADERS == 1 << 20
    container = hostile_wheels.fatbin_container(90, entries=3)  # 4 headers
    so = hostile_wheels.elf([(".nv_fatbin", hostile_wheels.SHT_PROGBITS, container * 10, 0, 0)])
    wheel = build_wheel(tmp_path, {f"demo_pkg/_C{k}.so": so for k in range(3)})
    budget = HeaderBudget(limit=60)
    results: list[object] = []
    with open_wheel(wheel) as archive:
        for member, stream in archive.shared_objects():
            try:
                results.append(scan_elf(member.name, ElfFile(stream, member.name), None, budget))
            except CheckFailed as exc:
                results.append(str(exc))
    first, second, third = results
    assert [str(arch) for arch in first.cubins] == ["9.0"]  # type: ignore[attr-defined]
    assert second == ("demo_pkg/_C1.so: the wheel's fat binaries hold more than 60 container and kernel headers, "
                      "more than any real wheel; refusing it")
    assert third is None
