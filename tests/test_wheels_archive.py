"""Safe wheel reading: every rejection is one CheckFailed line naming the wheel and the member."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from wheel_factory import build_wheel, raw_zip

from ci.errors import CheckFailed
from ci.wheels.archive import open_wheel, parse_filename

WHEEL = "demo_pkg-1.0-cp311-cp311-linux_x86_64.whl"


def _reject(path: Path) -> str:
    with pytest.raises(CheckFailed) as info:
        open_wheel(path)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_rejects_parent_directory_member(tmp_path: Path) -> None:
    wheel = raw_zip(tmp_path / WHEEL, [("demo_pkg/../../evil.py", b"x")])
    assert _reject(wheel) == (
        f"{WHEEL}: member 'demo_pkg/../../evil.py' contains a '..' path component; "
        "rebuild the wheel with relative member paths"
    )


def test_rejects_absolute_member(tmp_path: Path) -> None:
    info = zipfile.ZipInfo("placeholder")
    info.filename = "/etc/evil.conf"  # zipfile strips a leading '/' from constructor names
    wheel = raw_zip(tmp_path / WHEEL, [(info, b"x")])
    assert _reject(wheel) == (
        f"{WHEEL}: member '/etc/evil.conf' has an absolute path; rebuild the wheel with relative member paths"
    )


def test_rejects_drive_relative_member(tmp_path: Path) -> None:
    # On Windows os.path.join(site_packages, "C:evil.pth") is "C:evil.pth": the member leaves the target.
    wheel = raw_zip(tmp_path / WHEEL, [("C:evil.pth", b"import os")])
    assert _reject(wheel) == (
        f"{WHEEL}: member 'C:evil.pth' has an absolute path; rebuild the wheel with relative member paths"
    )


def test_rejects_symlink_member(tmp_path: Path) -> None:
    info = zipfile.ZipInfo("demo_pkg/link")
    info.external_attr = 0o120777 << 16
    wheel = raw_zip(tmp_path / WHEEL, [(info, b"/etc/passwd")])
    assert _reject(wheel) == f"{WHEEL}: member 'demo_pkg/link' is a symbolic link; wheels must hold regular files only"


def test_rejects_duplicate_member(tmp_path: Path) -> None:
    wheel = raw_zip(tmp_path / WHEEL, [("demo_pkg/a.py", b"1"), ("demo_pkg/a.py", b"2")])
    assert _reject(wheel) == f"{WHEEL}: member 'demo_pkg/a.py' occurs more than once; rebuild the wheel"


def test_rejects_corrupt_zip(tmp_path: Path) -> None:
    wheel = tmp_path / WHEEL
    wheel.write_bytes(b"PK\x03\x04 this is not really a zip archive" * 10)
    assert _reject(wheel) == (
        f"{WHEEL}: not a readable zip archive (File is not a zip file); rebuild or re-download the wheel"
    )


def test_rejects_corrupt_member_data(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, {"demo_pkg/data.bin": b"A" * 5000}, compression=zipfile.ZIP_STORED)
    data = bytearray(wheel.read_bytes())
    pos = data.find(b"A" * 100)
    data[pos : pos + 10] = b"B" * 10  # CRC no longer matches
    wheel.write_bytes(bytes(data))
    with open_wheel(wheel) as archive, pytest.raises(CheckFailed) as info:
        b"".join(archive.iter_chunks("demo_pkg/data.bin"))
    assert str(info.value).startswith(f"{WHEEL}: member 'demo_pkg/data.bin' is corrupt (Bad CRC-32")


def test_rejects_bad_filename(tmp_path: Path) -> None:
    path = tmp_path / "not-a-wheel.zip"
    path.write_bytes(b"")
    with pytest.raises(CheckFailed, match=r"^not-a-wheel.zip: not a valid wheel filename"):
        open_wheel(path)


def test_reads_valid_wheel_in_chunks(tmp_path: Path) -> None:
    payload = bytes(range(256)) * 10_000
    wheel = build_wheel(tmp_path, {"demo_pkg/__init__.py": b"", "demo_pkg/blob.bin": payload}, version="1.0+abc")
    with open_wheel(wheel) as archive:
        assert archive.dist_info == "demo_pkg-1.0+abc.dist-info"
        chunks = list(archive.iter_chunks("demo_pkg/blob.bin", chunk=65536))
        assert max(len(c) for c in chunks) <= 65536
        assert b"".join(chunks) == payload
        copy = archive.copy_to("demo_pkg/blob.bin", tmp_path)
        assert copy.parent == tmp_path and copy.read_bytes() == payload
    name = parse_filename(wheel)
    assert (name.name, name.version, name.distribution) == ("demo-pkg", "1.0+abc", "demo_pkg")
    assert {str(t) for t in name.tags} == {"cp311-cp311-linux_x86_64"}


def test_rejects_local_header_naming_another_file(tmp_path: Path) -> None:
    from tests.hostile_wheels import header_mismatch

    wheel = header_mismatch(tmp_path)
    assert _reject(wheel) == (
        f"{wheel.name}: member 'demo_pkg/zzzzzzzzzzzzzzzzzzzzzzzzzzz.py' of the central directory has the local "
        "header name '../../../../../../../tmp/escaped.pyxxxx'; rebuild the wheel"
    )


def test_rejects_name_with_a_nul_byte(tmp_path: Path) -> None:
    info = zipfile.ZipInfo("placeholder")
    wheel = raw_zip(tmp_path / WHEEL, [(info, b"x")])
    data = wheel.read_bytes().replace(b"placeholder", b"place\0older")  # local header and central directory alike
    wheel.write_bytes(data)
    assert "has a NUL byte in its name" in _reject(wheel)
