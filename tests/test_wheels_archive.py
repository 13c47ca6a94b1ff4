"""Safe wheel reading: every rejection is one CheckFailed line naming the wheel and the member."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest
from wheel_factory import build_wheel, raw_zip

from ci.base.errors import CheckFailed
from ci.formats.archive import open_wheel, parse_filename

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
        with archive.open_in_place("demo_pkg/blob.bin") as stream:
            assert stream.read() == payload
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


# --- bounded work: what a wheel's declared sizes allow is judged before any member is read --------------


def _declare_size(wheel: Path, member: str, size: int) -> None:
    """Rewrite the uncompressed size the central directory declares for ``member`` (a 32-bit field)."""
    data = bytearray(wheel.read_bytes())
    entry = data.rfind(b"PK\x01\x02", 0, data.rfind(member.encode()))
    data[entry + 24 : entry + 28] = size.to_bytes(4, "little")
    wheel.write_bytes(bytes(data))


def test_declared_sizes_beyond_the_cap_are_refused_before_reading(tmp_path: Path) -> None:
    from ci.formats.archive import MAX_UNCOMPRESSED

    files = {f"demo_pkg/part{k}.bin": b"x" for k in range(5)}
    wheel = build_wheel(tmp_path, files)
    for name in files:
        _declare_size(wheel, name, 0xFFFFFFF0)  # 4 GiB each, 20 GiB in all: reading would end in a CRC error
    total = 5 * 0xFFFFFFF0 + sum(info.file_size for info in zipfile.ZipFile(wheel).infolist()
                                 if not info.filename.endswith(".bin"))
    assert MAX_UNCOMPRESSED == 16 << 30
    assert _reject(wheel) == (f"{WHEEL}: its members add up to {total} bytes uncompressed, more than any real wheel "
                              f"({16 << 30} at most); refusing it")


def test_ratio_beyond_a_real_wheels_is_refused_and_small_wheels_of_zeros_pass(tmp_path: Path) -> None:
    bomb = build_wheel(tmp_path / "bomb", {"demo_pkg/zeros.bin": bytes(65 << 20)})
    size = bomb.stat().st_size
    total = sum(info.file_size for info in zipfile.ZipFile(bomb).infolist())
    assert _reject(bomb) == (f"{WHEEL}: its members add up to {total} bytes uncompressed from {size} bytes "
                             f"({total // size}:1), more than any real wheel (100:1 at most; a decompression bomb); "
                             "refusing it")
    with open_wheel(build_wheel(tmp_path / "small", {"demo_pkg/zeros.bin": bytes(8 << 20)})):
        pass  # 8 MiB at 1000:1 costs little to check: below the floor the ratio is not judged


def test_rejects_encrypted_member(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, {"demo_pkg/__init__.py": b"secret"}, compression=zipfile.ZIP_STORED)
    data = bytearray(wheel.read_bytes())
    for signature, flags_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):  # local header, central directory
        at = data.find(signature)
        data[at + flags_at] |= 1
    wheel.write_bytes(bytes(data))
    assert _reject(wheel) == (f"{WHEEL}: member 'demo_pkg/__init__.py' is encrypted, which no installer can read; "
                              "rebuild the wheel")


# --- reading in place ----------------------------------------------------------------------------------


@pytest.mark.parametrize("compression", [zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2])
def test_open_in_place_reads_what_the_member_holds_at_any_offset(tmp_path: Path, compression: int,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import random

    from ci.formats.archive import MemberReader

    monkeypatch.setattr(MemberReader, "CHECKPOINT_EVERY", 1 << 16)  # many checkpoints in a small member
    rng = random.Random(7)
    payload = b"".join(rng.choice([b"abcd" * 64, rng.randbytes(256)]) for _ in range(8192))  # 2 MiB, compressible
    wheel = build_wheel(tmp_path, {"demo_pkg/lib.so": payload}, compression=compression)
    with open_wheel(wheel) as archive, archive.open_in_place("demo_pkg/lib.so") as stream:
        assert stream.read() == payload
        for _ in range(200):  # forwards and backwards, across checkpoints and inside the last chunk
            start = rng.randrange(len(payload) + 10)
            size = rng.choice([1, 4, 64, 4096, 1 << 20])
            stream.seek(start)
            assert stream.read(size) == payload[start : start + size]
            assert stream.tell() == max(start, min(start + size, len(payload)))
        stream.seek(-10, 2)
        assert stream.read() == payload[-10:]


def test_open_in_place_of_a_corrupt_member_is_one_line(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, {"demo_pkg/lib.so": bytes(range(256)) * 4096})
    data = bytearray(wheel.read_bytes())
    start = data.find(b"demo_pkg/lib.so") + len("demo_pkg/lib.so")
    data[start + 100 : start + 400] = b"\xff" * 300  # the deflate stream, past the local header
    wheel.write_bytes(bytes(data))
    with (open_wheel(wheel) as archive, archive.open_in_place("demo_pkg/lib.so") as stream,
          pytest.raises(CheckFailed) as info):
        stream.read()
    assert str(info.value).startswith(f"{WHEEL}: member 'demo_pkg/lib.so' is corrupt (")
    assert str(info.value).endswith("); rebuild or re-download the wheel")
