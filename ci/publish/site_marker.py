"""``wheelhouse-site.json``: the file that makes a published site ours.

Only publishing writes it. It names the store the site was built from, how many wheel links its
world pages hold, and every other file the publish wrote (its format: ``schemas/site_marker.schema.json``). A later publish takes over a directory,
branch or live site only when this file is there (or the site predates it, see below), may
replace or remove only the files it lists, and compares its link count with the new site's where
only the live site can be read (a Pages artifact is built on a fresh runner).

Sites published before the marker existed hold ``digests.json`` alone. Such a site is adopted when
its ``digests.json`` is a digest cache of ours and every file in it has the path of an index file
(``.nojekyll``, ``index.html``, ``wheelhouse-index.json``, ``[<world>/]simple/[<package>/]index.html``, a
world's ``index.html``, ``wheelhouse-world.json`` and ``pylock.<project>.toml``); with ``adopt``, one
that also holds other files is adopted too, and those files are kept. Any other ``digests.json``
(e.g. ``{}``) proves nothing.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ci.base import bounded_json, json_schema
from ci.base.errors import WheelhouseError
from ci.publish.catalog import INDEX_RECORD, WORLD_RECORD
from ci.publish.index import CACHE_FILE, CACHE_VERSION, DigestCache
from ci.publish.which_wheel import SERVED_NAME

MARKER_FILE = "wheelhouse-site.json"
SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "site_marker.schema.json"
_FORMAT = "wheelhouse-site"
_VERSION = 1
_WORLD = r"(?:cpu|cu\d{2,4})/torch\d+\.\d+/"
_PAGE = re.compile(rf"^(?:{_WORLD})?simple/(?:[a-z0-9][a-z0-9._-]*/)?index\.html$"
                   rf"|^{_WORLD}(?:index\.html|{re.escape(WORLD_RECORD)}|pylock\.[a-z0-9][a-z0-9-]*\.toml)$")
"""A PEP 503 page, or a world's page, record or lock file (ci/publish/catalog.py, ci/publish/install_commands.py)."""
_ROOT_FILES = frozenset({".nojekyll", "index.html", CACHE_FILE, MARKER_FILE, INDEX_RECORD, SERVED_NAME})
_LANDING_ROW = re.compile(r"<tr><td>[^<]*</td><td>\d+</td><td>(\d+)</td>")


@dataclass(frozen=True)
class SiteMarker:
    store: str | None
    """The store the site was built from (``github:owner/repo`` or a local store's directory)."""
    links: int
    """Wheel links of the world pages (``/simple/``, the default world's alias, not counted again)."""
    files: frozenset[str]
    """Every file of the site but the marker, as relative POSIX paths."""

    def to_json(self) -> bytes:
        doc = {"format": _FORMAT, "version": _VERSION, "store": self.store, "links": self.links,
               "files": sorted(self.files)}
        return (json.dumps(doc, indent=1) + "\n").encode()

    @classmethod
    def parse(cls, data: bytes, *, source: str) -> SiteMarker:
        """The marker in ``data``, or a WheelhouseError saying ``source`` is not one this tool wrote."""
        try:
            doc = bounded_json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != _FORMAT or doc.get("version") != _VERSION:
                raise ValueError(f"no \"format\": \"{_FORMAT}\", \"version\": {_VERSION}")
            if problem := json_schema.problem(doc, SCHEMA_FILE):
                raise ValueError(problem)
            store, links, files = doc["store"], doc["links"], doc["files"]
            # what a schema cannot say plainly: a path that stays inside the site
            outside = next((i for i, f in enumerate(files) if not _relative(f)), None)
            if outside is not None:
                raise ValueError(f"$.files[{outside}] is {json_schema.shown(files[outside])}, not a relative path "
                                 "inside the site")
        except (ValueError, RecursionError) as exc:
            raise WheelhouseError(f"{source} is not a site marker this tool wrote ({exc}): the site cannot be "
                                  "told from someone else's files; name a new or empty directory or branch") from None
        return cls(store, links, frozenset(files))


def _relative(path: str) -> bool:
    parts = path.split("/")
    return bool(path) and not path.startswith("/") and ".." not in parts and ".git" not in parts and "" not in parts


def is_index_file(rel: str) -> bool:
    """Whether ``rel`` is a path only a site of ours has (what adopting a site from before the marker may replace)."""
    return rel in _ROOT_FILES or bool(_PAGE.match(rel))


def is_digest_cache(data: bytes | None) -> bool:
    """Whether ``data`` is a ``digests.json`` of ours: its version and nothing but our keys (``{}`` is not)."""
    if not data:
        return False
    try:
        doc = bounded_json.loads(data)
        DigestCache.from_json(data)
    except (ValueError, RecursionError, WheelhouseError):
        return False
    return doc.get("version") == CACHE_VERSION and set(doc) <= {"version", "assets", "metadata", "sidecars", "wheels"}


def legacy_files(files: Iterable[str]) -> tuple[frozenset[str], tuple[str, ...]]:
    """(the index files, the other files) of a site published before the marker."""
    files = list(files)
    return frozenset(filter(is_index_file, files)), tuple(sorted(f for f in files if not is_index_file(f)))


def landing_links(html: bytes | None) -> int | None:
    """The wheel links a landing page of ours counts (its table's files column), None if it has no such table."""
    if not html:
        return None
    counts = _LANDING_ROW.findall(html.decode("utf-8", "replace"))
    if not counts and "No wheels are published yet" not in html.decode("utf-8", "replace"):
        return None
    return sum(int(n) for n in counts)
