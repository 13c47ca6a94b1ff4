"""Safe, streaming access to a wheel (a zip archive).

Opening a wheel validates it first; any of these ends in one
:class:`~ci.errors.CheckFailed` line naming the wheel and the member:

- the file is not a readable zip archive (corrupt, truncated);
- a member name is absolute or contains a ``..`` component;
- a member is a symbolic link (``S_IFLNK`` in the zip external attributes);
- a member name occurs twice;
- a member's local file header names another file than the central directory (extractors read the
  local name, so the checked name must be the installed one).

Members are only ever read as streams (bounded chunks); when a tool needs a
real file (an ELF parser that seeks, cuobjdump, c++filt) the member is copied
chunk by chunk into a temporary directory the caller owns, never elsewhere.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import stat
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from ci.errors import CheckFailed

CHUNK = 1 << 20
"""Bytes per read when streaming a member (1 MiB keeps memory flat)."""


@dataclass(frozen=True)
class WheelName:
    """The parts of a wheel filename (``{name}-{version}(-{build})?-{tags}.whl``)."""

    filename: str
    name: str
    """Normalised project name (PEP 503)."""
    version: str
    """The version as written in the filename (local segment included)."""
    build: str
    tags: frozenset[Tag]

    @property
    def distribution(self) -> str:
        """The name as it appears in the filename and the ``.dist-info`` directory."""
        return self.filename.split("-", 1)[0]


@dataclass(frozen=True)
class Member:
    """One zip member, as recorded in the central directory."""

    name: str
    file_size: int
    compress_size: int
    compress_type: int
    crc: int

    @property
    def is_dir(self) -> bool:
        return self.name.endswith("/")


def parse_filename(path: Path | str) -> WheelName:
    """Parse a wheel filename; a malformed one is a :class:`CheckFailed`."""
    filename = Path(path).name
    try:
        name, _version, build, tags = parse_wheel_filename(filename)
    except InvalidWheelFilename as exc:
        raise CheckFailed(
            f"{filename}: not a valid wheel filename ({exc}); rename it to name-version-tags.whl"
        ) from None
    version_text = filename[:-4].split("-")[1]
    return WheelName(
        filename=filename,
        name=str(name),
        version=version_text,
        build="".join(str(part) for part in build) if build else "",
        tags=frozenset(tags),
    )


def unsafe_path(name: str) -> str | None:
    """Why extracting a member named ``name`` could write outside the target directory, or None.

    ``/x``, ``\\x`` and ``C:x`` are absolute (a drive-relative ``C:x`` leaves the target on
    Windows: ``os.path.join(target, "C:x")`` is ``C:x``); ``..`` is a component with either slash.
    """
    if name.startswith(("/", "\\")) or re.match(r"^[A-Za-z]:", name):
        return "has an absolute path"
    if ".." in PurePosixPath(name.replace("\\", "/")).parts:
        return "contains a '..' path component"
    return None


def is_symlink(info: zipfile.ZipInfo) -> bool:
    """Whether the member's Unix mode (zip external attributes) makes it a symbolic link."""
    return stat.S_ISLNK(info.external_attr >> 16)


def unsafe_member(info: zipfile.ZipInfo) -> str | None:
    """Why a member of an untrusted zip must not be extracted (see :func:`unsafe_path`), or None."""
    return unsafe_path(info.orig_filename) or ("is a symbolic link" if is_symlink(info) else None)


_LOCAL_HEADER = struct.Struct("<4s22xHH")
"""Signature, then (after version, flags, method, time, date, crc and sizes) name and extra lengths."""


def _local_header_name(raw: IO[bytes], info: zipfile.ZipInfo) -> str | None:
    """The member name its local file header gives, decoded as zipfile decodes the central one."""
    try:
        raw.seek(info.header_offset)
        header = raw.read(_LOCAL_HEADER.size)
    except (OSError, OverflowError, ValueError):
        return None
    if len(header) != _LOCAL_HEADER.size:
        return None
    signature, name_length, _extra_length = _LOCAL_HEADER.unpack(header)
    encoded = raw.read(name_length)
    if signature != b"PK\x03\x04" or len(encoded) != name_length:
        return None
    return encoded.decode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace")


class WheelArchive:
    """A validated wheel open for reading; use as a context manager."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.wheel_name = parse_filename(self.path)
        label = self.path.name
        try:
            self._zip = zipfile.ZipFile(self.path)
        except FileNotFoundError:
            raise CheckFailed(f"{label}: no such file ({self.path}); check the path") from None
        except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
            raise CheckFailed(
                f"{label}: not a readable zip archive ({exc}); rebuild or re-download the wheel"
            ) from None
        try:
            self._members = self._validate(label)
        except BaseException:
            self._zip.close()
            raise

    def _validate(self, label: str) -> dict[str, Member]:
        members: dict[str, Member] = {}
        with open(self.path, "rb") as raw:
            for info in self._zip.infolist():
                self._validate_member(label, info, raw, members)
        return members

    def _validate_member(self, label: str, info: zipfile.ZipInfo, raw: IO[bytes], members: dict[str, Member]) -> None:
        name = info.filename
        reason = unsafe_path(info.orig_filename)
        if reason:
            raise CheckFailed(f"{label}: member {info.orig_filename!r} {reason}; rebuild the wheel with relative "
                              "member paths")
        if name != info.orig_filename:
            raise CheckFailed(f"{label}: member {info.orig_filename!r} has a NUL byte in its name, which zip readers "
                              "cut differently; rebuild the wheel")
        # Extractors (pip among them) read the local file header's name, the checks the central
        # directory's: they must be the same name, or the checked name is not the installed one.
        local = _local_header_name(raw, info)
        if local != name:
            shown = "has no readable local header" if local is None else f"has the local header name {local!r}"
            raise CheckFailed(f"{label}: member {name!r} of the central directory {shown}; rebuild the wheel")
        if is_symlink(info):
            raise CheckFailed(f"{label}: member {name!r} is a symbolic link; wheels must hold regular files only")
        if name in members:
            raise CheckFailed(f"{label}: member {name!r} occurs more than once; rebuild the wheel")
        members[name] = Member(name, info.file_size, info.compress_size, info.compress_type, info.CRC)

    # -- context manager --------------------------------------------------
    def __enter__(self) -> WheelArchive:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._zip.close()

    # -- listing ----------------------------------------------------------
    @property
    def zipfile(self) -> zipfile.ZipFile:
        """The underlying reader (for low-level copying; do not extract from it)."""
        return self._zip

    @property
    def members(self) -> tuple[Member, ...]:
        """Members in archive order."""
        return tuple(self._members.values())

    def member(self, name: str) -> Member:
        try:
            return self._members[name]
        except KeyError:
            raise CheckFailed(f"{self.path.name}: has no member {name!r}") from None

    def names(self) -> tuple[str, ...]:
        return tuple(self._members)

    @property
    def dist_info(self) -> str:
        """The single top-level ``*.dist-info`` directory (without trailing slash)."""
        found = sorted({n.split("/", 1)[0] for n in self._members if n.split("/", 1)[0].endswith(".dist-info")})
        if len(found) != 1:
            what = "no" if not found else f"{len(found)} ({', '.join(found)})"
            raise CheckFailed(
                f"{self.path.name}: has {what} top-level .dist-info directories; a wheel needs exactly one"
            )
        return found[0]

    # -- reading ----------------------------------------------------------
    def open(self, name: str) -> IO[bytes]:
        """A stream of one member's uncompressed bytes (CRC checked at the end)."""
        self.member(name)
        return self._zip.open(name)

    def read_small(self, name: str, limit: int = 16 << 20) -> bytes:
        """The whole of a small member (METADATA, RECORD, WHEEL); refuses large ones."""
        member = self.member(name)
        if member.file_size > limit:
            raise CheckFailed(f"{self.path.name}: member {name!r} is {member.file_size} bytes, more than {limit}")
        with self._reading(name):
            return self._zip.read(name)

    def iter_chunks(self, name: str, chunk: int = CHUNK) -> Iterator[bytes]:
        """Stream a member in chunks of at most ``chunk`` bytes."""
        with self._reading(name), self.open(name) as stream:
            while True:
                block = stream.read(chunk)
                if not block:
                    return
                yield block

    def copy_to(self, name: str, directory: Path) -> Path:
        """Copy one member into ``directory`` (a temp dir) under a flat, safe file name."""
        target = Path(directory) / (hashlib.sha256(name.encode()).hexdigest()[:16] + "-" + PurePosixPath(name).name)
        with self._reading(name), self.open(name) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)
        return target

    def shared_objects(self, prefix: str) -> Iterator[tuple[Member, Path]]:
        """Each ELF shared-object member as a temporary file, one at a time (removed after use).

        Bounded disk and memory however large the wheel: the one place that streams members
        out for the ABI and fatbin scans.
        """
        with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
            for member in self.members:
                if member.is_dir or not is_shared_object_name(member.name):
                    continue
                path = self.copy_to(member.name, Path(tmp))
                try:
                    yield member, path
                finally:
                    path.unlink()

    @contextmanager
    def _reading(self, name: str) -> Iterator[None]:
        """Turn a corrupt member (bad CRC, bad deflate data, truncation) into one CheckFailed line."""
        try:
            yield
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise CheckFailed(
                f"{self.path.name}: member {name!r} is corrupt ({exc}); rebuild or re-download the wheel"
            ) from None


def open_wheel(path: Path | str) -> WheelArchive:
    """Open and validate a wheel (see the module docstring for what is rejected)."""
    return WheelArchive(path)


def is_shared_object_name(name: str) -> bool:
    """``x.so``, ``x.so.1.2`` or a standalone ``x.cubin``: members worth an ELF look."""
    base = PurePosixPath(name).name
    return base.endswith((".so", ".cubin")) or ".so." in base
