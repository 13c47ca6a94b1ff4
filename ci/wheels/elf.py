"""A minimal ELF64 (little-endian) reader over a seekable binary file object.

Only what the wheel checks need: the section table, the dynamic symbol table
(``.dynsym``/``.dynstr``) with GNU symbol versions (``.gnu.version``,
``.gnu.version_r`` for needs, ``.gnu.version_d`` for definitions), the shared
libraries the file needs (``DT_NEEDED`` in ``.dynamic``), and the location of
named sections (``.nv_fatbin``) so their bytes can be streamed.
Sections are read on demand; nothing but the tables asked for is loaded.

Demangling goes through ``c++filt`` in one batch; without it (or when it
fails) a name stays mangled.
"""

from __future__ import annotations

import shutil
import struct
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import IO

from ci.errors import CheckFailed

ELF_MAGIC = b"\x7fELF"
EM_X86_64 = 62
EM_AARCH64 = 183
EM_CUDA = 190

SHT_DYNAMIC = 6
SHT_DYNSYM = 11
DT_NULL = 0
DT_NEEDED = 1
SHT_GNU_VERDEF = 0x6FFFFFFD
SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF
SHN_UNDEF = 0
SHN_XINDEX = 0xFFFF

STB_NAMES = {0: "LOCAL", 1: "GLOBAL", 2: "WEAK", 10: "GNU_UNIQUE"}
STT_NAMES = {0: "NOTYPE", 1: "OBJECT", 2: "FUNC", 3: "SECTION", 4: "FILE", 5: "COMMON", 6: "TLS", 10: "GNU_IFUNC"}

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_DYN = struct.Struct("<qQ")
_MAX_TABLE = 512 << 20
"""Refuse symbol/string tables beyond this size: a corrupt header, not a real library."""


@dataclass(frozen=True)
class Section:
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    entsize: int


@dataclass(frozen=True)
class DynamicSymbol:
    name: str
    """The mangled name."""
    defined: bool
    binding: str
    kind: str
    version: str | None = None
    """GNU version name (``GLIBCXX_3.4.21``), when the symbol has one."""
    version_file: str | None = None
    """For an undefined versioned symbol: the library the version need names (``libstdc++.so.6``)."""


class ElfFile:
    """Parsed headers of one ELF64 LE file; the file object must stay open while in use."""

    def __init__(self, fp: IO[bytes], label: str = "<elf>") -> None:
        self._fp = fp
        self.label = label
        fp.seek(0)
        raw = fp.read(_EHDR.size)
        if len(raw) < _EHDR.size or raw[:4] != ELF_MAGIC:
            raise CheckFailed(f"{label}: not an ELF file")
        if raw[4] != 2 or raw[5] != 1:
            raise CheckFailed(f"{label}: only 64-bit little-endian ELF files are supported")
        (_, self.elf_type, self.machine, _, _, _, shoff, self.flags, _, _, _, shentsize, shnum, shstrndx) = (
            _EHDR.unpack(raw)
        )
        self.abi_version = raw[8]
        self.sections: tuple[Section, ...] = self._read_sections(shoff, shentsize, shnum, shstrndx)

    # -- low level --------------------------------------------------------
    def _read_at(self, offset: int, size: int) -> bytes:
        self._fp.seek(offset)
        data = self._fp.read(size)
        if len(data) != size:
            raise CheckFailed(f"{self.label}: truncated ELF file (wanted {size} bytes at offset {offset})")
        return data

    def _read_sections(self, shoff: int, shentsize: int, shnum: int, shstrndx: int) -> tuple[Section, ...]:
        if shoff == 0:
            return ()
        if shentsize != _SHDR.size:
            raise CheckFailed(f"{self.label}: unexpected section header size {shentsize}")
        if shnum == 0 or shstrndx == SHN_XINDEX:
            first = _SHDR.unpack(self._read_at(shoff, _SHDR.size))
            shnum = shnum or first[5]
            if shstrndx == SHN_XINDEX:
                shstrndx = first[6]
        if shnum > 1 << 20:
            raise CheckFailed(f"{self.label}: implausible section count {shnum}")
        table = self._read_at(shoff, shnum * _SHDR.size)
        raw = [_SHDR.unpack_from(table, i * _SHDR.size) for i in range(shnum)]
        names = b""
        if 0 < shstrndx < shnum:
            sh = raw[shstrndx]
            names = self._read_at(sh[4], min(sh[5], _MAX_TABLE))
        sections = []
        for name_off, stype, flags, _addr, offset, size, link, info, _align, entsize in raw:
            end = names.find(b"\0", name_off)
            name = names[name_off : end if end >= 0 else len(names)].decode("utf-8", "replace")
            sections.append(Section(name, stype, flags, offset, size, link, info, entsize))
        return tuple(sections)

    def section(self, name: str) -> Section | None:
        for sec in self.sections:
            if sec.name == name:
                return sec
        return None

    def sections_with_prefix(self, *prefixes: str) -> tuple[Section, ...]:
        return tuple(s for s in self.sections if s.name.startswith(prefixes) and s.type != 8)  # 8: SHT_NOBITS

    def read_section(self, section: Section) -> bytes:
        """A whole (small) section; use :meth:`iter_section` for large ones."""
        if section.size > _MAX_TABLE:
            raise CheckFailed(f"{self.label}: section {section.name} is too large to load ({section.size} bytes)")
        return self._read_at(section.offset, section.size)

    def iter_section(self, section: Section, chunk: int = 1 << 20) -> Iterator[bytes]:
        """A section's bytes in bounded chunks."""
        pos, end = section.offset, section.offset + section.size
        while pos < end:
            data = self._read_at(pos, min(chunk, end - pos))
            pos += len(data)
            yield data

    def read_range(self, offset: int, size: int) -> bytes:
        """Bytes at an absolute file offset (for parsers that walk a section)."""
        return self._read_at(offset, size)

    # -- dynamic symbols ----------------------------------------------------
    def _string(self, table: bytes, offset: int) -> str:
        end = table.find(b"\0", offset)
        return table[offset : end if end >= 0 else len(table)].decode("utf-8", "replace")

    def _version_names(self, strtab: bytes) -> tuple[dict[int, str], dict[int, str]]:
        """Version index -> name, and (for needs) index -> library file."""
        names: dict[int, str] = {}
        files: dict[int, str] = {}
        for sec in self.sections:
            if sec.type == SHT_GNU_VERNEED:
                data = self.read_section(sec)
                pos = 0
                for _ in range(sec.info or 1 << 16):
                    if pos + 16 > len(data):
                        break
                    _ver, cnt, file_off, aux, nxt = struct.unpack_from("<HHIII", data, pos)
                    libfile = self._string(strtab, file_off)
                    apos = pos + aux
                    for _ in range(cnt):
                        if apos + 16 > len(data):
                            break
                        _hash, _flags, other, name_off, anext = struct.unpack_from("<IHHII", data, apos)
                        names[other & 0x7FFF] = self._string(strtab, name_off)
                        files[other & 0x7FFF] = libfile
                        if not anext:
                            break
                        apos += anext
                    if not nxt:
                        break
                    pos += nxt
            elif sec.type == SHT_GNU_VERDEF:
                data = self.read_section(sec)
                pos = 0
                for _ in range(sec.info or 1 << 16):
                    if pos + 20 > len(data):
                        break
                    _ver, _flags, ndx, cnt, _hash, aux, nxt = struct.unpack_from("<HHHHIII", data, pos)
                    if cnt and pos + aux + 8 <= len(data):
                        (name_off, _anext) = struct.unpack_from("<II", data, pos + aux)
                        names[ndx & 0x7FFF] = self._string(strtab, name_off)
                    if not nxt:
                        break
                    pos += nxt
        return names, files

    def dynamic_symbols(self) -> Iterator[DynamicSymbol]:
        """Every named global/weak dynamic symbol, defined or not, with its version."""
        dynsym = next((s for s in self.sections if s.type == SHT_DYNSYM), None)
        if dynsym is None or dynsym.entsize not in (0, _SYM.size):
            return
        if not 0 <= dynsym.link < len(self.sections):
            raise CheckFailed(f"{self.label}: .dynsym links to a missing string table")
        strtab = self.read_section(self.sections[dynsym.link])
        versym_sec = next((s for s in self.sections if s.type == SHT_GNU_VERSYM), None)
        versym = self.read_section(versym_sec) if versym_sec else b""
        vnames, vfiles = self._version_names(strtab) if versym else ({}, {})
        table = self.read_section(dynsym)
        for index, (name_off, info, _other, shndx, _value, _size) in enumerate(_SYM.iter_unpack(table)):
            if not name_off:
                continue
            bind = info >> 4
            if bind == 0:  # local
                continue
            version = vfile = None
            if versym and 2 * index + 2 <= len(versym):
                vidx = struct.unpack_from("<H", versym, 2 * index)[0] & 0x7FFF
                if vidx > 1:
                    version = vnames.get(vidx)
                    vfile = vfiles.get(vidx)
            defined = shndx != SHN_UNDEF
            yield DynamicSymbol(
                name=self._string(strtab, name_off),
                defined=defined,
                binding=STB_NAMES.get(bind, str(bind)),
                kind=STT_NAMES.get(info & 0xF, str(info & 0xF)),
                version=version,
                version_file=None if defined else vfile,
            )

    def needed_libraries(self) -> tuple[str, ...]:
        """The shared libraries this file needs (``DT_NEEDED``), in order."""
        dynamic = next((s for s in self.sections if s.type == SHT_DYNAMIC), None)
        if dynamic is None:
            return ()
        if not 0 <= dynamic.link < len(self.sections):
            raise CheckFailed(f"{self.label}: .dynamic links to a missing string table")
        strtab = self.read_section(self.sections[dynamic.link])
        needed = []
        for tag, value in _DYN.iter_unpack(self.read_section(dynamic)[: dynamic.size // _DYN.size * _DYN.size]):
            if tag == DT_NULL:
                break
            if tag == DT_NEEDED:
                needed.append(self._string(strtab, value))
        return tuple(needed)

    def defined_names(self) -> set[str]:
        """Names of all defined global/weak dynamic symbols (the exports)."""
        return {s.name for s in self.dynamic_symbols() if s.defined}

    def undefined_symbols(self) -> tuple[DynamicSymbol, ...]:
        return tuple(s for s in self.dynamic_symbols() if not s.defined)


def is_elf(fp: IO[bytes]) -> bool:
    """True when the stream starts with the ELF magic; the position is restored to 0."""
    fp.seek(0)
    head = fp.read(4)
    fp.seek(0)
    return head == ELF_MAGIC


def demangle(names: Iterable[str]) -> dict[str, str]:
    """Mangled -> demangled for each name, via one ``c++filt`` call; mangled where that fails."""
    unique = sorted(set(names))
    result = {name: name for name in unique}
    cxxfilt = shutil.which("c++filt")
    if not unique or cxxfilt is None:
        return result
    try:
        proc = subprocess.run(
            [cxxfilt], input="\n".join(unique) + "\n", capture_output=True, text=True, timeout=120, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return result
    lines = proc.stdout.splitlines()
    if len(lines) == len(unique):
        result.update(zip(unique, lines, strict=True))
    return result
