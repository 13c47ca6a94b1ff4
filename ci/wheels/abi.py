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
file read in place (each ``torch/lib`` library streamed to a temporary file in
turn; nothing is installed).

One rule needs no target: an extension that links torch must take libstdc++
from the shared library, as torch does (``static_libstdcxx_problem``).

The libstdc++ dual ABI is checked too: an extension that references
``std::__cxx11`` symbols cannot load into a torch built with
``_GLIBCXX_USE_CXX11_ABI=0`` and vice versa. Torch's setting is read from its
exports: a torch-namespace export mentioning ``__cxx11`` means ABI 1, torch
exports without any means ABI 0 (c10 always exports functions taking
``std::string``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ci.errors import CheckFailed
from ci.wheels.archive import WheelArchive, open_wheel
from ci.wheels.elf import EM_CUDA, ElfFile, demangle, is_elf

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


# -- the extension side ------------------------------------------------------


@dataclass(frozen=True)
class ElfNeeds:
    """What one ELF member of a wheel needs from torch."""

    member: str
    torch_symbols: tuple[str, ...]
    """Mangled names of the undefined, non-weak symbols torch is expected to provide."""
    uses_cxx11_abi: bool | None
    """True: references std::__cxx11; False: passes old-ABI std::string to torch; None: cannot tell."""


def elf_needs(member: str, path: Path) -> ElfNeeds | None:
    with open(path, "rb") as fp:
        if not is_elf(fp):
            return None
        elf = ElfFile(fp, member)
        if elf.machine == EM_CUDA:  # a cubin: no host symbols
            return None
        # Streamed: one crafted table may hold a million symbols, so keep only what the verdict needs.
        needed: set[str] = set()
        mentions_cxx11 = False
        for sym in elf.dynamic_symbols():
            if sym.defined or sym.binding == "WEAK":
                continue
            if torch_expected(sym.name):
                needed.add(sym.name)
            mentions_cxx11 = mentions_cxx11 or _mentions_cxx11(sym.name)
    torch_syms = tuple(sorted(needed))
    if mentions_cxx11:
        cxx11: bool | None = True
    else:
        spelled = demangle(torch_syms)
        old = any(("std::string" in d or "std::basic_string<" in d) for d in spelled.values())
        cxx11 = False if old else None
    return ElfNeeds(member, torch_syms, cxx11)


def links_libstdcxx_dynamically(needed: Iterable[str]) -> bool:
    """Whether a shared object with these DT_NEEDED entries takes libstdc++ from ``libstdc++.so``."""
    return any(name.startswith("libstdc++.so") for name in needed)


def static_libstdcxx_problem(member: str, needed: tuple[str, ...]) -> str | None:
    """Why an extension that links torch but embeds its own libstdc++ cannot ship, or None.

    ``needed``: the member's DT_NEEDED entries. Such a module (``-static-libstdc++``,
    or a compiler wrapper that adds it) needs libc10/libtorch but not
    ``libstdc++.so.6``. Its std::locale facets are then a second copy beside
    torch's shared one, while the template code it shares with torch (std::regex's,
    for one) binds to torch's exports: the ids disagree and the first std::regex
    throws std::bad_cast or crashes.
    """
    torch_libs = [name for name in needed if name.startswith(("libc10", "libtorch"))]
    if not torch_libs or links_libstdcxx_dynamically(needed):
        return None
    return (f"{member} links {torch_libs[0]} but not libstdc++.so.6: libstdc++ was linked in statically "
            "(-static-libstdc++, or a compiler wrapper that adds it), and beside torch's shared one std::regex "
            "crashes at run time; build with a compiler that links libstdc++ dynamically (CXX)")


def collect_torch_needs(archive: WheelArchive) -> tuple[ElfNeeds, ...]:
    """The torch needs of every ELF shared object in an open wheel (members streamed to a temp dir)."""
    needs = (elf_needs(member.name, path) for member, path in archive.shared_objects("wheel-abi-"))
    return tuple(found for found in needs if found is not None)


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


@contextmanager
def _torch_libraries(target: TorchTarget) -> Iterator[Iterator[tuple[str, Path]]]:
    """Yield (library name, readable path) pairs; wheel members go through a temp dir one at a time."""
    if target.kind != "wheel":
        libs = sorted(p for p in (target.location / "lib").iterdir() if ".so" in p.name and p.is_file())
        yield ((p.name, p) for p in libs)
        return
    with open_wheel(target.location) as archive, tempfile.TemporaryDirectory(prefix="torch-libs-") as tmp:

        def members() -> Iterator[tuple[str, Path]]:
            for member in archive.members:
                if member.is_dir or not _is_torch_lib_member(member.name):
                    continue
                path = archive.copy_to(member.name, Path(tmp))
                try:
                    yield PurePosixPath(member.name).name, path
                finally:
                    path.unlink()

        yield members()


@dataclass(frozen=True)
class TorchExports:
    """What the target torch exports, restricted to the symbols asked about."""

    target: TorchTarget
    found: frozenset[str]
    cxx11_abi: bool | None
    libraries: tuple[str, ...]


def scan_torch_exports(target: TorchTarget | Path | str, wanted: Iterable[str]) -> TorchExports:
    """Which of ``wanted`` (mangled names) the target torch's libraries define, and its dual-ABI setting."""
    if not isinstance(target, TorchTarget):
        target = resolve_torch_target(target)
    wanted_set = set(wanted)
    found: set[str] = set()
    saw_torch_export = saw_cxx11 = False
    libraries = []
    with _torch_libraries(target) as libs:
        for name, path in libs:
            with open(path, "rb") as fp:
                if not is_elf(fp):
                    continue
                libraries.append(name)
                for sym in ElfFile(fp, f"{target.location.name}:{name}").dynamic_symbols():
                    if not sym.defined:
                        continue
                    if sym.name in wanted_set:
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
    uses_cxx11_abi: bool | None


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


def evaluate_abi(wheel: str, needs: Iterable[ElfNeeds], exports: TorchExports) -> AbiResult:
    """Compare an extension's needs with a torch's exports (no I/O besides c++filt)."""
    needs = tuple(needs)
    missing_all = {sym for n in needs for sym in n.torch_symbols if sym not in exports.found}
    spelled = demangle(missing_all)
    torch_label = f"torch {exports.target.version}" if exports.target.version else "torch"
    elves: list[ElfAbiResult] = []
    problems: list[str] = []
    for n in needs:
        missing = tuple(
            sorted(
                (MissingSymbol(s, spelled[s]) for s in n.torch_symbols if s in missing_all), key=lambda m: m.demangled
            )
        )
        elves.append(ElfAbiResult(n.member, len(n.torch_symbols), missing, n.uses_cxx11_abi))
        if missing:
            names = "; ".join(m.demangled for m in missing)
            problems.append(
                f"{wheel}: {n.member} needs {len(missing)} symbol(s) that {torch_label} ({exports.target.description}) "
                f"does not export: {names}; rebuild against that torch"
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


def check_torch_abi(wheel: Path | str, target: TorchTarget | Path | str) -> AbiResult:
    """Check one wheel's ELF members against a target torch (see the module docstring)."""
    wheel = Path(wheel)
    with open_wheel(wheel) as archive:
        needs = collect_torch_needs(archive)
    exports = scan_torch_exports(target, {s for n in needs for s in n.torch_symbols})
    return evaluate_abi(wheel.name, needs, exports)
