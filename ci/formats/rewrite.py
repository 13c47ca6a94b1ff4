"""Remove the ``+local`` segment of a wheel's version without repacking it.

A release asset name cannot carry ``+`` (GitHub turns it into ``.``), so a
wheel built as ``1.2.0+cu130`` is published as ``1.2.0``. Unpacking and
re-zipping would recompress every member (slow for GB-sized wheels) and stamp
new timestamps (a new sha256 on every run). Instead:

- the filename, ``*.dist-info/METADATA`` ``Version:``, the ``.dist-info`` and
  ``.data`` directory names and RECORD are rewritten;
- METADATA and RECORD are the only members whose bytes change; they are
  deflated afresh with a fixed timestamp (1980-01-01) and their original
  permissions; RECORD gets METADATA's new hash and the renamed paths;
- every other member is copied raw (local header, compressed data and data
  descriptor as they are, only the name replaced when its directory was
  renamed), in the original order;
- the central directory is written here (zip64 records where sizes or offsets
  need them).

:func:`add_members` is the same writer for bundle mode (build_scripts/lib/bundle_pythons.py) and for
what every build adds (ci/building/stamp.py: the torch pin in METADATA, the SBOM): it adds files and replaces
small members (WHEEL, METADATA), updating RECORD, and copies the rest raw.

The same input therefore gives the same output bytes, and a member's
compressed bytes are never touched.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import struct
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, BinaryIO

from packaging.version import InvalidVersion, Version

from ci.base import log
from ci.base.digest import sha256_file
from ci.base.errors import CheckFailed
from ci.formats.archive import CHUNK, open_wheel
from ci.formats.record import file_record_hash, record_hash

_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_CENTRAL = struct.Struct("<4s4B4HL2L5H2L")
_EOCD = struct.Struct("<4s4H2LH")
_ZIP64_EOCD = struct.Struct("<4sQ2H2L4Q")
_ZIP64_LOCATOR = struct.Struct("<4sLQL")
_SIG_LOCAL = b"PK\x03\x04"
_SIG_CENTRAL = b"PK\x01\x02"
_SIG_DESCRIPTOR = b"PK\x07\x08"
_LIMIT32 = 0xFFFFFFFF
_FIXED_DATE_TIME = (1980, 1, 1, 0, 0, 0)
_VERSION_LINE = re.compile(rb"^Version:[ \t]*([^\r\n]*?)[ \t]*(\r?\n)", re.M)


@dataclass
class _Entry:
    """One central-directory record to write."""

    name: bytes
    create_version: int
    create_system: int
    extract_version: int
    reserved: int
    flag_bits: int
    compress_type: int
    date_time: tuple[int, int, int, int, int, int]
    crc: int
    compress_size: int
    file_size: int
    extra: bytes
    comment: bytes
    internal_attr: int
    external_attr: int
    header_offset: int


def _dos(date_time: tuple[int, ...]) -> tuple[int, int]:
    y, mo, d, h, mi, s = date_time
    return (h << 11) | (mi << 5) | (s // 2), ((y - 1980) << 9) | (mo << 5) | d


def _strip_zip64(extra: bytes, *, keep_only_zip64: bool = False) -> bytes:
    """The extra fields without zip64's (the central directory writes its own), or with only zip64's."""
    out = bytearray()
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, pos)
        if (tag == 1) == keep_only_zip64:
            out += extra[pos : pos + 4 + size]
        pos += 4 + size
    return bytes(out)


def _encode_name(name: str, flag_bits: int) -> tuple[bytes, int]:
    if flag_bits & 0x800:
        return name.encode("utf-8"), flag_bits
    try:
        return name.encode("ascii"), flag_bits
    except UnicodeEncodeError:
        return name.encode("utf-8"), flag_bits | 0x800


def _copy_exact(src: BinaryIO, dst: BinaryIO, size: int, label: str) -> None:
    remaining = size
    while remaining:
        block = src.read(min(CHUNK, remaining))
        if not block:
            raise CheckFailed(f"{label}: truncated member data; re-download the wheel")
        dst.write(block)
        remaining -= len(block)


def local_version_free(version: str) -> str:
    return version.split("+", 1)[0]


def stripped_filename(filename: str) -> str:
    """``pkg-1.0+abc-cp311-cp311-linux_x86_64.whl`` -> ``pkg-1.0-cp311-cp311-linux_x86_64.whl``."""
    dist, version, rest = filename.split("-", 2)
    return f"{dist}-{local_version_free(version)}-{rest}"


def strip_local_version(wheel: Path | str, out_dir: Path | str) -> Path:
    """Write ``wheel`` without its local version segment into ``out_dir``; returns the new path.

    A wheel without a local segment is copied unchanged (idempotent).
    """
    wheel = Path(wheel)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with open_wheel(wheel) as archive:
        name = archive.wheel_name
        version = name.version
        target = out_dir / stripped_filename(name.filename)
        if "+" not in version:
            if target.resolve() != wheel.resolve():
                shutil.copyfile(wheel, target)
            return target
        public = local_version_free(version)
        dist_info = archive.dist_info
        if not dist_info.endswith(f"-{version}.dist-info"):
            raise CheckFailed(
                f"{name.filename}: {dist_info} does not carry the filename's version {version}; rebuild the wheel"
            )
        stem = dist_info[: -len(".dist-info")]
        new_stem = stem[: -len(version)] + public
        renames = {f"{stem}.dist-info/": f"{new_stem}.dist-info/", f"{stem}.data/": f"{new_stem}.data/"}

        def rename(path: str) -> str:
            for old, new in renames.items():
                if path.startswith(old):
                    return new + path[len(old) :]
            return path

        metadata_name = f"{dist_info}/METADATA"
        record_name = f"{dist_info}/RECORD"
        metadata = archive.read_small(metadata_name)
        new_metadata = _rewrite_metadata(name.filename, metadata, version, public)
        record = archive.read_small(record_name)
        new_record = _rewrite_record(name.filename, record, rename,
                                     {metadata_name: (record_hash(new_metadata), len(new_metadata))}, {}, record_name)
        replaced = {metadata_name: new_metadata, record_name: new_record}
        _write_checked(archive.zipfile, wheel, target, rename, replaced, {}, "", name.filename)
    return target


def add_members(wheel: Path | str, target: Path | str, added: Mapping[str, Path | bytes],
                replaced: Mapping[str, bytes]) -> Path:
    """Write ``wheel`` as ``target`` with the members ``added`` (arcname -> a file's path, or the bytes of a
    small document) and new bytes for the small members ``replaced``, RECORD updated to match; every
    other member is copied raw.

    Added members are deflated with the fixed timestamp, in name order, before the ``.dist-info``
    directory (an added name the wheel holds already is replaced where it stands), with mode 0755 for
    a file (an extension module) and 0644 for bytes; each gets a RECORD line before RECORD's own. A
    replaced member must be listed in RECORD already.
    ``target`` may be ``wheel``: the output is written beside it and moved over it.
    """
    wheel, target = Path(wheel), Path(target)
    with open_wheel(wheel) as archive:
        label = archive.wheel_name.filename
        record_name = f"{archive.dist_info}/RECORD"
        if record_name not in archive.names():
            raise CheckFailed(f"{label}: has no {record_name}; rebuild the wheel")
        if record_name in replaced or record_name in added:
            raise CheckFailed(f"{label}: {record_name} is written from the other members, not given")
        new_record = _rewrite_record(
            label, archive.read_small(record_name), _same,
            {name: (record_hash(data), len(data)) for name, data in replaced.items()},
            {name: _record_fields(data) for name, data in added.items()}, record_name,
        )
        _write_checked(archive.zipfile, wheel, target, _same, {**replaced, record_name: new_record}, added,
                       f"{archive.dist_info}/", label)
    return target


def _same(path: str) -> str:
    return path


def _record_fields(data: Path | bytes) -> tuple[str, int]:
    """RECORD's hash and size of an added member: a file read in blocks, or bytes."""
    return file_record_hash(data) if isinstance(data, Path) else (record_hash(data), len(data))


def _write_checked(zin: zipfile.ZipFile, wheel: Path, target: Path, rename: Callable[[str], str],
                   replaced: Mapping[str, bytes], added: Mapping[str, Path | bytes], added_before: str,
                   label: str) -> None:
    """Write the new archive beside ``target``, validate it as any input is, then move it into place."""
    with tempfile.TemporaryDirectory(prefix=".wheelhouse-rewrite-", dir=target.parent) as tmp:
        partial = Path(tmp) / target.name
        with open(wheel, "rb") as src, open(partial, "wb") as dst:
            _write_archive(zin, src, dst, rename, replaced, label, added, added_before)
        with open_wheel(partial):  # the output passes the same archive validation as the input
            pass
        partial.replace(target)


def _rewrite_metadata(label: str, metadata: bytes, version: str, public: str) -> bytes:
    head_end = metadata.find(b"\n\n")
    head_end = len(metadata) if head_end < 0 else head_end
    match = _VERSION_LINE.search(metadata, 0, head_end + 1)
    if not match:
        raise CheckFailed(f"{label}: METADATA has no Version: header; rebuild the wheel")
    found = match.group(1).decode("utf-8", "replace")
    try:
        same = Version(found) == Version(version)
    except InvalidVersion:
        same = False
    if not same:
        raise CheckFailed(
            f"{label}: METADATA Version {found!r} differs from the filename's {version!r}; rebuild the wheel"
        )
    line = b"Version: " + public.encode() + match.group(2)
    return metadata[: match.start()] + line + metadata[match.end() :]


def _rewrite_record(
    label: str,
    record: bytes,
    rename: Callable[[str], str],
    changed: Mapping[str, tuple[str, int]],
    added: Mapping[str, tuple[str, int]],
    record_name: str,
) -> bytes:
    """RECORD with new (hash, size) for the ``changed`` members (each must be listed) and the ``added``
    ones (updated where listed, else new lines before RECORD's own), every path passed through ``rename``."""
    try:
        text = record.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckFailed(f"{label}: RECORD is not UTF-8; rebuild the wheel") from None
    terminator = "\r\n" if "\r\n" in text else "\n"
    fields = {**changed, **added}
    rows, seen = [], set()
    for row in csv.reader(io.StringIO(text)):
        if not row:
            continue
        path = row[0]
        if path in fields:
            row = [path, fields[path][0], str(fields[path][1])]
            seen.add(path)
        row[0] = rename(path)
        rows.append(row)
    missing = [path for path in changed if path not in seen]
    if missing:
        raise CheckFailed(f"{label}: RECORD has no line for {missing[0]}; rebuild the wheel")
    new = [[path, digest, str(size)] for path, (digest, size) in sorted(added.items()) if path not in seen]
    at = next((i for i, row in enumerate(rows) if row[0] == rename(record_name)), len(rows))
    out = io.StringIO()
    csv.writer(out, lineterminator=terminator).writerows(rows[:at] + new + rows[at:])
    return out.getvalue().encode("utf-8")


def _write_archive(
    zin: zipfile.ZipFile,
    src: BinaryIO,
    dst: BinaryIO,
    rename: Callable[[str], str],
    replaced: Mapping[str, bytes],
    label: str,
    added: Mapping[str, Path | bytes] | None = None,
    added_before: str = "",
) -> None:
    """Members in order: ``replaced`` ones deflated afresh, the others copied raw; the ``added`` files
    not already members go before the first member under ``added_before`` (at the end when none is)."""
    added = added or {}
    pending = sorted(name for name in added if name not in {info.filename for info in zin.infolist()})
    entries: list[_Entry] = []

    def write_pending() -> None:
        for name in pending:
            entries.append(_write_fresh(dst, name, added[name], None, dst.tell(), label))
        pending.clear()

    for info in zin.infolist():
        if pending and added_before and info.filename.startswith(added_before):
            write_pending()
        new_name = rename(info.filename)
        offset = dst.tell()
        if info.filename in replaced:
            entries.append(_write_fresh(dst, new_name, replaced[info.filename], info, offset, label))
        elif info.filename in added:
            entries.append(_write_fresh(dst, new_name, added[info.filename], None, offset, label))
        else:
            entries.append(_copy_raw(src, dst, info, new_name, offset, label))
    write_pending()
    _write_central_directory(dst, entries, zin.comment)


def _write_fresh(
    dst: BinaryIO, name: str, data: bytes | Path, like: zipfile.ZipInfo | None, offset: int, label: str, *,
    date_time: tuple[int, int, int, int, int, int] = _FIXED_DATE_TIME,
) -> _Entry:
    """Deflate ``data`` (bytes, or a file streamed in blocks) as a new member dated ``date_time`` (default:
    the fixed timestamp).

    Its mode is ``like``'s (a replaced member keeps its permissions), else 0755 for an added file and
    0644 for added bytes.
    """
    raw_name, flags = _encode_name(name, 0)
    dostime, dosdate = _dos(date_time)

    def header(crc: int, compressed: int, size: int) -> bytes:
        return _LOCAL_HEADER.pack(_SIG_LOCAL, 20, 0, flags, zipfile.ZIP_DEFLATED, dostime, dosdate, crc,
                                  compressed, size, len(raw_name), 0)

    dst.write(header(0, 0, 0))
    dst.write(raw_name)
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    crc = size = compressed = 0
    with open(data, "rb") if isinstance(data, Path) else io.BytesIO(data) as source:
        while block := source.read(CHUNK):
            crc = zlib.crc32(block, crc)
            size += len(block)
            body = compressor.compress(block)
            dst.write(body)
            compressed += len(body)
    body = compressor.flush()
    dst.write(body)
    compressed += len(body)
    if size >= _LIMIT32 or compressed >= _LIMIT32:
        raise CheckFailed(f"{label}: {name} is 4 GiB or more; a member added here must be smaller")
    end = dst.tell()
    dst.seek(offset)
    dst.write(header(crc, compressed, size))  # the sizes and crc are known only now
    dst.seek(end)
    external_attr = like.external_attr if like is not None and like.external_attr else (
        (0o100755 if like is None and isinstance(data, Path) else 0o100644) << 16)
    return _Entry(
        name=raw_name,
        create_version=20,
        create_system=3,
        extract_version=20,
        reserved=0,
        flag_bits=flags,
        compress_type=zipfile.ZIP_DEFLATED,
        date_time=date_time,
        crc=crc,
        compress_size=compressed,
        file_size=size,
        extra=b"",
        comment=b"",
        internal_attr=0,
        external_attr=external_attr,
        header_offset=offset,
    )


def _copy_raw(src: BinaryIO, dst: BinaryIO, info: zipfile.ZipInfo, new_name: str, offset: int, label: str, *,
              date_time: tuple[int, int, int, int, int, int] | None = None, drop_extra: bool = False) -> _Entry:
    """Copy one member's local header, data and data descriptor as they are; with ``date_time``, that date
    in both headers, and with ``drop_extra`` only the zip64 field of the extra fields kept."""
    src.seek(info.header_offset)
    header = src.read(_LOCAL_HEADER.size)
    if len(header) != _LOCAL_HEADER.size or header[:4] != _SIG_LOCAL:
        raise CheckFailed(f"{label}: member {info.filename!r} has a bad local header; re-download the wheel")
    fields = list(_LOCAL_HEADER.unpack(header))
    name_len, extra_len = fields[10], fields[11]
    old_raw_name = src.read(name_len)
    local_extra = src.read(extra_len)
    raw_name, flags = _encode_name(new_name, info.flag_bits)
    if old_raw_name.decode("utf-8" if info.flag_bits & 0x800 else "cp437", "replace") != info.filename:
        # the bytes copied must carry the name that was validated (the central directory's)
        raise CheckFailed(f"{label}: member {info.filename!r} has another name in its local header; rebuild the wheel")
    if drop_extra:
        local_extra = _strip_zip64(local_extra, keep_only_zip64=True)
    if new_name == info.filename and date_time is None and not drop_extra:
        dst.write(header)
        dst.write(old_raw_name)
    else:
        fields[3] = flags
        fields[10] = len(raw_name)
        fields[11] = len(local_extra)
        if date_time is not None:
            fields[5], fields[6] = _dos(date_time)
        dst.write(_LOCAL_HEADER.pack(*fields))
        dst.write(raw_name)
    dst.write(local_extra)
    _copy_exact(src, dst, info.compress_size, label)
    if info.flag_bits & 0x08:  # a data descriptor follows the data
        zip64 = (
            any(tag == 1 for tag in _extra_tags(local_extra))
            or info.compress_size >= _LIMIT32
            or info.file_size >= _LIMIT32
        )
        sizes = 16 if zip64 else 8
        first = src.read(4)
        dst.write(first)
        # With its optional signature first, the descriptor is signature, crc, sizes; without, crc, sizes.
        _copy_exact(src, dst, sizes + 4 if first == _SIG_DESCRIPTOR else sizes, label)
    return _Entry(
        name=raw_name if new_name != info.filename else old_raw_name,
        create_version=info.create_version,
        create_system=info.create_system,
        extract_version=info.extract_version,
        reserved=info.reserved,
        flag_bits=flags if new_name != info.filename else info.flag_bits,
        compress_type=info.compress_type,
        date_time=date_time or info.date_time,
        crc=info.CRC,
        compress_size=info.compress_size,
        file_size=info.file_size,
        extra=b"" if drop_extra else _strip_zip64(info.extra),
        comment=b"" if drop_extra else info.comment,
        internal_attr=info.internal_attr,
        external_attr=info.external_attr,
        header_offset=offset,
    )


def normalize_wheel(wheel: Path | str, epoch: int) -> Path:
    """Rewrite ``wheel`` in place so that its bytes depend on its contents and ``epoch`` only.

    Members are sorted by name, ``.dist-info`` last and RECORD the very last (as wheel tools write them);
    each gets ``epoch`` as its date (UTC, no earlier than 1980, the first date a zip entry can carry) and
    mode 0755 when any execute bit was set, else 0644; extra fields other than zip64's (an extended
    timestamp is a build's wall clock) are dropped. RECORD is written in the same order. The compressed
    data is copied raw, so the cost is about a copy.
    """
    wheel = Path(wheel)
    stamp = datetime.fromtimestamp(max(epoch, _EARLIEST_ZIP_EPOCH), tz=timezone.utc)
    date_time = (stamp.year, stamp.month, stamp.day, stamp.hour, stamp.minute, stamp.second - stamp.second % 2)
    with open_wheel(wheel) as archive:
        label = archive.wheel_name.filename
        record_name = f"{archive.dist_info}/RECORD"
        if record_name not in archive.names():
            raise CheckFailed(f"{label}: has no {record_name}; rebuild the wheel")
        infos = sorted(archive.zipfile.infolist(), key=lambda info: _normalized_order(info.filename, archive.dist_info))
        order = {info.filename: position for position, info in enumerate(infos)}
        record = _sorted_record(label, archive.read_small(record_name), order)
        with tempfile.TemporaryDirectory(prefix=".wheelhouse-normalize-", dir=wheel.parent) as tmp:
            partial = Path(tmp) / wheel.name
            with open(wheel, "rb") as src, open(partial, "wb") as dst:
                entries = []
                for info in infos:
                    mode = _normalized_mode(info)
                    if info.filename == record_name:
                        like = zipfile.ZipInfo(info.filename)
                        like.external_attr = mode
                        entry = _write_fresh(dst, info.filename, record, like, dst.tell(), label,
                                             date_time=date_time)
                    else:
                        entry = _copy_raw(src, dst, info, info.filename, dst.tell(), label,
                                          date_time=date_time, drop_extra=True)
                        entry.external_attr = mode
                    entries.append(entry)
                _write_central_directory(dst, entries, b"")
            with open_wheel(partial):  # the output passes the same archive validation as the input
                pass
            partial.replace(wheel)
    return wheel


_EARLIEST_ZIP_EPOCH = 315532800  # 1980-01-01T00:00:00Z


def _normalized_order(name: str, dist_info: str) -> tuple[int, str]:
    if name == f"{dist_info}/RECORD":
        return (2, name)
    return (1 if name.startswith(f"{dist_info}/") else 0, name)


def _normalized_mode(info: zipfile.ZipInfo) -> int:
    unix = info.external_attr >> 16
    if info.is_dir():
        return (0o40755 << 16) | 0x10
    return (0o100755 if unix & 0o111 else 0o100644) << 16


def _sorted_record(label: str, record: bytes, order: Mapping[str, int]) -> bytes:
    """RECORD's lines in the members' order (lines for names not in the wheel last, by name)."""
    try:
        text = record.decode("utf-8")
    except UnicodeDecodeError:
        raise CheckFailed(f"{label}: RECORD is not UTF-8; rebuild the wheel") from None
    terminator = "\r\n" if "\r\n" in text else "\n"
    rows = [row for row in csv.reader(io.StringIO(text)) if row]
    rows.sort(key=lambda row: (order.get(row[0], len(order)), row[0]))
    out = io.StringIO()
    csv.writer(out, lineterminator=terminator).writerows(rows)
    return out.getvalue().encode("utf-8")


def _extra_tags(extra: bytes) -> list[int]:
    tags = []
    pos = 0
    while pos + 4 <= len(extra):
        tag, size = struct.unpack_from("<HH", extra, pos)
        tags.append(tag)
        pos += 4 + size
    return tags


def _write_central_directory(dst: BinaryIO, entries: list[_Entry], comment: bytes) -> None:
    start = dst.tell()
    for e in entries:
        zip64 = []
        file_size, compress_size, offset = e.file_size, e.compress_size, e.header_offset
        if e.file_size >= _LIMIT32:
            zip64.append(e.file_size)
            file_size = _LIMIT32
        if e.compress_size >= _LIMIT32:
            zip64.append(e.compress_size)
            compress_size = _LIMIT32
        if e.header_offset >= _LIMIT32:
            zip64.append(e.header_offset)
            offset = _LIMIT32
        extra = e.extra
        extract_version, create_version = e.extract_version, e.create_version
        if zip64:
            extra = struct.pack(f"<HH{len(zip64)}Q", 1, 8 * len(zip64), *zip64) + extra
            extract_version, create_version = max(45, extract_version), max(45, create_version)
        dostime, dosdate = _dos(e.date_time)
        dst.write(
            _CENTRAL.pack(
                _SIG_CENTRAL,
                create_version,
                e.create_system,
                extract_version,
                e.reserved,
                e.flag_bits,
                e.compress_type,
                dostime,
                dosdate,
                e.crc,
                compress_size,
                file_size,
                len(e.name),
                len(extra),
                len(e.comment),
                0,
                e.internal_attr,
                e.external_attr,
                offset,
            )
        )
        dst.write(e.name)
        dst.write(extra)
        dst.write(e.comment)
    end = dst.tell()
    size, count = end - start, len(entries)
    if count > 0xFFFF or size >= _LIMIT32 or start >= _LIMIT32:
        dst.write(_ZIP64_EOCD.pack(b"PK\x06\x06", _ZIP64_EOCD.size - 12, 45, 45, 0, 0, count, count, size, start))
        dst.write(_ZIP64_LOCATOR.pack(b"PK\x06\x07", 0, end, 1))
        dst.write(
            _EOCD.pack(
                b"PK\x05\x06",
                0,
                0,
                min(count, 0xFFFF),
                min(count, 0xFFFF),
                min(size, _LIMIT32),
                min(start, _LIMIT32),
                len(comment),
            )
        )
    else:
        dst.write(_EOCD.pack(b"PK\x05\x06", 0, 0, count, count, size, start, len(comment)))
    dst.write(comment)


def check_strip_collisions(wheels: list[Path], out_dir: Path | None) -> None:
    """Refuse, before anything is written, when stripping would make one file out of several.

    Inputs whose stripped names coincide (``1.0+cu129``, ``1.0+cu130``, ``1.0``) must strip to the same
    bytes, and so must an existing file of that name that is not an input; otherwise one would
    silently replace the others.
    """
    import tempfile

    targets: dict[Path, list[Path]] = {}
    for wheel in wheels:
        folder = out_dir if out_dir is not None else wheel.parent
        target = (Path(folder) / stripped_filename(wheel.name)).resolve()
        targets.setdefault(target, []).append(wheel)
    inputs = {w.resolve() for w in wheels}
    for target, group in targets.items():
        others = [target] if target.exists() and target not in inputs else []
        if len(group) + len(others) < 2:
            continue
        with tempfile.TemporaryDirectory(prefix="wheelhouse-strip-") as tmp:
            digests = {}
            for i, wheel in enumerate(group):
                stripped = strip_local_version(wheel, Path(tmp) / str(i))
                digests[wheel] = sha256_file(stripped)
            for existing in others:
                digests[existing] = sha256_file(existing)
        if len(set(digests.values())) > 1:
            names = ", ".join(str(p) for p in digests)
            raise CheckFailed(
                f"{names} all become {target.name} once the local version is stripped, with different contents: "
                "strip them into separate --out directories, or remove the ones you do not want"
            )


def strip_in_place(wheels: list[Path]) -> list[Path]:
    """Strip each wheel's local version beside it and remove the original; returns the new paths."""
    check_strip_collisions(wheels, None)
    results = []
    for wheel in wheels:
        stripped = strip_local_version(wheel, wheel.parent)
        if stripped != wheel:
            wheel.unlink()
        results.append(stripped)
    return results


def add_command(commands: Any) -> None:
    """``python -m ci strip-local-version WHEEL...``: what build_scripts/lib/wheel_pack.sh runs."""
    command = commands.add_parser("strip-local-version", help="strip the +local version of wheels, in place")
    command.add_argument("wheels", nargs="+", type=Path, metavar="WHEEL")
    command.set_defaults(run=_strip_command)


def _strip_command(args: Any) -> None:
    for path in strip_in_place(args.wheels):
        log.out(str(path))
