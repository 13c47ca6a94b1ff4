"""What every built wheel carries before its checks: the torch pin and the SBOM, in one raw copy.

The build runs this after the builder (and auditwheel's repair), before the wheel checks, so the
checks see the bytes that are published. Each ELF member is streamed out once: its ``DT_NEEDED``
says whether it links torch (ci/checks/pin.py), the fatbin parser says which archs it carries, and
its sha256 goes into the SBOM (ci/building/sbom.py). Then the wheel is rewritten in place by the raw-copy
writer (ci/formats/rewrite.py): METADATA replaced when the pin changes it, the SBOM added under
``.dist-info/sboms/`` beside any SBOM auditwheel wrote there, RECORD updated, every other member
copied as it is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

from ci.base import log
from ci.base.digest import sha256_stream
from ci.building import sbom
from ci.checks import pin
from ci.formats.archive import open_wheel
from ci.formats.elf import ElfFile, is_elf
from ci.formats.fatbin import HeaderBudget, scan_elf
from ci.formats.metadata import read_metadata
from ci.formats.rewrite import add_members
from ci.model.matrix import MatrixRow

_LOG = log.get("stamp")


@dataclass(frozen=True)
class Stamped:
    wheel: Path
    torch_pin: str | None
    """The specifier written (``==2.13.*``), or None: no shared object links torch, or ``torch_pin: none``."""
    links_torch: bool


def stamp_wheel(wheel: Path, *, torch_version: str, pin_mode: str, facts: Mapping[str, Any]) -> Stamped:
    """Pin torch in ``wheel``'s METADATA (when an ELF member links torch) and write its SBOM, in place."""
    with open_wheel(wheel) as archive:
        label = archive.wheel_name.filename
        metadata_name = f"{archive.dist_info}/METADATA"
        sbom_name = f"{archive.dist_info}/{sbom.SBOM_NAME}"
        shared = []
        budget = HeaderBudget()  # the wheel's, as in the checks
        for member, stream in archive.shared_objects():  # read in place: nothing extracted
            digest = sha256_stream(stream)
            if not is_elf(stream):  # (rewinds) the checks that follow refuse it by name
                shared.append(sbom.SharedObject(member.name, digest, (), (), ()))
                continue
            elf = ElfFile(stream, member.name)
            scan = scan_elf(member.name, elf, budget=budget)
            shared.append(sbom.SharedObject(member.name, digest, pin.torch_libraries_of(elf),
                                            scan.cubins if scan else (), scan.ptx if scan else ()))
        metadata = read_metadata(archive)
    links_torch = any(s.torch_libraries for s in shared)
    specifier = pin.torch_specifier(torch_version, pin_mode) if links_torch else None
    replaced = {}
    if specifier is not None:
        pinned = pin.pinned_metadata(metadata, specifier, label)
        if pinned != metadata:
            replaced[metadata_name] = pinned
    headers = _name_and_version(replaced.get(metadata_name, metadata))
    document = sbom.document(*headers, filename=label, facts=facts, shared_objects=shared, torch_pin=specifier)
    add_members(wheel, wheel, {sbom_name: sbom.dumps(document)}, replaced)
    return Stamped(wheel, specifier, links_torch)


def _name_and_version(metadata: bytes) -> tuple[str, str]:
    headers = HeaderParser().parsestr(metadata.decode("utf-8"))  # read_metadata checked both are there
    return str(headers["Name"]).strip(), str(headers["Version"]).strip()


def describe_plan(row: MatrixRow) -> str:
    """What the build writes into each wheel, for the plan."""
    specifier = pin.torch_specifier(row.torch, row.settings.torch_pin)
    pinned = f"Requires-Dist: torch{specifier}" if specifier else "no torch pin (torch_pin: none)"
    return f"{pinned} where an ELF member links torch, and the SBOM .dist-info/{sbom.SBOM_NAME}"


def stamp_wheels(row: MatrixRow, wheels: Sequence[Path], facts: Mapping[str, Any]) -> list[Stamped]:
    """:func:`stamp_wheel` for each wheel of a build, with the row's torch and its ``torch_pin`` setting."""
    stamped = []
    for wheel in wheels:
        result = stamp_wheel(wheel, torch_version=row.torch, pin_mode=row.settings.torch_pin, facts=facts)
        pinned = f"Requires-Dist: torch{result.torch_pin}" if result.torch_pin else (
            "torch_pin: none" if result.links_torch else "links no torch, requirements kept")
        _LOG.info(f"{wheel.name}: {pinned}; SBOM {sbom.SBOM_NAME}")
        stamped.append(result)
    return stamped
