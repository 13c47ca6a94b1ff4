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

from ci.base.errors import CheckFailed

ELF_MAGIC = b"\x7fELF"
EM_X86_64 = 62
EM_AARCH64 = 183
EM_CUDA = 190

SHT_DYNAMIC = 6
SHT_NOBITS = 8  # a section with no bytes in the file (.bss)
SHT_DYNSYM = 11
DT_NULL = 0
DT_NEEDED = 1
DT_SONAME = 14
DT_RPATH = 15
DT_RUNPATH = 29
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
"""Refuse to load a whole section beyond this size: a corrupt header, not a real library."""
# Caps a real library never reaches (torch 2.13's libtorch_cpu.so: 75,415 dynamic symbols, a 5 MB .dynstr;
# an ELF has a few dozen sections). A crafted file beyond them is refused in one line instead of costing
# minutes or gigabytes: every loop below is bounded by them.
MAX_SECTIONS = 1 << 16
MAX_DYNAMIC_SYMBOLS = 1 << 20
MAX_STRING_TABLE = 64 << 20
MAX_NAME_BYTES = 64 << 20
"""Total bytes of the symbol names read from one ELF (names may overlap in a crafted string table)."""
MAX_VERSION_TABLE = 1 << 20
_SYMBOL_CHUNK = 4096
_NAME_CACHE = 1 << 16


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
    name_offset: int = 0
    """Where the name starts in ``.dynstr``: one per distinct name in a linked file (linkers merge them)."""


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
        try:
            self._fp.seek(offset)
            data = self._fp.read(size)
        except (OSError, OverflowError, ValueError):  # an offset beyond what the OS can seek to
            data = b""
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
        if shnum > MAX_SECTIONS:
            raise CheckFailed(f"{self.label}: implausible section count {shnum} (a real ELF has far fewer than "
                              f"{MAX_SECTIONS}); refusing it")
        table = self._read_at(shoff, shnum * _SHDR.size)
        raw = [_SHDR.unpack_from(table, i * _SHDR.size) for i in range(shnum)]
        names = _StringTable(b"", self.label)
        if 0 < shstrndx < shnum:
            sh = raw[shstrndx]
            names = _StringTable(self._read_at(sh[4], self._table_size(sh[5], ".shstrtab")), self.label)
        sections = []
        for name_off, stype, flags, _addr, offset, size, link, info, _align, entsize in raw:
            sections.append(Section(names.name(name_off), stype, flags, offset, size, link, info, entsize))
        return tuple(sections)

    def _table_size(self, size: int, what: str, limit: int = MAX_STRING_TABLE) -> int:
        if size > limit:
            raise CheckFailed(f"{self.label}: {what} of {size} bytes is larger than any real library's "
                              f"({limit} bytes at most); refusing it")
        return size

    def section(self, name: str) -> Section | None:
        for sec in self.sections:
            if sec.name == name:
                return sec
        return None

    def sections_with_prefix(self, *prefixes: str) -> tuple[Section, ...]:
        return tuple(s for s in self.sections if s.name.startswith(prefixes) and s.type != SHT_NOBITS)

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

    def copy_to(self, target: IO[bytes]) -> None:
        """The whole file into ``target`` in bounded chunks (for a tool that needs a real file)."""
        self._fp.seek(0)
        shutil.copyfileobj(self._fp, target, 1 << 20)

    # -- dynamic symbols ----------------------------------------------------
    def _version_names(self, strtab: _StringTable) -> tuple[dict[int, str], dict[int, str]]:
        """Version index -> name, and (for needs) index -> library file."""
        names: dict[int, str] = {}
        files: dict[int, str] = {}
        for sec in self.sections:
            if sec.type not in (SHT_GNU_VERNEED, SHT_GNU_VERDEF):
                continue
            data = self._read_at(sec.offset, self._table_size(sec.size, "a symbol version table", MAX_VERSION_TABLE))
            # Records are at least 8 bytes and never overlap in a real table: more steps than that means the
            # offsets loop back on themselves.
            steps = len(data) // 8 + 1
            pos = 0
            for _ in range(sec.info or 1 << 16):
                if sec.type == SHT_GNU_VERNEED:
                    if pos + 16 > len(data):
                        break
                    _ver, cnt, file_off, aux, nxt = struct.unpack_from("<HHIII", data, pos)
                    libfile = strtab.name(file_off)
                    apos = pos + aux
                    for _ in range(cnt):
                        steps -= 1
                        if apos + 16 > len(data) or steps < 0:
                            break
                        _hash, _flags, other, name_off, anext = struct.unpack_from("<IHHII", data, apos)
                        names[other & 0x7FFF] = strtab.name(name_off)
                        files[other & 0x7FFF] = libfile
                        if not anext:
                            break
                        apos += anext
                else:
                    if pos + 20 > len(data):
                        break
                    _ver, _flags, ndx, cnt, _hash, aux, nxt = struct.unpack_from("<HHHHIII", data, pos)
                    if cnt and pos + aux + 8 <= len(data):
                        (name_off, _anext) = struct.unpack_from("<II", data, pos + aux)
                        names[ndx & 0x7FFF] = strtab.name(name_off)
                steps -= 1
                if not nxt or steps < 0:
                    break
                pos += nxt
        return names, files

    def dynamic_symbols(self) -> Iterator[DynamicSymbol]:
        """Every named global/weak dynamic symbol, defined or not, with its version.

        The symbol table is streamed in bounded chunks; the caps above bound time and memory.
        """
        dynsym = next((s for s in self.sections if s.type == SHT_DYNSYM), None)
        if dynsym is None or dynsym.entsize not in (0, _SYM.size):
            return
        if not 0 <= dynsym.link < len(self.sections):
            raise CheckFailed(f"{self.label}: .dynsym links to a missing string table")
        count = dynsym.size // _SYM.size
        if count > MAX_DYNAMIC_SYMBOLS:
            raise CheckFailed(f"{self.label}: .dynsym holds {count} symbols, more than any real library "
                              f"({MAX_DYNAMIC_SYMBOLS} at most); refusing it")
        link = self.sections[dynsym.link]
        strtab = _StringTable(self._read_at(link.offset, self._table_size(link.size, ".dynstr")), self.label)
        versym_sec = next((s for s in self.sections if s.type == SHT_GNU_VERSYM), None)
        versym = b""
        if versym_sec:
            versym = self._read_at(versym_sec.offset, self._table_size(versym_sec.size, ".gnu.version", 2 * count + 2))
        vnames, vfiles = self._version_names(strtab) if versym else ({}, {})
        for first in range(0, count, _SYMBOL_CHUNK):
            chunk = self._read_at(dynsym.offset + first * _SYM.size, min(_SYMBOL_CHUNK, count - first) * _SYM.size)
            for index, (name_off, info, _other, shndx, _value, _size) in enumerate(_SYM.iter_unpack(chunk), first):
                bind = info >> 4
                if not name_off or bind == 0:  # unnamed or local
                    continue
                version = vfile = None
                if versym and 2 * index + 2 <= len(versym):
                    vidx = struct.unpack_from("<H", versym, 2 * index)[0] & 0x7FFF
                    if vidx > 1:
                        version = vnames.get(vidx)
                        vfile = vfiles.get(vidx)
                defined = shndx != SHN_UNDEF
                yield DynamicSymbol(
                    name=strtab.name(name_off),
                    defined=defined,
                    binding=STB_NAMES.get(bind, str(bind)),
                    kind=STT_NAMES.get(info & 0xF, str(info & 0xF)),
                    version=version,
                    version_file=None if defined else vfile,
                    name_offset=name_off,
                )

    def needed_libraries(self) -> tuple[str, ...]:
        """The shared libraries this file needs (``DT_NEEDED``), in order."""
        return tuple(name for _, name in self.dynamic_strings(DT_NEEDED))

    def soname(self) -> str | None:
        """The name a library is needed by (``DT_SONAME``), if it has one."""
        return next((name for _, name in self.dynamic_strings(DT_SONAME)), None)

    def dynamic_strings(self, *tags: int) -> list[tuple[int, str]]:
        """(tag, string) for each ``.dynamic`` entry with one of ``tags``, whose value is a name in the dynamic
        string table (``DT_NEEDED``, ``DT_RPATH``, ``DT_RUNPATH``...), in order."""
        dynamic = next((s for s in self.sections if s.type == SHT_DYNAMIC), None)
        if dynamic is None:
            return []
        if not 0 <= dynamic.link < len(self.sections):
            raise CheckFailed(f"{self.label}: .dynamic links to a missing string table")
        link = self.sections[dynamic.link]
        strtab = _StringTable(self._read_at(link.offset, self._table_size(link.size, ".dynstr")), self.label)
        entries = self._read_at(dynamic.offset, self._table_size(dynamic.size, ".dynamic"))
        found = []
        for tag, value in _DYN.iter_unpack(entries[: len(entries) // _DYN.size * _DYN.size]):
            if tag == DT_NULL:
                break
            if tag in tags:
                found.append((tag, strtab.name(value)))
        return found


class _StringTable:
    """NUL-terminated names in one string table, read with a budget.

    Names may overlap (every offset into a long run of bytes is a name), so the bytes read for
    names are counted: past :data:`MAX_NAME_BYTES` the file is refused. Repeated offsets are cached.
    """

    def __init__(self, data: bytes, label: str) -> None:
        self._data = data
        self._label = label
        self._budget = MAX_NAME_BYTES
        self._cache: dict[int, str] = {}

    def name(self, offset: int) -> str:
        cached = self._cache.get(offset)
        if cached is not None:
            return cached
        end = self._data.find(b"\0", offset, offset + self._budget + 1)
        if end < 0:
            end = min(len(self._data), offset + self._budget + 1)
        self._budget -= max(0, end - offset)
        if self._budget < 0:
            raise CheckFailed(f"{self._label}: the names of one string table add up to more than {MAX_NAME_BYTES} "
                              "bytes, more than any real library's; refusing it")
        name = self._data[offset:end].decode("utf-8", "replace")
        if len(self._cache) < _NAME_CACHE:
            self._cache[offset] = name
        return name


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
