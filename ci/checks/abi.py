"""Torch ABI check: every symbol an extension expects torch to provide must be exported by the target torch.

Which undefined dynamic symbols are torch's (the rule, on mangled names):

- C++ names whose outermost namespace is ``c10``, ``at``, ``torch`` or ``caffe2``
  (``_ZN3c10...``, ``_ZNK2at...``), including their vtables, typeinfo, guard
  variables, function-local statics and thunks (``_ZTVN3c10...``, ``_ZTIN2at...``);
- ``pybind11::`` names: pybind11 is header-only, so an *undefined* pybind11
  symbol can only come from libtorch_python (the ``type_caster<at::Tensor>``
  ``load``/``cast`` pair is the usual one);
- torch's C entry points: ``THP*`` (C or C++ linkage, libtorch_python) and the
  stable C ABI (``aoti_torch_*``, ``torch_*``).

Everything else is somebody else's: CPython API (``Py*``, resolved by the
interpreter), libstdc++/libgcc/glibc (versioned ``GLIBCXX_*``/``GLIBC_*``),
CUDA runtime and libraries. Weak undefined symbols are optional and skipped.

Those symbols must be defined by the target torch's ``torch/lib/*.so*``. The
target may be a Python interpreter (asked, without importing torch, where torch
lives), a site-packages directory, a torch package directory, or a torch wheel
file read in place (each ``torch/lib`` library read from the zip itself; nothing
is installed or extracted). The target's torch exports are read first, once; each
ELF of a wheel is then compared as its symbols stream by, keeping counts and the
first few missing names only, so memory does not grow with the wheel. A CUDA
wheel checked against a CPU build of torch is told so, not to rebuild.

One rule needs no target: every shared object of a wheel must take libstdc++
from the shared library, as torch and the interpreter do (``static_libstdcxx_problem``).

The libstdc++ dual ABI is checked too: an extension that references
``std::__cxx11`` symbols cannot load into a torch built with
``_GLIBCXX_USE_CXX11_ABI=0`` and vice versa. Torch's setting is read from its
exports: a torch-namespace export mentioning ``__cxx11`` means ABI 1, torch
exports without any means ABI 0 (c10 always exports functions taking
``std::string``).
"""

from __future__ import annotations

import bisect
import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import IO

from ci.base.errors import CheckFailed
from ci.formats.archive import WheelArchive, open_wheel
from ci.formats.elf import EM_CUDA, ElfFile, demangle, is_elf

_TORCH_CXX = re.compile(
    r"^_Z(?:Z|GV|T[VIST]|Th\d+_|Thn\d+_|Tv\d+_n?\d+_|Tvn\d+_n?\d+_)?N?[rVKRO]*(?:3c10|2at|5torch|6caffe2|8pybind11)"
)
_TORCH_C = re.compile(r"^(?:_Z\d+)?THP|^aoti_torch_|^torch_")
_CXX11_MARKERS = ("St7__cxx11", "B5cxx11")
_VERSION_RE = re.compile(r"""^__version__\s*(?::\s*str\s*)?=\s*['"]([^'"]+)['"]""", re.M)


def torch_expected(name: str) -> bool:
    """True when an undefined symbol of this (mangled) name is torch's to provide (module docstring)."""
    return bool(_TORCH_CXX.match(name) or _TORCH_C.match(name))


def _mentions_cxx11(name: str) -> bool:
    return any(marker in name for marker in _CXX11_MARKERS)


SHOWN_MISSING = 5
"""Missing symbols named per ELF; the rest are counted (a crafted table may miss a million)."""
_OLD_ABI_SAMPLE = 64
"""Torch symbols that may pass an old-ABI ``std::string`` (``Ss``/``Sb`` in the mangled name), demangled to tell."""
# Defined only by libstdc++ (or another C++ runtime) itself: a shared object that exports one carries its own copy.
_CXX_RUNTIME_OWN = frozenset({"__gxx_personality_v0", "__cxa_throw", "__cxa_begin_catch", "_ZSt9terminatev",
                              "_ZNSt6locale7classicEv", "_ZNSt8ios_base4InitC1Ev"})
_CUDA_LIBRARIES = ("libc10_cuda", "libtorch_cuda", "libcudart", "libcuda.so")


class _OffsetSet:
    """Which ``.dynstr`` offsets were seen: one bit each (at most 8 MiB for the 64 MiB string table cap)."""

    def __init__(self) -> None:
        self._bits = bytearray()

    def add(self, offset: int) -> bool:
        """Mark ``offset``; True when it was not marked yet."""
        byte, bit = divmod(offset, 8)
        if byte >= len(self._bits):
            self._bits.extend(bytes(byte + 1 - len(self._bits)))
        if self._bits[byte] >> bit & 1:
            return False
        self._bits[byte] |= 1 << bit
        return True


# -- the extension side ------------------------------------------------------

# libcudart, libcublas(Lt), libcudnn*, libcufft, libcurand, libcusparse(Lt), libcusolver, libcupti, libcufile,
# libnvrtc, libnvJitLink, libnvshmem*, libnvToolsExt, libnccl; not the driver's (libcuda.so.1, libnvidia-ml.so.1...),
# which come with the machine's driver, not with a wheel
_CUDA_LIBRARY = re.compile(r"^lib(?:cu(?!da\.so)|nv(?!idia-)|nccl)[A-Za-z0-9_+-]*\.so(?:\.|$)")
MAX_CUDA_SYMBOLS = 1 << 16
"""Distinct CUDA-library symbols kept per shared object (a real extension takes a few hundred)."""


def is_cuda_library(soname: str) -> bool:
    """Whether ``soname`` is one of the CUDA libraries an nvidia-* wheel ships (not the driver)."""
    return bool(_CUDA_LIBRARY.match(soname))




@dataclass(frozen=True)
class ElfNeeds:
    """What one ELF member of a wheel needs at load time, read in one pass over its dynamic symbols."""

    member: str
    needed_libraries: tuple[str, ...]
    """Its ``DT_NEEDED`` entries."""
    cxx_runtime_symbol: str | None
    """A symbol only a C++ runtime defines (``__gxx_personality_v0``) that this ELF defines itself, if any."""
    torch_needed: int = 0
    """How many distinct torch symbols it references (0 without a torch target)."""
    missing: tuple[str, ...] = ()
    """The first :data:`SHOWN_MISSING` (mangled, sorted) that the target torch does not export."""
    missing_count: int = 0
    uses_cxx11_abi: bool | None = None
    """True: references std::__cxx11; False: passes old-ABI std::string to torch; None: cannot tell."""
    cuda_symbols: tuple[tuple[str, str, str], ...] = ()
    """(name, version, library) of each versioned symbol it takes from a CUDA library (ci/checks/cuda_libs.py)."""

    @property
    def links_cuda(self) -> bool:
        return any(name.startswith(_CUDA_LIBRARIES) for name in self.needed_libraries)


def elf_needs(member: str, elf: ElfFile, exports: TorchExports | None) -> ElfNeeds:
    """Read one host ELF's needs; with ``exports``, compare its torch symbols with them as they stream by.

    Memory stays flat however large the symbol table: distinct names are told apart by their string
    table offsets (a bitmap), and only counts and the first few missing names are kept.
    """
    seen = _OffsetSet()
    torch_needed = missing_count = 0
    missing: list[str] = []  # sorted, at most SHOWN_MISSING
    old_abi_sample: list[str] = []
    mentions_cxx11 = False
    runtime_symbol = None
    cuda_symbols: dict[tuple[str, str, str], None] = {}
    for sym in elf.dynamic_symbols():
        if sym.defined:
            if runtime_symbol is None and sym.name in _CXX_RUNTIME_OWN:
                runtime_symbol = sym.name
            continue
        if (sym.binding != "WEAK" and sym.version and sym.version_file and is_cuda_library(sym.version_file)
                and len(cuda_symbols) < MAX_CUDA_SYMBOLS):
            cuda_symbols[(sym.name, sym.version, sym.version_file)] = None
        if exports is None or sym.binding == "WEAK":
            continue
        mentions_cxx11 = mentions_cxx11 or _mentions_cxx11(sym.name)
        if not torch_expected(sym.name) or not seen.add(sym.name_offset):
            continue
        torch_needed += 1
        if len(old_abi_sample) < _OLD_ABI_SAMPLE and ("Ss" in sym.name or "Sb" in sym.name):
            old_abi_sample.append(sym.name)
        if sym.name not in exports.found:
            missing_count += 1
            if sym.name not in missing and (len(missing) < SHOWN_MISSING or sym.name < missing[-1]):
                bisect.insort(missing, sym.name)
                del missing[SHOWN_MISSING:]
    cxx11: bool | None = None
    if mentions_cxx11:
        cxx11 = True
    elif any("std::string" in d or "std::basic_string<" in d for d in demangle(old_abi_sample).values()):
        cxx11 = False
    return ElfNeeds(member, elf.needed_libraries(), runtime_symbol, torch_needed, tuple(missing), missing_count,
                    cxx11, tuple(cuda_symbols))


def links_libstdcxx_dynamically(needed: Iterable[str]) -> bool:
    """Whether a shared object with these DT_NEEDED entries takes libstdc++ from ``libstdc++.so``."""
    return any(name.startswith("libstdc++.so") for name in needed)


def static_libstdcxx_problem(needs: ElfNeeds) -> str | None:
    """Why a shared object that carries its own libstdc++ cannot ship, or None.

    Torch, the interpreter and every other extension share the one ``libstdc++.so.6``. A module
    linked with ``-static-libstdc++`` (or by a compiler wrapper that adds it) has a second copy
    inside: its std::locale facets are then not torch's, while the template code it shares with
    torch (std::regex's, for one) binds to torch's exports, so the ids disagree and the first
    std::regex throws std::bad_cast or crashes. Seen two ways: it exports the C++ runtime's own
    symbols, or (with those hidden) it needs libc10/libtorch but not ``libstdc++.so.6``.
    """
    if links_libstdcxx_dynamically(needs.needed_libraries):
        return None
    torch_libs = [name for name in needs.needed_libraries if name.startswith(("libc10", "libtorch"))]
    if torch_libs:
        how = f"links {torch_libs[0]} but not libstdc++.so.6"
    elif needs.cxx_runtime_symbol:
        how = f"defines the C++ runtime's {needs.cxx_runtime_symbol} but does not link libstdc++.so.6"
    else:
        return None
    return (f"{needs.member} {how}: libstdc++ was linked in statically (-static-libstdc++, or a compiler wrapper "
            "that adds it), and beside torch's shared one std::regex crashes at run time; build with a compiler "
            "that links libstdc++ dynamically (CXX)")


# -- the torch side ------------------------------------------------------------


@dataclass(frozen=True)
class TorchTarget:
    """Where the target torch's libraries are read from."""

    kind: str
    """``wheel``, ``directory`` (a torch package dir) or ``python``/``site-packages`` (resolved to the dir)."""
    location: Path
    """The torch wheel file, or the torch package directory."""
    version: str | None
    description: str


def _version_from_dir(torch_dir: Path) -> str | None:
    version_py = torch_dir / "version.py"
    if version_py.is_file():
        match = _VERSION_RE.search(version_py.read_text(errors="replace"))
        if match:
            return match.group(1)
    return None


def _torch_dir_of_python(python: Path) -> Path:
    probe = (
        "import importlib.util, json; s = importlib.util.find_spec('torch'); "
        "print(json.dumps(list(s.submodule_search_locations or []) if s else None))"
    )
    try:
        proc = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, timeout=120, check=True)
        locations = json.loads(proc.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        raise CheckFailed(
            f"torch target {python}: cannot run this interpreter ({exc}); pass a working python"
        ) from None
    if not locations:
        raise CheckFailed(
            f"torch target {python}: torch is not installed for this interpreter; install it or pass another"
        )
    return Path(locations[0])


def resolve_torch_target(target: Path | str) -> TorchTarget:
    """Interpret ``target`` as a torch wheel, a torch dir, a site-packages dir or a Python interpreter.

    An interpreter may be given by name (``python3``): it is looked up on PATH.
    """
    path = Path(target)
    if not path.exists() and os.sep not in str(target) and (found := shutil.which(str(target))):
        path = Path(found)
    if not path.exists():
        raise CheckFailed(
            f"torch target {path}: does not exist; pass a python, site-packages, torch dir or torch wheel"
        )
    if path.is_file() and path.suffix == ".whl":
        version = path.name.split("-")[1] if path.name.count("-") >= 4 else None
        return TorchTarget("wheel", path, version, f"torch wheel {path.name}")
    if path.is_dir():
        if (path / "lib").is_dir() and (path / "__init__.py").is_file() and path.name == "torch":
            return TorchTarget("directory", path, _version_from_dir(path), f"torch at {path}")
        if (path / "torch" / "lib").is_dir():
            torch_dir = path / "torch"
            return TorchTarget("site-packages", torch_dir, _version_from_dir(torch_dir), f"torch at {torch_dir}")
        raise CheckFailed(f"torch target {path}: neither a torch package dir nor a site-packages holding torch/lib")
    torch_dir = _torch_dir_of_python(path)
    if not (torch_dir / "lib").is_dir():
        raise CheckFailed(f"torch target {path}: torch at {torch_dir} has no lib/ directory; reinstall torch")
    return TorchTarget("python", torch_dir, _version_from_dir(torch_dir), f"torch at {torch_dir} (from {path})")


def _is_torch_lib_member(name: str) -> bool:
    p = PurePosixPath(name)
    return len(p.parts) == 3 and p.parts[0] == "torch" and p.parts[1] == "lib" and ".so" in p.name


def _torch_libraries(target: TorchTarget) -> Iterator[tuple[str, IO[bytes]]]:
    """(library name, open file) for each of the target's ``torch/lib`` libraries, one at a time.

    A torch wheel's libraries are read from the zip in place: nothing is installed or extracted.
    """
    if target.kind != "wheel":
        for path in sorted(p for p in (target.location / "lib").iterdir() if ".so" in p.name and p.is_file()):
            with open(path, "rb") as fp:
                yield path.name, fp
        return
    with open_wheel(target.location) as archive:
        for member in archive.members:
            if not member.is_dir and _is_torch_lib_member(member.name):
                with archive.open_in_place(member.name) as fp:
                    yield PurePosixPath(member.name).name, fp


@dataclass(frozen=True)
class TorchExports:
    """What the target torch exports of the symbols extensions may need from it (:func:`torch_expected`)."""

    target: TorchTarget
    found: frozenset[str]
    cxx11_abi: bool | None
    libraries: tuple[str, ...]

    @property
    def cuda(self) -> bool:
        """Whether this is a CUDA build of torch (it has libtorch_cuda / libc10_cuda)."""
        return any(name.startswith(("libtorch_cuda", "libc10_cuda")) for name in self.libraries)


def scan_torch_exports(target: TorchTarget | Path | str) -> TorchExports:
    """The torch-namespace symbols the target torch's libraries define, and its dual-ABI setting.

    Read once per check (torch 2.13's libraries define about 100,000 such names), before any wheel.
    """
    if not isinstance(target, TorchTarget):
        target = resolve_torch_target(target)
    found: set[str] = set()
    saw_torch_export = saw_cxx11 = False
    libraries = []
    for name, fp in _torch_libraries(target):
        if not is_elf(fp):
            continue
        libraries.append(name)
        for sym in ElfFile(fp, f"{target.location.name}:{name}").dynamic_symbols():
            if not sym.defined or not torch_expected(sym.name):
                continue
            found.add(sym.name)
            if not saw_cxx11 and _TORCH_CXX.match(sym.name):
                saw_torch_export = True
                saw_cxx11 = _mentions_cxx11(sym.name)
    if not libraries:
        raise CheckFailed(
            f"torch target {target.description}: no torch/lib/*.so libraries found; is it a torch install?"
        )
    cxx11 = True if saw_cxx11 else (False if saw_torch_export else None)
    return TorchExports(target, frozenset(found), cxx11, tuple(libraries))


# -- the verdict -----------------------------------------------------------------


@dataclass(frozen=True)
class MissingSymbol:
    mangled: str
    demangled: str


@dataclass(frozen=True)
class ElfAbiResult:
    member: str
    needed: int
    """How many distinct torch symbols this ELF needs."""
    missing: tuple[MissingSymbol, ...]
    """The first :data:`SHOWN_MISSING` missing symbols."""
    uses_cxx11_abi: bool | None
    missing_count: int = 0
    """How many are missing in all."""


@dataclass(frozen=True)
class AbiResult:
    wheel: str
    target: str
    torch_version: str | None
    torch_cxx11_abi: bool | None
    elves: tuple[ElfAbiResult, ...]
    problems: tuple[str, ...] = field(default=())
    """One line per defect (missing symbols per ELF, dual-ABI mismatch)."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def missing(self) -> dict[str, tuple[str, ...]]:
        """ELF member -> demangled names of missing symbols (only ELFs with any)."""
        return {e.member: tuple(m.demangled for m in e.missing) for e in self.elves if e.missing}


def evaluate_abi(wheel: str, needs: Iterable[ElfNeeds], exports: TorchExports, *, cuda_wheel: bool = False) -> AbiResult:
    """The verdict on a wheel's ELFs, compared with ``exports`` by :func:`elf_needs` (no I/O besides c++filt).

    ``cuda_wheel``: the wheel carries device code or links CUDA; against a CPU build of torch its
    missing symbols mean the wrong torch, not a wrong build.
    """
    needs = tuple(needs)
    spelled = demangle(s for n in needs for s in n.missing)
    torch_label = f"torch {exports.target.version}" if exports.target.version else "torch"
    if cuda_wheel and not exports.cuda:
        fix = (f"{exports.target.description} is a CPU build; a CUDA wheel needs the row's CUDA torch "
               "(pass it to --torch)")
    else:
        fix = "rebuild against that torch"
    elves: list[ElfAbiResult] = []
    problems: list[str] = []
    for n in needs:
        missing = tuple(sorted((MissingSymbol(s, spelled[s]) for s in n.missing), key=lambda m: m.demangled))
        elves.append(ElfAbiResult(n.member, n.torch_needed, missing, n.uses_cxx11_abi, n.missing_count))
        if n.missing_count:
            names = "; ".join(m.demangled for m in missing)
            if n.missing_count > len(missing):
                names += f" (and {n.missing_count - len(missing)} more)"
            problems.append(
                f"{wheel}: {n.member} needs {n.missing_count} symbol(s) that {torch_label} "
                f"({exports.target.description}) does not export: {names}; {fix}"
            )
        if n.uses_cxx11_abi is True and exports.cxx11_abi is False:
            problems.append(
                f"{wheel}: {n.member} uses the libstdc++ cxx11 ABI (std::__cxx11) but {torch_label} was built with "
                "_GLIBCXX_USE_CXX11_ABI=0; rebuild with -D_GLIBCXX_USE_CXX11_ABI=0"
            )
        elif n.uses_cxx11_abi is False and exports.cxx11_abi is True:
            problems.append(
                f"{wheel}: {n.member} uses the old libstdc++ ABI (no std::__cxx11) but {torch_label} was built with "
                "_GLIBCXX_USE_CXX11_ABI=1; rebuild with -D_GLIBCXX_USE_CXX11_ABI=1"
            )
    return AbiResult(
        wheel=wheel,
        target=exports.target.description,
        torch_version=exports.target.version,
        torch_cxx11_abi=exports.cxx11_abi,
        elves=tuple(elves),
        problems=tuple(problems),
    )


def wheel_needs(archive: WheelArchive, exports: TorchExports | None) -> Iterator[ElfNeeds]:
    """:func:`elf_needs` of every host ELF shared object of an open wheel, each read in place."""
    for member, stream in archive.shared_objects():
        if is_elf(stream):
            elf = ElfFile(stream, member.name)
            if elf.machine != EM_CUDA:  # a cubin: no host symbols
                yield elf_needs(member.name, elf, exports)


def check_torch_abi(wheel: Path | str, target: TorchTarget | Path | str) -> AbiResult:
    """Check one wheel's ELF members against a target torch (see the module docstring)."""
    wheel = Path(wheel)
    exports = scan_torch_exports(target)
    with open_wheel(wheel) as archive:
        needs = tuple(wheel_needs(archive, exports))
    return evaluate_abi(wheel.name, needs, exports)
