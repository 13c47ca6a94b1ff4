"""The anchor's ``ci/cuda_archs.py`` ``wheel_cuda_archs(wheel)`` (reference §6), without cuobjdump.

Behaviour reproduced:

- every zip member whose name ends in ``.so``, contains ``.so.`` or ends in ``.cubin`` is read
  **whole into memory** (``archive.read``);
- a minimal ELF parser finds the sections named ``.nv_fatbin*`` and regex-scans them for
  ``(sm|compute)_(\\d{2,3})([a-z]?)``; a whole blob is scanned only when it is not ELF or its
  ``e_machine`` is 190 (EM_CUDA); host ELFs without a fatbin contribute nothing;
- ``base_arch("9.0a") == "9.0"``: coverage is compared on base arches.

The anchor also runs ``cuobjdump --list-elf --list-ptx`` when it finds the tool (after writing
the member to a temp file); the benchmarks compare both sides without cuobjdump.

Usable as a script: ``python -m benchmarks.anchor.cuda_archs WHEEL`` prints the archs as JSON
and the process's peak RSS (VmHWM).
"""

from __future__ import annotations

import json
import re
import struct
import sys
import zipfile

ARCH_RE = re.compile(rb"(sm|compute)_(\d{2,3})([a-z]?)")
EM_CUDA = 190


def _is_candidate(name: str) -> bool:
    return name.endswith(".so") or ".so." in name or name.endswith(".cubin")


def _token(digits: bytes, suffix: bytes) -> str:
    text = digits.decode()
    return f"{text[:-1]}.{text[-1]}{suffix.decode()}"


def base_arch(token: str) -> str:
    return token.rstrip("abcdefghijklmnopqrstuvwxyz")


def _fatbin_sections(blob: bytes) -> list[bytes] | None:
    """The ``.nv_fatbin*`` sections of an ELF64/32 blob; None when the blob should be scanned whole."""
    if blob[:4] != b"\x7fELF":
        return None
    is64 = blob[4] == 2
    endian = "<" if blob[5] == 1 else ">"
    machine = struct.unpack_from(endian + "H", blob, 18)[0]
    if machine == EM_CUDA:
        return None
    if is64:
        shoff = struct.unpack_from(endian + "Q", blob, 0x28)[0]
        shentsize, shnum, shstrndx = struct.unpack_from(endian + "HHH", blob, 0x3A)
        fmt = endian + "IIQQQQIIQQ"
    else:
        shoff = struct.unpack_from(endian + "I", blob, 0x20)[0]
        shentsize, shnum, shstrndx = struct.unpack_from(endian + "HHH", blob, 0x2E)
        fmt = endian + "IIIIIIIIII"
    headers = [struct.unpack_from(fmt, blob, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx]
    str_off = strtab[4]
    out = []
    for h in headers:
        name_end = blob.index(b"\0", str_off + h[0])
        name = blob[str_off + h[0]: name_end].decode(errors="replace")
        if name.startswith(".nv_fatbin"):
            out.append(blob[h[4]: h[4] + h[5]])
    return out


def blob_cuda_archs(blob: bytes) -> set[str]:
    sections = _fatbin_sections(blob)
    targets = [blob] if sections is None else sections
    found: set[str] = set()
    for data in targets:
        for match in ARCH_RE.finditer(data):
            found.add(_token(match.group(2), match.group(3)))
    return found


def wheel_cuda_archs(wheel: str) -> list[str]:
    """Sorted arch tokens of every candidate member, each member read whole (``archive.read``)."""
    found: set[str] = set()
    with zipfile.ZipFile(wheel) as archive:
        for name in archive.namelist():
            if _is_candidate(name):
                blob = archive.read(name)
                found |= blob_cuda_archs(blob)
                del blob
    return sorted(found)


def main(argv: list[str]) -> int:
    archs = wheel_cuda_archs(argv[0])
    with open("/proc/self/status") as status:
        hwm = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    print(json.dumps({"archs": archs, "base_archs": sorted({base_arch(a) for a in archs}), "vmhwm_kb": hwm}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
