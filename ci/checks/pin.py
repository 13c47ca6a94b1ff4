"""The torch pin: a wheel whose extension links torch requires the torch line it was built against.

An unpinned ``Requires-Dist: torch`` lets pip or uv move torch to a release the
extension was not built for (an undefined c10 symbol at import, or worse, a
silent mismatch). Whether a wheel links torch is read from its ELF files, not
guessed from its name: a shared object that needs ``libtorch*`` or ``libc10*``
(``DT_NEEDED``). Such a wheel gets one unconditional ``Requires-Dist`` for the
row's torch in place of upstream's torch requirements; a pure-Python wheel, or
one whose extension does not link torch, keeps upstream's requirements.

versions.yaml's ``torch_pin`` says how tight the pin is:

- ``minor`` (default): ``torch==2.13.*``; PEP 440 local labels (``2.13.0+cu130``)
  and patch releases satisfy it;
- ``exact``: ``torch==2.13.0`` (a local label still satisfies it);
- ``none``: upstream's requirements stay as they are (a component whose ABI
  spans torch releases).

The METADATA rewrite itself is :func:`pinned_metadata` (bytes in, bytes out);
ci/building/stamp.py writes it into the wheel with the raw-copy writer.
"""

from __future__ import annotations

import re
from email.parser import HeaderParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from ci.base.errors import CheckFailed
from ci.formats.archive import open_wheel
from ci.formats.elf import ElfFile, is_elf
from ci.formats.metadata import read_metadata

PIN_MODES = ("minor", "exact", "none")
TORCH_LIBRARY_PREFIXES = ("libtorch", "libc10")
_HEADER_NAME = re.compile(rb"^([A-Za-z0-9-]+)[ \t]*:")


def torch_specifier(torch_version: str, mode: str) -> str | None:
    """The version specifier ``mode`` pins the row's torch to (``==2.13.*``), or None for ``none``."""
    if mode not in PIN_MODES:
        raise ValueError(f"torch_pin {mode!r} is not one of {', '.join(PIN_MODES)}")
    if mode == "none":
        return None
    version = Version(torch_version)
    return f"=={version.major}.{version.minor}.*" if mode == "minor" else f"=={version.public}"


def torch_libraries_needed(path: Path | str, label: str = "<elf>") -> tuple[str, ...]:
    """The torch libraries (``libtorch*``, ``libc10*``) an ELF file needs; empty for anything else."""
    with open(path, "rb") as fp:
        return torch_libraries_of(ElfFile(fp, label)) if is_elf(fp) else ()


def torch_libraries_of(elf: ElfFile) -> tuple[str, ...]:
    """The torch libraries an opened ELF needs (its ``DT_NEEDED`` entries named ``libtorch*``/``libc10*``)."""
    return tuple(name for name in elf.needed_libraries() if name.startswith(TORCH_LIBRARY_PREFIXES))


def _header_entries(lines: list[bytes]) -> list[bytes]:
    """The header lines of METADATA, each with its continuation lines (those starting with white space)."""
    entries: list[bytes] = []
    for line in lines:
        if entries and line[:1] in (b" ", b"\t"):
            entries[-1] += line
        else:
            entries.append(line)
    return entries


def _requirement_value(entry: bytes) -> str | None:
    """The value of a ``Requires-Dist`` header entry (continuation lines joined), else None."""
    match = _HEADER_NAME.match(entry)
    if not match or match.group(1).lower() != b"requires-dist":
        return None
    return " ".join(entry[match.end():].decode("utf-8").split())


def _torch_requirement(entry: bytes, label: str) -> Requirement | None:
    """The requirement of a ``Requires-Dist`` header entry when it names torch, else None."""
    value = _requirement_value(entry)
    if value is None:
        return None
    try:
        requirement = Requirement(value)
    except InvalidRequirement as exc:
        raise CheckFailed(f"{label}: METADATA Requires-Dist {value!r} is not a valid requirement ({exc}); "
                          "rebuild the wheel") from None
    return requirement if canonicalize_name(requirement.name) == "torch" else None


def _mentions_extra(requirement: Requirement) -> bool:
    return requirement.marker is not None and "extra" in str(requirement.marker)


def pinned_metadata(metadata: bytes, specifier: str, label: str) -> bytes:
    """METADATA with every torch requirement pinned to ``specifier``.

    Upstream's torch requirements without an ``extra`` marker give way to one unconditional
    ``Requires-Dist: torch<specifier>`` where the first of them stood (the extension needs torch on
    every platform it was built for, whatever their markers said); one under an extra keeps its
    marker and gets the pin too, so no extra can ask for another torch. Without any, the pin follows
    the last ``Requires-Dist`` (else ends the headers). The body (the description) is untouched;
    running it again gives the same bytes.
    """
    lines = metadata.splitlines(keepends=True)
    blank = next((i for i, line in enumerate(lines) if line in (b"\n", b"\r\n")), len(lines))
    head, body = lines[:blank], b"".join(lines[blank:])
    newline = b"\r\n" if head and head[0].endswith(b"\r\n") else b"\n"
    entries = _header_entries(head)
    if entries and not entries[-1].endswith(b"\n"):
        entries[-1] += newline
    kept: list[bytes] = []
    extras: set[str] = set()
    insert_at: int | None = None
    last_requirement = None
    for entry in entries:
        requirement = _torch_requirement(entry, label)
        if requirement is None:
            if _requirement_value(entry) is not None:
                last_requirement = len(kept)
            kept.append(entry)
            continue
        if _mentions_extra(requirement):
            requirement.specifier = SpecifierSet(specifier)
            kept.append(b"Requires-Dist: " + str(requirement).encode() + newline)
            last_requirement = len(kept) - 1
            continue
        extras |= requirement.extras
        if insert_at is None:
            insert_at = len(kept)
    if insert_at is None:
        insert_at = len(kept) if last_requirement is None else last_requirement + 1
    name = "torch" + (f"[{','.join(sorted(extras))}]" if extras else "")
    kept.insert(insert_at, f"Requires-Dist: {name}{specifier}".encode() + newline)
    return b"".join(kept) + body


def torch_pin_of(metadata: bytes) -> str | None:
    """The specifier of the unconditional torch requirement in METADATA bytes (``==2.13.*``), or None.

    A requirement with a marker does not count: only one that holds everywhere pins torch.
    """
    headers = HeaderParser().parsestr(metadata.decode("utf-8"))
    for value in headers.get_all("Requires-Dist") or []:
        try:
            requirement = Requirement(" ".join(value.split()))
        except InvalidRequirement:
            continue
        if canonicalize_name(requirement.name) == "torch" and requirement.marker is None:
            return str(requirement.specifier) or None
    return None


def read_torch_pin(wheel: Path | str) -> str | None:
    """The torch pin a wheel's METADATA declares (``==2.13.*``), or None when it has none."""
    with open_wheel(wheel) as archive:
        return torch_pin_of(read_metadata(archive))
