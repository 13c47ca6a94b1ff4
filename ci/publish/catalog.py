"""The published record of what the index serves: per world, each project's wheels with their facts, and
each world's and project's status. The HTML pages (ci/publish/landing.py) and the JSON records are both made
from it, so they cannot disagree; which-wheel (ci/publish/which_wheel.py, which also defines the records' format and
checks every value when it reads them back) reads the JSON.

Files (beside the PEP 503 pages):

- ``wheelhouse-index.json``: every world with its status, torch index and project names;
- ``<world>/wheelhouse-world.json``: the world and, per project, its wheels: file name, URL, sha256,
  size, release tag and page, Requires-Python, yank, and what the wheel says about itself (CUDA archs
  from our fatbin scan, the torch it was built against, its torch pin; ci/publish/wheel_facts.py).

Their formats are JSON Schemas, ``schemas/index_record.schema.json`` and ``schemas/world_record.schema.json``: an
earlier publish's index record is checked against its schema when it is read back (:func:`parse_previous`).

Status (PEP 792 ``pypi:project-status``): a world or project is ``active``; ``deprecated`` when
versions.yaml no longer builds it (its wheels stay, none come after them); ``archived`` when an earlier
publish served it and no release holds it any more (a prune). An archived world or project does not
vanish: its pages stay, without files, saying so, and the next publish carries it over from the
``wheelhouse-index.json`` the target (or the live site) holds.
"""

from __future__ import annotations

import functools
import json
import operator
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ci.base import json_schema, json_text
from ci.base.errors import WheelhouseError
from ci.building.toolchain import TORCH_INDEX_BASE
from ci.publish.wheel_facts import WheelFacts
from ci.publish.which_wheel import (
    ACTIVE,
    ARCHIVED,
    DEPRECATED,
    INDEX_FORMAT,
    INDEX_RECORD,
    RECORD_VERSION,
    STATUSES,
    WORLD_FORMAT,
    WORLD_RECORD,
    Status,
    WorldPath,
)

__all__ = ["ACTIVE", "ARCHIVED", "DEPRECATED", "INDEX_RECORD", "STATUSES", "WORLD_RECORD", "Catalog", "Context",
           "ProjectEntry", "Status", "WheelEntry", "WorldEntry", "build_catalog", "parse_previous", "release_page",
           "wheel_entry"]


class WheelEntry(NamedTuple):
    """One wheel of a world: the link its project's simple page serves and what its record says (a tuple, and the
    only object a site build keeps per wheel: its pages, records and lock files are all written from it)."""

    filename: str
    url: str
    sha256: str | None
    size: int
    release: str
    """The release tag."""
    release_url: str
    version: Version
    """The filename's version, as packaging parses it."""
    record: str
    """The text of its record in its world's record (``json_text.dumps(to_json())`` where the wheels stand there), made
    with the entry by :func:`wheel_entry` while its values are at hand: later, a world's record only joins them."""
    requires_python: str | None = None
    yanked: str | None = None
    """None: not yanked; otherwise the reason (may be empty)."""
    facts: WheelFacts | None = None
    """What the wheel says about itself (ci/publish/wheel_facts.py); None when it was never read (no sidecar)."""
    metadata: bool = False
    """A ``<url>.metadata`` sidecar exists and is advertised."""
    metadata_sha256: str | None = None
    provenance: str | None = None
    """The URL of the release's provenance statement that names this wheel."""
    rehosted: bool = False
    """Upstream's wheel, rehosted unchanged (versions.yaml ``rehost``), not built from the sources."""

    def python_admits(self, python: str) -> bool:
        """Whether ``Requires-Python`` admits ``python`` (``3.12``); True without one."""
        if not self.requires_python:
            return True
        try:
            return Version(python) in SpecifierSet(self.requires_python)
        except (InvalidSpecifier, InvalidVersion):
            return True

    def to_json(self) -> dict[str, Any]:
        """The wheel's record (:func:`wheel_records` writes its text directly)."""
        return {"filename": self.filename, "url": self.url, "sha256": self.sha256, "size": self.size,
                "release": self.release, "release_url": self.release_url, "requires_python": self.requires_python,
                "yanked": self.yanked, "facts": self.facts.to_json() if self.facts is not None else None}

    def without_sha256(self) -> WheelEntry:
        """The same entry without its hash (a page whose hashes cannot all be had carries none)."""
        fields = self._asdict()
        del fields["record"]
        return wheel_entry(**{**fields, "sha256": None})


SCHEMAS = Path(__file__).resolve().parent / "schemas"
INDEX_SCHEMA = SCHEMAS / "index_record.schema.json"
"""``wheelhouse-index.json``'s format, checked where an earlier publish's record is read back (:func:`parse_previous`)."""
WORLD_SCHEMA = SCHEMAS / "world_record.schema.json"
"""``wheelhouse-world.json``'s format; which-wheel, standard library only, reads it by the same rules."""

_WHEEL_KEYS = ("facts", "filename", "release", "release_url", "requires_python", "sha256", "size", "url", "yanked")
"""The keys of :meth:`WheelEntry.to_json`, sorted: the order of a record's values."""
_WHEELS_DEPTH = 3
"""Where a world's record holds each project's wheels: document > projects > project > its wheels."""
_RECORD = json_text.dict_template(_WHEEL_KEYS, _WHEELS_DEPTH + 1)


def wheel_entry(filename: str, url: str, sha256: str | None, size: int, release: str, release_url: str,
                version: Version, requires_python: str | None = None, yanked: str | None = None,
                facts: WheelFacts | None = None, metadata: bool = False, metadata_sha256: str | None = None,
                provenance: str | None = None, rehosted: bool = False) -> WheelEntry:
    """The entry of one wheel, with the text of its record: one ``%`` of a template, each value encoded by json's
    own string encoder (a dict per wheel for json's encoder to sort and walk cost three times as much, and 144,000
    wheels at 12,000 releases x 12 assets)."""
    string = json_text.string
    record = _RECORD % (
        "null" if facts is None else json_text.dumps(facts.to_json(), _WHEELS_DEPTH + 2),
        string(filename), string(release), string(release_url),
        "null" if requires_python is None else string(requires_python),
        "null" if sha256 is None else string(sha256),
        int.__repr__(size), string(url),
        "null" if yanked is None else string(yanked),
    )
    return _new_entry((filename, url, sha256, size, release, release_url, version, record, requires_python, yanked,
                       facts, metadata, metadata_sha256, provenance, rehosted))


def wheel_records(wheels: Iterable[WheelEntry], depth: int) -> list[str]:
    """``json_text.dumps([w.to_json() for w in wheels], depth)`` where a world's record holds them, in parts: their
    records and what stands between them."""
    if depth != _WHEELS_DEPTH:
        raise ValueError(f"a wheel's record is made for depth {_WHEELS_DEPTH} of its world's record, not {depth}")
    return json_text.list_parts(list(map(_record, wheels)), depth)


_new_entry = functools.partial(tuple.__new__, WheelEntry)
"""``WheelEntry(*fields)`` without the Python frame of a named tuple's ``__new__``: one per wheel."""
_record = operator.attrgetter("record")
_filename = operator.attrgetter("filename")


@dataclass(frozen=True)
class ProjectEntry:
    name: str
    status: Status = field(default_factory=Status)
    wheels: tuple[WheelEntry, ...] = ()

    @cached_property  # the entry is frozen: its newest version and wheels are computed once
    def newest(self) -> Version | None:
        """The newest version with a wheel that is not yanked."""
        versions = [w.version for w in self.wheels if w.yanked is None]
        return max(versions) if versions else None

    def newest_wheels(self) -> tuple[WheelEntry, ...]:
        return self._newest_wheels

    @cached_property
    def _newest_wheels(self) -> tuple[WheelEntry, ...]:
        newest = self.newest
        return tuple(w for w in self.wheels if w.yanked is None and w.version == newest)


@dataclass(frozen=True)
class WorldEntry(WorldPath):
    path: str
    """``cu130/torch2.13``"""
    index_url: str
    """Its PEP 503 index, ``<base>/<path>/simple/``."""
    torch_index: str | None
    """Where its torch comes from; None: the installer's own configured index."""
    status: Status = field(default_factory=Status)
    projects: tuple[ProjectEntry, ...] = ()

    def project(self, name: str) -> ProjectEntry | None:
        return next((p for p in self.projects if p.name == name), None)

    def to_json(self) -> dict[str, Any]:
        """The world's record (``<world>/wheelhouse-world.json``), as a document."""
        return self._document(lambda wheels: [w.to_json() for w in wheels])

    def record(self) -> bytes:
        """The bytes of the world's record: :func:`dumps` of :meth:`to_json`, its wheels written directly."""
        return dumps(self._document(lambda wheels: json_text.Encoded(functools.partial(wheel_records, wheels))))

    def _document(self, wheels: Callable[[tuple[WheelEntry, ...]], Any]) -> dict[str, Any]:
        return {"format": WORLD_FORMAT, "version": RECORD_VERSION, "world": self.path, "cuda": self.cuda,
                "torch": self.torch, "index": self.index_url, "torch_index": self.torch_index,
                "status": self.status.value, "status_reason": self.status.reason,
                "projects": [{"name": p.name, "status": p.status.value, "status_reason": p.status.reason,
                              "newest": str(p.newest) if p.newest is not None else None,
                              "wheels": wheels(p.wheels)} for p in self.projects]}


def _status(raw: Mapping[str, Any]) -> Status:
    value = raw.get("status", ACTIVE)
    if value not in STATUSES:
        raise ValueError(f"status {value!r} is not one of {', '.join(STATUSES)}")
    return Status(value, str(raw.get("status_reason", "")))


@dataclass(frozen=True)
class Catalog:
    worlds: tuple[WorldEntry, ...]
    default_world: str | None = None

    def world(self, path: str) -> WorldEntry | None:
        return next((w for w in self.worlds if w.path == path), None)

    def index_json(self) -> dict[str, Any]:
        return {"format": INDEX_FORMAT, "version": RECORD_VERSION, "default_world": self.default_world,
                "worlds": [{"world": w.path, "status": w.status.value, "status_reason": w.status.reason,
                            "torch_index": w.torch_index, "index": w.index_url, "record": f"{w.path}/{WORLD_RECORD}",
                            "projects": [{"name": p.name, "status": p.status.value, "status_reason": p.status.reason}
                                         for p in w.projects]} for w in self.worlds]}

    def files(self) -> dict[str, bytes]:
        """``wheelhouse-index.json`` and each world's ``wheelhouse-world.json``."""
        files = {INDEX_RECORD: dumps(self.index_json())}
        for world in self.worlds:
            files[f"{world.path}/{WORLD_RECORD}"] = world.record()
        return files


def dumps(document: Mapping[str, Any]) -> bytes:
    return json_text.dumps(document, end="\n").encode()  # json.dumps(indent=1, sort_keys=True)'s bytes, faster


@dataclass(frozen=True)
class Previous:
    """What an earlier publish served: world -> project names, and the statuses it gave them."""

    worlds: Mapping[str, Status]
    projects: Mapping[str, Mapping[str, Status]]


def parse_previous(data: bytes | None, *, source: str) -> Previous | None:
    """The ``wheelhouse-index.json`` of an earlier publish (None when there is none); a WheelhouseError
    naming ``source`` when it is not one."""
    if not data:
        return None
    try:
        raw = json.loads(data)
        if not isinstance(raw, dict) or raw.get("format") != INDEX_FORMAT or raw.get("version") != RECORD_VERSION:
            raise ValueError(f'no "format": "{INDEX_FORMAT}", "version": {RECORD_VERSION}')
        if problem := json_schema.problem(raw, INDEX_SCHEMA):
            raise ValueError(problem)
        worlds = {str(w["world"]): _status(w) for w in raw["worlds"]}
        projects = {str(w["world"]): {str(p["name"]): _status(p) for p in w["projects"]} for w in raw["worlds"]}
    except RecursionError:
        raise WheelhouseError(f"{source} is nested too deeply to be an index record of ours: retired worlds and "
                              "components it named are not carried over") from None
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise WheelhouseError(f"{source} is not an index record this tool wrote ({exc}): retired worlds and "
                              "components it named are not carried over") from None
    return Previous(worlds, projects)


@dataclass(frozen=True)
class Context:
    """What versions.yaml and the earlier publish say about the worlds, beyond the releases."""

    torch_indexes: Mapping[str, str | None] = field(default_factory=dict)
    """world -> its torch index; a world not named, or named with None (versions.yaml's ``default``), gets
    PyTorch's index of its CUDA."""
    current_worlds: frozenset[str] | None = None
    """The worlds a build_matrix row builds; None: every world counts as current."""
    current_projects: frozenset[str] | None = None
    """The projects versions.yaml's components publish; None: every project counts as current."""
    previous: Previous | None = None


def derived_torch_index(world: str) -> str:
    """PyTorch's index of a world's CUDA (``…/whl/cu130``, ``…/whl/cpu``), as ci/building/toolchain.py derives a row's."""
    return f"{TORCH_INDEX_BASE}/{world.split('/')[0]}"


def release_page(asset_url: str, tag: str) -> str:
    """The page of the release an asset belongs to: GitHub's ``…/releases/tag/<tag>`` for its download URL,
    else the folder the asset lies in (a local store's ``releases/<tag>/``)."""
    marker = f"/releases/download/{tag}/"
    if marker in asset_url:
        return asset_url.split(marker, 1)[0] + f"/releases/tag/{tag}"
    folder = asset_url.rsplit("/", 1)[0] + "/"
    return folder.removesuffix("assets/")


_DEPRECATED_WORLD = "no build_matrix row of versions.yaml builds this world any more: its wheels stay, no new ones come"
_DEPRECATED_PROJECT = "versions.yaml no longer builds it: its wheels stay, no new ones come"
_ARCHIVED_WORLD = "retired: no release of the store holds a wheel of this world any more; pick a current world"
_ARCHIVED_PROJECT = "retired: no release of the store holds it for this world any more"


def build_catalog(worlds: Iterable[tuple[str, Mapping[str, Iterable[WheelEntry]]]], *, base_url: str,
                  default_world: str | None, context: Context) -> Catalog:
    """The catalog of worlds (path -> project -> wheel entries) as ci/publish/index.py built them, with statuses."""
    previous = context.previous or Previous({}, {})
    entries: dict[str, WorldEntry] = {}
    for path, projects in worlds:
        world_status = Status()
        if context.current_worlds is not None and path not in context.current_worlds:
            world_status = Status(DEPRECATED, _DEPRECATED_WORLD)
        found = []
        for name, wheels in sorted(projects.items()):
            status = Status()
            if context.current_projects is not None and name not in context.current_projects:
                status = Status(DEPRECATED, _DEPRECATED_PROJECT)
            found.append(ProjectEntry(name, status, tuple(sorted(wheels, key=_filename))))
        for name, earlier in sorted(previous.projects.get(path, {}).items()):
            if name not in projects:
                found.append(ProjectEntry(name, earlier if earlier.value == ARCHIVED else Status(ARCHIVED, _ARCHIVED_PROJECT)))
        entries[path] = WorldEntry(path, _index_url(base_url, path), _torch_index(path, context), world_status,
                                   tuple(sorted(found, key=lambda p: p.name)))
    for path, earlier in previous.worlds.items():
        if path not in entries:
            status = earlier if earlier.value == ARCHIVED else Status(ARCHIVED, _ARCHIVED_WORLD)
            retired = tuple(ProjectEntry(name, s if s.value == ARCHIVED else Status(ARCHIVED, _ARCHIVED_PROJECT))
                            for name, s in sorted(previous.projects.get(path, {}).items()))
            entries[path] = WorldEntry(path, _index_url(base_url, path), _torch_index(path, context), status, retired)
    return Catalog(tuple(entries[p] for p in sorted(entries)), default_world)


def _index_url(base_url: str, world: str) -> str:
    return f"{base_url}/{world}/simple/"


def _torch_index(world: str, context: Context) -> str:
    """The torch index the pages and records name for ``world``: versions.yaml's, else PyTorch's of its CUDA. A
    row's ``default`` (pip's own configuration, for the build) is PyTorch's here too: a user's installer is
    configured for the package index, whose torch is a CUDA build, so a CPU world would pull it."""
    return context.torch_indexes.get(world) or derived_torch_index(world)
