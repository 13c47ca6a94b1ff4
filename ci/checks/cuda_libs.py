"""CUDA-library skew: the CUDA libraries a wheel needs, against those the row's torch pins.

A torch extension that links cuBLAS/cuBLASLt, cuDNN, NCCL, NVSHMEM, cuSPARSE, cuRAND... loads the copy of
that library the process already has: in a pip-installed world, the one of the nvidia-* wheel torch requires
(torch 2.13.0 requires ``cuda-toolkit[cublas,...]==13.0.3``, which requires nvidia-cublas 13.1.1.3). An
extension linked against a newer library (a newer CUDA toolkit's) takes symbols the pinned one lacks and
fails at import with ``undefined symbol: X, version libcublasLt.so.13``; a TransformerEngine aarch64 wheel
did. So, for every shared object of a wheel:

- each versioned symbol it takes from a CUDA library (``name@version``; ``.gnu.version_r`` names the
  library) must be defined with that version by the library of that soname among the nvidia-* distributions
  torch requires, transitively;
- each CUDA library it needs (``DT_NEEDED``) must be one of those, or a member of the wheel itself.
  The driver's ``libcuda.so.1`` is the machine's, not a wheel's, and is left out.

The pinned distributions are read in place, as the torch ABI check reads torch: from the site-packages that
holds the target torch (each dist-info's METADATA and RECORD), or from wheel files (torch's wheel and the
nvidia-* wheels beside it). A library's symbol table is read only when a wheel needs that library. A torch
that requires no nvidia-* wheel takes CUDA from the system: there is nothing to compare with, and the report
says so. A symbol the pinned library lacks is named with a library that defines it where one is found (the
CUDA toolkit the build used: its ``libcudart.so.13.2.75`` is nvidia-cuda-runtime 13.2.75).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from email.parser import HeaderParser
from pathlib import Path
from typing import IO

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ci.checks.abi import ElfNeeds, TorchTarget, is_cuda_library
from ci.formats.archive import open_wheel
from ci.formats.elf import ElfFile

SHOWN = 5
"""Missing symbols named per shared object and library; the rest are counted."""

Opener = Callable[[], AbstractContextManager[IO[bytes]]]


@dataclass
class Library:
    """One CUDA library file, its symbol table read on first use."""

    soname: str
    distribution: str
    """The canonical name of the distribution that ships it (``nvidia-cublas``), or ``CUDA toolkit``."""
    version: str
    where: str
    opener: Opener = field(repr=False)
    _defined: frozenset[tuple[str, str | None]] | None = field(default=None, repr=False)

    def defines(self, name: str, version: str) -> bool:
        if self._defined is None:
            with self.opener() as stream:
                elf = ElfFile(stream, self.where)
                self._defined = frozenset((s.name, s.version) for s in elf.dynamic_symbols() if s.defined)
        return (name, version) in self._defined

    @property
    def wheel(self) -> str:
        return f"{self.distribution} {self.version}"


@dataclass(frozen=True)
class LibrarySet:
    libraries: dict[str, Library]
    """By soname."""
    description: str
    note: str = ""
    """Why nothing can be compared, when that is so (a torch that requires no nvidia-* wheel)."""
    absent: tuple[str, ...] = ()
    """Pinned distributions that are not here: a library they ship is not known to be missing."""

    def get(self, soname: str) -> Library | None:
        return self.libraries.get(soname)


# --- distributions: installed, or wheel files ------------------------------------------------------


@dataclass(frozen=True)
class _Distribution:
    name: str
    version: str
    requires: tuple[str, ...]
    files: tuple[tuple[str, Opener], ...]
    """(file name, opener) of each CUDA library it ships."""
    where: str


def _headers(data: bytes) -> tuple[str, str, tuple[str, ...]]:
    headers = HeaderParser().parsestr(data.decode("utf-8", "replace"))
    return (canonicalize_name(headers.get("Name", "")), str(headers.get("Version", "")).strip(),
            tuple(headers.get_all("Requires-Dist") or ()))


def _installed(site: Path) -> dict[str, _Distribution]:
    """Every distribution installed in ``site``, with the CUDA libraries its RECORD lists."""
    found = {}
    for dist_info in sorted(site.glob("*.dist-info")):
        metadata = dist_info / "METADATA"
        if not metadata.is_file():
            continue
        name, version, requires = _headers(metadata.read_bytes())
        files: list[tuple[str, Opener]] = []
        record = dist_info / "RECORD"
        if name.startswith("nvidia-") and record.is_file():
            for line in record.read_text(errors="replace").splitlines():
                relative = line.split(",", 1)[0]
                path = site / relative
                if ".." not in Path(relative).parts and is_cuda_library(path.name) and path.is_file():
                    files.append((path.name, _file_opener(path)))
        found[name] = _Distribution(name, version, requires, tuple(files), str(site))
    return found


def _file_opener(path: Path) -> Opener:
    return lambda: open(path, "rb")


def _wheels(paths: Iterable[Path]) -> dict[str, _Distribution]:
    """The distributions of wheel files, each CUDA library a member read in place."""
    found = {}
    for path in paths:
        with open_wheel(path) as archive:
            name, version, requires = _headers(archive.read_small(f"{archive.dist_info}/METADATA"))
            members = [m.name for m in archive.members if not m.is_dir and is_cuda_library(Path(m.name).name)]
        files = tuple((Path(member).name, _member_opener(path, member)) for member in members)
        found[name] = _Distribution(name, version, requires, files, path.name)
    return found


def _member_opener(wheel: Path, member: str) -> Opener:
    @contextmanager
    def opener() -> Iterator[IO[bytes]]:
        with open_wheel(wheel) as archive, archive.open_in_place(member) as stream:
            yield stream

    return opener


def _closure(distributions: dict[str, _Distribution], root: str,
             machine: str | None) -> tuple[list[_Distribution], list[str]]:
    """``root`` and every distribution it requires, transitively, with the extras each requirement names; and the
    names of those required but not among ``distributions``."""
    environment: dict[str, str] = {key: str(value) for key, value in default_environment().items()}
    if machine:
        environment["platform_machine"] = machine
    seen: dict[str, set[str]] = {}
    queue = [(root, frozenset[str]())]
    while queue:
        name, extras = queue.pop()
        if name in seen and extras <= seen[name]:
            continue
        seen.setdefault(name, set()).update(extras)
        dist = distributions.get(name)
        if dist is None:
            continue
        for text in dist.requires:
            try:
                requirement = Requirement(text)
            except InvalidRequirement:
                continue
            marker = requirement.marker
            if marker is None or any(marker.evaluate({**environment, "extra": e}) for e in (*extras, "")):
                queue.append((canonicalize_name(requirement.name), frozenset(requirement.extras)))
    return ([distributions[name] for name in sorted(seen) if name in distributions],
            [name for name in sorted(seen) if name not in distributions])


def _library_set(distributions: dict[str, _Distribution], root: str, where: str, machine: str | None = None) -> LibrarySet:
    torch = distributions.get(root)
    if torch is None:
        return LibrarySet({}, where, f"no {root} distribution in {where} to read its requirements from")
    found, absent = _closure(distributions, root, machine)
    pinned = [d for d in found if d.name.startswith("nvidia-")]
    absent_pins = tuple(name for name in absent if name.startswith(("nvidia-", "cuda-")))
    label = f"{root} {torch.version}"
    if not pinned and absent_pins:
        return LibrarySet({}, label, f"the CUDA wheels {label} requires ({', '.join(absent_pins)}) are not in {where}")
    if not pinned:
        return LibrarySet({}, label, f"{label} requires no nvidia-* wheel (its CUDA libraries come from the system)")
    libraries: dict[str, Library] = {}
    for dist in pinned:
        for file_name, opener in dist.files:
            libraries.setdefault(file_name, Library(file_name, dist.name, dist.version, f"{dist.where}: {file_name}",
                                                    opener))
    return LibrarySet(libraries, f"{label}'s nvidia-* wheels in {where}", absent=absent_pins)


def pinned_by_torch(target: TorchTarget) -> LibrarySet:
    """The CUDA libraries of the nvidia-* distributions the target torch requires: installed beside it, or, for a
    torch wheel, the wheel files in its directory."""
    if target.kind == "wheel":
        wheels = sorted(target.location.parent.glob("*.whl"))
        platform = target.location.name.rsplit("-", 1)[-1].removesuffix(".whl")
        machine = next((m for m in ("x86_64", "aarch64") if platform.endswith(m)), None)
        return _library_set(_wheels(wheels), "torch", str(target.location.parent), machine)
    site = target.location.parent
    return _library_set(_installed(site), "torch", str(site))


def from_wheels(paths: Iterable[Path], *, root: str = "torch") -> LibrarySet:
    """The CUDA libraries of these wheel files (``root``'s nvidia-* requirements among them, read in place)."""
    return _library_set(_wheels(paths), canonicalize_name(root), "the given wheels")


def shipped_by(paths: Iterable[Path]) -> LibrarySet:
    """Every CUDA library of these nvidia-* wheel files, as candidates that may define a missing symbol."""
    libraries: dict[str, Library] = {}
    for dist in _wheels(paths).values():
        for file_name, opener in dist.files:
            libraries[file_name] = Library(file_name, dist.name, dist.version, f"{dist.where}: {file_name}", opener)
    return LibrarySet(libraries, "the given wheels")


_REAL_NAME = re.compile(r"^(?P<soname>.+?\.so\.\d+)\.(?P<version>\d+(?:\.\d+)*)$")


def toolkit_libraries(cuda_home: Path | None) -> LibrarySet:
    """The CUDA libraries of a toolkit (``lib64``, ``targets/*/lib``) by their real names
    (``libcublasLt.so.13.2.0.9``: soname ``libcublasLt.so.13``, version 13.2.0.9)."""
    libraries: dict[str, Library] = {}
    if cuda_home is None:
        return LibrarySet(libraries, "no CUDA toolkit")
    for folder in (cuda_home / "lib64", cuda_home / "lib", *sorted(cuda_home.glob("targets/*/lib"))):
        for path in sorted(folder.glob("lib*.so.*")) if folder.is_dir() else ():
            match = _REAL_NAME.match(path.name)
            if match and is_cuda_library(path.name) and not path.is_symlink():
                libraries.setdefault(match["soname"], Library(match["soname"], "CUDA toolkit", match["version"],
                                                              str(path), _file_opener(path)))
    return LibrarySet(libraries, f"the CUDA toolkit in {cuda_home}")


# --- the check ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SkewResult:
    problems: tuple[str, ...]
    checked: dict[str, int]
    """Soname -> how many versioned symbols of it were compared."""
    against: str
    note: str = ""

    def describe(self) -> str:
        if self.note:
            return f"not checked: {self.note}"
        compared = ", ".join(f"{count} of {soname}" for soname, count in sorted(self.checked.items()))
        return f"versioned symbols vs {self.against}: {compared or 'none taken'}"


def check_skew(wheel: str, needs: Iterable[ElfNeeds], pinned: LibrarySet, *, carried: Iterable[str] = (),
               candidates: Iterable[LibrarySet] = ()) -> SkewResult:
    """The skew problems of a wheel's shared objects (``needs``, from ci/checks/abi.py ``elf_needs``), one line each
    per library; ``carried``: the file names of the wheel's members (a library it ships itself)."""
    own = set(carried)
    candidates = tuple(candidates)
    problems: list[str] = []
    checked: dict[str, int] = {}
    needs = [n for n in needs if any(is_cuda_library(lib) for lib in n.needed_libraries) or n.cuda_symbols]
    if pinned.note:
        return SkewResult((), {}, pinned.description, pinned.note if needs else "")
    for n in needs:
        for soname in dict.fromkeys(lib for lib in n.needed_libraries if is_cuda_library(lib) and lib not in own):
            if pinned.get(soname) is None and not pinned.absent:
                problems.append(f"{wheel}: {n.member} needs {soname}, which neither the wheel nor {pinned.description} "
                                "provide, so it loads from the system or not at all: link the library torch pins, or "
                                "ship it in the wheel")
        by_library: dict[str, list[tuple[str, str]]] = {}
        for name, version, soname in n.cuda_symbols:
            by_library.setdefault(soname, []).append((name, version))
        for soname, symbols in sorted(by_library.items()):
            library = pinned.get(soname)
            if library is None or soname in own:
                continue
            checked[soname] = checked.get(soname, 0) + len(symbols)
            missing = sorted(s for s in symbols if not library.defines(*s))
            if missing:
                problems.append(_missing_line(wheel, n.member, library, missing, candidates))
    return SkewResult(tuple(problems), checked, pinned.description)


def _missing_line(wheel: str, member: str, library: Library, missing: list[tuple[str, str]],
                  candidates: tuple[LibrarySet, ...]) -> str:
    shown = "; ".join(f"{name}@{version}" for name, version in missing[:SHOWN])
    if len(missing) > SHOWN:
        shown += f" (and {len(missing) - SHOWN} more)"
    first = missing[0]
    provider = next((lib for found in candidates if (lib := found.get(library.soname)) is not None
                     and lib.defines(*first)), None)
    if provider is None:
        would = (f"no library here defines {first[0]}: build against {library.wheel} (torch's pin) or pin a torch "
                 f"whose {library.distribution} does")
    else:
        version = provider.version
        what = f"{library.distribution} {version}" if provider.distribution == "CUDA toolkit" else provider.wheel
        would = (f"{what} would ({provider.where} defines it): build against {library.wheel} (torch's pin), or pin a "
                 f"torch that requires {library.distribution}>={version}")
    return (f"{wheel}: {member} needs {len(missing)} symbol(s) of {library.soname} that {library.wheel} "
            f"(torch's pin) does not define: {shown}; {would}")
