"""Which CUDA architectures a wheel's device code covers.

Every ELF member (``*.so``, ``*.so.*``, ``*.cubin``) is read in place from the
wheel in bounded chunks (a wheel of any size keeps memory flat), then:

- with ``cuobjdump`` available (PATH, or ``<cuda_home>/bin``): a member with a
  fatbin section is copied to a temporary file for it, and
  ``cuobjdump --list-elf --list-ptx`` names each embedded cubin/PTX. It names a
  family cubin by its base (cuobjdump 13.2 lists nvcc 13.0's ``sm_120f`` as
  ``sm_120``), so the family flag is taken from the containers' own headers;
- otherwise the fatbin containers in the ELF's ``.nv_fatbin*``/``__nv_relfatbin``
  sections are parsed here. Container: a 16-byte header (``u32`` magic
  ``0xBA55ED50``, or ``0x466243B1`` for relocatable code; ``u16`` version 1;
  ``u16`` header size 16; ``u64`` size of the entries that follow), then entries
  back to back, each a header of ``u32`` size at offset 4 (64, 80 or 112 bytes)
  with ``u16`` kind at 0 (1 = PTX, 2 = ELF cubin), ``u64`` payload size at 8,
  ``u32`` SM number at 28 (80, 90, 100, 120) and ``u64`` flags at 40 (bit 20:
  arch-specific ``a``, bit 21: family ``f``), followed by the payload. Only
  headers are read; payloads are skipped by offset.
- a section that holds no container is searched for ``sm_XX`` strings
  (documented fallback, reported as method ``regex``).

The work is linear in the bytes read: candidate containers are found by one regex
over the whole 8-byte header prefix (a section of bare magics costs no Python step
per magic), and the container and kernel headers one wheel may cost are capped
(:data:`MAX_FATBIN_HEADERS`, one refusal line).

A standalone cubin (``e_machine`` 190) names its SM in ``e_flags``. Host ELFs
without a fatbin section contribute nothing (never scanned whole).
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ci.base.errors import CheckFailed
from ci.formats.archive import WheelArchive, open_wheel
from ci.formats.archs import ArchList, CudaArch, fallback, format_archs, missing_archs, stray_archs
from ci.formats.elf import EM_CUDA, ElfFile, Section, is_elf

FATBIN_MAGICS = (0xBA55ED50, 0x466243B1)
FATBIN_SECTION_PREFIXES = (".nv_fatbin", "__nv_relfatbin")
_CONTAINER = struct.Struct("<IHHQ")
_VERSION, _HEADER_SIZE = 1, _CONTAINER.size
# magic, version 1, header size 16: a container header's first 8 bytes, matched in C
_ANY_CONTAINER = re.compile(
    b"(?:" + b"|".join(re.escape(struct.pack("<I", m)) for m in FATBIN_MAGICS) + b")"
    + re.escape(struct.pack("<HH", _VERSION, _HEADER_SIZE))
)
MAX_FATBIN_HEADERS = 1 << 20
"""Container and kernel headers read in one wheel's fat binaries. A container holds one translation unit's
kernels, one entry per arch and PTX: a real wheel reads a few thousand (upstream extensions), torch's own
libtorch_cuda.so some tens of thousands."""
_ENTRY = struct.Struct("<HHIQ")
_KIND_PTX = 1
_KIND_CUBIN = 2
_FLAG_ARCH_SPECIFIC = 1 << 20
_FLAG_FAMILY = 1 << 21
_SM_RE = re.compile(rb"(sm|compute)_(\d{2,3})([af]?)(?![0-9a-z])")
_CUOBJDUMP_LINE = re.compile(r"^(ELF|PTX) file\s+\d+:.*?\bsm_(\d{2,3})([af]?)\b")
_SEARCH_CHUNK = 1 << 20


@dataclass(frozen=True)
class MemberArchs:
    member: str
    cubins: tuple[CudaArch, ...]
    ptx: tuple[CudaArch, ...]
    method: str
    """``cuobjdump``, ``fatbin`` (our container parser), ``regex`` (fallback) or ``cubin`` (ELF header)."""


@dataclass(frozen=True)
class ArchScan:
    wheel: str
    members: tuple[MemberArchs, ...]
    """Only members that carry device code."""

    @property
    def cubin_archs(self) -> tuple[CudaArch, ...]:
        return tuple(sorted({a for m in self.members for a in m.cubins}))

    @property
    def ptx_archs(self) -> tuple[CudaArch, ...]:
        return tuple(sorted({a for m in self.members for a in m.ptx}))

    @property
    def base_archs(self) -> tuple[CudaArch, ...]:
        return tuple(sorted({a.base for a in self.cubin_archs}))

    def cubins_by_member(self) -> dict[str, list[str]]:
        """Each member's cubin targets (``sm_90``, ``sm_100a``...), in arch order; members with PTX alone are left
        out. What a device record lists per shared object."""
        return {m.member: [a.sm for a in m.cubins] for m in self.members if m.cubins}


def find_cuobjdump(cuda_home: Path | str | None = None) -> Path | None:
    """cuobjdump on PATH, else under ``cuda_home/bin``; None when absent."""
    found = shutil.which("cuobjdump")
    if found:
        return Path(found)
    if cuda_home is not None:
        candidate = Path(cuda_home) / "bin" / "cuobjdump"
        if candidate.is_file():
            return candidate
    return None


def _arch(sm: int, flags: int = 0) -> CudaArch:
    suffix = "a" if flags & _FLAG_ARCH_SPECIFIC else ("f" if flags & _FLAG_FAMILY else "")
    return CudaArch.from_sm(sm, suffix)


class HeaderBudget:
    """How many more fatbin headers one wheel may cost (:data:`MAX_FATBIN_HEADERS`); refused once, then spent."""

    def __init__(self, limit: int = MAX_FATBIN_HEADERS) -> None:
        self.limit = limit
        self.left = limit

    @property
    def spent(self) -> bool:
        return self.left < 0

    def spend(self, label: str) -> None:
        self.left -= 1
        if self.left < 0:
            raise CheckFailed(f"{label}: the wheel's fat binaries hold more than {self.limit} container and kernel "
                              "headers, more than any real wheel; refusing it")


def _scan_section(elf: ElfFile, section: Section, cubins: set[CudaArch], ptx: set[CudaArch],
                  budget: HeaderBudget) -> int:
    """Parse the fatbin containers of one section; returns how many were found.

    Linear in the section size: candidate headers are found by one regex search in the chunk already
    read, and a chunk is read again only after moving past all but its last header's worth of bytes (a
    section filled with the magic used to cost one 1 MiB read per 4 bytes).
    """
    pos, end = section.offset, section.offset + section.size
    containers = 0
    while pos + _CONTAINER.size <= end:
        base = pos
        chunk = elf.read_range(base, min(_SEARCH_CHUNK, end - base))
        at = 0
        while True:
            if at + _CONTAINER.size > len(chunk):  # past the chunk, or a header straddling it: read from there
                pos = base + max(at, 1)
                break
            magic, version, header_size, body = _CONTAINER.unpack_from(chunk, at)
            if magic in FATBIN_MAGICS and version == _VERSION and header_size == _HEADER_SIZE:
                budget.spend(elf.label)
                containers += 1
                start = base + at
                stop = min(start + header_size + body, end)
                _scan_entries(elf, start + header_size, stop, cubins, ptx, budget)
                at = max(stop, start + _CONTAINER.size) - base  # the next container may be in this chunk
                continue
            hit = _ANY_CONTAINER.search(chunk, at + 1)  # one search: scans only up to the next header
            if hit is None:
                # keep the last bytes: a magic may start there and continue in the next chunk
                pos = base + max(1, len(chunk) - (_CONTAINER.size - 1))
                break
            at = hit.start()
    return containers


def _scan_entries(elf: ElfFile, entry: int, stop: int, cubins: set[CudaArch], ptx: set[CudaArch],
                  budget: HeaderBudget) -> None:
    """The entry headers of one container; each step moves at least one 64-byte header forward."""
    while entry + 64 <= stop:
        budget.spend(elf.label)
        raw = elf.read_range(entry, 64)
        kind, _unknown, entry_size, payload = _ENTRY.unpack_from(raw)
        if entry_size < 64:
            break
        sm = struct.unpack_from("<I", raw, 28)[0]
        flags = struct.unpack_from("<Q", raw, 40)[0]
        if 10 <= sm < 1000:
            if kind & _KIND_CUBIN or kind == 0x10:
                cubins.add(_arch(sm, flags))
            elif kind & _KIND_PTX:
                ptx.add(_arch(sm, flags))
        entry += entry_size + payload


def _regex_section(elf: ElfFile, section: Section, cubins: set[CudaArch], ptx: set[CudaArch]) -> None:
    tail = b""
    for chunk in elf.iter_section(section):
        data = tail + chunk
        for kind, sm, suffix in set(_SM_RE.findall(data)):  # distinct in C: a section of sm_ strings is cheap
            arch = CudaArch.from_sm(int(sm), suffix.decode())
            (cubins if kind == b"sm" else ptx).add(arch)
        tail = data[-16:]


def _cuobjdump(tool: Path, path: Path, label: str) -> tuple[set[CudaArch], set[CudaArch]]:
    try:
        proc = subprocess.run(
            [str(tool), "--list-elf", "--list-ptx", str(path)], capture_output=True, text=True, timeout=300
        )
    except (OSError, subprocess.SubprocessError) as exc:
        raise CheckFailed(f"{label}: cuobjdump failed ({exc}); check the CUDA toolkit install") from None
    cubins: set[CudaArch] = set()
    ptx: set[CudaArch] = set()
    for line in proc.stdout.splitlines():
        match = _CUOBJDUMP_LINE.match(line.strip())
        if match:
            arch = CudaArch.from_sm(int(match.group(2)), match.group(3))
            (cubins if match.group(1) == "ELF" else ptx).add(arch)
    return cubins, ptx


def _with_families(listed: set[CudaArch], parsed: set[CudaArch]) -> set[CudaArch]:
    """cuobjdump's targets, each plain one that the container headers flag as a family target (``f``) renamed so."""
    family = {arch.base for arch in parsed if arch.suffix == "f"}
    return {CudaArch(a.major, a.minor, "f") if not a.suffix and a.base in family else a for a in listed}


def scan_elf(member: str, elf: ElfFile, cuobjdump: Path | None = None,
             budget: HeaderBudget | None = None) -> MemberArchs | None:
    """The device code of one ELF; None when it has none. ``budget``: the wheel's, shared by its members."""
    budget = budget or HeaderBudget()
    cubins: set[CudaArch] = set()
    ptx: set[CudaArch] = set()
    if elf.machine == EM_CUDA:
        sm = (elf.flags >> 8) & 0xFF if elf.abi_version >= 8 else elf.flags & 0xFF
        return MemberArchs(member, (CudaArch.from_sm(sm),), (), "cubin") if sm else None
    sections = elf.sections_with_prefix(*FATBIN_SECTION_PREFIXES)
    if not sections or budget.spent:
        return None
    method = "fatbin"
    for section in sections:
        if not _scan_section(elf, section, cubins, ptx, budget):
            _regex_section(elf, section, cubins, ptx)
            method = "regex"
    if cuobjdump is not None:
        with tempfile.TemporaryDirectory(prefix="wheel-cuobjdump-") as tmp:
            copy = Path(tmp) / "member.so"
            with open(copy, "wb") as out:
                elf.copy_to(out)
            listed_cubins, listed_ptx = _cuobjdump(cuobjdump, copy, member)
        cubins, ptx = _with_families(listed_cubins, cubins), _with_families(listed_ptx, ptx)
        method = "cuobjdump"
    if not cubins and not ptx:
        return None
    return MemberArchs(member, tuple(sorted(cubins)), tuple(sorted(ptx)), method)


def scan_archive_archs(archive: WheelArchive, cuobjdump: Path | None = None) -> ArchScan:
    """Scan every ELF member of an open wheel, each read in place."""
    budget = HeaderBudget()
    scans = []
    for member, stream in archive.shared_objects():
        if is_elf(stream):
            scans.append(scan_elf(member.name, ElfFile(stream, member.name), cuobjdump, budget))
    return ArchScan(archive.wheel_name.filename, tuple(found for found in scans if found is not None))


def scan_wheel_archs(wheel: Path | str, *, cuda_home: Path | str | None = None, use_cuobjdump: bool = True) -> ArchScan:
    """The CUDA architectures of a wheel's device code (cuobjdump when found, else our parser)."""
    tool = find_cuobjdump(cuda_home) if use_cuobjdump else None
    with open_wheel(wheel) as archive:
        return scan_archive_archs(archive, tool)


STANDALONE_CUBINS = "standalone cubins"
"""The member name the arch gate gives a wheel's ``.cubin`` files, taken together (each holds one target)."""


def arch_problems(scan: ArchScan, required: ArchList, accepted: Iterable[CudaArch] = ()) -> tuple[str, ...]:
    """One line per shared object whose device code does not hold every entry of ``required`` as its exact target
    (missing, or reached only through a family member's cubin, another flavour or PTX), and per shared object with
    cubins the list does not ask for, but the exact targets in ``accepted``; the wheel's ``.cubin`` files count as
    one object."""
    if not scan.members:
        return (f"{scan.wheel}: device code is missing required CUDA arch(es) {format_archs(required.archs)} "
                "(found cubins for none); add them to TORCH_CUDA_ARCH_LIST and rebuild",)
    extra = tuple(accepted)
    problems = [line for member, cubins, ptx in _device_groups(scan)
                for line in _member_problems(scan.wheel, member, cubins, ptx, required, extra)]
    if required.ptx and not scan.ptx_archs:
        problems.append(f"{scan.wheel}: +PTX was required but the wheel embeds no PTX; build with +PTX")
    return tuple(problems)


def _device_groups(scan: ArchScan) -> list[tuple[str, tuple[CudaArch, ...], tuple[CudaArch, ...]]]:
    groups = [(m.member, m.cubins, m.ptx) for m in scan.members if m.method != "cubin"]
    standalone = [m for m in scan.members if m.method == "cubin"]
    if standalone:
        groups.append((STANDALONE_CUBINS, tuple(sorted({a for m in standalone for a in m.cubins})), ()))
    return groups


def _member_problems(wheel: str, member: str, cubins: tuple[CudaArch, ...], ptx: tuple[CudaArch, ...],
                     required: ArchList, accepted: tuple[CudaArch, ...]) -> list[str]:
    problems = []
    missing = missing_archs(required, cubins)
    absent = [arch for arch in missing if fallback(arch, cubins, ptx) is None]
    if absent:
        problems.append(f"{wheel}: {member}: device code is missing required CUDA arch(es) {format_archs(absent)} "
                        f"(found cubins for {format_archs(cubins)}); add them to TORCH_CUDA_ARCH_LIST and rebuild")
    for arch in missing:
        how = fallback(arch, cubins, ptx)
        if how is not None:
            problems.append(f"{wheel}: {member}: {arch} is covered only through {how}; the arch list asks for the "
                            f"exact target {arch.sm}: build that -gencode (code={arch.sm})")
    stray = stray_archs(required, cubins, accepted)
    if stray:
        problems.append(f"{wheel}: {member}: cubins for {', '.join(a.sm for a in stray)}, which the arch list "
                        f"({required}) does not ask for: nvcc's default arch of a device link (-dlink) or a compile "
                        "without -gencode; pass the list's -gencode flags to every nvcc step, the device link too, or, "
                        "where the component's own build adds them on purpose, name them with the reason in its "
                        "extra_cubins in versions.yaml")
    return problems


def union_archs(scans: Iterable[ArchScan]) -> tuple[CudaArch, ...]:
    return tuple(sorted({a for s in scans for a in s.cubin_archs}))
