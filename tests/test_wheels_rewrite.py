"""strip_local_version: renames, raw member copies, reproducible bytes, installable result."""

from __future__ import annotations

import csv
import hashlib
import io
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from wheel_factory import build_wheel, record_hash, reversion_wheel

from ci.base.errors import CheckFailed
from ci.formats.rewrite import strip_local_version

LOCAL = "0.1.0+abc1234"


def _raw_member_bytes(wheel: Path, name: str) -> bytes:
    """The compressed bytes of one member exactly as stored."""
    with zipfile.ZipFile(wheel) as zf, open(wheel, "rb") as fp:
        info = zf.getinfo(name)
        fp.seek(info.header_offset)
        header = fp.read(30)
        name_len, extra_len = int.from_bytes(header[26:28], "little"), int.from_bytes(header[28:30], "little")
        fp.seek(info.header_offset + 30 + name_len + extra_len)
        return fp.read(info.compress_size)


def _validate_record(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as zf:
        (record_name,) = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
        rows = list(csv.reader(io.StringIO(zf.read(record_name).decode())))
        assert {r[0] for r in rows} == set(zf.namelist())
        for path, digest, size in rows:
            if path == record_name:
                continue
            data = zf.read(path)
            expected = record_hash(data)
            assert (digest, int(size)) == (expected, len(data)), path


@pytest.mark.parametrize("data_descriptors", [False, True], ids=["plain", "data-descriptors"])
def test_round_trip_on_fixture(tmp_path: Path, fixture_wheel: Path, data_descriptors: bool) -> None:
    local = reversion_wheel(fixture_wheel, LOCAL, tmp_path / "local", data_descriptors=data_descriptors)
    assert local.name == "wheelhouse_fixture-0.1.0+abc1234-cp311-cp311-linux_x86_64.whl"
    first = strip_local_version(local, tmp_path / "one")
    second = strip_local_version(local, tmp_path / "two")
    assert first.name == "wheelhouse_fixture-0.1.0-cp311-cp311-linux_x86_64.whl"
    assert hashlib.sha256(first.read_bytes()).digest() == hashlib.sha256(second.read_bytes()).digest()

    with zipfile.ZipFile(local) as before, zipfile.ZipFile(first) as after:
        old_names, new_names = before.namelist(), after.namelist()
        assert new_names == [n.replace("0.1.0+abc1234.dist-info", "0.1.0.dist-info") for n in old_names]
        assert after.testzip() is None
        metadata = after.read("wheelhouse_fixture-0.1.0.dist-info/METADATA").decode()
        assert "\nVersion: 0.1.0\n" in metadata
        assert metadata == before.read(f"wheelhouse_fixture-{LOCAL}.dist-info/METADATA").decode().replace(
            LOCAL, "0.1.0"
        )
    for old, new in zip(old_names, new_names, strict=True):
        if old.endswith(("/METADATA", "/RECORD")):
            continue
        assert _raw_member_bytes(first, new) == _raw_member_bytes(local, old), old
    _validate_record(first)

    unpacked = tmp_path / "unpacked"
    subprocess.run([sys.executable, "-m", "wheel", "unpack", "--dest", str(unpacked), str(first)], check=True)
    assert (unpacked / "wheelhouse_fixture-0.1.0" / "wheelhouse_fixture-0.1.0.dist-info" / "METADATA").is_file()

    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(target), str(first)],
        check=True,
    )
    assert (target / "wheelhouse_fixture-0.1.0.dist-info").is_dir()
    assert (target / "wheelhouse_fixture" / "_C.cpython-311-x86_64-linux-gnu.so").is_file()


def test_data_dir_renamed_and_stored_members_raw(tmp_path: Path) -> None:
    files = {"pkg/__init__.py": b"x = 1\n", "pkg-2.0+cu130.data/scripts/tool": b"#!/bin/sh\n", "pkg/blob": b"\1" * 4096}
    wheel = build_wheel(tmp_path / "in", files, name="pkg", version="2.0+cu130", compression=zipfile.ZIP_STORED)
    out = strip_local_version(wheel, tmp_path / "out")
    with zipfile.ZipFile(out) as zf:
        assert "pkg-2.0.data/scripts/tool" in zf.namelist()
        assert zf.getinfo("pkg/blob").compress_type == zipfile.ZIP_STORED
    _validate_record(out)


def test_without_local_segment_is_copied_unchanged(tmp_path: Path, fixture_wheel: Path) -> None:
    out = strip_local_version(fixture_wheel, tmp_path)
    assert out.name == fixture_wheel.name and out.read_bytes() == fixture_wheel.read_bytes()


def test_metadata_version_mismatch_is_refused(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path, {"pkg/__init__.py": b""}, name="pkg", version="1.0+abc")
    bad = tmp_path / "bad" / wheel.name
    bad.parent.mkdir()
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("METADATA"):
                data = data.replace(b"Version: 1.0+abc", b"Version: 1.1+abc")
            zout.writestr(info, data)
    with pytest.raises(CheckFailed, match=r"METADATA Version '1.1\+abc' differs from the filename's '1.0\+abc'"):
        strip_local_version(bad, tmp_path / "out")
    assert not list((tmp_path / "out").glob("*"))


def test_command_line_strips_in_place(tmp_path: Path, fixture_wheel: Path) -> None:
    """The entry point build_scripts/lib/wheel_pack.sh runs: the +local wheel is replaced by the plain one."""
    import subprocess
    import sys

    local = reversion_wheel(fixture_wheel, LOCAL, tmp_path)
    result = subprocess.run([sys.executable, "-m", "ci", "strip-local-version", str(local)], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in tmp_path.glob("*.whl")) == ["wheelhouse_fixture-0.1.0-cp311-cp311-linux_x86_64.whl"]
    assert result.stdout.strip() == str(tmp_path / "wheelhouse_fixture-0.1.0-cp311-cp311-linux_x86_64.whl")


def test_builders_run_the_library_with_the_wheelhouse_interpreter_not_the_row_venv(tmp_path: Path,
                                                                                   fixture_wheel: Path) -> None:
    """A row's venv holds torch and the build tools only; `python -m ci` in a builder (the local-version strip,
    the jit-cache steps) needs the wheelhouse's own requirements, so it runs under WHEELHOUSE_TOOLS_PYTHON. Under
    the row's interpreter it failed with "No module named 'jsonschema'" (the GPU machine's flashinfer build)."""
    repo = Path(__file__).resolve().parent.parent
    row_venv = tmp_path / "row-venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(row_venv)], check=True)
    dist = tmp_path / "dist"
    dist.mkdir()
    reversion_wheel(fixture_wheel, LOCAL, dist)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "WHEELHOUSE_ROOT": str(repo),
           "WHEELHOUSE_PYTHON": str(row_venv / "bin" / "python"), "WHEELHOUSE_TOOLS_PYTHON": sys.executable}
    script = f'source {repo}/build_scripts/lib/wheel_pack.sh && strip_local_version "$1"'
    result = subprocess.run(["bash", "-c", script, "bash", str(dist)], env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert [p.name for p in dist.glob("*.whl")] == ["wheelhouse_fixture-0.1.0-cp311-cp311-linux_x86_64.whl"]
    # every builder reaches the library through wheelhouse_ci alone
    calls = [f"{path.relative_to(repo)}: {line.strip()}" for path in sorted((repo / "build_scripts").rglob("*.sh"))
             for line in path.read_text().splitlines()
             if re.search(r'python[^"]*" -m ci |python -m ci ', line) and not line.lstrip().startswith("#")
             and "die " not in line and path.name not in ("env.sh", "recheck_wheels.sh")]
    assert calls == []


def test_strip_refuses_a_local_header_name_it_did_not_validate(tmp_path: Path) -> None:
    """The local header's '../' name never reaches the output's central directory (nor any output)."""
    from ci.formats import rewrite
    from tests.hostile_wheels import header_mismatch

    wheel = header_mismatch(tmp_path)
    out = tmp_path / "out"
    with pytest.raises(CheckFailed, match="of the central directory has the local header name"):
        strip_local_version(wheel, out)
    assert not any(out.iterdir())
    # the raw copy refuses on its own too, should it ever be given an unvalidated archive
    with zipfile.ZipFile(wheel) as zin, open(wheel, "rb") as src, open(tmp_path / "raw.zip", "wb") as dst, \
            pytest.raises(CheckFailed, match="has another name in its local header"):
        rewrite._write_archive(zin, src, dst, lambda name: name, {}, wheel.name)


def test_command_line_refuses_inputs_that_strip_to_one_name(tmp_path: Path) -> None:
    """1.0+cu129, 1.0+cu130 and 1.0 all become 1.0: refused with one line, every input kept."""
    import subprocess
    import sys

    inputs = [build_wheel(tmp_path, {"pkg/build.py": f"BUILD = {v!r}\n".encode()}, name="pkg", version=v)
              for v in ("1.0+cu129", "1.0+cu130", "1.0")]
    before = {p.name: p.read_bytes() for p in inputs}
    result = subprocess.run([sys.executable, "-m", "invoke", "fix-wheel", "--wheel", str(tmp_path / "*.whl"),
                             "--strip-local-version"], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: ") and "all become pkg-1.0-cp311-cp311-linux_x86_64.whl" in line
    assert all(str(p) in line for p in inputs)
    assert {p.name: p.read_bytes() for p in tmp_path.glob("*.whl")} == before

    # byte-identical after stripping: one output, no complaint
    same = tmp_path / "same"
    for v in ("1.0+cu129", "1.0+cu130"):
        build_wheel(same, {"pkg/build.py": b"BUILD = 1\n"}, name="pkg", version=v)
    result = subprocess.run([sys.executable, "-m", "invoke", "fix-wheel", "--wheel", str(same / "*.whl"),
                             "--strip-local-version"],
                            capture_output=True, text=True, cwd=Path(__file__).resolve().parent.parent)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in same.glob("*.whl")) == ["pkg-1.0-cp311-cp311-linux_x86_64.whl"]


def test_add_members_copies_the_rest_raw_and_records_the_new_files(tmp_path: Path) -> None:
    """Bundle mode's writer: new files before .dist-info, WHEEL replaced, RECORD right, other bytes as they were."""
    from ci.formats.archive import open_wheel
    from ci.formats.record import check_record
    from ci.formats.rewrite import add_members

    wheel = build_wheel(tmp_path / "in", {"demo_pkg/__init__.py": b"x = 1\n" * 1000, "demo_pkg/_C.cpython-311.so": b"311"})
    module = tmp_path / "_C.cpython-312.so"
    module.write_bytes(b"\x7fELF" + bytes(range(256)) * 64)
    wheel_file = b"Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\nTag: cp312-cp312-linux_x86_64\n"
    bundled = wheel.with_name("demo_pkg-1.0-cp311.cp312-cp311.cp312-linux_x86_64.whl")
    target = add_members(wheel, bundled,
                         {"demo_pkg/_C.cpython-312.so": module}, {"demo_pkg-1.0.dist-info/WHEEL": wheel_file})
    with open_wheel(target) as archive:
        assert check_record(archive) == []
        assert archive.names() == ("demo_pkg/__init__.py", "demo_pkg/_C.cpython-311.so", "demo_pkg/_C.cpython-312.so",
                                   "demo_pkg-1.0.dist-info/METADATA", "demo_pkg-1.0.dist-info/WHEEL",
                                   "demo_pkg-1.0.dist-info/RECORD")
        assert archive.read_small("demo_pkg/_C.cpython-312.so") == module.read_bytes()
        assert archive.read_small("demo_pkg-1.0.dist-info/WHEEL") == wheel_file
        assert archive.zipfile.getinfo("demo_pkg/_C.cpython-312.so").external_attr >> 16 == 0o100755
    with zipfile.ZipFile(wheel) as before, zipfile.ZipFile(target) as after:
        for name in ("demo_pkg/__init__.py", "demo_pkg-1.0.dist-info/METADATA"):
            old, new = before.getinfo(name), after.getinfo(name)
            with open(wheel, "rb") as a, open(target, "rb") as b:
                a.seek(old.header_offset + 30 + len(name))
                b.seek(new.header_offset + 30 + len(name))
                assert a.read(old.compress_size) == b.read(new.compress_size), name
