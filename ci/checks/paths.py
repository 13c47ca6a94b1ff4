"""A shared object must not send a user's import to the build machine's paths.

Two places where an installed extension reads a path at run time:

- its ``DT_RUNPATH``/``DT_RPATH``: the dynamic loader searches each entry when the module is imported.
  An absolute entry into a ``site-packages``/``dist-packages`` directory or the build directory names
  the builder's machine (DeepEP's setup.py writes the NVSHMEM directory it linked against);
- a path compiled in for run time (a ``-DBASE_PATH="<build dir>"`` that a run-time compile reads, as
  DeepEP's setup.py passes one to hybrid_ep): the build directory's bytes in ``.rodata`` or ``.data``.

Compile-time paths (``__FILE__``, debug info) are mapped away by the build (ci/building/reproducible.py), so
what is left in those sections was put there on purpose. A component whose upstream needs such a path
names the member in versions.yaml's ``build_path_exceptions`` with the reason; the check then reports
it as an exception instead of a problem.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ci.formats.elf import DT_RPATH, DT_RUNPATH, SHT_NOBITS, ElfFile

# where builders see their sources (ci/building/build_place.py): fixed, so that nvcc's device code names the same path
# everywhere; it exists only inside each build's own mount namespace
FIXED_BUILD_ROOT = "/srv/wheelhouse-src"
SITE_DIRECTORIES = ("/site-packages", "/dist-packages")
RUN_TIME_SECTIONS = (".rodata", ".data", ".data.rel.ro")
_OVERLAP = 4096  # a path split across two blocks of a section is still found


@dataclass(frozen=True)
class BuildPathFinding:
    member: str
    where: str
    """``RUNPATH``, ``RPATH`` or a section name."""
    path: str
    exception: str | None = None
    """versions.yaml's reason, when the component allows it."""

    def problem(self, wheel: str) -> str:
        return (f"{wheel}: member {self.member!r} names the build machine's {self.path!r} in its {self.where}, "
                "where an import reads it; link with an $ORIGIN-relative rpath and no build path, or name the member "
                "with the reason in this component's build_path_exceptions in versions.yaml")

    def describe(self) -> str:
        return f"{self.member}: {self.where} names {self.path!r} (allowed: {self.exception})"


def run_paths(elf: ElfFile) -> list[tuple[str, str]]:
    """(``RPATH`` or ``RUNPATH``, entry) for each entry of the dynamic section's search paths."""
    return [("RPATH" if tag == DT_RPATH else "RUNPATH", entry)
            for tag, text in elf.dynamic_strings(DT_RPATH, DT_RUNPATH) for entry in text.split(":") if entry]


def _names_the_build(entry: str, build_paths: Iterable[str]) -> bool:
    if not entry.startswith("/"):  # $ORIGIN-relative (or empty): resolved on the user's machine
        return False
    return any(part in entry for part in SITE_DIRECTORIES) or any(entry.startswith(p) for p in build_paths)


def find_build_paths(member: str, elf: ElfFile, build_paths: Iterable[str]) -> list[BuildPathFinding]:
    """Where ``elf`` names a build path for run time: search-path entries, and the ``build_paths`` (the build
    directory, the builder's site-packages) in the sections a program reads at run time."""
    build_paths = [p.rstrip("/") for p in build_paths if p and p != "/"]
    findings = [BuildPathFinding(member, where, entry) for where, entry in run_paths(elf)
                if _names_the_build(entry, build_paths)]
    needles = [p.encode() for p in build_paths]
    for name in RUN_TIME_SECTIONS:
        section = elf.section(name)
        if section is None or section.type == SHT_NOBITS:
            continue
        tail = b""
        seen: set[bytes] = set()
        for block in elf.iter_section(section):
            window = tail + block
            for needle in needles:
                if needle not in seen and needle in window:
                    seen.add(needle)
                    findings.append(BuildPathFinding(member, name, needle.decode()))
            tail = window[-_OVERLAP:]
    return findings


def allowed_by(member: str, exceptions: Mapping[str, str]) -> str | None:
    """The reason versions.yaml gives for ``member`` (its path or basename matches a key), or None."""
    base = member.rsplit("/", 1)[-1]
    for pattern, reason in exceptions.items():
        if fnmatch.fnmatchcase(member, pattern) or fnmatch.fnmatchcase(base, pattern):
            return reason
    return None


def check_build_paths(member: str, elf: ElfFile, build_paths: Iterable[str],
                      exceptions: Mapping[str, str]) -> list[BuildPathFinding]:
    """:func:`find_build_paths`, each marked with the component's exception for the member, if any."""
    reason = allowed_by(member, exceptions)
    return [BuildPathFinding(f.member, f.where, f.path, reason) for f in find_build_paths(member, elf, build_paths)]
