"""Release and asset records shared by every store, and the store protocol.

A store holds releases keyed by tag; each release holds named assets. The
GitHub store maps these onto GitHub Releases, the local store onto a
directory tree; both return these same frozen records so that the release,
index and maintenance code never knows which one it talks to.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Asset:
    name: str
    size: int
    url: str
    """Where a client downloads the bytes (browser_download_url or file:// URL)."""
    digest: str | None = None
    """``sha256:<hex>``; None for GitHub assets uploaded before June 2025."""
    state: str = "uploaded"
    """``uploaded`` or ``starter`` (a failed upload GitHub left behind)."""
    id: int | str | None = None

    @property
    def sha256(self) -> str | None:
        if self.digest and self.digest.startswith("sha256:"):
            return self.digest.split(":", 1)[1]
        return None


@dataclass(frozen=True)
class Release:
    tag: str
    title: str
    body: str = ""
    draft: bool = False
    assets: tuple[Asset, ...] = field(default_factory=tuple)
    id: int | str | None = None
    created_at: str | None = None
    """When the release was published, ISO 8601 UTC (``2025-01-01T00:00:00Z``); None when unknown.

    GitHub: ``published_at`` (its ``created_at`` is the date of the tagged commit). Local store: the
    time recorded at creation, else the release record's modification time (never younger than the
    release, so an age filter errs towards keeping it)."""

    def asset(self, name: str) -> Asset | None:
        for asset in self.assets:
            if asset.name == name:
                return asset
        return None


def newest_by_name(assets: Iterable[Asset]) -> dict[str, Asset]:
    """One asset per name: the newest upload, i.e. the highest numeric id (GitHub's ids grow with
    time), else the one listed last.

    Two assets of one name exist after a clobber interrupted between its rename and its delete on a
    server that allows the rename; the newest holds the bytes meant to be served. The index, the
    stores and the test server all pick by this rule, so a link's hash always belongs to the bytes
    its URL serves."""
    chosen: dict[str, tuple[tuple[int, int], Asset]] = {}
    for position, asset in enumerate(assets):
        key = (asset.id if isinstance(asset.id, int) else -1, position)
        if asset.name not in chosen or key > chosen[asset.name][0]:
            chosen[asset.name] = (key, asset)
    return {name: asset for name, (_, asset) in chosen.items()}


@runtime_checkable
class ReleaseStore(Protocol):
    """What the release, index and maintenance code needs from a store.

    Every mutating method is idempotent: calling it again after a crash or a
    concurrent peer converges to the same state.
    """

    description: str
    """Human-readable location, e.g. ``github:owner/repo`` or a directory."""

    @property
    def root(self) -> Path | None:
        """The directory the store lives in (the index's default place, and a place a site may not go); None
        for a remote store."""

    def list_releases(self) -> list[Release]:
        """Every published (non-draft) release with its assets."""

    def get_release(self, tag: str) -> Release | None:
        """The release with this tag, or None."""

    def ensure_release(self, tag: str, title: str, body: str) -> Release:
        """Create the release, or update title/body of the existing one."""

    def upload_asset(self, tag: str, path: Path, *, name: str | None = None, clobber: bool = False) -> Asset:
        """Upload ``path`` as asset ``name`` (default: the file name).

        An existing asset with the same name and digest is left as is. With a
        different digest, ``clobber=False`` raises RemoteError; ``clobber=True``
        replaces it without a window where the name is missing.
        """

    def delete_asset(self, tag: str, name: str) -> None:
        """Delete one asset; a missing asset is not an error."""

    def delete_release(self, tag: str) -> None:
        """Delete the release (and its tag); a missing release is not an error."""

    def retag_release(self, old_tag: str, new_tag: str) -> Release:
        """Move a release to a new tag, keeping its assets."""

    def read_asset(self, tag: str, name: str, *, asset: Asset | None = None) -> bytes:
        """The bytes of a (small) asset such as the build manifest.

        ``asset``, the record from an earlier listing, lets a store fetch it
        without looking the release up again.
        """

    def fetch(self, asset: Asset) -> Iterator[bytes]:
        """The bytes an asset's URL serves, in chunks (the index hashes an asset without a digest this way)."""

    def get_public(self, url: str) -> bytes | None:
        """The bytes at a public URL of the kind the store serves (a published site's files); None when
        nothing is there."""

    def rehearsed_calls(self) -> list[str] | None:
        """In a dry run, the changes the store recorded instead of making them; None for a store that has no
        dry run (it is then not asked to change anything)."""
