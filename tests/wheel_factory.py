"""Small builders for the wheel-check tests: synthetic wheels, raw zips, real ELF files.

Compiled artefacts (gcc/nvcc shared objects) are cached under .cache/tests/
keyed by a digest of their source, flags and compiler version.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import os
import shutil
import struct
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO

from made_once import one_maker

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "tests"
NVCC = Path("/usr/local/cuda/bin/nvcc")

CUDA_SOURCE = """\
__global__ void scale(float* x, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) x[i] *= a;
}
extern "C" void launch_scale(float* x, float a, int n) { scale<<<(n + 255) / 256, 256>>>(x, a, n); }
"""

HOST_SOURCE = """\
#include <string>
#include <stdio.h>
namespace c10 { void needs_string(const std::string&); }
extern "C" int PyLong_AsLong(void*);
extern "C" __attribute__((weak)) void optional_hook(void);
int exported_value = 3;
int exported_function(int x) { puts("hi"); return x + exported_value; }
void calls_torch() { c10::needs_string(std::string("x")); PyLong_AsLong(nullptr); if (optional_hook) optional_hook(); }
"""


def _b64(digest: bytes) -> str:
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def record_hash(data: bytes) -> str:
    return "sha256=" + _b64(hashlib.sha256(data).digest())


def build_wheel(
    out_dir: Path,
    files: dict[str, bytes] | None = None,
    *,
    name: str = "demo_pkg",
    version: str = "1.0",
    tags: str = "cp311-cp311-linux_x86_64",
    compression: int = zipfile.ZIP_DEFLATED,
    requires_python: str | None = ">=3.10",
    requires: Sequence[str] = (),
    random_member_bytes: int = 0,
    sidecar: bool = False,
) -> Path:
    """A valid wheel holding ``files`` plus METADATA, WHEEL and RECORD.

    ``requires``: ``Requires-Dist`` lines. ``random_member_bytes``: a stored (uncompressed) member
    ``<name>/blob.bin`` of that many random bytes, streamed (for wheels of hundreds of MB).
    ``sidecar``: also ``<wheel>.metadata`` (PEP 658), written by the wheelhouse's own extract_metadata.
    Without ``files``, the package is one ``<name>/__init__.py`` saying its version.
    """
    if files is None:
        files = {f"{name}/__init__.py": f'VERSION = "{version}"\n'.encode()}
    out_dir.mkdir(parents=True, exist_ok=True)
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    if requires_python:
        metadata += f"Requires-Python: {requires_python}\n"
    metadata += "".join(f"Requires-Dist: {requirement}\n" for requirement in requires)
    interp, abi, plat = tags.split("-")
    wheel_meta = f"Wheel-Version: 1.0\nGenerator: wheel-factory\nRoot-Is-Purelib: {str(plat == 'any').lower()}\n"
    for i in interp.split("."):
        for a in abi.split("."):
            for p in plat.split("."):
                wheel_meta += f"Tag: {i}-{a}-{p}\n"
    members = dict(files)
    members[f"{dist_info}/METADATA"] = metadata.encode()
    members[f"{dist_info}/WHEEL"] = wheel_meta.encode()
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    target = out_dir / f"{name}-{version}-{tags}.whl"
    with zipfile.ZipFile(target, "w", compression) as zf:
        # package files first, .dist-info last: the layout bdist_wheel writes, so a client without
        # PEP 658 has to read the end of the archive (range request or full download)
        for path, data in members.items():
            if path == f"{dist_info}/METADATA" and random_member_bytes:
                writer.writerow(_random_member(zf, f"{name}/blob.bin", random_member_bytes))
            info = zipfile.ZipInfo(path, date_time=(2024, 1, 1, 0, 0, 0))
            info.external_attr = 0o100644 << 16
            info.compress_type = compression
            zf.writestr(info, data)
            writer.writerow([path, record_hash(data), len(data)])
        writer.writerow([f"{dist_info}/RECORD", "", ""])
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", date_time=(2024, 1, 1, 0, 0, 0))
        info.external_attr = 0o100644 << 16
        info.compress_type = compression
        zf.writestr(info, record.getvalue().encode())
    if sidecar:
        sys.path.insert(0, str(REPO))
        from ci.formats.metadata import extract_metadata

        extract_metadata(target)
    return target


def _random_member(zf: zipfile.ZipFile, arcname: str, size: int) -> list[str | int]:
    """Stream ``size`` random bytes into a stored zip64 member; its RECORD row."""
    digest = hashlib.sha256()
    info = zipfile.ZipInfo(arcname, date_time=(2024, 1, 1, 0, 0, 0))
    info.external_attr = 0o100644 << 16
    info.compress_type = zipfile.ZIP_STORED
    with zf.open(info, "w", force_zip64=True) as member:
        left = size
        while left:
            chunk = os.urandom(min(left, 8 << 20))
            member.write(chunk)
            digest.update(chunk)
            left -= len(chunk)
    return [arcname, "sha256=" + _b64(digest.digest()), size]


def raw_zip(path: Path, entries: Iterable[tuple[zipfile.ZipInfo | str, bytes]]) -> Path:
    """A zip with exactly these entries (duplicates allowed; zipfile only warns)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(path, "w") as zf:
            for info, data in entries:
                zf.writestr(info, data)
    return path


class _NonSeekable(io.RawIOBase):
    """A write-only stream without seek/tell, so zipfile writes data descriptors."""

    def __init__(self, target: io.BufferedWriter) -> None:
        self._target = target

    def writable(self) -> bool:
        return True

    def write(self, data: bytes) -> int:  # type: ignore[override]
        return self._target.write(data)


def reversion_wheel(src: Path, new_version: str, out_dir: Path, *, data_descriptors: bool = False) -> Path:
    """Re-version a wheel (filename, dist-info, METADATA, RECORD); every member recompressed.

    ``data_descriptors`` writes through a non-seekable stream, as streaming zip writers do.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    dist, old_version, rest = src.name.split("-", 2)
    old_di, new_di = f"{dist}-{old_version}.dist-info/", f"{dist}-{new_version}.dist-info/"
    with zipfile.ZipFile(src) as zin:
        items = [(info, zin.read(info)) for info in zin.infolist()]
    renamed: list[tuple[zipfile.ZipInfo, bytes]] = []
    metadata_bytes = b""
    for info, data in items:
        name = info.filename.replace(old_di, new_di, 1)
        if name.endswith(".dist-info/METADATA"):
            data = data.replace(f"\nVersion: {old_version}\n".encode(), f"\nVersion: {new_version}\n".encode(), 1)
            metadata_bytes = data
        new = zipfile.ZipInfo(name, date_time=info.date_time)
        new.external_attr, new.compress_type = info.external_attr, info.compress_type
        renamed.append((new, data))
    fixed = []
    for info, data in renamed:
        if info.filename.endswith(".dist-info/RECORD"):
            rows = []
            for row in csv.reader(io.StringIO(data.decode())):
                if not row:
                    continue
                row[0] = row[0].replace(old_di, new_di, 1)
                if row[0].endswith(".dist-info/METADATA"):
                    row[1:] = [record_hash(metadata_bytes), str(len(metadata_bytes))]
                rows.append(row)
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows)
            data = buf.getvalue().encode()
        fixed.append((info, data))
    target = out_dir / f"{dist}-{new_version}-{rest}"
    with open(target, "wb") as raw:
        stream = _NonSeekable(raw) if data_descriptors else raw
        with zipfile.ZipFile(stream, "w") as zf:  # type: ignore[arg-type]
            for info, data in fixed:
                zf.writestr(info, data)
    return target


def _compile_cached(kind: str, key_parts: Iterable[str], build: Callable[[Path], None]) -> Path:
    key = hashlib.sha256("\0".join(key_parts).encode()).hexdigest()[:16]
    out_dir = CACHE / kind / key
    target = out_dir / "lib.so"
    with one_maker(out_dir):
        if not target.is_file():
            _make(out_dir, build)
    return target


def _make(out_dir: Path, build: Callable[[Path], None]) -> None:
    staging = out_dir.with_suffix(".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    build(staging)
    shutil.rmtree(out_dir, ignore_errors=True)
    staging.rename(out_dir)


def cuda_shared_object(archs: Iterable[str] = ("80", "90")) -> Path:
    """A real host .so with a fatbin holding one cubin per arch (nvcc + g++ -shared)."""
    archs = tuple(archs)
    version = subprocess.run([str(NVCC), "--version"], capture_output=True, text=True, check=True).stdout

    def build(d: Path) -> None:
        (d / "k.cu").write_text(CUDA_SOURCE)
        gencode = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
        subprocess.run([str(NVCC), "-c", "k.cu", "-o", "k.o", "-Xcompiler", "-fPIC", *gencode], cwd=d, check=True)
        subprocess.run(["g++", "-shared", "k.o", "-o", "lib.so"], cwd=d, check=True)

    return _compile_cached("cuda-so", [CUDA_SOURCE, *archs, version], build)


def gencode_shared_object(gencodes: Iterable[str], *, device_link: bool = False) -> Path:
    """A real host .so from nvcc with these ``-gencode`` values (``compute_120f,code=sm_120f``).

    ``device_link``: compile relocatable device code (-rdc) and device-link it the way a build that forgets the
    arch flags does (``nvcc -dlink`` without -gencode), which adds a cubin of nvcc's default arch.
    """
    gencodes = tuple(gencodes)
    version = subprocess.run([str(NVCC), "--version"], capture_output=True, text=True, check=True).stdout
    flags = [f"-gencode=arch={g.split(',code=')[0]},code={g.split(',code=')[1]}" for g in gencodes]

    def build(d: Path) -> None:
        (d / "k.cu").write_text(CUDA_SOURCE)
        rdc = ["-rdc=true"] if device_link else []
        subprocess.run([str(NVCC), "-c", "k.cu", "-o", "k.o", "-Xcompiler", "-fPIC", *rdc, *flags], cwd=d, check=True,
                       capture_output=True)
        objects = ["k.o"]
        if device_link:
            subprocess.run([str(NVCC), "-dlink", "k.o", "-o", "dlink.o", "-Xcompiler", "-fPIC"], cwd=d, check=True,
                           capture_output=True)
            objects.append("dlink.o")
        subprocess.run(["g++", "-shared", *objects, "-o", "lib.so"], cwd=d, check=True)

    return _compile_cached("gencode-so", [CUDA_SOURCE, *gencodes, str(device_link), version], build)


def host_shared_object(extra_flags: Iterable[str] = ()) -> Path:
    """A host-only C++ .so (no device code) referencing a c10 symbol, CPython API and libc."""
    flags = tuple(extra_flags)
    version = subprocess.run(["g++", "--version"], capture_output=True, text=True, check=True).stdout

    def build(d: Path) -> None:
        (d / "h.cpp").write_text(HOST_SOURCE)
        subprocess.run(["g++", "-shared", "-fPIC", "-O1", *flags, "h.cpp", "-o", "lib.so"], cwd=d, check=True)

    return _compile_cached("host-so", [HOST_SOURCE, *flags, version], build)


def fatbin_section_bytes(so: Path) -> bytes:
    """The raw bytes of the ``.nv_fatbin`` section of a real shared object."""
    import sys

    sys.path.insert(0, str(REPO))
    from ci.formats.elf import ElfFile

    with open(so, "rb") as fp:
        elf = ElfFile(fp)
        sec = elf.section(".nv_fatbin")
        assert sec is not None
        return elf.read_section(sec)


def write_synthetic_elf(stream: IO[bytes], sections: list[tuple[str, int, Iterable[bytes]]]) -> None:
    """Write a minimal ELF64 (x86_64, ET_DYN) with the given PROGBITS sections to a write stream.

    Each section is (name, size, chunks); chunks are written as they come, so sections may be huge.
    """
    names = b"\0" + b"".join(n.encode() + b"\0" for n, _, _ in sections) + b".shstrtab\0"
    offset = 64
    headers = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    name_off = 1
    layout = []
    for name, size, _ in sections:
        layout.append((name_off, offset, size))
        name_off += len(name) + 1
        offset += size
    shstr_off, shoff = offset, offset + len(names)
    ehdr = struct.pack(
        "<16sHHIQQQIHHHHHH",
        b"\x7fELF\x02\x01\x01" + b"\0" * 9,
        3,
        62,
        1,
        0,
        0,
        shoff,
        0,
        64,
        0,
        0,
        64,
        len(sections) + 2,
        len(sections) + 1,
    )
    stream.write(ehdr)
    for (_, size, chunks), (noff, soff, _) in zip(sections, layout, strict=True):
        written = 0
        for chunk in chunks:
            stream.write(chunk)
            written += len(chunk)
        assert written == size, (written, size)
        headers.append(struct.pack("<IIQQQQIIQQ", noff, 1, 2, 0, soff, size, 0, 0, 8, 0))
    stream.write(names)
    headers.append(struct.pack("<IIQQQQIIQQ", name_off, 3, 0, 0, shstr_off, len(names), 0, 0, 1, 0))
    for h in headers:
        stream.write(h)
