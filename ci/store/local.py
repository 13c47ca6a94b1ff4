"""A release store in a local directory, with the GitHub store's behaviour.

Layout (one folder per release, assets beside a small JSON record)::

    <root>/releases/<tag>/release.json     {"tag", "title", "body", "created_at", "assets": {name: {size, sha256}}}
    <root>/releases/<tag>/assets/<name>

Every write goes to a temporary file in the same folder and is then renamed
into place, so a reader never sees a half-written asset and a clobber has no
moment where the name is missing (rename is atomic on one file system).

Several processes may write one store at once (the two arch jobs of one
release): each read-modify-write of a record happens under an exclusive
``flock`` on ``<root>/.wheelhouse-store.lock``; the long copy of an asset
happens before, outside the lock.

Crash consistency (a process may die between any two steps):

- a clobber first records the new bytes as ``pending`` (with the name of the
  fully written temporary file), then renames the file into place, then
  records the new digest. While the temporary file exists the old bytes and
  the old record still agree; once it is gone the pending digest is the true
  one. Readers resolve this without writing; the next writer settles it.
- a release's tag is its folder name, so a retag (rename the folder, then
  rewrite the record) is complete as soon as the folder has moved.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from ci.base import bounded_json
from ci.base.digest import sha256_file
from ci.base.errors import RemoteError
from ci.store.model import Asset, Release

_CHUNK = 1 << 20
LOCK_FILE = ".wheelhouse-store.lock"
_TEMP_MARK = ".new-"
"""Temporary copies are ``assets/.<name>.new-<random>``."""
_TEMP_RANDOM = re.compile(r"[a-z0-9_]+")
"""The characters ``tempfile.mkstemp`` puts after the prefix."""
_FILE_MODE = 0o644
"""Assets and records are world-readable, so a web server running as another user can serve a store."""
_SAFE_NAME = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+")


def _name_is_safe(name: str) -> bool:
    """A name that stays inside the folder it is joined to: no separator, not ``.`` or ``..``."""
    return bool(name) and name not in (".", "..") and set(name) <= _SAFE_NAME


def _check_name(kind: str, name: str) -> None:
    if not _name_is_safe(name):
        raise RemoteError(f"local store: {kind} name {name!r} has characters outside [A-Za-z0-9._+-]; rename it")


def _is_temporary_name(file: object, name: str) -> bool:
    """Whether ``file`` is a temporary copy of asset ``name`` as upload_asset makes it (``.<name>.new-<random>``)."""
    prefix = f".{name}{_TEMP_MARK}"
    return (isinstance(file, str) and file.startswith(prefix)
            and _TEMP_RANDOM.fullmatch(file[len(prefix):]) is not None)


class LocalStore:
    """ReleaseStore over a directory; ``base_url`` makes asset URLs http:// instead of file://."""

    def __init__(self, root: Path, base_url: str | None = None, *, must_exist: bool = False) -> None:
        self.root = Path(root).resolve()
        self.base_url = base_url.rstrip("/") if base_url else None
        self.description = str(self.root)
        self._lock = threading.Lock()
        if must_exist and not self.releases_dir.is_dir():
            raise RemoteError(
                f"local store {self.root} does not exist (no releases/ folder): check --store / WHEELHOUSE_STORE; "
                "a store is created by its first `invoke release`")

    @contextlib.contextmanager
    def _locked(self):
        """Exclusive access to the store's records, across threads and processes."""
        with self._lock:
            self.releases_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, _FILE_MODE)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                yield
            finally:
                os.close(fd)  # releases the lock (as the death of the process would)

    # --- paths and records ---

    @property
    def releases_dir(self) -> Path:
        return self.root / "releases"

    def _dir(self, tag: str) -> Path:
        _check_name("tag", tag)
        return self.releases_dir / tag

    def _url(self, tag: str, name: str) -> str:
        if self.base_url:
            quoted = "/".join(urllib.parse.quote(part) for part in ("releases", tag, "assets", name))
            return f"{self.base_url}/{quoted}"
        return (self.releases_dir / tag / "assets" / name).as_uri()

    def _read_record(self, tag: str) -> dict | None:
        path = self._dir(tag) / "release.json"
        try:
            record = bounded_json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise RemoteError(f"local store: {path} is unreadable ({exc}); remove that release") from None
        problem = _record_problem(record)
        if problem:
            raise RemoteError(f"local store: {path} is not a release record ({problem}); restore it from a copy "
                              "or remove that release folder")
        return record

    def _write_record(self, tag: str, record: dict) -> None:
        record["tag"] = tag  # informational: the folder name is the tag
        _atomic_write(self._dir(tag) / "release.json", json.dumps(record, indent=2, sort_keys=True).encode() + b"\n")

    def _temporary(self, tag: str, file: str) -> Path:
        """``assets/<file>`` of a pending clobber; never a path outside ``assets/`` (the record is data)."""
        if not _name_is_safe(file):  # _record_problem refused it already: this guards the unlink itself
            raise RuntimeError(f"release {tag}: pending file {file!r} passed the record checks but leaves assets/")
        return self._dir(tag) / "assets" / file

    def _assets(self, tag: str, record: dict) -> dict[str, dict]:
        """The record's assets with each crash-interrupted clobber resolved (see the module docstring)."""
        assets = dict(record.get("assets", {}))
        for name, pending in record.get("pending", {}).items():
            if not self._temporary(tag, pending["file"]).exists():  # renamed into place: new bytes
                assets[name] = {"size": pending["size"], "sha256": pending["sha256"]}
        return assets

    def _settle(self, tag: str, record: dict) -> dict:
        """Finish (or roll back) a clobber a crash interrupted; call with the lock held."""
        if not record.get("pending"):
            return record
        settled = {key: value for key, value in record.items() if key != "pending"}
        settled["assets"] = self._assets(tag, record)
        self._write_record(tag, settled)
        for pending in record["pending"].values():  # never renamed into place: drop the temporary file
            self._temporary(tag, pending["file"]).unlink(missing_ok=True)
        return settled

    def _release(self, tag: str, record: dict) -> Release:
        """The release in folder ``tag`` (the folder name is the tag: a retag is done once it has moved)."""
        assets = tuple(
            Asset(name=name, size=info["size"], url=self._url(tag, name), digest=f"sha256:{info['sha256']}", id=name)
            for name, info in sorted(self._assets(tag, record).items())
        )
        created = record.get("created_at") or self._record_mtime(tag)
        return Release(tag=tag, title=record["title"], body=record.get("body", ""), assets=assets, id=tag,
                       created_at=created)

    def _record_mtime(self, tag: str) -> str | None:
        """Last change of the release record: an upper bound of its creation time (older records lack one)."""
        try:
            return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime((self._dir(tag) / "release.json").stat().st_mtime))
        except OSError:
            return None

    # --- ReleaseStore ---

    def list_releases(self) -> list[Release]:
        if not self.releases_dir.is_dir():
            return []
        releases = []
        for folder in sorted(self.releases_dir.iterdir()):
            record = self._read_record(folder.name) if (folder / "release.json").exists() else None
            if record is not None:
                releases.append(self._release(folder.name, record))
        return releases

    def get_release(self, tag: str) -> Release | None:
        record = self._read_record(tag)
        return self._release(tag, record) if record else None

    def ensure_release(self, tag: str, title: str, body: str) -> Release:
        with self._locked():
            (self._dir(tag) / "assets").mkdir(parents=True, exist_ok=True)
            record = self._read_record(tag) or {
                "tag": tag, "assets": {}, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            if record.get("title") != title or record.get("body") != body:
                record.update(title=title, body=body)
                self._write_record(tag, record)
            return self._release(tag, record)

    def upload_asset(self, tag: str, path: Path, *, name: str | None = None, clobber: bool = False) -> Asset:
        name = name or Path(path).name
        _check_name("asset", name)
        sha256 = sha256_file(Path(path))
        record = self._read_record(tag)
        if record is not None and record.get("pending"):
            with self._locked():
                record = self._settle(tag, self._read_record(tag) or record)
        done = self._upload_decision(tag, name, sha256, clobber, record)
        if done is not None:  # unchanged: no copy at all
            return done
        # The long copy happens outside the lock; the record is re-read under it.
        assets_dir = self._dir(tag) / "assets"
        with self._locked():  # created and locked at once for _reap_orphans, which runs under this lock
            fd, tmp_name = tempfile.mkstemp(dir=assets_dir, prefix=f".{name}{_TEMP_MARK}")
            fcntl.flock(fd, fcntl.LOCK_EX)  # held while this process lives
        tmp = Path(tmp_name)
        keep_tmp = False  # once a pending record names it, only _settle may remove it
        try:
            shutil.copyfile(path, tmp)
            tmp.chmod(_FILE_MODE)
            with self._locked():
                record = self._read_record(tag)
                if record is not None:
                    record = self._settle(tag, record)
                    self._reap_orphans(tag)
                done = self._upload_decision(tag, name, sha256, clobber, record)
                if done is not None:  # a peer uploaded the same bytes meanwhile
                    return done
                if record is None:
                    raise RuntimeError(f"release {tag}: no record, yet no upload decision was taken")
                info = {"size": tmp.stat().st_size, "sha256": sha256}
                target = assets_dir / name
                if name in record["assets"]:
                    # Clobber: record the pending change first, so that a crash at any point is resolvable.
                    record.setdefault("pending", {})[name] = {**info, "file": tmp.name}
                    keep_tmp = True
                    self._write_record(tag, record)
                    os.replace(tmp, target)
                    del record["pending"][name]
                    if not record["pending"]:
                        del record["pending"]
                else:  # a new name: a crash before the record is written leaves an unlisted file only
                    os.replace(tmp, target)
                record["assets"][name] = info
                self._write_record(tag, record)
                asset = self._release(tag, record).asset(name)
                if asset is None:
                    raise RuntimeError(f"release {tag}: asset {name} missing from the record just written")
                return asset
        finally:
            os.close(fd)
            if not keep_tmp:
                tmp.unlink(missing_ok=True)

    def _reap_orphans(self, tag: str) -> None:
        """Delete temporary copies whose writer died (call with the lock held, after _settle).

        A writer holds an flock on its temporary file for as long as it runs; the kernel drops it
        when the process dies, so a temporary file whose lock can be taken belongs to nobody."""
        for leftover in (self._dir(tag) / "assets").glob(f".*{_TEMP_MARK}*"):
            try:
                fd = os.open(leftover, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live writer's copy
            finally:
                os.close(fd)
            leftover.unlink(missing_ok=True)

    def _upload_decision(self, tag: str, name: str, sha256: str, clobber: bool, record: dict | None) -> Asset | None:
        """The existing asset when it holds these bytes; raise when it must not be replaced; else None."""
        if record is None:
            raise RemoteError(f"local store: release {tag} does not exist; create it first (invoke release)")
        existing = self._assets(tag, record).get(name)
        if existing and existing["sha256"] == sha256:
            return self._release(tag, record).asset(name)
        if existing and not clobber:
            raise RemoteError(
                f"release {tag}: asset {name} exists with other bytes (sha256 {existing['sha256'][:12]}…); "
                "replace it on purpose (invoke release: --replace; restore-wheels: --clobber)"
            )
        return None

    def delete_asset(self, tag: str, name: str) -> None:
        with self._locked():
            record = self._read_record(tag)
            if record is None:
                return
            record = self._settle(tag, record)
            if name not in record["assets"]:
                return
            del record["assets"][name]
            self._write_record(tag, record)
            (self._dir(tag) / "assets" / name).unlink(missing_ok=True)

    def delete_release(self, tag: str) -> None:
        with self._locked():
            shutil.rmtree(self._dir(tag), ignore_errors=True)

    def retag_release(self, old_tag: str, new_tag: str) -> Release:
        with self._locked():
            record = self._read_record(old_tag)
            if record is None:
                existing = self._read_record(new_tag)
                if existing is not None:  # moved before (perhaps killed before its record was rewritten)
                    if existing.get("tag") != new_tag:
                        existing["tag"] = new_tag
                        self._write_record(new_tag, existing)
                    return self._release(new_tag, existing)
                raise RemoteError(f"local store: release {old_tag} does not exist")
            if self._dir(new_tag).exists():
                raise RemoteError(f"local store: cannot retag {old_tag}: {new_tag} already exists")
            os.rename(self._dir(old_tag), self._dir(new_tag))  # the retag is done here; the record follows
            record["tag"] = new_tag
            self._write_record(new_tag, record)
            return self._release(new_tag, record)

    def fetch(self, asset: Asset) -> Iterator[bytes]:
        """The bytes of one of this store's assets, read from the file its URL names."""
        path = self._asset_path(asset.url)
        try:
            with path.open("rb") as source:
                while chunk := source.read(_CHUNK):
                    yield chunk
        except FileNotFoundError:
            raise RemoteError(f"local store: {asset.url} is gone (deleted meanwhile?); re-run") from None

    def get_public(self, url: str) -> bytes | None:
        """The bytes of a file named by a ``file://`` URL (a site published into a directory); None when no file
        is there. A local store serves files only: another scheme is an error that names the fix."""
        try:
            return _file_path(url).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None

    def rehearsed_calls(self) -> list[str] | None:
        """A local store has no dry run: the release task stops before it would change one."""
        return None

    def _asset_path(self, url: str) -> Path:
        """The file behind an asset URL this store made (``file://`` or under ``base_url``)."""
        if self.base_url and url.startswith(self.base_url + "/"):
            path = self.root / urllib.parse.unquote(url.removeprefix(self.base_url + "/"))
        else:
            path = _file_path(url)
        if not path.resolve().is_relative_to(self.releases_dir):
            raise RemoteError(f"local store: {url} is not an asset of {self.root}; list the asset from this store")
        return path

    def read_asset(self, tag: str, name: str, *, asset: Asset | None = None) -> bytes:
        _check_name("asset", name)
        try:
            return (self._dir(tag) / "assets" / name).read_bytes()
        except FileNotFoundError:
            raise RemoteError(f"local store: release {tag} has no asset {name}") from None


def _file_path(url: str) -> Path:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
        raise RemoteError(f"{url}: a local store reads file:// URLs only; give --base-url as the file:// URL of the "
                          "published site's directory")
    return Path(urllib.parse.unquote(parts.path))


def _record_problem(record: object) -> str | None:
    """What makes ``record`` not a release record of ours (the layout in the module docstring), or None."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    if not isinstance(record.get("title"), str):
        return "no title"
    for key in ("assets", "pending"):
        entries = record.get(key, {})
        if not isinstance(entries, dict):
            return f"{key} is not an object"
        for name, info in entries.items():
            if not _name_is_safe(name):  # asset names become paths under assets/
                return f"{key} entry {name!r} is not an asset name (characters outside [A-Za-z0-9._+-], or . or ..)"
            wanted = ("size", "sha256", "file") if key == "pending" else ("size", "sha256")
            if not isinstance(info, dict) or any(field not in info for field in wanted):
                return f"{key} entry {name!r} lacks {' or '.join(wanted)}"
            if not isinstance(info["size"], int) or not isinstance(info["sha256"], str):
                return f"{key} entry {name!r} has a malformed size or sha256"
            if key == "pending" and not _is_temporary_name(info["file"], name):
                # the next writer deletes this file: only a temporary copy of ours may be named
                return (f"pending entry {name!r} names file {info['file']!r}, not a temporary copy "
                        f"'.{name}{_TEMP_MARK}<random>' in assets/")
    return None


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.chmod(tmp, _FILE_MODE)
    os.replace(tmp, path)
