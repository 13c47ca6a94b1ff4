"""Crafted wheels that once stalled or exhausted the checks (the fatbin scan, the dynamic-symbol reader).

Each is a small wheel whose one extension module is a minimal ELF64 with chosen sections. The tests
check them under a timeout and a memory limit; ``benchmarks/hostile.py`` times them.
"""

from __future__ import annotations

import struct
import zipfile
from pathlib import Path

from tests.wheel_factory import build_wheel

SO = "demo_pkg/_C.cpython-311-x86_64-linux-gnu.so"
FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
_SYM = struct.Struct("<IBBHQQ")
SHT_PROGBITS, SHT_STRTAB, SHT_DYNSYM = 1, 3, 11


def elf(sections: list[tuple[str, int, bytes, int, int]], *, shoff: int | None = None) -> bytes:
    """A minimal ELF64 LE shared object; ``sections`` = [(name, type, data, link, entsize)]."""
    everything = [*sections, (".shstrtab", SHT_STRTAB, b"", 0, 0)]
    names = b"\0" + b"".join(s[0].encode() + b"\0" for s in everything)
    everything[-1] = (".shstrtab", SHT_STRTAB, names, 0, 0)
    body, offsets = b"", []
    for section in everything:
        offsets.append(64 + len(body))
        body += section[2] + b"\0" * (-len(section[2]) % 8)
    headers, name_off = b"\0" * 64, 1
    for (name, kind, data, link, entsize), offset in zip(everything, offsets, strict=True):
        headers += struct.pack("<IIQQQQIIQQ", name_off, kind, 0, 0, offset, len(data), link, 0, 1, entsize)
        name_off += len(name) + 1
    count = len(everything) + 1
    header = struct.pack("<16sHHIQQQIHHHHHH", b"\x7fELF\2\1\1" + b"\0" * 9, 3, 62, 1, 0, 0,
                         64 + len(body) if shoff is None else shoff, 0, 64, 0, 0, 64, count, count - 1)
    return header + body + headers


def undefined_symbols(count: int, name_offset: int | None = 1) -> bytes:
    """``count`` global undefined symbols; all at ``name_offset``, or symbol i at offset i + 1 when None."""
    if name_offset is not None:
        return _SYM.pack(0, 0, 0, 0, 0, 0) + _SYM.pack(name_offset, 0x12, 0, 0, 0, 0) * (count - 1)
    return _SYM.pack(0, 0, 0, 0, 0, 0) + b"".join(_SYM.pack(i, 0x12, 0, 0, 0, 0) for i in range(1, count))


def _wheel(out: Path, case: str, so: bytes, compression: int = zipfile.ZIP_DEFLATED) -> Path:
    return build_wheel(out / case, {"demo_pkg/__init__.py": b"", SO: so}, compression=compression)


def fatbin_flood(out: Path, mib: int = 1) -> Path:
    """A ``.nv_fatbin`` filled with the container magic (wrong version field): quadratic for the old scan."""
    return _wheel(out, f"fatbin-flood-{mib}mib", elf([(".nv_fatbin", SHT_PROGBITS, FATBIN_MAGIC * (mib << 18), 0, 0)]))


def fatbin_empty_containers(out: Path, mib: int = 1) -> Path:
    """Back-to-back valid 16-byte container headers with empty bodies: one fresh chunk read each, once."""
    header = struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 0)
    return _wheel(out, f"fatbin-containers-{mib}mib",
                  elf([(".nv_fatbin", SHT_PROGBITS, header * (mib << 16), 0, 0)]))


def dynsym_bomb(out: Path, mib: int = 64) -> Path:
    """A ``.dynsym`` of ``mib`` MiB, every symbol an undefined c10 function: 698 MB of memory before.

    Stored, not deflated: at 400:1 the archive's ratio cap would refuse it before the symbol reader is reached.
    """
    count = (mib << 20) // _SYM.size
    strings = b"\0_ZN3c104TestEv\0"
    return _wheel(out, f"dynsym-bomb-{mib}mib", elf([(".dynstr", SHT_STRTAB, strings, 0, 0),
                                                    (".dynsym", SHT_DYNSYM, undefined_symbols(count), 1, _SYM.size)]),
                  zipfile.ZIP_STORED)


def overlapping_names(out: Path, symbols: int = 200_000, string_mib: int = 16) -> Path:
    """Symbol i named from offset i of one long unterminated run: names overlap, total length quadratic."""
    strings = b"\0_ZN3c10" + b"A" * ((string_mib << 20) - 8)
    return _wheel(out, "overlapping-names", elf([(".dynstr", SHT_STRTAB, strings, 0, 0),
                                                 (".dynsym", SHT_DYNSYM, undefined_symbols(symbols, None), 1,
                                                  _SYM.size)]))


def fatbin_flood_members(out: Path, mib: int, members: int) -> Path:
    """``members`` extension modules, each a ``.nv_fatbin`` of ``mib`` MiB of magics: deflate's 1000:1 per member."""
    so = elf([(".nv_fatbin", SHT_PROGBITS, FATBIN_MAGIC * (mib << 18), 0, 0)])
    return build_wheel(out / f"fatbin-{mib}mib-x{members}",
                       {"demo_pkg/__init__.py": b"", **{SO.replace("_C", f"_C{k}"): so for k in range(members)}})


def distinct_torch_symbols(out: Path, members: int, count: int) -> Path:
    """``members`` extension modules, each referencing ``count`` distinct c10-looking symbols torch lacks."""
    strings = bytearray(b"\0")
    symbols = bytearray(_SYM.pack(0, 0, 0, 0, 0, 0))
    for i in range(count):
        symbols += _SYM.pack(len(strings), 0x12, 0, 0, 0, 0)
        strings += b"_ZN3c109X%08dEv\0" % i  # c10::X00000000()
    so = elf([(".dynstr", SHT_STRTAB, bytes(strings), 0, 0), (".dynsym", SHT_DYNSYM, bytes(symbols), 1, _SYM.size)])
    return build_wheel(out / f"symbols-{count}-x{members}",
                       {"demo_pkg/__init__.py": b"", **{SO.replace("_C", f"_C{k}"): so for k in range(members)}})


def fatbin_container(sm: int = 90, entries: int = 1) -> bytes:
    """A fatbin container holding ``entries`` empty cubin entries for ``sm_<sm>`` (what nvcc embeds, minus code)."""
    entry = struct.pack("<HHIQ", 2, 0, 64, 0) + bytes(12) + struct.pack("<I", sm) + bytes(32)  # SM at offset 28
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, 64 * entries) + entry * entries


def huge_section_offset(out: Path) -> Path:
    """A section whose offset is 2**62: seeking there used to raise OSError."""
    so = bytearray(elf([(".nv_fatbin", SHT_PROGBITS, b"x" * 64, 0, 0)]))
    shoff = struct.unpack_from("<Q", so, 40)[0]
    struct.pack_into("<Q", so, shoff + 64 + 24, 1 << 62)  # section 1's sh_offset
    return _wheel(out, "huge-offset", bytes(so))


CRAFTED = {
    "fatbin flood 1 MiB": fatbin_flood,
    "fatbin flood 4 MiB": lambda out: fatbin_flood(out, 4),
    "empty fatbin containers 4 MiB": lambda out: fatbin_empty_containers(out, 4),
    "dynsym bomb 64 MiB": dynsym_bomb,
    "dynsym 16 MiB (under the cap)": lambda out: dynsym_bomb(out, 16),
    "overlapping symbol names": overlapping_names,
}
"""Name -> maker(out_dir) of every crafted wheel (the benchmark times each)."""


def header_mismatch(out: Path, version: str = "1.0+cu130") -> Path:
    """The central directory names a harmless file, its local file header a ``../`` path of the same length."""
    central = "demo_pkg/zzzzzzzzzzzzzzzzzzzzzzzzzzz.py"
    local = "../../../../../../../tmp/escaped.py"
    local += "x" * (len(central) - len(local))
    wheel = build_wheel(out / "header-mismatch", {"demo_pkg/__init__.py": b"", central: b"print(1)\n"},
                        version=version)
    data = bytearray(wheel.read_bytes())
    at = data.find(central.encode())  # the first occurrence is the local header's
    data[at:at + len(central)] = local.encode()
    wheel.write_bytes(bytes(data))
    return wheel
