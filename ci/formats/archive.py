"""Safe, streaming access to a wheel (a zip archive).

Opening a wheel validates it first; any of these ends in one
:class:`~ci.base.errors.CheckFailed` line naming the wheel and the member:

- the file is not a readable zip archive (corrupt, truncated);
- a member name is absolute or contains a ``..`` component;
- a member is a symbolic link (``S_IFLNK`` in the zip external attributes);
- a member name occurs twice;
- a member's local file header names another file than the central directory (extractors read the
  local name, so the checked name must be the installed one).

- a member is encrypted;
- the members add up to more than :data:`MAX_UNCOMPRESSED` bytes, or (beyond
  :data:`RATIO_FLOOR`) to more than :data:`MAX_RATIO` times the wheel's size: every
  check is linear in the bytes it reads, so these bound the work a wheel can cause.

Members are read in place: as streams (bounded chunks), or through
:meth:`WheelArchive.open_in_place`, a seekable view for the ELF reader that reads a
stored member's bytes where they lie and inflates a deflated one from the nearest
checkpoint. Nothing is written to disk but what a tool that needs a real file
(cuobjdump) is given.
"""

from __future__ import annotations

import io
import re
import stat
import struct
import zipfile
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, cast

from packaging.tags import Tag
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from ci.base.errors import CheckFailed

CHUNK = 1 << 20
"""Bytes per read when streaming a member (1 MiB keeps memory flat)."""
# What real wheels reach: torch 2.14's CUDA wheel holds 1.1 GiB in 528 MiB (2.1:1), its CPU wheel
# 666 MiB in 182 MiB (3.7:1); no member of either compresses better than 24:1. Deflate reaches
# 1032:1 on repeated bytes, which is how a 2 MB wheel once cost minutes of checks.
MAX_UNCOMPRESSED = 16 << 30
"""Total uncompressed bytes of one wheel's members: far beyond any real wheel."""
MAX_RATIO = 100
"""Total uncompressed bytes per byte of wheel file, once past :data:`RATIO_FLOOR`."""
RATIO_FLOOR = 64 << 20
"""Below this total a wheel costs little to check whatever its ratio (and small test wheels of zeros pass)."""


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
    data_offset: int = 0
    """Where the member's (compressed) bytes start in the wheel file."""

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
_ENCRYPTED = 0x1
_CORRUPT = (zipfile.BadZipFile, zlib.error, EOFError)
"""What reading a corrupt member raises (bad CRC, bad deflate data, truncation)."""


def _local_header(raw: IO[bytes], info: zipfile.ZipInfo) -> tuple[str, int] | None:
    """The member name its local file header gives (decoded as zipfile decodes the central one), and
    where the member's data starts; None when there is no readable local header."""
    try:
        raw.seek(info.header_offset)
        header = raw.read(_LOCAL_HEADER.size)
    except (OSError, OverflowError, ValueError):
        return None
    if len(header) != _LOCAL_HEADER.size:
        return None
    signature, name_length, extra_length = _LOCAL_HEADER.unpack(header)
    encoded = raw.read(name_length)
    if signature != b"PK\x03\x04" or len(encoded) != name_length:
        return None
    name = encoded.decode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace")
    return name, info.header_offset + _LOCAL_HEADER.size + name_length + extra_length


def _size_problem(total: int, wheel_size: int) -> str | None:
    """Why members adding up to ``total`` bytes cannot be a real wheel of ``wheel_size`` bytes, or None."""
    if total > MAX_UNCOMPRESSED:
        return (f"its members add up to {total} bytes uncompressed, more than any real wheel "
                f"({MAX_UNCOMPRESSED} at most); refusing it")
    if total > RATIO_FLOOR and total > MAX_RATIO * wheel_size:
        return (f"its members add up to {total} bytes uncompressed from {wheel_size} bytes "
                f"({total // max(wheel_size, 1)}:1), more than any real wheel ({MAX_RATIO}:1 at most; "
                "a decompression bomb); refusing it")
    return None


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
        # The declared sizes bound every read (zipfile and open_in_place stop at them), so they are
        # judged before any member is read.
        problem = _size_problem(sum(info.file_size for info in self._zip.infolist()), self.path.stat().st_size)
        if problem:
            raise CheckFailed(f"{label}: {problem}")
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
        local = _local_header(raw, info)
        if local is None or local[0] != name:
            shown = "has no readable local header" if local is None else f"has the local header name {local[0]!r}"
            raise CheckFailed(f"{label}: member {name!r} of the central directory {shown}; rebuild the wheel")
        if is_symlink(info):
            raise CheckFailed(f"{label}: member {name!r} is a symbolic link; wheels must hold regular files only")
        if info.flag_bits & _ENCRYPTED:
            raise CheckFailed(f"{label}: member {name!r} is encrypted, which no installer can read; rebuild the wheel")
        if name in members:
            raise CheckFailed(f"{label}: member {name!r} occurs more than once; rebuild the wheel")
        members[name] = Member(name, info.file_size, info.compress_size, info.compress_type, info.CRC, local[1])

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

    @contextmanager
    def open_in_place(self, name: str) -> Iterator[IO[bytes]]:
        """A seekable, read-only view of one member's uncompressed bytes, read from the wheel file itself.

        For readers that seek (the ELF reader): nothing is extracted. No CRC is checked here (a
        reader that seeks does not read every byte); the RECORD check hashes every member whole.
        """
        member = self.member(name)
        with ExitStack() as stack:
            if member.compress_type in (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED):
                raw: IO[bytes] = stack.enter_context(open(self.path, "rb"))
            else:  # bzip2, lzma: zipfile's own stream seeks (a backward seek reads again from the start)
                raw = stack.enter_context(self._zip.open(name))
            yield cast(IO[bytes], MemberReader(raw, member, self.path.name))  # a binary file as readers use one

    def shared_objects(self) -> Iterator[tuple[Member, IO[bytes]]]:
        """Each ELF shared-object member, opened in place, one at a time: no disk, bounded memory."""
        for member in self.members:
            if member.is_dir or not is_shared_object_name(member.name):
                continue
            with self.open_in_place(member.name) as stream:
                yield member, stream

    @contextmanager
    def _reading(self, name: str) -> Iterator[None]:
        """Turn a corrupt member (bad CRC, bad deflate data, truncation) into one CheckFailed line."""
        try:
            yield
        except _CORRUPT as exc:
            raise CheckFailed(
                f"{self.path.name}: member {name!r} is corrupt ({exc}); rebuild or re-download the wheel"
            ) from None


class MemberReader(io.RawIOBase):
    """A stored or deflated zip member as a seekable binary file (see :meth:`WheelArchive.open_in_place`).

    A stored member's bytes are read where they lie. A deflated one is inflated forward; every
    :data:`CHECKPOINT_EVERY` bytes of output the inflater's state is kept (a copy of its 32 KiB window),
    so seeking back costs at most that much inflating again, not the whole member. The last chunk of
    output is kept too: small steps back (a header read twice) cost nothing. Reads stop at the
    member's declared size; data that ends before it is a one-line :class:`CheckFailed`.
    """

    CHECKPOINT_EVERY = 16 << 20

    def __init__(self, raw: IO[bytes], member: Member, label: str) -> None:
        """``raw``: the wheel file for a stored or deflated member, else zipfile's stream of the member."""
        super().__init__()
        self._raw = raw
        self._member = member
        self._label = label
        self._pos = 0
        # inflating state: output position, compressed bytes consumed, input the inflater has not taken
        self._inflater = zlib.decompressobj(-zlib.MAX_WBITS)
        self._out = 0
        self._consumed = 0
        self._pending = b""
        self._checkpoints: list[tuple[int, int, Any, bytes]] = [(0, 0, self._inflater.copy(), b"")]
        self._window_start = 0
        self._window = b""

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._member.file_size}[whence]
        if base + offset < 0:
            raise ValueError(f"negative seek position {base + offset}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        end = self._member.file_size if size is None or size < 0 else min(self._pos + size, self._member.file_size)
        if end <= self._pos:
            return b""
        try:
            if self._member.compress_type == zipfile.ZIP_DEFLATED:
                data = self._read_deflated(self._pos, end)
            else:
                offset = self._member.data_offset if self._member.compress_type == zipfile.ZIP_STORED else 0
                self._raw.seek(offset + self._pos)
                data = self._raw.read(end - self._pos)
        except _CORRUPT as exc:
            raise self._corrupt(str(exc)) from None
        if len(data) != end - self._pos:
            raise self._corrupt(f"its data ends before its {self._member.file_size} bytes")
        self._pos = end
        return data

    def _corrupt(self, reason: str) -> CheckFailed:
        return CheckFailed(f"{self._label}: member {self._member.name!r} is corrupt ({reason}); "
                           "rebuild or re-download the wheel")

    def _read_deflated(self, start: int, end: int) -> bytes:
        parts = []
        window_end = self._window_start + len(self._window)
        if self._window_start <= start < window_end:  # a step back into the last chunk: no inflating again
            parts.append(self._window[start - self._window_start : min(end, window_end) - self._window_start])
            start = min(end, window_end)
        if start < end and start < self._out:
            self._restart_before(start)
        while start < end and self._out < end:
            block = self._inflate(min(CHUNK, self._member.file_size - self._out))
            if not block:
                break
            block_start, self._out = self._out, self._out + len(block)
            self._window_start, self._window = block_start, block
            if self._out > start:
                parts.append(block[max(0, start - block_start) : end - block_start])
        return b"".join(parts)

    def _restart_before(self, position: int) -> None:
        out, consumed, inflater, pending = max((c for c in self._checkpoints if c[0] <= position), key=lambda c: c[0])
        self._out, self._consumed, self._inflater, self._pending = out, consumed, inflater.copy(), pending

    def _inflate(self, limit: int) -> bytes:
        """Up to ``limit`` more bytes of output; none once the member's data is used up."""
        while True:
            data = self._pending
            if not data and self._consumed < self._member.compress_size:
                self._raw.seek(self._member.data_offset + self._consumed)
                data = self._raw.read(min(CHUNK, self._member.compress_size - self._consumed))
                self._consumed += len(data)
            block = self._inflater.decompress(data, limit)
            self._pending = self._inflater.unconsumed_tail
            if block:
                break
            if not data:  # nothing left to inflate: the caller sees the short read
                return b""
        if (self._out + len(block)) // self.CHECKPOINT_EVERY > self._checkpoints[-1][0] // self.CHECKPOINT_EVERY:
            self._checkpoints.append((self._out + len(block), self._consumed, self._inflater.copy(), self._pending))
        return block


def open_wheel(path: Path | str) -> WheelArchive:
    """Open and validate a wheel (see the module docstring for what is rejected)."""
    return WheelArchive(path)


def is_shared_object_name(name: str) -> bool:
    """``x.so``, ``x.so.1.2`` or a standalone ``x.cubin``: members worth an ELF look."""
    base = PurePosixPath(name).name
    return base.endswith((".so", ".cubin")) or ".so." in base
