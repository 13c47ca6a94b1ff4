"""Byte-identical rebuilds: the same row from the same sources gives the same wheel, wherever and whenever.

What made two builds of one row differ, and what this module does about each (measured on
fast-hadamard-transform on the GPU machine, and with nvcc 13.0 on a tiny ``-lineinfo`` kernel):

- zip dates were the build's wall-clock time: ``SOURCE_DATE_EPOCH`` comes from the sources
  (:func:`source_date_epoch`), and the final wheel is normalized to it (ci/formats/rewrite.py
  ``normalize_wheel``);
- host compiles embed the build directory (``__FILE__`` in ``.rodata``, debug paths) and the torch
  headers' site-packages: ``-ffile-prefix-map`` in ``CFLAGS``/``CXXFLAGS`` and, through
  ``NVCC_APPEND_FLAGS``, for nvcc's host part (:func:`build_variables`); a build that sets its own flags
  (TransformerEngine's CMake sets ``CMAKE_CXX_FLAGS`` before ``project()``, which hides ``CXXFLAGS``)
  or its own compiler command (flashinfer's JIT) still runs ``cc``/``c++``/``$CXX``: those are wrappers
  that put the maps first (:func:`compiler_wrappers`);
- nvcc's device code keeps the source's absolute path in ``.nv_fatbin`` (``-lineinfo``) and no nvcc
  flag remaps it: the builder sees its sources at one fixed path (ci/building/build_place.py);
- the same line table holds each source file's mtime (a copy gives a new one):
  :func:`pin_source_times` sets every source file to ``SOURCE_DATE_EPOCH``;
- nvcc compiles the host part from a temporary file named after its pid, which lands in ``.symtab`` as
  a local file symbol: the link drops local symbols (``-Wl,--discard-all``; exported ones stay).
- a ``setup.py`` that gathers its requirements in a set (TransformerEngine's) lists them in METADATA in the
  order of Python's per-process string hashing: ``PYTHONHASHSEED`` is fixed for the build;
- cudafe++ names internal-linkage entities (anonymous namespaces, ``static __device__`` functions)
  ``_INTERNAL_<path hash>_<len>_<file>_<module id>``; in a translation unit without a plain external
  definition to name it after (templates only, say) the module id is a hash plus cudafe++'s pid, so
  ``.nv_fatbin``, ``.symtab`` and ``.rodata`` differ: nvcc's ``-frandom-seed`` replaces it
  (:func:`nvcc_random_seed`).

:func:`compare_wheels` says what differs between two wheels: members, and for a shared object its
ELF sections.
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tarfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ci.base import log
from ci.base.digest import sha256_file
from ci.base.errors import WheelhouseError
from ci.building.sources import Checkout, _ignored, _sdist_archives, sdist_downloads
from ci.formats.archive import is_shared_object_name

DISCARD_LOCAL_SYMBOLS = "-Wl,--discard-all"
NVCC_RANDOM_SEED = "-frandom-seed"
FIXED_HASH_SEED = "0"
"""``PYTHONHASHSEED`` for every build, whatever the caller's: a set's order is then the same in every run."""
UNCOMMITTED_EPOCH = 315532800
"""1980-01-01T00:00:00Z, the first time a zip member can carry: a directory's sources with changes git does
not hold have no time of their own that another copy of them would share."""
PREFIX_MAPS_VARIABLE = "WHEELHOUSE_PREFIX_MAPS"
WRAPPED_COMPILERS = ("cc", "c++", "gcc", "g++", "clang", "clang++")
"""The names a build finds its C and C++ compilers by on PATH (CMake, setuptools, torch's and flashinfer's
JIT, nvcc's host compiler), each wrapped where PATH has it."""
COMPILER_VARIABLES = ("CC", "CXX", "CUDAHOSTCXX")
_LOG = log.get("reproducible")


def source_date_epoch(checkout: Checkout, cache_dir: Path) -> int:
    """The sources' own time: a git commit's committer time, an sdist's newest member (else the archive's
    mtime), a directory's last commit (:func:`directory_epoch`). Never the wall clock, nor a file's mtime,
    which a checkout sets."""
    if checkout.kind == "git":
        from ci.building.sbom import _git_output  # the same git invocation the SBOM reads the commit time with

        found = _git_output(["log", "-1", "--format=%ct", "HEAD"], checkout.path)
        if not found or not found.isdigit():
            raise WheelhouseError(f"{checkout.location}: cannot read the commit time of {checkout.revision}; "
                                  "fetch the sources again (remove the source cache)")
        return int(found)
    if checkout.kind == "sdist":
        archive = _sdist_archive(checkout, cache_dir)
        if archive is not None:
            return _archive_epoch(archive)
    return directory_epoch(checkout.path)


def _sdist_archive(checkout: Checkout, cache_dir: Path) -> Path | None:
    """The downloaded archive of the checkout's name and version whose sha256 is its revision."""
    downloads = sdist_downloads(cache_dir)
    if not downloads.is_dir():
        return None
    return next((archive for archive in _sdist_archives(downloads, checkout.location, checkout.ref)
                 if sha256_file(archive) == checkout.revision), None)


def _archive_epoch(archive: Path) -> int:
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            times = [int(datetime(*info.date_time, tzinfo=timezone.utc).timestamp()) for info in zf.infolist()]
    else:
        with tarfile.open(archive) as tf:
            times = [int(member.mtime) for member in tf.getmembers()]
    return max(times, default=int(archive.stat().st_mtime))


def directory_epoch(path: Path) -> int:
    """A source directory's time, from its contents alone: the committer time of the last commit that touched
    it, when it lies in a git work tree and git holds all of it (no change, no untracked file); otherwise
    :data:`UNCOMMITTED_EPOCH`. Two clones of one commit agree, whenever each was made."""
    def git(*args: str) -> str | None:
        try:
            result = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=60,
                                    env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"})
        except (OSError, subprocess.SubprocessError):
            return None
        return result.stdout if result.returncode == 0 else None

    status = git("status", "--porcelain", "-z", "--untracked-files=all", "--", ".")
    if status is None or any(not _ignored(Path(entry[3:])) for entry in status.split("\0") if entry[3:]):
        return UNCOMMITTED_EPOCH  # not in git, or files git does not hold that a build would copy
    found = (git("log", "-1", "--format=%ct", "--", ".") or "").strip()
    return int(found) if found.isdigit() else UNCOMMITTED_EPOCH


def pin_source_times(src: Path, epoch: int) -> None:
    """Every file and directory below ``src`` gets mtime ``epoch``: nvcc's ``-lineinfo`` line table records
    each source file's mtime, which a copy or a checkout sets to the wall clock."""
    for path in [src, *src.rglob("*")]:
        os.utime(path, (epoch, epoch), follow_symlinks=False)


def prefix_maps(source_dir: Path, site_packages: Iterable[Path | str] | Path | str) -> list[str]:
    """gcc flags that write the sources as ``.`` and torch's headers as ``/site-packages``.

    ``site_packages`` names the site-packages of every Python of the row's compile group (and each one's
    resolved path), not just the build's own: the compiler cache hashes these flags, so the host compile of
    a unit without Python headers is the same compile for each Python only when their flags are the same
    (one map per Python, in one order, each mapping that Python's headers when it builds)."""
    sites = [site_packages] if isinstance(site_packages, (str, Path)) else list(site_packages)
    every = sorted({str(path) for site in sites for path in (site, os.path.realpath(site))})
    return [*(f"-ffile-prefix-map={site}=/site-packages" for site in every), f"-ffile-prefix-map={source_dir}=."]


def nvcc_random_seed(source_dir: Path) -> str:
    """nvcc's ``-frandom-seed`` for every compile of one build, a number taken from the fixed source path
    (ci/building/build_place.py ``fixed_path``, which names the component and arch; in place too, so that the seed
    is the same wherever the build runs).

    The seed replaces only the random part of a module id; the path hash before it keeps the names of two
    source files apart, and a different seed per component keeps two components apart. nvcc asks for one seed
    per file, which one environment variable cannot give: one source file compiled twice (other defines) into
    objects device-linked together (``-rdc``) then fails at the device link, naming the duplicate
    ``__cudaRegisterLinkedBinary_<id>``."""
    digest = hashlib.sha256(str(source_dir).encode()).hexdigest()[:8]
    return f"{NVCC_RANDOM_SEED}=0x{digest}"


def build_variables(environ: Mapping[str, str], *, epoch: int, source_dir: Path,
                    site_packages: Iterable[Path | str] | Path | str, seed_path: Path | None = None) -> dict[str, str]:
    """What the builder needs on top of ``environ`` for a reproducible build: ``SOURCE_DATE_EPOCH``, a fixed
    ``PYTHONHASHSEED`` and the prefix maps, appended to the caller's ``CFLAGS``/``CXXFLAGS``/``NVCC_APPEND_FLAGS`` and given to the
    compiler wrappers (``WHEELHOUSE_PREFIX_MAPS``), and nvcc's seed (from ``seed_path``, else ``source_dir``)."""
    maps = prefix_maps(source_dir, site_packages)
    variables = {"SOURCE_DATE_EPOCH": str(epoch), PREFIX_MAPS_VARIABLE: " ".join(maps),
                 "PYTHONHASHSEED": FIXED_HASH_SEED}
    for name in ("CFLAGS", "CXXFLAGS"):
        variables[name] = " ".join([environ.get(name, ""), *maps]).strip()
    nvcc = [flag for m in maps for flag in ("-Xcompiler", m)]
    given = environ.get("NVCC_APPEND_FLAGS", "")
    if NVCC_RANDOM_SEED not in given:  # a caller's own seed stays (nvcc warns on a second one, and takes the last)
        nvcc.append(nvcc_random_seed(seed_path or source_dir))
    variables["NVCC_APPEND_FLAGS"] = " ".join([given, *nvcc]).strip()
    # nvcc hands the host compiler a temporary file named after its own pid (tmpxft_<pid>_...cudafe1.cpp),
    # which becomes a local file symbol of the shared object; the linker leaves local symbols out
    variables["LDFLAGS"] = " ".join([environ.get("LDFLAGS", ""), DISCARD_LOCAL_SYMBOLS]).strip()
    return variables


def describe_plan() -> str:
    """What a build adds for reproducibility, for the plan."""
    return ("SOURCE_DATE_EPOCH and every source file's mtime = the sources' time; -ffile-prefix-map for the sources "
            f"and site-packages in CFLAGS, CXXFLAGS, NVCC_APPEND_FLAGS and in front of every C/C++ compiler the build "
            f"runs ({', '.join(WRAPPED_COMPILERS)} on PATH, {', '.join(COMPILER_VARIABLES)} where set); nvcc "
            f"{NVCC_RANDOM_SEED} from the fixed source path; LDFLAGS {DISCARD_LOCAL_SYMBOLS}; "
            f"PYTHONHASHSEED={FIXED_HASH_SEED}; wheels normalized last")


def compiler_wrappers(directory: Path, environ: Mapping[str, str], *, write: bool = True) -> dict[str, str]:
    """Write a wrapper for each C/C++ compiler the build can run (``write``; a plan only names them), and return
    the variables that make the build run them: ``PATH`` (``directory``/bin first) and ``CC``/``CXX``/
    ``CUDAHOSTCXX`` where ``environ`` sets them. Each wrapper runs the real compiler with
    ``$WHEELHOUSE_PREFIX_MAPS`` before the build's own flags, so a flag the build sets cannot drop them; the name
    stays the compiler's own (nvcc and torch tell the compiler's kind by it)."""
    path = environ.get("PATH", "")
    bin_dir = directory / "bin"
    if write:
        shutil.rmtree(directory, ignore_errors=True)
        bin_dir.mkdir(parents=True)
        for name in WRAPPED_COMPILERS:
            found = shutil.which(name, path=path)
            if found:
                _write_wrapper(bin_dir / name, [found])
    variables = {"PATH": os.pathsep.join(part for part in (str(bin_dir), path) if part)}
    for variable in COMPILER_VARIABLES:
        command = environ.get(variable, "").strip()
        if not command:
            continue
        words = shlex.split(command)
        wrapper = directory / variable / Path(words[-1]).name
        if write:
            words[-1] = shutil.which(words[-1], path=path) or words[-1]  # as the build's PATH would find it
            wrapper.parent.mkdir()
            _write_wrapper(wrapper, words)
        variables[variable] = str(wrapper)
    return variables


def _write_wrapper(wrapper: Path, command: list[str]) -> None:
    wrapper.write_text("#!/bin/sh\n# the build's compiler with its prefix maps first (ci/building/reproducible.py)\n"
                       f"exec {shlex.join(command)} ${PREFIX_MAPS_VARIABLE} \"$@\"\n")
    wrapper.chmod(0o755)


# --- comparing two wheels --------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberDifference:
    name: str
    reason: str
    """``only in the first``, ``only in the second``, ``content``, ``date/mode``."""
    sections: tuple[str, ...] = ()
    """For a shared object whose content differs: the ELF sections whose bytes differ."""

    def describe(self) -> str:
        text = f"{self.name}: {self.reason}"
        return text + (f" (ELF sections {', '.join(self.sections)})" if self.sections else "")


def compare_wheels(first: Path, second: Path) -> list[MemberDifference]:
    """Each member that differs between two wheels (an empty list: the same members, contents, dates and
    modes, in the same order); for a shared object, the ELF sections that differ."""
    with zipfile.ZipFile(first) as a, zipfile.ZipFile(second) as b:
        infos_a = {info.filename: info for info in a.infolist()}
        infos_b = {info.filename: info for info in b.infolist()}
        differences = [MemberDifference(name, "only in the first") for name in infos_a if name not in infos_b]
        differences += [MemberDifference(name, "only in the second") for name in infos_b if name not in infos_a]
        for name, info in infos_a.items():
            other = infos_b.get(name)
            if other is None:
                continue
            if info.CRC != other.CRC or info.file_size != other.file_size or a.read(name) != b.read(name):
                sections = _elf_sections_differing(a.read(name), b.read(name)) if is_shared_object_name(name) else ()
                differences.append(MemberDifference(name, "content", sections))
            elif (info.date_time, info.external_attr) != (other.date_time, other.external_attr):
                differences.append(MemberDifference(name, "date/mode"))
        if not differences and list(infos_a) != list(infos_b):
            differences.append(MemberDifference("(archive)", "member order"))
    return differences


def _elf_sections_differing(first: bytes, second: bytes) -> tuple[str, ...]:
    import io

    from ci.base.errors import CheckFailed
    from ci.formats.elf import SHT_NOBITS, ElfFile

    def sections(data: bytes) -> dict[str, bytes]:
        elf = ElfFile(io.BytesIO(data))
        return {s.name: (b"" if s.type == SHT_NOBITS else elf.read_section(s)) for s in elf.sections}

    try:
        a, b = sections(first), sections(second)
    except CheckFailed:
        return ("(not a readable ELF file)",)
    return tuple(name for name in sorted(set(a) | set(b)) if a.get(name) != b.get(name))
