"""What an interpreter runs when it starts, and whether a build changed any of it.

A build runs third-party code (the builder, the project's setup.py, an sdist's) as the user who later runs
``invoke release`` or ``publish-index`` with a token, in an interpreter that such a command may run in (with
``--reuse-env``, the tool's own). Whatever the build leaves where an interpreter reads at start runs again with
that token: a ``.pth`` or a module in site-packages, an entry script in ``bin/`` (``invoke``), ``pyvenv.cfg``,
the user site, a ``sitecustomize``. This module takes the state of all of it before the build and compares
after, by contents, not by what a process can set back:

- every file below each directory of the interpreter's ``sys.path`` (the standard library, site-packages, the
  user site even before it exists, directories ``.pth`` files and ``PYTHONPATH`` add), the entry scripts of its
  ``bin/`` (all of a venv's ``bin/``), and a venv's ``pyvenv.cfg``;
- a file of up to :data:`DIGESTED_BYTES` by its sha256 (the code and start-up files R2's attacks rewrote to the
  same size with the old mtime), a larger one (shared libraries, data) by size, mtime, change time and inode:
  a process can set a file's mtime back but not its change time (``ctime``, which any write or ``utime`` moves
  to now), nor keep its inode when it replaces it; a ctime moved by a link made or removed elsewhere (uv's
  cache linking the same file into another venv) is no change: when the link count moved too, or else when the
  file still has the sha256 its distribution's ``RECORD`` lists, that ``RECORD`` itself unchanged;
- cached bytecode (``__pycache__/*.pyc``) that a build added or altered is not a finding but is deleted: Python
  compiles the source again, and a ``.pyc`` made to match its source's size and mtime would run instead of it.

The repository checkout (also where ``PYTHONPATH`` names it), the shell's start-up files and ``~/.config`` are
not interpreters: code that runs as
you can write them too, which is why the build environment withholds every credential and the README says not
to build in a shell that holds one.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import stat
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.base.digest import sha256_file
from ci.formats.record import file_record_hash

DIGESTED_BYTES = 1 << 20
"""Files up to this size are compared by sha256; larger ones by size, mtime, ctime and inode."""
CHANGED_SUFFIX = ".changed-by-build"
"""What a file a build altered is renamed to: a name no interpreter imports, runs or reads at start."""

_PROBE = (
    "import json, os, site, sys\n"
    "venv = sys.prefix != sys.base_prefix\n"
    "print(json.dumps({'executable': sys.executable, 'prefix': sys.prefix, 'venv': venv,\n"
    "                  'paths': [p for p in sys.path if p and os.path.isabs(p)],\n"
    "                  'user_site': site.getusersitepackages() if site.ENABLE_USER_SITE else None}))\n"
)


@dataclass(frozen=True)
class StartPaths:
    """Where an interpreter reads when it starts and imports."""

    python: Path
    directories: tuple[Path, ...]
    """Walked whole: sys.path's directories, the user site (also when it does not exist yet), a venv's bin/."""
    files: tuple[Path, ...]
    """Single files: zip archives on sys.path, pyvenv.cfg, the entry scripts of a system interpreter's bin/."""


def start_paths(python: Path | str, env: Mapping[str, str]) -> StartPaths:
    """Ask ``python`` (started as a later command would start it, in ``env``) where it reads at start."""
    result = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True, env=dict(env))
    if result.returncode != 0:
        raise OSError(f"{python}: cannot run it to see what it reads at start ({result.stderr.strip()[-200:]})")
    info = json.loads(result.stdout.strip().splitlines()[-1])
    directories: list[Path] = []
    files: list[Path] = []
    for entry in info["paths"]:
        (directories if os.path.isdir(entry) else files).append(Path(entry))
    if info["user_site"]:
        directories.append(Path(info["user_site"]))
    bin_dir = Path(info["executable"]).parent
    if info["venv"]:
        directories.append(bin_dir)
        files.append(Path(info["prefix"]) / "pyvenv.cfg")
    else:
        files += _entry_scripts(bin_dir)
    return StartPaths(Path(python), tuple(dict.fromkeys(directories)), tuple(dict.fromkeys(files)))


def _entry_scripts(bin_dir: Path) -> list[Path]:
    """The scripts of a shared bin/ (``/usr/bin``) that a Python runs: a ``#!`` line naming python."""
    found = []
    for path in sorted(bin_dir.iterdir()) if bin_dir.is_dir() else ():
        try:
            with open(path, "rb") as script:
                first = script.readline(256)
        except OSError:
            continue
        if first.startswith(b"#!") and b"python" in first:
            found.append(path)
    return found


@dataclass(frozen=True)
class FileState:
    """A file as the comparison sees it: contents for small files, what no process can set back for large ones."""

    kind: str
    """``file``, ``link`` or ``absent``."""
    mode: int = 0
    digest: str = ""
    """sha256 of a small file, the target of a link."""
    fixed: tuple[int, ...] = ()
    """(size, mtime_ns, ctime_ns, device, inode, links) of a large file."""

    def same_as(self, other: FileState) -> bool:
        """Equal, or a large file whose change time moved only because a link to its inode was made or removed
        elsewhere: uv links one cached file into every venv of its wheel, so another venv made from the cache
        moves the ctime of this venv's torch libraries. (Left open: a write in place with the mtime set back,
        made together with a new link outside the watched directories.)"""
        if self == other:
            return True
        if self.kind != "file" or other.kind != "file" or not self.fixed or not other.fixed:
            return False
        return self.unmoved == other.unmoved and self.fixed[5] != other.fixed[5]

    @property
    def unmoved(self) -> tuple[int, ...]:
        """(size, mtime_ns, device, inode) of a large file: what a link to its inode made or removed elsewhere leaves
        as it was (it moves the change time, and the link count unless removed again)."""
        return (*self.fixed[:2], *self.fixed[3:5])


def _state(path: str) -> FileState:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return FileState("absent")
    if stat.S_ISLNK(info.st_mode):
        return FileState("link", info.st_mode, os.readlink(path))
    if not stat.S_ISREG(info.st_mode):
        return FileState("other", info.st_mode)
    if info.st_size > DIGESTED_BYTES:
        return FileState("file", info.st_mode, "", (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_dev,
                                                    info.st_ino, info.st_nlink))
    try:
        return FileState("file", info.st_mode, sha256_file(path))
    except OSError:
        return FileState("unreadable", info.st_mode)


def snapshot(paths: Iterable[StartPaths], *, skip: Iterable[Path] = ()) -> dict[str, FileState]:
    """The state of every file the interpreters read at start; ``skip``: directories that change by design (the
    build's own cache and output, the checkout a person edits meanwhile), never walked, nor is a directory of
    ``sys.path`` that holds one of them (``PYTHONPATH=.`` in the checkout)."""
    skipped = {os.path.realpath(p) for p in skip}
    found: dict[str, FileState] = {}
    for start in paths:
        for directory in start.directories:
            real = os.path.realpath(directory)
            if any(s == real or s.startswith(real.rstrip(os.sep) + os.sep) for s in skipped):
                continue
            for root, dirs, files in os.walk(directory):
                dirs[:] = [d for d in dirs if os.path.realpath(os.path.join(root, d)) not in skipped]
                for name in files:
                    path = os.path.join(root, name)
                    if path not in found:
                        found[path] = _state(path)
        for file in start.files:
            found.setdefault(str(file), _state(str(file)))
    return found


@dataclass(frozen=True)
class Changes:
    added: tuple[str, ...]
    altered: tuple[str, ...]
    removed: tuple[str, ...]
    bytecode: tuple[str, ...]
    """Cached bytecode added or altered (deleted; not a finding)."""

    def __bool__(self) -> bool:
        return bool(self.added or self.altered or self.removed)

    @property
    def found(self) -> tuple[str, ...]:
        return (*self.added, *self.altered, *self.removed)

    def outside(self, folder: Path) -> Changes:
        """The changes to files that are not below ``folder``."""
        def keep(paths: tuple[str, ...]) -> tuple[str, ...]:
            return tuple(p for p in paths if not Path(p).is_relative_to(folder))
        return Changes(keep(self.added), keep(self.altered), keep(self.removed), ())


def is_cached_bytecode(path: str) -> bool:
    return Path(path).parent.name == "__pycache__" and path.endswith(".pyc")


class _Records:
    """The sha256 that installed distributions' ``RECORD`` files list, read only for a large file whose change time
    alone moved: a link to its inode made and removed again elsewhere (a venv made from uv's cache and deleted while
    the build ran) leaves the link count where it was."""

    def __init__(self, before: Mapping[str, FileState], after: Mapping[str, FileState]) -> None:
        self._before, self._after = before, after
        self._read: dict[str, dict[str, tuple[str, str]]] = {}

    def vouch_for(self, path: str, old: FileState, new: FileState) -> bool:
        """Whether ``path`` kept its contents: its size, mtime and inode as they were, and its sha256 the one its
        distribution's RECORD lists, that RECORD unchanged by the build."""
        if not (old.kind == new.kind == "file" and old.fixed and new.fixed) or old.unmoved != new.unmoved:
            return False
        entry = self._entry(path)
        if entry is None:
            return False
        record, listed = entry
        if record not in self._before or self._before[record] != self._after.get(record):
            return False
        try:
            return file_record_hash(path)[0] == listed
        except OSError:
            return False

    def _entry(self, path: str) -> tuple[str, str] | None:
        for folder in Path(path).parents:
            entries = self._site(str(folder))
            if path in entries:
                return entries[path]
        return None

    def _site(self, folder: str) -> dict[str, tuple[str, str]]:
        if folder not in self._read:
            entries: dict[str, tuple[str, str]] = {}
            for record in sorted(Path(folder).glob("*.dist-info/RECORD")):
                with contextlib.suppress(OSError, csv.Error, UnicodeDecodeError), open(record, newline="") as fp:
                    for row in csv.reader(fp):
                        if len(row) >= 2 and row[1].startswith("sha256="):
                            entries[os.path.normpath(os.path.join(folder, row[0]))] = (str(record), row[1])
            self._read[folder] = entries
        return self._read[folder]


def compare(before: Mapping[str, FileState], after: Mapping[str, FileState]) -> Changes:
    absent = FileState("absent")
    added, altered, removed, bytecode = [], [], [], []
    records = _Records(before, after)
    for path in sorted(before.keys() | after.keys()):
        old, new = before.get(path, absent), after.get(path, absent)
        if old.same_as(new) or records.vouch_for(path, old, new):
            continue
        if is_cached_bytecode(path):
            if new.kind != "absent":  # a removed .pyc is compiled again from its (compared) source
                bytecode.append(path)
        elif old.kind == "absent":
            added.append(path)
        elif new.kind == "absent":
            removed.append(path)
        else:
            altered.append(path)
    return Changes(tuple(added), tuple(altered), tuple(removed), tuple(bytecode))


def _listed(paths: Sequence[str], most: int = 5) -> str:
    return ", ".join(paths[:most]) + (f" and {len(paths) - most} more" if len(paths) > most else "")


def take_back(changes: Changes) -> list[str]:
    """Take what a build changed out of an interpreter's reach, and say what was done, one phrase each: what it
    added is removed, what it altered renamed to ``<name>.changed-by-build`` (kept to look at, never run), and what
    it deleted is named with the distributions to reinstall."""
    done = []
    for path in changes.added:
        with contextlib.suppress(FileNotFoundError, IsADirectoryError):
            os.unlink(path)
    if changes.added:
        done.append(f"removed what it added ({_listed(changes.added)})")
    for path in changes.altered:
        with contextlib.suppress(FileNotFoundError):
            os.replace(path, path + CHANGED_SUFFIX)
    if changes.altered:
        done.append(f"renamed what it altered to <name>{CHANGED_SUFFIX} ({_listed(changes.altered)})")
    if changes.removed:
        done.append(f"could not bring back what it deleted ({_listed(changes.removed)})")
    owners = distributions_of([*changes.altered, *changes.removed])
    if changes.altered or changes.removed:
        done.append("reinstall " + (" ".join(owners) if owners else "them") + " before this interpreter runs again "
                    f"(pip install --force-reinstall {' '.join(owners) or '<distribution>'})")
    return done


def distributions_of(paths: Iterable[str]) -> list[str]:
    """The distributions whose RECORD lists any of ``paths`` (in the site-packages above each), sorted."""
    wanted = {os.path.realpath(p) for p in paths}
    owners: set[str] = set()
    seen: set[Path] = set()
    for path in wanted:
        for folder in Path(path).parents:
            if folder in seen:
                continue
            seen.add(folder)
            for record in folder.glob("*.dist-info/RECORD") if folder.is_dir() else ():
                if _record_lists(record, folder, wanted):
                    owners.add(record.parent.name.split("-")[0])
    return sorted(owners)


def _record_lists(record: Path, site: Path, wanted: set[str]) -> bool:
    try:
        rows = csv.reader(record.read_text(encoding="utf-8", errors="replace").splitlines())
        return any(row and os.path.realpath(site / row[0]) in wanted for row in rows)
    except (OSError, csv.Error):
        return False
