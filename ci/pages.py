"""Publishing a generated index site: git branch, Pages artifact or plain directory.

Every target takes a finished site directory (built into a temporary directory
by :func:`publish_index`) and converges to it:

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

A directory target must be new, empty or a site published before (it holds
our ``digests.json``); it may not be or contain the repository or the store,
nor lie inside the store's ``releases/``, and a ``.git`` in it is never
touched: a mistyped ``--out`` is refused instead of emptied.
:func:`publish_index` also refuses, unless ``allow_shrink``, a site that
drops more than :data:`MAX_DROPPED_SHARE` of the wheel links published
before (a store read from the wrong place looks empty).

Files whose bytes are equal are never rewritten, so their mtimes stay and a
change in one world touches only that world's files (and the shared landing
page / digest cache when their content changes). ``dry_run=True`` returns the
plan (files added, changed, removed) and writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol
from urllib.parse import urlsplit, urlunsplit

from ci import log, matrix
from ci.errors import RemoteError, UsageError, WheelhouseError
from ci.index import CACHE_FILE, DigestCache, Fetch, IndexSummary, site_files, summarize, write_files
from ci.store.model import Release
from ci.versions import REPO_ROOT, Versions

_GIT_DIR = ".git"
MAX_DROPPED_SHARE = 0.5
"""Share of the previously published wheel links a publish may drop without ``allow_shrink``."""
_LINK = re.compile(r'<a href="[^"]*"[^>]*>([^<]+)</a>')


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


class PagesTarget(Protocol):
    description: str

    def read(self, relpath: str) -> bytes | None:
        """The bytes of one published file, or None."""

    def published_root(self) -> Path | None:
        """The local tree of the published site (None when there is none yet)."""

    def publish(self, site_dir: Path, *, dry_run: bool = False) -> PublishResult:
        """Make the target hold exactly the files of ``site_dir``."""


# --------------------------------------------------------------------------- tree comparison


def _files(root: Path, *, skip_git: bool = False) -> dict[str, Path]:
    """Regular files under ``root`` by relative POSIX path; symlinks are refused."""
    found: dict[str, Path] = {}
    if not root.exists():
        return found
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        if skip_git and here == root and _GIT_DIR in dirnames:
            dirnames.remove(_GIT_DIR)
        for name in list(dirnames) + filenames:
            path = here / name
            if path.is_symlink():
                raise WheelhouseError(f"{path} is a symlink: a Pages site must hold plain files only; remove it")
        for name in filenames:
            path = here / name
            found[path.relative_to(root).as_posix()] = path
    return dict(sorted(found.items()))


def _same(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with a.open("rb") as fa, b.open("rb") as fb:
        while True:
            ca, cb = fa.read(1 << 20), fb.read(1 << 20)
            if ca != cb:
                return False
            if not ca:
                return True


def diff_trees(site_dir: Path, dest: Path, *, skip_git: bool = False) -> SiteChanges:
    """What :func:`sync_tree` would do to make ``dest`` equal to ``site_dir``."""
    new = _files(site_dir)
    old = _files(dest, skip_git=skip_git)
    added = [rel for rel in new if rel not in old]
    changed = [rel for rel in new if rel in old and not _same(new[rel], old[rel])]
    removed = [rel for rel in old if rel not in new]
    unchanged = len(new) - len(added) - len(changed)
    return SiteChanges(tuple(added), tuple(changed), tuple(removed), unchanged)


def _atomic_copy(src: Path, dst: Path) -> None:
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    shutil.copyfile(src, tmp)
    os.replace(tmp, dst)


def _prune_empty_dirs(root: Path) -> None:
    for dirpath, _dirnames, _filenames in sorted(os.walk(root), key=lambda item: -len(item[0])):
        path = Path(dirpath)
        if path == root or _GIT_DIR in path.relative_to(root).parts:
            continue
        with contextlib.suppress(OSError):
            path.rmdir()


def sync_tree(site_dir: Path, dest: Path, *, dry_run: bool = False, skip_git: bool = False) -> SiteChanges:
    """Make ``dest`` hold exactly the files of ``site_dir``, touching only files that differ.

    New and changed files are written before anything is removed, so a reader (or a crash) never
    meets a listing whose package pages are gone."""
    changes = diff_trees(site_dir, dest, skip_git=skip_git)
    if dry_run or changes.empty:
        return changes
    dest.mkdir(parents=True, exist_ok=True)
    for rel in changes.added + changes.changed:
        _atomic_copy(site_dir / rel, dest / rel)
    for rel in changes.removed:
        (dest / rel).unlink()
    _prune_empty_dirs(dest)
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


def _is_published_site(path: Path) -> bool:
    """Every publish writes ``digests.json`` (a corrupt one is rebuilt, so only its presence counts)."""
    return (path / CACHE_FILE).is_file()


def check_site_dir(path: Path, *, store_root: Path | None = None) -> None:
    """Refuse a directory a publish would damage (see the module docstring)."""
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
    if where.is_dir() and any(where.iterdir()) and not _is_published_site(where):
        raise WheelhouseError(
            f"{path} is not empty and holds no published site (no {CACHE_FILE}): publishing would delete "
            "its files; name a new or empty directory, or the directory of an earlier publish")


# --------------------------------------------------------------------------- directory targets


class DirectoryTarget:
    """A plain directory updated in place (e.g. the local store's index).

    ``store_root``: the local store the site is built from, which the directory may not overlap."""

    def __init__(self, path: Path, *, store_root: Path | None = None) -> None:
        self.path = Path(path)
        self.description = f"directory {self.path}"
        check_site_dir(self.path, store_root=store_root)

    def published_root(self) -> Path | None:
        return self.path

    def read(self, relpath: str) -> bytes | None:
        try:
            return (self.path / relpath).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def publish(self, site_dir: Path, *, dry_run: bool = False) -> PublishResult:
        check_site_dir(self.path)  # still ours (it may have changed since the target was named)
        changes = sync_tree(site_dir, self.path, dry_run=dry_run, skip_git=True)
        return PublishResult(self.description, changes, dry_run)


class ArtifactTarget(DirectoryTarget):
    """A Pages artifact directory, replaced as a whole by a rename."""

    def __init__(self, path: Path, *, store_root: Path | None = None) -> None:
        super().__init__(path, store_root=store_root)
        self.description = f"pages artifact {self.path}"
        if (self.path / _GIT_DIR).exists():
            raise WheelhouseError(f"{self.path} holds a {_GIT_DIR}: an artifact directory is replaced as a whole; "
                                  "name a directory of its own")

    def _recover(self) -> None:
        """Undo what a publish killed between its two renames left: no tree, a backup, a staging tree."""
        parent = self.path.parent
        backups = sorted(parent.glob(f".{self.path.name}.old-*"), key=lambda p: p.stat().st_mtime)
        if backups and not self.path.exists():
            os.rename(backups.pop(), self.path)
        for leftover in backups + list(parent.glob(f".{self.path.name}.new-*")):
            shutil.rmtree(leftover, ignore_errors=True)

    def publish(self, site_dir: Path, *, dry_run: bool = False) -> PublishResult:
        check_site_dir(self.path)
        if not dry_run:
            self._recover()
        changes = diff_trees(site_dir, self.path)
        if dry_run or (changes.empty and self.path.is_dir()):
            return PublishResult(self.description, changes, dry_run)
        parent = self.path.parent
        parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{self.path.name}.new-", dir=parent))
        backup = parent / f".{self.path.name}.old-{os.getpid()}"
        try:
            old = _files(self.path)
            unchanged = set(_files(site_dir)) - set(changes.added) - set(changes.changed)
            for rel, src in _files(site_dir).items():
                target = staging / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                if rel in unchanged:
                    try:
                        os.link(old[rel], target)  # same inode: bytes and mtime kept
                        continue
                    except OSError:
                        pass
                    shutil.copy2(old[rel], target)
                else:
                    shutil.copyfile(src, target)
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


class GitBranchTarget:
    """One branch of a git remote (``gh-pages``), updated by commit and push.

    Use as a context manager (or call :meth:`close`): the worktree is a
    temporary clone made on first use.
    """

    def __init__(
        self,
        remote: str,
        branch: str = "gh-pages",
        *,
        message: str = "Update package index",
        author_name: str = "wheelhouse",
        author_email: str = "wheelhouse@localhost",
    ) -> None:
        self.remote = remote
        self.branch = branch
        self.message = message
        self.author = (author_name, author_email)
        self.description = f"git {_redact(remote)} branch {branch}"
        self._tmp: tempfile.TemporaryDirectory[str] | None = None
        self._worktree: Path | None = None

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
        self._tmp = tempfile.TemporaryDirectory(prefix="wheelhouse-pages-")
        work = Path(self._tmp.name) / "site"
        heads = self._git("ls-remote", "--heads", "--", self.remote, f"refs/heads/{self.branch}")
        if heads.strip():
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

    def read(self, relpath: str) -> bytes | None:
        path = self.worktree() / relpath
        try:
            return path.read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def head(self) -> str | None:
        work = self.worktree()
        try:
            return self._git("rev-parse", "--verify", "--quiet", "HEAD", cwd=work).strip() or None
        except RemoteError:
            return None

    def publish(self, site_dir: Path, *, dry_run: bool = False) -> PublishResult:
        work = self.worktree()
        changes = sync_tree(site_dir, work, dry_run=dry_run, skip_git=True)
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
                 base_url: str | None = None, repo_root: Path = REPO_ROOT) -> tuple[PagesTarget, str] | None:
    """Where the index is published, and the public URL its pages are read at; None when nothing names a target.

    The target is the first named of ``push_branch`` (of ``remote``, default this repository's origin),
    ``pages_artifact`` and ``out``; a local store (``store_root``) with none of them publishes into
    ``<store>/site``. The base URL is ``base_url``, else GitHub Pages of the store's repository
    (``https://<owner>.github.io/<repo>``), else the site directory as a ``file://`` URL.
    """
    if push_branch:
        target: PagesTarget = GitBranchTarget(remote or origin_url(repo_root), branch=push_branch)
    elif pages_artifact:
        target = ArtifactTarget(Path(pages_artifact), store_root=store_root)
    elif out:
        target = DirectoryTarget(Path(out), store_root=store_root)
    elif store_root is not None:
        target = DirectoryTarget(store_root / "site", store_root=store_root)
    else:
        return None
    if base_url is None:
        if github_repo:
            owner, name = github_repo.split("/")
            base_url = f"https://{owner}.github.io/{name}"
        else:
            base_url = Path(out or pages_artifact or (store_root or Path(".")) / "site").resolve().as_uri()
    return target, base_url



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
) -> PublishOutcome:
    """Build the index of ``releases`` into a temporary directory and publish it to ``target``.

    The digest cache comes from ``previous_cache`` when given, else from the
    target's published ``digests.json``; an unreadable one is replaced, with a
    warning. Unless ``allow_shrink``, a site that drops all, or more than
    :data:`MAX_DROPPED_SHARE`, of the wheel links published before is refused.
    """
    warnings: list[str] = []
    raw = previous_cache if previous_cache is not None else target.read(CACHE_FILE)
    try:
        cache = DigestCache.from_json(raw, source=f"{CACHE_FILE} of {target.description}")
    except WheelhouseError as exc:
        warnings.append(str(exc))
        cache = DigestCache()
    site, files = site_files(
        releases,
        base_url=base_url,
        default_world=default_world,
        fetch=fetch,
        cache=cache,
        yanked=yanked,
        site_name=site_name,
    )
    summary = summarize(site, files)
    if not allow_shrink:
        _check_shrink(target, files)
    with tempfile.TemporaryDirectory(prefix="wheelhouse-site-") as tmp:
        site_dir = Path(tmp) / "site"
        write_files(files, site_dir)
        try:
            result = target.publish(site_dir, dry_run=dry_run)
        except OSError as exc:  # the target's file system said no (read-only, /proc, full disk...)
            where = getattr(target, "path", None) or exc.filename
            raise WheelhouseError(f"cannot write the site to {where} ({exc.strerror}); name a writable "
                                  "directory") from None
    return PublishOutcome(summary, result, tuple(warnings) + summary.warnings)


def published_cache(base_url: str, get: Callable[[str], bytes | None]) -> tuple[bytes | None, str | None]:
    """(the live site's ``digests.json``, a warning) read from ``base_url`` with ``get(url)``.

    A Pages artifact is built on a fresh runner, so its own directory holds no cache: without the live
    one every asset lacking a digest and every ``.metadata`` would be downloaded again on every publish.
    ``get`` returns None for a 404 (a first publish); any failure gives a warning and no cache."""
    url = f"{base_url.rstrip('/')}/{CACHE_FILE}"
    try:
        return get(url), None
    except Exception as exc:  # the cache only saves downloads; its absence costs time
        return None, f"could not read the published {CACHE_FILE} at {url} ({exc}); hashing without it"


def _check_shrink(target: PagesTarget, files: Mapping[str, bytes]) -> None:
    before = site_links(target.published_root())
    if not before:
        return
    after: set[str] = set()
    for rel, data in files.items():
        parts = rel.split("/")
        if len(parts) == 5 and parts[2] == "simple" and parts[4] == "index.html":
            after.update(f"{parts[0]}/{parts[1]}/{name}" for name in _LINK.findall(data.decode("utf-8", "replace")))
    dropped = before - after
    if len(dropped) == len(before) or len(dropped) > MAX_DROPPED_SHARE * len(before):
        raise WheelhouseError(
            f"the new index would drop {len(dropped)} of the {len(before)} wheel links {target.description} "
            f"publishes now (more than {MAX_DROPPED_SHARE:.0%}), e.g. {sorted(dropped)[0]}: check that the store "
            "(--store / WHEELHOUSE_STORE) is the right one; pass --allow-shrink if the drop is intended")
