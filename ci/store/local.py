"""A release store in a local directory, with the GitHub store's behaviour.

Layout (one folder per release, assets beside a small JSON record)::

    <root>/releases/<tag>/release.json     {"tag", "title", "body", "created_at", "assets": {name: {size, sha256}}}
    <root>/releases/<tag>/assets/<name>

Every write goes to a temporary file in the same folder and is then renamed
into place, so a reader never sees a half-written asset and a clobber has no
moment where the name is missing (rename is atomic on one file system).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path

from ci.errors import RemoteError
from ci.store.model import Asset, Release

_CHUNK = 1 << 20
_SAFE_NAME = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+")


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _check_name(kind: str, name: str) -> None:
    if not name or name in (".", "..") or not set(name) <= _SAFE_NAME:
        raise RemoteError(f"local store: {kind} name {name!r} has characters outside [A-Za-z0-9._+-]; rename it")


class LocalStore:
    """ReleaseStore over a directory; ``base_url`` makes asset URLs http:// instead of file://."""

    def __init__(self, root: Path, base_url: str | None = None) -> None:
        self.root = Path(root).resolve()
        self.base_url = base_url.rstrip("/") if base_url else None
        self.description = str(self.root)
        self._lock = threading.Lock()

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
        try:
            return json.loads((self._dir(tag) / "release.json").read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise RemoteError(f"local store: {self._dir(tag)}/release.json is unreadable ({exc}); remove that release") from None

    def _write_record(self, tag: str, record: dict) -> None:
        _atomic_write(self._dir(tag) / "release.json", json.dumps(record, indent=2, sort_keys=True).encode() + b"\n")

    def _release(self, record: dict) -> Release:
        tag = record["tag"]
        assets = tuple(
            Asset(name=name, size=info["size"], url=self._url(tag, name), digest=f"sha256:{info['sha256']}", id=name)
            for name, info in sorted(record.get("assets", {}).items())
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
                releases.append(self._release(record))
        return releases

    def get_release(self, tag: str) -> Release | None:
        record = self._read_record(tag)
        return self._release(record) if record else None

    def ensure_release(self, tag: str, title: str, body: str) -> Release:
        with self._lock:
            (self._dir(tag) / "assets").mkdir(parents=True, exist_ok=True)
            record = self._read_record(tag) or {
                "tag": tag, "assets": {}, "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
            if record.get("title") != title or record.get("body") != body:
                record.update(title=title, body=body)
                self._write_record(tag, record)
            return self._release(record)

    def upload_asset(self, tag: str, path: Path, *, name: str | None = None, clobber: bool = False) -> Asset:
        name = name or Path(path).name
        _check_name("asset", name)
        sha256 = sha256_file(Path(path))
        with self._lock:
            record = self._read_record(tag)
            if record is None:
                raise RemoteError(f"local store: release {tag} does not exist; create it first (invoke release)")
            existing = record["assets"].get(name)
            if existing and existing["sha256"] == sha256:
                return self._release(record).asset(name)
            if existing and not clobber:
                raise RemoteError(
                    f"release {tag}: asset {name} exists with other bytes (sha256 {existing['sha256'][:12]}…); "
                    "pass --clobber to replace it"
                )
            target = self._dir(tag) / "assets" / name
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{name}.")
            os.close(fd)
            shutil.copyfile(path, tmp)
            os.replace(tmp, target)
            record["assets"][name] = {"size": target.stat().st_size, "sha256": sha256}
            self._write_record(tag, record)
            return self._release(record).asset(name)

    def delete_asset(self, tag: str, name: str) -> None:
        with self._lock:
            record = self._read_record(tag)
            if record is None or name not in record["assets"]:
                return
            del record["assets"][name]
            self._write_record(tag, record)
            (self._dir(tag) / "assets" / name).unlink(missing_ok=True)

    def delete_release(self, tag: str) -> None:
        with self._lock:
            shutil.rmtree(self._dir(tag), ignore_errors=True)

    def retag_release(self, old_tag: str, new_tag: str) -> Release:
        with self._lock:
            record = self._read_record(old_tag)
            if record is None:
                existing = self._read_record(new_tag)
                if existing is not None:
                    return self._release(existing)  # already moved: idempotent
                raise RemoteError(f"local store: release {old_tag} does not exist")
            if self._dir(new_tag).exists():
                raise RemoteError(f"local store: cannot retag {old_tag}: {new_tag} already exists")
            os.rename(self._dir(old_tag), self._dir(new_tag))
            record["tag"] = new_tag
            self._write_record(new_tag, record)
            return self._release(record)

    def read_asset(self, tag: str, name: str, *, asset: Asset | None = None) -> bytes:
        _check_name("asset", name)
        try:
            return (self._dir(tag) / "assets" / name).read_bytes()
        except FileNotFoundError:
            raise RemoteError(f"local store: release {tag} has no asset {name}") from None


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)
