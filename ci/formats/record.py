"""RECORD: the wheel's own list of its files with their hashes (PEP 376/427), checked as installers read it.

pip refuses a wheel without RECORD; a RECORD whose hashes or sizes are wrong, that lists a file
the wheel does not hold, or that leaves one out means the bytes are not the ones the wheel was
built with. Every member is hashed while streamed (bounded memory, any wheel size).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
from pathlib import Path

from ci.formats.archive import CHUNK, WheelArchive

# PEP 427: sha256 or stronger; md5 and sha1 are not accepted.
ALGORITHMS = ("sha256", "sha384", "sha512", "sha3_256", "sha3_384", "sha3_512", "blake2b", "blake2s")
_UNHASHED = ("RECORD", "RECORD.jws", "RECORD.p7s")


def encode_digest(digest: bytes) -> str:
    """A digest as RECORD writes it: urlsafe base64 without ``=`` padding (PEP 376)."""
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def record_hash(data: bytes) -> str:
    """RECORD's hash field for ``data``: ``sha256=<digest>``."""
    return "sha256=" + encode_digest(hashlib.sha256(data).digest())


def file_record_hash(path: Path | str) -> tuple[str, int]:
    """RECORD's hash field and the size of the file at ``path``, read in blocks."""
    hasher = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            hasher.update(block)
            size += len(block)
    return "sha256=" + encode_digest(hasher.digest()), size


def check_record(archive: WheelArchive) -> list[str]:
    """One line per RECORD defect of an open wheel (empty when RECORD matches every member)."""
    label = archive.wheel_name.filename
    name = f"{archive.dist_info}/RECORD"
    if name not in archive.names():
        return [f"{label}: has no {name}; pip refuses a wheel without RECORD; rebuild the wheel"]
    try:
        rows = list(csv.reader(io.StringIO(archive.read_small(name).decode("utf-8"), newline="")))
    except (UnicodeDecodeError, csv.Error) as exc:
        return [f"{label}: {name} is not a UTF-8 CSV file ({exc}); rebuild the wheel"]
    listed: dict[str, tuple[str, str]] = {}
    for number, row in enumerate(rows, 1):
        if not row:
            continue
        if len(row) != 3:
            return [f"{label}: {name} line {number} has {len(row)} fields instead of path,hash,size; rebuild the wheel"]
        path, digest, size = row
        if path in listed:
            return [f"{label}: {name} lists {path!r} twice; rebuild the wheel"]
        listed[path] = (digest, size)
    problems = []
    members = [m for m in archive.members if not m.is_dir]
    for member in members:
        if member.name not in listed:
            problems.append(f"{label}: member {member.name!r} is not listed in {name}; rebuild the wheel")
            continue
        if member.name.rsplit("/", 1)[-1] in _UNHASHED and member.name.startswith(f"{archive.dist_info}/"):
            continue
        problem = _check_member(archive, member.name, *listed[member.name])
        if problem:
            problems.append(f"{label}: {problem}; rebuild the wheel")
    held = {m.name for m in members}
    problems += [f"{label}: {name} lists {path!r}, which the wheel does not hold; rebuild the wheel"
                 for path in listed if path not in held]
    return problems[:20] + ([f"{label}: ... and {len(problems) - 20} more RECORD problems"] if len(problems) > 20 else [])


def _check_member(archive: WheelArchive, path: str, digest: str, size: str) -> str | None:
    algorithm, _, expected = digest.partition("=")
    if algorithm not in ALGORITHMS or not expected:
        return f"RECORD gives {path!r} no sha256 (or stronger) hash ({digest!r})"
    hasher = hashlib.new(algorithm)
    total = 0
    for chunk in archive.iter_chunks(path):  # a corrupt member raises its own CheckFailed line
        hasher.update(chunk)
        total += len(chunk)
    actual = encode_digest(hasher.digest())
    if actual != expected.rstrip("="):
        return f"member {path!r} does not match its RECORD hash ({algorithm}={actual}, RECORD says {expected})"
    if size and size != str(total):
        return f"member {path!r} is {total} bytes, RECORD says {size}"
    return None
