"""PEP 658 metadata files: ``<wheel filename>.metadata`` beside the wheel in an index.

The file holds the exact bytes of the wheel's ``*.dist-info/METADATA``; the
index advertises its sha256 (``data-dist-info-metadata="sha256=..."``) and the
wheel's own sha256, both returned here.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path

from packaging.utils import canonicalize_name

from ci.base.digest import sha256_file
from ci.base.errors import CheckFailed
from ci.formats.archive import WheelArchive, open_wheel


@dataclass(frozen=True)
class MetadataFile:
    wheel: Path
    path: Path
    """Where ``<wheel filename>.metadata`` was written."""
    wheel_sha256: str
    metadata_sha256: str
    name: str
    version: str
    requires_python: str | None


def read_metadata(archive: WheelArchive) -> bytes:
    """The raw METADATA bytes of an open wheel, checked against the filename's name and version."""
    data = archive.read_small(f"{archive.dist_info}/METADATA")
    label = archive.wheel_name.filename
    try:
        headers = HeaderParser().parsestr(data.decode("utf-8"))  # str headers: non-ASCII values stay str
    except UnicodeDecodeError:
        raise CheckFailed(f"{label}: METADATA is not UTF-8; rebuild the wheel") from None
    for key in ("Name", "Version"):
        values = headers.get_all(key) or []
        if len(values) > 1:
            raise CheckFailed(f"{label}: METADATA has {len(values)} {key}: headers; rebuild the wheel "
                              "with one")
    name, version = headers.get("Name"), headers.get("Version")
    if not name or not version:
        raise CheckFailed(f"{label}: METADATA lacks Name or Version; rebuild the wheel")
    if canonicalize_name(name) != archive.wheel_name.name:
        raise CheckFailed(f"{label}: METADATA Name {name!r} does not match the filename; rebuild the wheel")
    if version.strip() != archive.wheel_name.version:
        raise CheckFailed(f"{label}: METADATA Version {version!r} does not match the filename; rebuild the wheel")
    return data


def requires_python_of(metadata: bytes) -> str | None:
    """The Requires-Python of METADATA bytes that :func:`read_metadata` returned, stripped; None if absent."""
    requires = HeaderParser().parsestr(metadata.decode("utf-8")).get("Requires-Python")
    return requires.strip() or None if requires else None


def extract_metadata(wheel: Path | str, out_dir: Path | str | None = None) -> MetadataFile:
    """Write ``<out_dir>/<wheel filename>.metadata`` (default: beside the wheel) and return its record."""
    wheel = Path(wheel)
    target_dir = Path(out_dir) if out_dir is not None else wheel.parent
    target_dir.mkdir(parents=True, exist_ok=True)
    with open_wheel(wheel) as archive:
        data = read_metadata(archive)
    headers = HeaderParser().parsestr(data.decode("utf-8"))  # read_metadata made sure it is UTF-8
    target = target_dir / f"{wheel.name}.metadata"
    partial = target.with_name(target.name + ".partial")
    partial.write_bytes(data)
    partial.replace(target)
    return MetadataFile(
        wheel=wheel,
        path=target,
        wheel_sha256=sha256_file(wheel),
        metadata_sha256=hashlib.sha256(data).hexdigest(),
        name=str(headers.get("Name")),
        version=str(headers.get("Version")).strip(),
        requires_python=requires_python_of(data),
    )
