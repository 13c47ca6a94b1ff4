"""Maintenance tasks on a release store: retag old releases, restore wheels from workflow
artifacts, prune releases versions.yaml no longer names.

Each module has the same shape: ``plan(...)`` reads nothing but its arguments and returns a frozen,
printable plan (``render()``); ``apply(plan, store, ...)`` carries it out and returns what it did.
Every apply is idempotent: running it again, or after it was killed, converges to the same state.
They work on any :class:`~ci.store.model.ReleaseStore` (GitHub or a local directory).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ci.store.model import ReleaseStore


def git_tags(store: ReleaseStore) -> list[str] | None:
    """The store's git tags, or None for a store without git tags (the local store)."""
    lister: Callable[[], list[str]] | None = getattr(store, "list_tag_names", None)
    return list(lister()) if lister is not None else None


def delete_git_tag(store: ReleaseStore, tag: str) -> None:
    deleter: Callable[[str], Any] | None = getattr(store, "delete_tag", None)
    if deleter is not None:
        deleter(tag)
