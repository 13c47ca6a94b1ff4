"""Publishing a generated index site: git branch, Pages artifact or plain directory.

Every target takes the files of a finished site (built in memory by :func:`publish_index`) and
converges to them:

- :class:`GitBranchTarget` clones one branch (e.g. ``gh-pages``) of a git
  remote into a temporary worktree (or starts it as an orphan branch), replaces
  its content, commits only when something changed, and pushes. Running it
  again with the same site makes no commit.
- :class:`ArtifactTarget` writes a directory for ``actions/upload-pages-artifact``
  (plain files, no symlinks): the new tree is assembled in a sibling temporary
  directory (unchanged files hard-linked from the old tree) and renamed into
  place, so a reader sees the old tree or the new one, never a mix.
- :class:`DirectoryTarget` updates a plain directory in place (the local
  store's index, served over file:// or loopback http); each file is replaced
  atomically, new and changed files first, removals last.

A target is ours only when it is new, empty, or holds the ``wheelhouse-site.json`` an earlier publish
wrote (:mod:`ci.publish.site_marker`; a site from before that file is adopted when it holds nothing but index
pages), and a publish replaces or removes only the files that marker lists: a ``.git`` (at any depth)
and any file no publish wrote stay. A directory target may not be or contain the repository or the
store, nor lie inside the store's ``releases/``. A branch that holds no site of ours, and the
remote's default branch, are replaced only with ``force``. A site whose marker names another store
is published over only with ``force``. :func:`publish_index` also refuses, unless ``allow_shrink``, a
site that drops all, or more than :data:`MAX_DROPPED_SHARE`, of the wheel links published before:
those of the target, and for a Pages artifact built on a fresh runner those the live site's marker
counts (a store read from the wrong place looks empty).

Files whose bytes are equal are never rewritten, so their mtimes stay and a
change in one world touches only that world's files (and the shared landing
page / digest cache / marker when their content changes). ``dry_run=True`` returns the
plan (files added, changed, removed) and writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from ci.base import log
from ci.base.errors import RemoteError, UsageError, WheelhouseError
from ci.building import toolchain
from ci.model import matrix, wheel_packages
from ci.model.versions import REPO_ROOT, Versions
from ci.publish import site_lock
from ci.publish.catalog import INDEX_RECORD, Context, parse_previous
from ci.publish.index import CACHE_FILE, DigestCache, Fetch, IndexSummary, Site, site_files, summarize
from ci.publish.site_marker import MARKER_FILE, SiteMarker, is_digest_cache, landing_links, legacy_files
from ci.store.model import Release, ReleaseStore

_GIT_DIR = ".git"
MAX_DROPPED_SHARE = 0.5
"""Share of the previously published wheel links a publish may drop without ``allow_shrink``."""
_LINK = re.compile(r'<a href="[^"]*"[^>]*>([^<]+)</a>')
_TEMP_SUFFIX = re.compile(r"^(?P<dir>(?:.*/)?)\.(?P<name>.+)\.tmp-\d+$")
"""``.<name>.tmp-<pid>``: what :func:`_atomic_write` leaves beside ``<name>`` when it is killed."""
_CLONE_PREFIX = "wheelhouse-pages-"


@dataclass(frozen=True)
class SiteChanges:
    """What publishing a site changes in a target, as sorted relative POSIX paths."""

    added: tuple[str, ...] = ()
    changed: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    unchanged: int = 0

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.removed)

    def line(self) -> str:
        return f"{len(self.added)} added, {len(self.changed)} changed, {len(self.removed)} removed, {self.unchanged} unchanged"


@dataclass(frozen=True)
class PublishResult:
    target: str
    changes: SiteChanges
    dry_run: bool
    commit: str | None = None
    """The commit made (git targets, when something changed and not a dry run)."""


@dataclass(frozen=True)
class PublishOutcome:
    summary: IndexSummary
    result: PublishResult
    warnings: tuple[str, ...] = field(default_factory=tuple)
    """The index's warnings plus publishing's own (e.g. an unreadable digest cache)."""


@dataclass(frozen=True)
class PreviousSite:
    """The site a target holds before a publish (None stands for a new or empty target)."""

    files: frozenset[str] | None
    """The files a publish may replace or remove; None: all of them (a branch replaced with ``force``)."""
    store: str | None = None
    """The store its marker names (None: no marker)."""
    adopted: str | None = None
    """A warning when the site predates the marker and was adopted."""


@dataclass(frozen=True)
class LiveSite:
    """What the site at the public URL holds; read for a Pages artifact, which is built on a fresh runner."""

    url: str
    cache: bytes | None = None
    """Its ``digests.json``."""
    published: bool = False
    """A site of ours is there (a marker, or a ``digests.json`` of ours)."""
    store: str | None = None
    links: int | None = None
    """The wheel links it serves: its marker's count, or its landing page's for a site from before the marker."""
    warning: str | None = None
    record: bytes | None = None
    """Its ``wheelhouse-index.json``: the worlds and projects a publish carries over as retired."""


class PagesTarget(Protocol):
    description: str

    def read(self, relpath: str) -> bytes | None:
        """The bytes of one published file, or None."""

    def published_root(self) -> Path | None:
        """The local tree of the published site (None when there is none yet)."""

    def previous_site(self) -> PreviousSite | None:
        """The site the target holds (None when new or empty); a WheelhouseError when it is not ours."""

    def publish(self, site: Mapping[str, bytes], *, previous: PreviousSite | None,
                dry_run: bool = False) -> PublishResult:
        """Make the target hold the files of ``site``, replacing or removing only files ``previous`` lists."""

    def built_fresh(self) -> bool:
        """Whether the target starts empty where the site is served from elsewhere (a Pages artifact on a fresh
        runner): then the live site stands for what was published before."""

    def close(self) -> None:
        """Release what the target holds for the publish (a git clone); nothing for a directory."""


# --------------------------------------------------------------------------- tree comparison


def _files(root: Path) -> dict[str, Path]:
    """Regular files under ``root`` by relative POSIX path, without any ``.git`` (at any depth, never
    touched); symlinks are refused."""
    found: dict[str, Path] = {}
    if not root.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if d != _GIT_DIR]
        filenames = [f for f in filenames if f != _GIT_DIR]  # a submodule's or worktree's .git file
        for name in dirnames + filenames:
            path = here / name
            if path.is_symlink():
                raise WheelhouseError(f"{path} is a symlink: a Pages site must hold plain files only; remove it")
        for name in filenames:
            path = here / name
            found[path.relative_to(root).as_posix()] = path
    return dict(sorted(found.items()))


def _same(data: bytes, path: Path) -> bool:
    return path.stat().st_size == len(data) and path.read_bytes() == data


def _may_replace(rel: str, previous: PreviousSite | None, site: Mapping[str, bytes]) -> bool:
    """Whether a publish may overwrite or remove ``rel``: a file the previous site lists, or the temporary
    file a killed write left beside one of its files or the new site's."""
    if previous is None:
        return False
    if previous.files is None:
        return True
    temp = _TEMP_SUFFIX.match(rel)
    if temp:
        rel = temp["dir"] + temp["name"]
        return rel in previous.files or rel in site
    return rel in previous.files


def diff_site(site: Mapping[str, bytes], dest: Path, *, previous: PreviousSite | None,
              where: str = "") -> SiteChanges:
    """What :func:`sync_tree` would do to make ``dest`` hold ``site``; files ``previous`` does not list stay."""
    old = _files(dest)
    added = [rel for rel in site if rel not in old]
    changed = [rel for rel in site if rel in old and not _same(site[rel], old[rel])]
    foreign = [rel for rel in changed if not _may_replace(rel, previous, site)]
    if foreign:
        raise WheelhouseError(f"{where or dest}: {foreign[0]} was not written by an earlier publish and the new site "
                              "would overwrite it; move it away and publish again")
    removed = [rel for rel in old if rel not in site and _may_replace(rel, previous, site)]
    unchanged = len(site) - len(added) - len(changed)
    return SiteChanges(tuple(sorted(added)), tuple(sorted(changed)), tuple(sorted(removed)), unchanged)


def _atomic_write(data: bytes, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, dst)


def _remove_emptied_dirs(root: Path, removed: Iterable[str]) -> None:
    """Remove the directories that removing ``removed`` left empty (never ``root``, never another)."""
    for rel in sorted({Path(r).parent for r in removed}, key=lambda p: -len(p.parts)):
        path = root / rel
        while path != root and path.is_relative_to(root):
            try:
                path.rmdir()
            except OSError:  # not empty: it holds something else
                break
            path = path.parent


def sync_tree(site: Mapping[str, bytes], dest: Path, *, previous: PreviousSite | None, dry_run: bool = False,
              where: str = "") -> SiteChanges:
    """Make ``dest`` hold the files of ``site``, touching only files that differ and removing only files
    ``previous`` lists.

    New and changed files are written before anything is removed, so a reader (or a crash) never meets a
    listing whose package pages are gone. The marker is written first listing the old files and the new
    ones, and last listing the new ones: after a crash at any point it names every file a publish wrote."""
    changes = diff_site(site, dest, previous=previous, where=where)
    if dry_run or changes.empty:
        return changes
    dest.mkdir(parents=True, exist_ok=True)
    marker = site.get(MARKER_FILE)
    interim = None
    if marker is not None and MARKER_FILE in changes.added + changes.changed:
        new = SiteMarker.parse(marker, source=MARKER_FILE)
        earlier = previous.files if previous is not None and previous.files is not None else frozenset()
        interim = SiteMarker(new.store, new.links, new.files | (earlier - {MARKER_FILE})).to_json()
        _atomic_write(interim, dest / MARKER_FILE)
    for rel in changes.added + changes.changed:
        if rel != MARKER_FILE:
            _atomic_write(site[rel], dest / rel)
    for rel in changes.removed:
        (dest / rel).unlink()
    if marker is not None and interim is not None and interim != marker:
        _atomic_write(marker, dest / MARKER_FILE)
    _remove_emptied_dirs(dest, changes.removed)
    return changes


def site_links(root: Path | None) -> set[str]:
    """``<world>/<wheel filename>`` of every link of the world pages of the site under ``root``."""
    links: set[str] = set()
    if root is None or not root.is_dir():
        return links
    for page in root.glob("*/*/simple/*/index.html"):
        world = page.relative_to(root).parts[:2]
        text = page.read_text(encoding="utf-8", errors="replace")
        links.update(f"{world[0]}/{world[1]}/{name}" for name in _LINK.findall(text))
    return links


def _wheel_links(files: Mapping[str, bytes]) -> set[str]:
    """:func:`site_links` of a site held in memory."""
    links: set[str] = set()
    for rel, data in files.items():
        parts = rel.split("/")
        if len(parts) == 5 and parts[2] == "simple" and parts[4] == "index.html":
            links.update(f"{parts[0]}/{parts[1]}/{name}" for name in _LINK.findall(data.decode("utf-8", "replace")))
    return links


def _first_write_leftover(name: str) -> bool:
    """The temporary marker a publish writes first, left alone by a kill: nothing else was written yet."""
    temp = _TEMP_SUFFIX.match(name)
    return temp is not None and temp["name"] == MARKER_FILE


_NOT_OURS_DIR = "name a new or empty directory, or the directory of an earlier publish"


def _previous_site(root: Path, *, where: str, adopt: bool, force: bool = False,
                   not_ours_fix: str = _NOT_OURS_DIR) -> PreviousSite | None:
    """The site under ``root`` (None when there is none): its marker's file list, or for a site published
    before the marker, its index files. Anything else is refused, unless ``force`` (then all of it goes)."""
    top = [entry.name for entry in root.iterdir() if entry.name != _GIT_DIR] if root.is_dir() else []
    if all(_first_write_leftover(name) for name in top):  # empty, or a first publish killed in its first write
        return PreviousSite(frozenset()) if top else None
    # only a marker, or our digests.json, is a reason to read the tree (it may be someone's home directory)
    marker, cache = root / MARKER_FILE, root / CACHE_FILE
    if marker.is_file():
        try:
            parsed = SiteMarker.parse(marker.read_bytes(), source=f"{MARKER_FILE} of {where}")
        except WheelhouseError:
            if force:
                return PreviousSite(None)
            raise
        return PreviousSite(parsed.files | {MARKER_FILE}, parsed.store)
    if cache.is_file() and is_digest_cache(cache.read_bytes()):
        ours, others = legacy_files(_files(root))
        if not others or adopt:
            kept = f"; kept {len(others)} file(s) no publish wrote, e.g. {others[0]}" if others else ""
            return PreviousSite(ours, adopted=f"{where}: adopted a site published before {MARKER_FILE} "
                                              f"({len(ours)} index file(s) and our {CACHE_FILE}){kept}")
        if not force:
            raise WheelhouseError(
                f"{where} holds a site published before {MARKER_FILE} and {len(others)} file(s) no publish wrote "
                f"(e.g. {others[0]}): pass --adopt to publish over it (those files are kept), or move them away")
    if force:
        return PreviousSite(None)
    raise WheelhouseError(f"{where} is not empty and holds no published site (no {MARKER_FILE}): publishing would "
                          f"delete its files; {not_ours_fix}")


def check_site_dir(path: Path, *, store_root: Path | None = None) -> None:
    """Refuse a directory a publish must never write: a file, the repository, the store (see the module
    docstring); whether the directory is ours is :func:`_previous_site`'s question."""
    where = path.resolve()
    if where.exists() and not where.is_dir():
        raise WheelhouseError(f"{path} is a file, not a directory: name a directory for the site")
    guarded = [(REPO_ROOT.resolve(), "the repository")]
    if store_root is not None:
        guarded.append((Path(store_root).resolve(), "the release store"))
        releases = Path(store_root).resolve() / "releases"
        if where == releases or where.is_relative_to(releases):
            raise WheelhouseError(f"{path} is inside the release store's releases/: "
                                  f"publish the site elsewhere (default: {Path(store_root) / 'site'})")
    for root, what in guarded:
        if root == where or root.is_relative_to(where):
            raise WheelhouseError(f"{path} is or contains {what} ({root}): publishing there would delete its files; "
                                  "name a directory of its own for the site")


# --------------------------------------------------------------------------- directory targets


class DirectoryTarget:
    """A plain directory updated in place (e.g. the local store's index).

    ``store_root``: the local store the site is built from, which the directory may not overlap.
    ``adopt``: take over a site published before the marker that also holds other files (they are kept)."""

    def __init__(self, path: Path, *, store_root: Path | None = None, adopt: bool = False) -> None:
        self.path = Path(path)
        self.description = f"directory {self.path}"
        self.adopt = adopt
        check_site_dir(self.path, store_root=store_root)
        self.previous_site()  # refused now, before the store is read, when it is not ours

    def published_root(self) -> Path | None:
        return self.path

    def read(self, relpath: str) -> bytes | None:
        try:
            return (self.published_root() or self.path).joinpath(relpath).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def previous_site(self) -> PreviousSite | None:
        check_site_dir(self.path)  # still a directory of its own (it may have changed since the target was named)
        root = self.published_root()
        return _previous_site(root, where=str(self.path), adopt=self.adopt) if root is not None else None

    def publish(self, site: Mapping[str, bytes], *, previous: PreviousSite | None,
                dry_run: bool = False) -> PublishResult:
        changes = sync_tree(site, self.path, previous=previous, dry_run=dry_run, where=self.description)
        return PublishResult(self.description, changes, dry_run)

    def built_fresh(self) -> bool:
        return False  # the directory is where the site is served from

    def close(self) -> None:
        pass


class ArtifactTarget(DirectoryTarget):
    """A Pages artifact directory, replaced as a whole by a rename."""

    def __init__(self, path: Path, *, store_root: Path | None = None, adopt: bool = False) -> None:
        super().__init__(path, store_root=store_root, adopt=adopt)
        self.description = f"pages artifact {self.path}"

    def _leftovers(self, kind: str) -> list[Path]:
        """``.<name>.old-*`` backups or ``.<name>.new-*`` staging trees of a killed publish (compared by
        prefix: the name may hold glob characters)."""
        parent, prefix = self.path.parent, f".{self.path.name}.{kind}-"
        if not parent.is_dir():
            return []
        found = [p for p in parent.iterdir() if p.name.startswith(prefix) and p.is_dir() and not p.is_symlink()]
        return sorted(found, key=lambda p: p.stat().st_mtime)

    def published_root(self) -> Path | None:
        """The tree, or when a publish was killed between its two renames, the backup the next run restores."""
        backups = self._leftovers("old")
        return backups[-1] if backups and not self.path.exists() else self.path

    def previous_site(self) -> PreviousSite | None:
        previous = super().previous_site()
        root = self.published_root()
        if root is not None and any(root.rglob(_GIT_DIR)):
            raise WheelhouseError(f"{self.path} holds a {_GIT_DIR}: an artifact directory is replaced as a whole; "
                                  "name a directory of its own")
        return previous

    def built_fresh(self) -> bool:
        return self.previous_site() is None

    def _recover(self) -> None:
        """Undo what a publish killed between its two renames left: no tree, a backup, a staging tree."""
        backups = self._leftovers("old")
        if backups and not self.path.exists():
            os.rename(backups.pop(), self.path)
        for leftover in backups + self._leftovers("new"):
            shutil.rmtree(leftover, ignore_errors=True)

    def publish(self, site: Mapping[str, bytes], *, previous: PreviousSite | None,
                dry_run: bool = False) -> PublishResult:
        if not dry_run:
            self._recover()
        changes = diff_site(site, self.path, previous=previous, where=self.description)
        if dry_run or (changes.empty and self.path.is_dir()):
            return PublishResult(self.description, changes, dry_run)
        parent = self.path.parent
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.new-", dir=parent))
        backup = parent / f".{self.path.name}.old-{os.getpid()}"
        try:
            old = _files(self.path)
            rewritten = set(changes.added) | set(changes.changed)
            # unchanged files keep their inode (bytes and mtime); files no publish wrote are carried over
            kept = [rel for rel in old if rel not in rewritten and rel not in changes.removed]
            for rel in kept:
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                try:
                    os.link(old[rel], target)
                except OSError:
                    shutil.copy2(old[rel], target)
            for rel in rewritten:
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(site[rel])
            staging.chmod(0o755)
            if self.path.exists():
                os.rename(self.path, backup)
                os.rename(staging, self.path)
                shutil.rmtree(backup)
            else:
                os.rename(staging, self.path)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return PublishResult(self.description, changes, dry_run)


# --------------------------------------------------------------------------- git target


def _redact(remote: str) -> str:
    parts = urlsplit(remote)
    if parts.password or parts.username:
        host = parts.hostname or ""
        if parts.port:
            host += f":{parts.port}"
        return urlunsplit((parts.scheme, "***@" + host, parts.path, parts.query, parts.fragment))
    return remote


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _reap_clones(tmp: Path) -> None:
    """Remove the clones of killed publishes: named by us (``wheelhouse-pages-<pid>-``), owned by this user,
    and their process is gone."""
    for entry in tmp.glob(f"{_CLONE_PREFIX}*"):
        pid = re.fullmatch(rf"{_CLONE_PREFIX}(\d+)-\w+", entry.name)
        with contextlib.suppress(OSError):
            if (pid and entry.is_dir() and not entry.is_symlink() and entry.stat().st_uid == os.getuid()
                    and not _process_alive(int(pid[1]))):
                shutil.rmtree(entry)


class GitBranchTarget:
    """One branch of a git remote (``gh-pages``), updated by commit and push.

    Use as a context manager (or call :meth:`close`): the worktree is a temporary clone made on first
    use. ``force``: replace a branch that holds no site of ours, the remote's default branch included
    (history keeps the old tree). ``adopt``: as for :class:`DirectoryTarget`.
    """

    def __init__(
        self,
        remote: str,
        branch: str = "gh-pages",
        *,
        message: str = "Update package index",
        author_name: str = "wheelhouse",
        author_email: str = "wheelhouse@localhost",
        force: bool = False,
        adopt: bool = False,
    ) -> None:
        self.remote = remote
        self.branch = branch
        self.message = message
        self.author = (author_name, author_email)
        self.force = force
        self.adopt = adopt
        self.description = f"git {_redact(remote)} branch {branch}"
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._worktree: Path | None = None
        self._exists = False
        self._default_branch: str | None = None

    def __enter__(self) -> GitBranchTarget:  # Python 3.10 has no typing.Self
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None
            self._worktree = None

    def _git(self, *args: str, cwd: Path | None = None) -> str:
        name, email = self.author
        env = {**os.environ, "GIT_TERMINAL_PROMPT": "0", "LC_ALL": "C"}
        cmd = ["git", "-c", f"user.name={name}", "-c", f"user.email={email}", "-c", "core.autocrlf=false", *args]
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            detail = " ".join((proc.stderr or proc.stdout).split())
            detail = log.mask(detail, urlsplit(self.remote).password)
            detail = detail.replace(self.remote, _redact(self.remote))
            raise RemoteError(
                f"git {args[0]} failed for {self.description}: {detail[:400]}; check the remote URL and its access"
            )
        return proc.stdout

    def worktree(self) -> Path:
        """The clone of the branch (created on first call); an orphan branch when the remote lacks it."""
        if self._worktree is not None:
            return self._worktree
        tmp = Path(tempfile.gettempdir())
        _reap_clones(tmp)
        self._tmp = tempfile.TemporaryDirectory(prefix=f"{_CLONE_PREFIX}{os.getpid()}-", dir=tmp)
        work = Path(self._tmp.name) / "site"
        refs = self._git("ls-remote", "--symref", "--", self.remote, "HEAD", f"refs/heads/{self.branch}")
        for line in refs.splitlines():
            symref = re.fullmatch(r"ref: refs/heads/(\S+)\s+HEAD", line.strip())
            if symref:
                self._default_branch = symref[1]
            elif line.endswith(f"\trefs/heads/{self.branch}"):
                self._exists = True
        if self._exists:
            self._git(
                "clone",
                "--quiet",
                "--depth",
                "1",
                "--no-tags",
                "--single-branch",
                "--branch",
                self.branch,
                "--",
                self.remote,
                str(work),
            )
        else:
            work.mkdir()
            self._git("init", "--quiet", cwd=work)
            self._git("checkout", "--quiet", "--orphan", self.branch, cwd=work)
            self._git("remote", "add", "--", "origin", self.remote, cwd=work)
        self._worktree = work
        return work

    def published_root(self) -> Path | None:
        return self.worktree()

    def built_fresh(self) -> bool:
        return False  # the branch is what is served

    def read(self, relpath: str) -> bytes | None:
        path = self.worktree() / relpath
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def previous_site(self) -> PreviousSite | None:
        work = self.worktree()
        if not self._exists:
            return None
        if self.branch == self._default_branch and not self.force:
            raise WheelhouseError(
                f"{self.branch} is the default branch of {_redact(self.remote)}: publishing would replace the "
                "project's files with the index; name a branch of its own such as gh-pages (or pass --force)")
        return _previous_site(work, where=self.description, adopt=self.adopt, force=self.force,
                              not_ours_fix="name a new branch or the branch of an earlier publish, or pass --force "
                                           "to replace its tree (its history keeps it)")

    def head(self) -> str | None:
        work = self.worktree()
        try:
            return self._git("rev-parse", "--verify", "--quiet", "HEAD", cwd=work).strip() or None
        except RemoteError:
            return None

    def publish(self, site: Mapping[str, bytes], *, previous: PreviousSite | None,
                dry_run: bool = False) -> PublishResult:
        work = self.worktree()
        changes = sync_tree(site, work, previous=previous, dry_run=dry_run, where=self.description)
        if dry_run or changes.empty:
            return PublishResult(self.description, changes, dry_run)
        self._git("add", "--all", cwd=work)
        if not self._git("status", "--porcelain", cwd=work).strip():
            return PublishResult(self.description, changes, dry_run)
        self._git("commit", "--quiet", "--no-verify", "-m", self.message, cwd=work)
        commit = self._git("rev-parse", "HEAD", cwd=work).strip()
        try:
            self._git("push", "--quiet", "origin", f"HEAD:refs/heads/{self.branch}", cwd=work)
        except RemoteError as exc:
            raise RemoteError(f"{exc} (if another publish pushed meanwhile, run publish again)") from None
        return PublishResult(self.description, changes, dry_run, commit)


# --------------------------------------------------------------------------- orchestration


def default_world(versions: Versions, chosen: str | None = None) -> str:
    """The world served at ``/simple/``: ``chosen``, else the first build_matrix row's."""
    return chosen or matrix.expand(versions)[0].world


def origin_url(repo_root: Path = REPO_ROOT) -> str:
    """This repository's ``origin`` remote: where ``--push-branch`` pushes unless ``--remote`` names another."""
    proc = subprocess.run(["git", "-C", str(repo_root), "remote", "get-url", "origin"], capture_output=True, text=True)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise UsageError(f"--push-branch: {repo_root} has no git remote 'origin'; name the remote with --remote URL")
    return proc.stdout.strip()


def index_target(*, store_root: Path | None, github_repo: str | None, out: str | Path | None = None,
                 pages_artifact: str | Path | None = None, push_branch: str | None = None, remote: str | None = None,
                 base_url: str | None = None, repo_root: Path = REPO_ROOT, force: bool = False,
                 adopt: bool = False) -> tuple[PagesTarget, str] | None:
    """Where the index is published, and the public URL its pages are read at; None when nothing names a target.

    The target is the first named of ``push_branch`` (of ``remote``, default this repository's origin),
    ``pages_artifact`` and ``out``; a local store (``store_root``) with none of them publishes into
    ``<store>/site``. The base URL is ``base_url``, else GitHub Pages of the store's repository
    (``https://<owner>.github.io/<repo>``), else the site directory as a ``file://`` URL.
    """
    if push_branch:
        target: PagesTarget = GitBranchTarget(remote or origin_url(repo_root), branch=push_branch, force=force,
                                              adopt=adopt)
    elif pages_artifact:
        target = ArtifactTarget(Path(pages_artifact), store_root=store_root, adopt=adopt)
    elif out:
        target = DirectoryTarget(Path(out), store_root=store_root, adopt=adopt)
    elif store_root is not None:
        target = DirectoryTarget(store_root / "site", store_root=store_root, adopt=adopt)
    else:
        return None
    if base_url is None:
        if github_repo:
            owner, name = github_repo.split("/")
            base_url = f"https://{owner}.github.io/{name}"
        else:
            base_url = Path(out or pages_artifact or (store_root or Path(".")) / "site").resolve().as_uri()
    return target, base_url


@dataclass(frozen=True)
class IndexWhere:
    """Where an index goes and what it serves: the target, the public URL its pages are read at, the world
    served at ``/simple/``, what each component may publish (:func:`ci.model.wheel_packages.by_component`), and
    what versions.yaml says about the worlds (:func:`context_of`)."""

    target: PagesTarget
    base_url: str
    default_world: str | None
    projects: Mapping[str, frozenset[str]] | None = None
    context: Context | None = None
    rehosted: Mapping[str, frozenset[str]] | None = None
    """What each component rehosts from upstream (:func:`ci.model.wheel_packages.rehosted_by_component`)."""
    store_url: str | None = None
    """Where a local store's root is served beside the site (:func:`served_store_url`); None: its wheel links are
    the store's own (``file://`` for a local store, GitHub's download URLs)."""
    warnings: tuple[str, ...] = ()


def context_of(versions: Versions) -> Context:
    """Each world's torch index (its first build_matrix row's), the worlds the rows build and the projects the
    components publish: what the pages and records say beside the releases (ci/publish/catalog.py)."""
    rows = matrix.expand(versions)
    indexes: dict[str, str | None] = {}
    for row in rows:
        indexes.setdefault(row.world, toolchain.torch_index(row))
    projects = frozenset(p for names in wheel_packages.by_component(versions).values() for p in names)
    return Context(indexes, frozenset(indexes), projects)


def index_where(store: ReleaseStore, versions: Versions, *, github_repo: str | None, chosen_world: str | None = None,
                out: str | Path | None = None, pages_artifact: str | Path | None = None, push_branch: str | None = None,
                remote: str | None = None, base_url: str | None = None, force: bool = False,
                adopt: bool = False) -> IndexWhere:
    """The :class:`IndexWhere` the options name for the index of ``store`` (see :func:`index_target`);
    ``chosen_world``: the world served at ``/simple/`` (default: the first build_matrix row's)."""
    found = index_target(store_root=store.root, github_repo=github_repo, out=out, pages_artifact=pages_artifact,
                         push_branch=push_branch, remote=remote, base_url=base_url, force=force, adopt=adopt)
    if found is None:
        raise UsageError(f"{store.description} keeps no site of its own: name where the index goes (--out, "
                         "--pages-artifact or --push-branch)")
    target, url = found
    store_url, warning = served_store_url(store.root, target, base_url)
    return IndexWhere(target, url, default_world(versions, chosen_world), wheel_packages.by_component(versions),
                      context_of(versions), wheel_packages.rehosted_by_component(versions), store_url,
                      (warning,) if warning else ())


def served_store_url(store_root: Path | None, target: PagesTarget, base_url: str | None) -> tuple[str | None, str | None]:
    """(the URL a local store's root is served at, a warning) for a site published with ``--base-url``.

    A site that lies inside the store (``<store>/site``, the default) is served with it: the server serves the
    store's root, the site at ``base_url``, so the wheels are at ``base_url`` less the site's path in the store
    (``http://host/site`` -> ``http://host/releases/...``). Elsewhere, or with a ``base_url`` that does not end
    in that path, the wheel links stay the store's ``file://`` URLs, which only this machine can open: a warning
    says so."""
    if store_root is None or base_url is None or base_url.startswith("file:") or not isinstance(target, DirectoryTarget):
        return None, None
    site = target.path.resolve()
    root = store_root.resolve()
    base = base_url.rstrip("/")
    rel = site.relative_to(root).as_posix() if site.is_relative_to(root) else None
    if rel is None or rel == "." or not base.endswith("/" + rel):
        return None, (f"the wheel links stay file:// URLs of the store {store_root}, which only this machine opens: "
                      f"publish into the store ({store_root / 'site'}, the default) with --base-url naming that "
                      "folder's URL, and serve the store's root there")
    return base.removesuffix("/" + rel), None


def publish(store: ReleaseStore, where: IndexWhere, *, releases: Iterable[Release] | None = None,
            dry_run: bool = False, allow_shrink: bool = False, force: bool = False,
            shrink_flag: str = "--allow-shrink") -> PublishOutcome:
    """Publish the index of the store's releases (or of ``releases``, a part of them) where ``where`` says:
    the one publishing flow of publish-index and prune.

    A target built fresh (a Pages artifact) reads the live site at the base URL first, through the store;
    assets without a digest are hashed through the store too; a git target's clone is removed afterwards.
    ``allow_shrink``, ``force`` and ``shrink_flag`` are :func:`publish_index`'s."""
    target = where.target
    if where.store_url is not None and store.root is not None:
        from ci.store.local import LocalStore

        store = LocalStore(store.root, base_url=where.store_url, must_exist=True)  # the same files, served URLs
    try:
        with _one_publish_at_a_time(target, dry_run=dry_run):
            live = read_live_site(where.base_url, store.get_public) if target.built_fresh() else None
            return publish_index(store.list_releases() if releases is None else releases, target,
                                 base_url=where.base_url, default_world=where.default_world, fetch=store.fetch,
                                 dry_run=dry_run, allow_shrink=allow_shrink, store=store.description, live=live,
                                 force=force, shrink_flag=shrink_flag, projects=where.projects,
                                 context=where.context, rehosted=where.rehosted, warnings=where.warnings)
    finally:
        target.close()


@contextlib.contextmanager
def _one_publish_at_a_time(target: PagesTarget, *, dry_run: bool) -> Iterator[None]:
    """The site lock (ci/publish/site_lock.py) of a directory target, held from reading the published site to writing
    the new one; a git branch needs none (a second push that is not a fast-forward is refused by the remote),
    nor does a dry run, which writes nothing."""
    site = target.path if isinstance(target, DirectoryTarget) else None
    if site is None or dry_run:
        yield
        return
    with site_lock.held(site):
        yield


def publish_index(
    releases: Iterable[Release],
    target: PagesTarget,
    *,
    base_url: str,
    default_world: str | None,
    fetch: Fetch | None = None,
    yanked: Mapping[str, str] | None = None,
    site_name: str = "wheelhouse",
    previous_cache: bytes | None = None,
    dry_run: bool = False,
    allow_shrink: bool = False,
    store: str | None = None,
    live: LiveSite | None = None,
    force: bool = False,
    shrink_flag: str = "--allow-shrink",
    projects: Mapping[str, frozenset[str]] | None = None,
    context: Context | None = None,
    rehosted: Mapping[str, frozenset[str]] | None = None,
    warnings: Iterable[str] = (),
) -> PublishOutcome:
    """Build the index of ``releases`` in memory and publish it, with its marker, to ``target``.

    ``store`` names the store the releases come from (the marker records it); a target or ``live``
    site whose marker names another store is refused unless ``force``. The digest cache comes from
    ``previous_cache`` when given, else from the target's published ``digests.json``, else from the
    ``live`` site's; an unreadable one is replaced, with a warning. Unless ``allow_shrink`` (named
    ``shrink_flag`` in the refusal), a site that drops all, or more than :data:`MAX_DROPPED_SHARE`, of
    the wheel links the target, or else the ``live`` site, published before is refused. ``projects``
    (:func:`ci.model.wheel_packages.by_component`) leaves out a wheel its release's component does not publish.
    ``context`` (:func:`context_of`) gives the worlds' torch indexes and what is current; the worlds and
    projects the earlier publish served (its ``wheelhouse-index.json``, the target's, else the live
    site's) that have no wheels now stay on the site, marked archived.
    """
    warnings = [*warnings, *([live.warning] if live is not None and live.warning else [])]
    previous = target.previous_site()
    if previous is not None and previous.adopted:
        warnings.append(previous.adopted)
    if not force:
        _check_same_store(previous.store if previous is not None else None, store, target.description)
        if live is not None:
            _check_same_store(live.store, store, f"the live site at {live.url}")
    raw = previous_cache if previous_cache is not None else target.read(CACHE_FILE)
    if raw is None and live is not None:
        raw = live.cache
    try:
        cache = DigestCache.from_json(raw, source=f"{CACHE_FILE} of {target.description}")
    except WheelhouseError as exc:
        warnings.append(str(exc))
        cache = DigestCache()
    record = target.read(INDEX_RECORD) if previous is not None else None
    if record is None and live is not None:
        record = live.record
    try:
        earlier = parse_previous(record, source=f"{INDEX_RECORD} of {target.description}")
    except WheelhouseError as exc:
        warnings.append(str(exc))
        earlier = None
    context = replace(context or Context(), previous=earlier)
    site, files = site_files(
        releases,
        base_url=base_url,
        default_world=default_world,
        fetch=fetch,
        cache=cache,
        yanked=yanked,
        site_name=site_name,
        projects=projects,
        context=context,
        rehosted=rehosted,
    )
    _check_default_world(site)
    links = _wheel_links(files)
    files[MARKER_FILE] = SiteMarker(store, len(links), frozenset(files)).to_json()
    summary = summarize(site, files)
    if not allow_shrink:
        _check_shrink(site_links(target.published_root()) if previous is not None else set(), links,
                      target.description, shrink_flag)
        if live is not None:
            _check_live_shrink(live, links, shrink_flag)
    try:
        result = target.publish(files, previous=previous, dry_run=dry_run)
    except OSError as exc:  # the target's file system said no (read-only, /proc, full disk...)
        where = getattr(target, "path", None) or exc.filename
        raise WheelhouseError(f"cannot write the site to {where} ({exc.strerror}); name a writable "
                              "directory") from None
    return PublishOutcome(summary, result, tuple(warnings) + summary.warnings)


def read_live_site(base_url: str, get: Callable[[str], bytes | None]) -> LiveSite:
    """The site published at ``base_url``, read with ``get(url)`` (None for a 404: nothing published yet).

    A Pages artifact is built on a fresh runner: the live site's ``digests.json`` saves downloading every
    asset without a digest again, and its marker (or, for a site from before the marker, its landing
    page) says how many wheel links it serves. A failure to read gives a warning and no comparison."""
    url = base_url.rstrip("/")
    try:
        marker = get(f"{url}/{MARKER_FILE}")
        cache = get(f"{url}/{CACHE_FILE}")
        landing = get(f"{url}/index.html") if marker is None and is_digest_cache(cache) else None
        record = get(f"{url}/{INDEX_RECORD}") if marker is not None else None
    except Exception as exc:  # unreachable: the publish goes on, as it did before the site existed
        return LiveSite(url, warning=f"could not read the live site at {url} ({exc}); hashing without its "
                                     f"{CACHE_FILE}, and the drop in wheel links is not measured against it")
    if marker is not None:
        parsed = SiteMarker.parse(marker, source=f"{MARKER_FILE} of the live site at {url} (check --base-url)")
        return LiveSite(url, cache, True, parsed.store, parsed.links, record=record)
    if is_digest_cache(cache):
        return LiveSite(url, cache, True, None, landing_links(landing))
    return LiveSite(url, cache)


def _check_default_world(site: Site) -> None:
    """/simple/ must not be re-pointed at a world without wheels while others have some: that is the mark of a
    versions file other than the one the store was built and released with (its first row names the world)."""
    served = [w.path for w in site.worlds if w.link_count]
    default = site.world(site.default_world) if site.default_world else None
    if served and site.default_world and (default is None or not default.link_count):
        raise UsageError(
            f"the world served at /simple/, {site.default_world} (the first build_matrix row's, or --default-world), "
            f"has no wheels in this store, which holds {', '.join(served)}: set WHEELHOUSE_VERSIONS to the versions "
            f"file the store was built and released with, or pass --default-world {served[0]}")


def _check_same_store(published: str | None, store: str | None, where: str) -> None:
    if published is not None and store is not None and published != store:
        raise WheelhouseError(f"{where} holds the index of the store {published}, not of {store}: check --store / "
                              "WHEELHOUSE_STORE (and --base-url); pass --force to publish over it")


def _check_shrink(before: set[str], after: set[str], where: str, flag: str) -> None:
    dropped = before - after
    if before and (len(dropped) == len(before) or len(dropped) > MAX_DROPPED_SHARE * len(before)):
        raise WheelhouseError(
            f"the new index would drop {len(dropped)} of the {len(before)} wheel links {where} "
            f"publishes now (more than {MAX_DROPPED_SHARE:.0%}), e.g. {sorted(dropped)[0]}: check that the store "
            f"(--store / WHEELHOUSE_STORE) is the right one; pass {flag} if the drop is intended")


def _check_live_shrink(live: LiveSite, after: set[str], flag: str) -> None:
    """The drop measured against the live site's count (a fresh artifact directory has nothing to compare)."""
    if not live.published:
        return
    if live.links is None:
        raise WheelhouseError(
            f"the live site at {live.url} holds an index of ours but neither {MARKER_FILE} nor a landing page that "
            f"counts its wheel links, so the drop cannot be measured: check --base-url; pass {flag} to publish anyway")
    if live.links and (not after or live.links - len(after) > MAX_DROPPED_SHARE * live.links):
        raise WheelhouseError(
            f"the new index would hold {len(after)} wheel links where the live site at {live.url} serves "
            f"{live.links} (a drop of more than {MAX_DROPPED_SHARE:.0%}): check that the store (--store / "
            f"WHEELHOUSE_STORE) is the right one; pass {flag} if the drop is intended")
