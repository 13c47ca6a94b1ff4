"""Static per-world package indexes (PEP 503 HTML) built from release records.

The input is the ``list[Release]`` a :class:`ci.store.model.ReleaseStore`
returns; the output is a tree of HTML files that pip and uv read as a "simple"
repository. Nothing here talks to GitHub: bytes that are needed (an asset
without a digest, a ``.metadata`` sidecar) come through an injected
``fetch(asset) -> Iterable[bytes]`` callable, once ever, thanks to a digest
cache that is published with the site (``digests.json``).

Rules
-----
Worlds
    A release's worlds come from its *title*, one per distinct
    ``(cuda tag, torch major.minor)`` of its segments (:func:`ci.model.naming.parse_title`):
    ``cu13.0.2 py3.12 torch2.13.0`` -> ``cu130/torch2.13``; a CPU row's segment
    ``cpu py3.11 torch2.13.0`` (``cucpu`` before) -> ``cpu/torch2.13``. Python is not part of a
    world (pip picks by wheel tag). A release whose title does not parse, or
    whose segments do not give a world of the form ``cu<digits>/torch<X.Y>`` or
    ``cpu/torch<X.Y>``, is left out of every index with a warning: a 404 is
    better than a misfiled ABI. Drafts are always left out. A wheel of a release
    with several worlds appears in each of them.
Files
    Only assets named ``*.whl`` (and their ``<wheel>.metadata`` sidecars in the
    same release) are indexed; other assets are ignored. A wheel name must be a
    valid wheel filename (``packaging.utils.parse_wheel_filename``) made of
    ``[A-Za-z0-9._+-]`` only and an ASCII PEP 503 project name; its URL must be
    ``http``, ``https`` or ``file`` of the characters which-wheel accepts in a record
    (:data:`ci.publish.which_wheel.SAFE_URL`). Anything else is refused with a warning.
    Assets in state ``starter`` (failed uploads) are skipped with a warning.
Projects
    Given ``projects`` (:func:`ci.model.wheel_packages.by_component` of versions.yaml),
    a wheel whose project is not one the release's component (from its title)
    publishes is left out with a warning, and so is every wheel of a component
    versions.yaml does not name other than its own name: a release cannot put
    ``torch`` into an index pip reads. Left out rather than failing the whole
    publish, so that one bad asset never holds back every other world's update
    (the shrink guard of ci/publish/pages.py still stops a publish that loses most links).
Hashes
    ``href`` is the asset URL plus ``#sha256=<hex>``. The hex comes from the
    asset's digest, else from the digest cache, else it is computed by hashing
    ``fetch(asset)`` (and checked against the asset's size) and stored in the
    cache under ``url|size|id``, so a replaced asset (new id or size) is hashed
    again and an unchanged one never is. A package page has hashes on all its
    links or on none: when one hash cannot be had, the package's hashes are
    dropped with a warning (uv rejects partially hashed pages).
Metadata (PEP 658/714)
    When ``<wheel>.metadata`` is an asset of the same release at ``<wheel url>.metadata``,
    the link carries both ``data-dist-info-metadata`` and ``data-core-metadata``
    (``sha256=<hex>`` of the sidecar, or ``true`` when its hash cannot be had).
    The sidecar is read once through ``fetch`` and its Name, Version and
    Requires-Python are cached under its sha256; ``data-requires-python`` comes
    from there. pip and uv resolve dependencies from the sidecar without opening
    the wheel, so it is advertised only once its bytes are known to equal the
    wheel's own ``*.dist-info/METADATA``: the wheel is downloaded once through
    ``fetch`` (it yields the wheel's sha256 too when the asset has no digest) and
    the pair ``wheel sha256 -> sidecar sha256`` is cached, so later runs never
    download it again. A sidecar whose bytes do not match its digest, whose Name
    or Version differ from the wheel filename, whose bytes differ from the
    wheel's METADATA, or that cannot be compared with it (no ``fetch``, a failed
    download, an unreadable wheel) is not advertised (a wrong metadata promise
    breaks installs, or adds dependencies the wheel does not declare) and a
    warning says so.
Provenance
    When the wheel's release holds the provenance statement of the wheel's arch
    (``wheelhouse-provenance-<arch>.intoto.json``, :func:`ci.publish.provenance.statement_for`), the link
    carries ``data-wheelhouse-provenance="<its URL>"``. Not PEP 740's ``data-provenance``: that must
    point to a PEP 740 provenance object of signed attestation bundles, and our statement is unsigned
    (GitHub's attestation store holds the signed one); a client that reads ``data-provenance`` would
    be promised a format it cannot read.
Rehosted wheels
    A wheel of a project its component rehosts (versions.yaml ``rehost``: upstream's wheel, downloaded and
    checked, not built from the sources) carries ``data-wheelhouse-rehosted="upstream"``.
Yanking (PEP 592)
    ``yanked`` maps a wheel filename to a reason (``""`` for none); listed files
    get ``data-yanked``. A name in the list that no index holds gives a warning.
Duplicates
    Within one release, of several uploaded assets of one name the newest
    (highest id, :func:`ci.store.model.newest_by_name`) is the one indexed, as
    the stores and the download URL serve it. When two releases put a file of one name into one world (a torch patch bump,
    a restored release), the one kept is from the release with the highest torch
    version among its segments of that world, then the greatest tag (string
    order); the warning names the kept and the dropped tag.
Aliases and landing page
    ``simple/`` is a byte-for-byte copy of the default world's ``simple/`` tree
    (an empty root page and a warning when that world has no packages). The
    landing page ``index.html``, each world's page ``<world>/index.html``, the JSON
    records (``wheelhouse-index.json``, ``<world>/wheelhouse-world.json``) and each
    project's lock file ``<world>/pylock.<project>.toml`` are made from one catalog
    (ci/publish/catalog.py, ci/publish/landing.py, ci/publish/install_commands.py). Every page carries PEP
    629's ``pypi:repository-version`` 1.0, or 1.4 on a project page that carries a
    PEP 792 status (``deprecated``, ``archived``); every attribute value and text is
    HTML-escaped. Output is sorted and carries no timestamps, so the same input
    gives the same bytes.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import html
import operator
import re
import tempfile
import zipfile
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path
from typing import IO, NamedTuple

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ci.base import bounded_json, json_text
from ci.base.errors import UsageError, WheelhouseError
from ci.model import wheel_packages
from ci.model.naming import parse_title, version_key, world_path
from ci.publish import install_commands, landing, provenance, which_wheel
from ci.publish.catalog import ARCHIVED, Catalog, Context, Status, WheelEntry, build_catalog, release_page, wheel_entry
from ci.publish.wheel_facts import WheelFacts, read_facts
from ci.store.model import Asset, Release, newest_by_name

Fetch = Callable[[Asset], Iterable[bytes]]
"""Yields the bytes of one asset, in chunks; may raise on a failed download."""

CACHE_FILE = "digests.json"
CACHE_VERSION = 1
METADATA_SUFFIX = ".metadata"
MAX_METADATA_BYTES = 16 * 1024 * 1024
_SPOOL_BYTES = 64 * 1024 * 1024
"""A wheel downloaded to compare its METADATA with a sidecar stays in memory up to this size, else a temp file."""

_WORLD = re.compile(r"^(?:cpu|cu\d{2,4})/torch\d+\.\d+$")
_SAFE_FILENAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*\.whl$")
_MAX_FILENAME = 200
_PROJECT_NAME = re.compile(r"^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$")
_SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")
_SHA256_DIGEST = re.compile(r"sha256:[0-9a-f]{64}\Z")


def _esc(text: str) -> str:
    # Most values (wheel names, URLs, hex digests) have nothing to escape; five substring tests cost a
    # quarter of html.escape's five replaces (and of one regex search).
    if "&" in text or "<" in text or ">" in text or '"' in text or "'" in text:
        return html.escape(text, quote=True)
    return text


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


# --------------------------------------------------------------------------- worlds


@dataclass(frozen=True)
class ReleaseWorlds:
    """The worlds one release belongs to, with the highest torch version per world."""

    worlds: tuple[str, ...]
    torch: Mapping[str, str]
    problem: str | None = None
    component: str = ""
    """The component the title names."""


def derive_worlds(release: Release) -> ReleaseWorlds:
    """The worlds of ``release`` from its title; ``problem`` says why there are none."""
    parsed = parse_title(release.title)
    if parsed is None:
        return ReleaseWorlds(
            (), {}, f"title {release.title!r} does not follow '<component> <ref> - cu<cuda>|cpu py<X.Y> torch<X.Y.Z>; ...'"
        )
    worlds: list[str] = []
    torch: dict[str, str] = {}
    for segment in parsed.segments:
        world = world_path(segment.cuda, segment.torch)
        if not _WORLD.match(world):
            return ReleaseWorlds((), {}, f"title segment {segment.render()!r} gives no valid world (got {world!r})")
        if world not in torch:
            worlds.append(world)
            torch[world] = segment.torch
        elif version_key(segment.torch) > version_key(torch[world]):
            torch[world] = segment.torch
    return ReleaseWorlds(tuple(worlds), torch, component=parsed.component)


def check_world(world: str) -> str:
    """``world`` if it is a valid world path, else a WheelhouseError naming the fix."""
    if not _WORLD.match(world):
        raise UsageError(
            f"default world {world!r} is not a world path: use cu<major><minor>/torch<X.Y> or cpu/torch<X.Y>, e.g. cu130/torch2.13"
        )
    return world


# --------------------------------------------------------------------------- digest cache


@dataclass(frozen=True)
class CoreMetadata:
    """What the index needs from a wheel's core metadata file."""

    name: str
    version: str
    requires_python: str | None


class DigestCache:
    """sha256 of assets without a digest, parsed ``.metadata`` sidecars, sidecars checked against wheels,
    and what each wheel says about itself.

    Keys: ``assets[url|size|id] = hex``, ``metadata[hex] = {name, version,
    requires_python}``, ``sidecars[wheel hex] = sidecar hex`` (the sidecar's
    bytes are the wheel's own METADATA) and ``wheels[wheel hex] = facts``
    (:class:`ci.publish.wheel_facts.WheelFacts`); both sides are content hashes, so an entry
    never goes stale. :meth:`to_json` writes only the entries used since the
    cache was loaded, so entries of deleted assets fall out on the next run.
    """

    def __init__(
        self,
        assets: Mapping[str, str] | None = None,
        metadata: Mapping[str, CoreMetadata] | None = None,
        sidecars: Mapping[str, str] | None = None,
        wheels: Mapping[str, WheelFacts] | None = None,
    ) -> None:
        self._assets = dict(assets or {})
        self._metadata = dict(metadata or {})
        self._sidecars = dict(sidecars or {})
        self._wheels = dict(wheels or {})
        self._used_assets: dict[str, str] = {}
        self._used_metadata: dict[str, CoreMetadata] = {}
        self._used_sidecars: dict[str, str] = {}
        self._used_wheels: dict[str, WheelFacts] = {}

    @staticmethod
    def asset_key(asset: Asset) -> str:
        return f"{asset.url}|{asset.size}|{asset.id if asset.id is not None else ''}"

    @classmethod
    def from_json(cls, data: bytes | str | None, *, source: str = CACHE_FILE) -> DigestCache:
        """Parse a cache written by :meth:`to_json`; ``None`` or empty gives an empty cache."""
        if not data:
            return cls()
        try:
            raw = bounded_json.loads(data)
            if not isinstance(raw, dict) or raw.get("version") != CACHE_VERSION:
                raise ValueError(f"version is not {CACHE_VERSION}")
            assets = {str(k): str(v) for k, v in raw.get("assets", {}).items() if _SHA256_HEX.match(str(v))}
            metadata = {
                str(k): CoreMetadata(str(v["name"]), str(v["version"]), v.get("requires_python"))
                for k, v in raw.get("metadata", {}).items()
                if _SHA256_HEX.match(str(k))
            }
            sidecars = {
                str(k): str(v)
                for k, v in raw.get("sidecars", {}).items()
                if _SHA256_HEX.match(str(k)) and _SHA256_HEX.match(str(v))
            }
            wheels = {str(k): WheelFacts.from_json(v) for k, v in raw.get("wheels", {}).items()
                      if _SHA256_HEX.match(str(k))}
        except (ValueError, TypeError, KeyError, AttributeError, RecursionError, WheelhouseError) as exc:
            raise WheelhouseError(
                f"{source} is not a digest cache ({_one_line(exc)}): delete it and publish again to rebuild it"
            ) from None
        return cls(assets, metadata, sidecars, wheels)

    @classmethod
    def load(cls, path: Path) -> DigestCache:
        """The cache at ``path``; an empty cache when the file does not exist."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return cls()
        return cls.from_json(data, source=str(path))

    def to_json(self) -> bytes:
        doc = {
            "version": CACHE_VERSION,
            "assets": dict(sorted(self._used_assets.items())),
            "metadata": {
                k: {"name": v.name, "version": v.version, "requires_python": v.requires_python}
                for k, v in sorted(self._used_metadata.items())
            },
            "sidecars": dict(sorted(self._used_sidecars.items())),
        }
        if self._used_wheels:  # absent rather than empty: a site without wheel facts keeps its bytes
            doc["wheels"] = {k: v.to_json() for k, v in sorted(self._used_wheels.items())}
        return (json_text.dumps(doc) + "\n").encode()

    def asset_sha256(self, asset: Asset) -> str | None:
        key = self.asset_key(asset)
        found = self._assets.get(key)
        if found is not None:
            self._used_assets[key] = found
        return found

    def put_asset_sha256(self, asset: Asset, hexdigest: str) -> None:
        key = self.asset_key(asset)
        self._assets[key] = self._used_assets[key] = hexdigest

    def metadata(self, hexdigest: str) -> CoreMetadata | None:
        found = self._metadata.get(hexdigest)
        if found is not None:
            self._used_metadata[hexdigest] = found
        return found

    def put_metadata(self, hexdigest: str, meta: CoreMetadata) -> None:
        self._metadata[hexdigest] = self._used_metadata[hexdigest] = meta

    def sidecar_of(self, wheel_hexdigest: str) -> str | None:
        """The sha256 of the sidecar known to equal this wheel's METADATA, if one was checked."""
        found = self._sidecars.get(wheel_hexdigest)
        if found is not None:
            self._used_sidecars[wheel_hexdigest] = found
        return found

    def put_sidecar(self, wheel_hexdigest: str, sidecar_hexdigest: str) -> None:
        self._sidecars[wheel_hexdigest] = self._used_sidecars[wheel_hexdigest] = sidecar_hexdigest

    def wheel_facts(self, wheel_hexdigest: str) -> WheelFacts | None:
        """What the wheel of this sha256 says about itself, if it was read."""
        found = self._wheels.get(wheel_hexdigest)
        if found is not None:
            self._used_wheels[wheel_hexdigest] = found
        return found

    def put_wheel_facts(self, wheel_hexdigest: str, facts: WheelFacts) -> None:
        self._wheels[wheel_hexdigest] = self._used_wheels[wheel_hexdigest] = facts


# --------------------------------------------------------------------------- site model


@dataclass(frozen=True)
class PackagePage:
    name: str
    links: tuple[WheelEntry, ...]
    """One per ``<a>`` of the page, sorted by filename; the catalog's entries of the project are these."""


@dataclass(frozen=True)
class World:
    path: str
    packages: tuple[PackagePage, ...]

    @property
    def link_count(self) -> int:
        return sum(len(p.links) for p in self.packages)


@dataclass(frozen=True)
class Site:
    worlds: tuple[World, ...]
    default_world: str | None
    warnings: tuple[str, ...]
    fetches: int
    """Calls made to ``fetch`` while building (0 on a warm cache)."""
    fetched_bytes: int

    def world(self, path: str) -> World | None:
        for world in self.worlds:
            if world.path == path:
                return world
        return None


class _Candidate(NamedTuple):
    """One wheel of one release for one world (a tuple: a site build makes one per link)."""

    world: str
    package: str
    version: Version
    release: Release
    wheel: Asset
    sidecar: Asset | None
    torch: str
    statement: Asset | None = None
    rehosted: bool = False


_new_candidate = functools.partial(tuple.__new__, _Candidate)
"""``_Candidate(*fields)`` without the Python frame of a named tuple's ``__new__``: one per wheel and world."""


class _Builder:
    def __init__(self, fetch: Fetch | None, cache: DigestCache) -> None:
        self.fetch = fetch
        self.cache = cache
        self.warnings: list[str] = []
        self.fetches = 0
        self.fetched_bytes = 0
        self._sha: dict[str, tuple[str | None, str | None]] = {}
        # Wheel names repeat their parts across releases (see wheel_project): each part is checked once per build.
        self._indexable_project = functools.lru_cache(maxsize=None)(_indexable_project)
        self._indexable_tail = functools.lru_cache(maxsize=None)(_indexable_tail)
        self._meta: dict[str, tuple[bool, str | None, CoreMetadata | None]] = {}

    def warn(self, message: str) -> None:
        self.warnings.append(_one_line(message))

    def wheel_project(self, asset: Asset) -> tuple[str, Version] | str:
        """(PEP 503 project name, version) for an indexable wheel asset, as packaging parses its name; else why not.

        Every check on a wheel name (its characters, packaging's parse, a PEP 503 project name) holds
        for the whole name exactly when it holds for the part before the first dash and for the rest,
        and both parts repeat across a site. A part that fails sends the asset through the checks
        one by one, which name the problem.
        """
        project_part, _, tail = asset.name.partition("-")
        name = self._indexable_project(project_part)
        version = self._indexable_tail(tail)
        if name is None or version is None or len(asset.name) > _MAX_FILENAME:
            return _wheel_project_checked(asset)
        if not _safe_url(asset.url):
            return f"URL {asset.url!r} {which_wheel.url_problem(asset.url)}"
        return name, version

    def _download(self, asset: Asset, limit: int | None = None) -> tuple[bytes | None, str, int]:
        """(bytes if kept, sha256 hex, size); bytes are kept only when ``limit`` is given."""
        if self.fetch is None:
            raise RuntimeError("_download needs a fetch function; callers check self.fetch first")
        self.fetches += 1
        digest = hashlib.sha256()
        size = 0
        kept: list[bytes] = []
        for chunk in self.fetch(asset):
            digest.update(chunk)
            size += len(chunk)
            if limit is not None:
                if size > limit:
                    raise WheelhouseError(f"{asset.name} is larger than {limit} bytes")
                kept.append(chunk)
        self.fetched_bytes += size
        return (b"".join(kept) if limit is not None else None), digest.hexdigest(), size

    def sha256(self, asset: Asset) -> tuple[str | None, str | None]:
        """(hex, problem) for one asset, fetching at most once per run and once ever."""
        if asset.digest is not None and _SHA256_DIGEST.match(asset.digest):
            return asset.digest[7:], None  # the common case, and every link asks
        key = DigestCache.asset_key(asset)
        if key not in self._sha:
            self._sha[key] = self._sha256_uncached(asset)
        return self._sha[key]

    def _sha256_uncached(self, asset: Asset) -> tuple[str | None, str | None]:
        if asset.digest is not None:
            if asset.sha256 and _SHA256_HEX.match(asset.sha256):
                return asset.sha256, None
            self.warn(f"{asset.name}: digest {asset.digest!r} is not 'sha256:<64 hex>', hashing the asset instead")
        cached = self.cache.asset_sha256(asset)
        if cached is not None:
            return cached, None
        if self.fetch is None:
            return None, "no digest and no fetch to compute one"
        try:
            _, hexdigest, size = self._download(asset)
        except Exception as exc:  # fetch is injected: any failure only costs the hash
            return None, f"download failed ({_one_line(exc)})"
        if size != asset.size:
            return None, f"downloaded {size} bytes but the asset says {asset.size}"
        self.cache.put_asset_sha256(asset, hexdigest)
        return hexdigest, None

    def sidecar(self, wheel: Asset, sidecar: Asset, tag: str) -> tuple[bool, str | None, CoreMetadata | None]:
        """(advertise, sha256 hex or None, parsed metadata or None) for a ``.metadata`` asset."""
        key = DigestCache.asset_key(sidecar) + "|" + wheel.name
        if key not in self._meta:
            found = self._sidecar_uncached(wheel, sidecar, tag)
            if found[0] and not self._is_wheels_own(wheel, found[1], f"{sidecar.name} (release {tag})"):
                found = (False, None, None)
            self._meta[key] = found
        return self._meta[key]

    def _known_sha256(self, asset: Asset) -> str | None:
        """The asset's sha256 from its digest, this run or the cache; never downloads."""
        if asset.digest is not None and _SHA256_DIGEST.match(asset.digest):
            return asset.digest[7:]
        memo = self._sha.get(DigestCache.asset_key(asset))
        if memo is not None and memo[0] is not None:
            return memo[0]
        return self.cache.asset_sha256(asset)

    def _is_wheels_own(self, wheel: Asset, sidecar_sha: str | None, where: str) -> bool:
        """Whether the sidecar of sha256 ``sidecar_sha`` is byte for byte the wheel's own METADATA (else a warning)."""
        if sidecar_sha is None:
            self.warn(f"{where}: its sha256 cannot be had, so it cannot be compared with the wheel's METADATA"
                      " and is not advertised; upload it again")
            return False
        known = self._known_sha256(wheel)
        # a cache from before the wheel facts were read downloads the wheel once more, once ever
        if (known is not None and self.cache.sidecar_of(known) == sidecar_sha
                and (self.cache.wheel_facts(known) is not None or self.fetch is None)):
            return True
        if self.fetch is None:
            self.warn(f"{where}: not advertised: nothing to download {wheel.name} with, to compare the sidecar"
                      " with the wheel's own METADATA")
            return False
        with tempfile.SpooledTemporaryFile(max_size=_SPOOL_BYTES) as spool:
            try:
                wheel_sha = self._download_to(wheel, spool)
            except Exception as exc:  # fetch is injected: any failure only costs the sidecar
                self.warn(f"{where}: not advertised: {wheel.name} could not be downloaded to compare it with"
                          f" ({_one_line(exc)})")
                return False
            if known is not None and wheel_sha != known:
                self.warn(f"{where}: not advertised: the downloaded {wheel.name} does not match its digest;"
                          " upload the wheel again")
                return False
            if known is None:
                self.cache.put_asset_sha256(wheel, wheel_sha)
                self._sha[DigestCache.asset_key(wheel)] = (wheel_sha, None)
            try:
                own = _own_metadata(spool)
            except (WheelhouseError, zipfile.BadZipFile, zipfile.LargeZipFile, KeyError, OSError, EOFError,
                    ValueError, NotImplementedError, zlib.error) as exc:
                self.warn(f"{where}: not advertised: the METADATA of {wheel.name} cannot be read ({_one_line(exc)})")
                return False
            spool.seek(0)
            self.cache.put_wheel_facts(wheel_sha, read_facts(spool, own))
        if hashlib.sha256(own).hexdigest() != sidecar_sha:
            self.warn(f"{where}: differs from the METADATA inside {wheel.name}, so it is not advertised (installers"
                      " would resolve what the wheel does not declare); upload the .metadata made from the wheel"
                      " (invoke release writes it)")
            return False
        self.cache.put_sidecar(wheel_sha, sidecar_sha)
        return True

    def _download_to(self, wheel: Asset, out: IO[bytes]) -> str:
        """Write the wheel to ``out`` through ``fetch`` (its size checked) and return its sha256."""
        if self.fetch is None:
            raise RuntimeError("_download_to needs a fetch function; callers check self.fetch first")
        self.fetches += 1
        digest = hashlib.sha256()
        size = 0
        for chunk in self.fetch(wheel):
            size += len(chunk)
            if size > wheel.size:
                break
            digest.update(chunk)
            out.write(chunk)
        self.fetched_bytes += size
        if size != wheel.size:
            raise WheelhouseError(f"got {'more than ' if size > wheel.size else ''}{size} bytes but the asset says {wheel.size}")
        return digest.hexdigest()

    def _sidecar_uncached(self, wheel: Asset, sidecar: Asset, tag: str) -> tuple[bool, str | None, CoreMetadata | None]:
        where = f"{sidecar.name} (release {tag})"
        if sidecar.url != wheel.url + METADATA_SUFFIX:
            self.warn(f"{where}: its URL is not the wheel URL + '.metadata', so it is not advertised")
            return False, None, None
        own = sidecar.sha256 if sidecar.sha256 and _SHA256_HEX.match(sidecar.sha256) else None
        expected = own
        if expected is None:
            expected = self.cache.asset_sha256(sidecar)
        if expected is not None:
            cached = self.cache.metadata(expected)
            if cached is not None:
                return self._check_meta(wheel, where, expected, cached)
        if self.fetch is None:
            return True, expected, None
        try:
            data, actual, size = self._download(sidecar, limit=MAX_METADATA_BYTES)
        except Exception as exc:  # fetch is injected: any failure only costs requires-python
            self.warn(f"{where}: download failed ({_one_line(exc)}), so data-requires-python is left out")
            return True, expected, None
        if data is None:
            raise RuntimeError("_download with a limit returned no bytes")
        if expected is not None and actual != expected:
            self.warn(f"{where}: its bytes do not match its digest, so it is not advertised; upload it again")
            return False, None, None
        if size != sidecar.size:
            self.warn(f"{where}: downloaded {size} bytes but the asset says {sidecar.size}, so it is not advertised")
            return False, None, None
        if own is None:
            self.cache.put_asset_sha256(sidecar, actual)
        headers = BytesHeaderParser().parsebytes(data)
        meta = CoreMetadata(
            str(headers.get("Name", "")).strip(),
            str(headers.get("Version", "")).strip(),
            (str(headers["Requires-Python"]).strip() or None) if headers.get("Requires-Python") is not None else None,
        )
        self.cache.put_metadata(actual, meta)
        return self._check_meta(wheel, where, actual, meta)

    def _check_meta(
        self, wheel: Asset, where: str, hexdigest: str, meta: CoreMetadata
    ) -> tuple[bool, str | None, CoreMetadata | None]:
        name, version, _, _ = _parse_wheel(wheel.name)
        try:
            same_version = Version(meta.version) == version
        except InvalidVersion:
            same_version = False
        if canonicalize_name(meta.name) != name or not same_version:
            said = f"says {meta.name} {meta.version}" if meta.name and meta.version else "lacks Name or Version"
            self.warn(
                f"{where}: {said} but the wheel is {name} {version}, so it is not advertised;"
                " rebuild the sidecar from the wheel"
            )
            return False, None, None
        if meta.requires_python is not None:
            try:
                SpecifierSet(meta.requires_python)
            except InvalidSpecifier:
                self.warn(f"{where}: Requires-Python {meta.requires_python!r} is not a valid specifier, left out")
                meta = CoreMetadata(meta.name, meta.version, None)
        return True, hexdigest, meta


def _own_metadata(wheel: IO[bytes]) -> bytes:
    """The bytes of the one ``*.dist-info/METADATA`` of a wheel archive, as installers read it (central directory)."""
    with zipfile.ZipFile(wheel) as archive:
        dist_infos = {name.split("/", 1)[0] for name in archive.namelist() if name.split("/", 1)[0].endswith(".dist-info")}
        if len(dist_infos) != 1:
            raise WheelhouseError(f"it has {len(dist_infos)} top-level .dist-info directories, not one")
        info = archive.getinfo(f"{dist_infos.pop()}/METADATA")
        if info.file_size > MAX_METADATA_BYTES:
            raise WheelhouseError(f"its METADATA is larger than {MAX_METADATA_BYTES} bytes")
        return archive.read(info)


@functools.lru_cache(maxsize=65536)
def _parse_wheel(filename: str):
    """parse_wheel_filename, once per name: a site build asks about each wheel several times."""
    return parse_wheel_filename(filename)


_safe_url = which_wheel.SAFE_URL.fullmatch
"""What which-wheel accepts in a record (and so may print in a command): the same check here."""


def _indexable_project(project_part: str) -> str | None:
    """The PEP 503 name of a wheel name's part before the first dash, or None when it is not indexable."""
    synthetic = f"{project_part}-0-py3-none-any.whl"
    if not _SAFE_FILENAME.match(synthetic):
        return None
    try:
        name = parse_wheel_filename(synthetic)[0]
    except InvalidWheelFilename:
        return None
    return name if _PROJECT_NAME.match(name) else None


def _indexable_tail(tail: str) -> Version | None:
    """The version of a wheel name's part after the first dash (version, build, tags), or None when that part is
    not indexable."""
    synthetic = f"x-{tail}"  # as many dashes as the whole name
    if not _SAFE_FILENAME.match(synthetic):
        return None
    try:
        return parse_wheel_filename(synthetic)[1]
    except InvalidWheelFilename:
        return None


def _wheel_project_checked(asset: Asset) -> tuple[str, Version] | str:
    """:meth:`_Builder.wheel_project`, one check after the other."""
    if not _SAFE_FILENAME.match(asset.name):
        return "the name has characters outside [A-Za-z0-9._+-]"
    if len(asset.name) > _MAX_FILENAME:  # its project folder and .metadata file must fit a file name
        return f"the name is {len(asset.name)} characters long, more than {_MAX_FILENAME}"
    try:
        name, version, _, _ = _parse_wheel(asset.name)
    except InvalidWheelFilename as exc:
        return f"not a valid wheel filename ({_one_line(exc)})"
    if not _PROJECT_NAME.match(name):
        return f"project name {name!r} is not a PEP 503 name"
    if not _safe_url(asset.url):
        return f"URL {asset.url!r} {which_wheel.url_problem(asset.url)}"
    return name, version  # packaging's canonical name is the PEP 503 normalised name


_asset_name = operator.attrgetter("name")
_release_tag = operator.attrgetter("tag")


def build_site(
    releases: Iterable[Release],
    *,
    default_world: str | None,
    fetch: Fetch | None = None,
    cache: DigestCache | None = None,
    yanked: Mapping[str, str] | None = None,
    projects: Mapping[str, frozenset[str]] | None = None,
    rehosted: Mapping[str, frozenset[str]] | None = None,
) -> Site:
    """The index model of ``releases`` (the module docstring states the rules).

    ``cache`` is read and updated in place; write ``cache.to_json()`` next to
    the site so that the next run does not download anything again. ``projects``
    maps each component to the projects it publishes (see "Projects"); ``rehosted`` to those it rehosts
    from upstream, whose links say so (``data-wheelhouse-rehosted="upstream"``).
    """
    if default_world is not None:
        check_world(default_world)
    builder = _Builder(fetch, cache if cache is not None else DigestCache())
    return _build_site(builder, releases, default_world, dict(yanked or {}), projects, rehosted or {})


def _build_site(
    builder: _Builder,
    releases: Iterable[Release],
    default_world: str | None,
    yanked: dict[str, str],
    projects: Mapping[str, frozenset[str]] | None,
    rehosted: Mapping[str, frozenset[str]],
) -> Site:
    chosen: dict[tuple[str, str], _Candidate] = {}
    for release in sorted(releases, key=_release_tag):
        _choose(builder, release, chosen, projects, rehosted)
    links, missing = _links(builder, chosen, yanked)
    for name in sorted(set(yanked) - {filename for _, filename in chosen} if yanked else ()):
        builder.warn(f"yank list names {name!r}, which no index holds")
    worlds: dict[str, list[PackagePage]] = {}
    for (world, package), page in sorted(links.items()):
        page.sort()  # by filename, the first field (unique in a page)
        if (world, package) in missing:
            reasons = "; ".join(sorted(missing[(world, package)]))
            builder.warn(f"{world} {package}: hashes dropped from every link because one is missing ({reasons})")
            page = [link.without_sha256() for link in page]
        worlds.setdefault(world, []).append(PackagePage(package, tuple(page)))
    if default_world is not None and default_world not in worlds:
        builder.warn(f"default world {default_world} has no wheels: /simple/ is an empty index")
    return Site(tuple(World(world, tuple(pages)) for world, pages in worlds.items()), default_world,
                tuple(builder.warnings), builder.fetches, builder.fetched_bytes)


def _choose(
    builder: _Builder,
    release: Release,
    chosen: dict[tuple[str, str], _Candidate],
    projects: Mapping[str, frozenset[str]] | None,
    rehosted: Mapping[str, frozenset[str]],
) -> None:
    """Add the wheels of ``release`` to ``chosen`` (world, filename -> candidate), keeping one of duplicates."""
    wheels, derived = _wheels_and_worlds(builder, release)
    if not wheels:
        return
    by_name = _newest_by_name(release.assets)
    statements = provenance.statements_by_arch(by_name)
    publishes = None
    if projects is not None:
        publishes = projects.get(derived.component) or wheel_packages.allowed(derived.component, ())
    rehosts = rehosted.get(derived.component, ())
    for wheel in wheels:
        if wheel.state != "uploaded":
            builder.warn(f"{wheel.name!r} (release {release.tag}) skipped: its upload is incomplete (state {wheel.state!r})")
            continue
        if by_name[wheel.name] is not wheel:  # an older asset of the same name: the newest upload wins
            continue
        indexable = builder.wheel_project(wheel)
        if isinstance(indexable, str):
            builder.warn(f"asset {wheel.name!r} (release {release.tag}) refused: {indexable}")
            continue
        package, version = indexable
        if publishes is not None and package not in publishes:
            builder.warn(f"asset {wheel.name!r} (release {release.tag}) left out of every index: "
                         f"{wheel_packages.refusal(derived.component, package, publishes)}; delete the asset")
            continue
        sidecar = by_name.get(wheel.name + METADATA_SUFFIX)
        statement = provenance.statement_for(wheel.name, statements) if statements else None
        if statement is not None and not _safe_url(statement.url):  # the same URL rule as a wheel's link
            statement = None
        for world in derived.worlds:
            candidate = _new_candidate((world, package, version, release, wheel, sidecar, derived.torch[world],
                                        statement, package in rehosts))
            key = (world, wheel.name)
            previous = chosen.get(key)
            if previous is None:
                chosen[key] = candidate
                continue
            keep, drop = sorted((previous, candidate), key=lambda c: (version_key(c.torch), c.release.tag), reverse=True)
            chosen[key] = keep
            builder.warn(f"duplicate {wheel.name} in {world}: kept release {keep.release.tag}, ignored release {drop.release.tag}")


def _wheels_and_worlds(builder: _Builder, release: Release) -> tuple[list[Asset], ReleaseWorlds]:
    """The release's wheel assets by name and its worlds; no wheels for a draft or a title without a world."""
    if release.draft:
        return [], ReleaseWorlds((), {})
    wheels = sorted([a for a in release.assets if a.name.endswith(".whl")], key=_asset_name)
    if not wheels:
        return [], ReleaseWorlds((), {})
    derived = derive_worlds(release)
    if derived.problem is not None:
        builder.warn(f"release {release.tag!r} left out of every index: {derived.problem}; fix the release title")
        return [], derived
    return wheels, derived


def _newest_by_name(assets: Iterable[Asset]) -> dict[str, Asset]:
    """:func:`ci.store.model.newest_by_name` of the uploaded assets; without it when no name repeats (the rule
    then keeps every asset, and a release's dozen assets cost a tuple and a dict lookup each)."""
    uploaded = [a for a in assets if a.state == "uploaded"]
    by_name = {a.name: a for a in uploaded}
    return by_name if len(by_name) == len(uploaded) else newest_by_name(uploaded)


def _links(
    builder: _Builder, chosen: Mapping[tuple[str, str], _Candidate], yanked: Mapping[str, str]
) -> tuple[dict[tuple[str, str], list[WheelEntry]], dict[tuple[str, str], list[str]]]:
    """The links of the chosen wheels by (world, project), unsorted, and why a page's hashes are missing."""
    pages: dict[tuple[str, str], list[WheelEntry]] = {}
    missing: dict[tuple[str, str], list[str]] = {}
    facts = builder.cache.wheel_facts
    # Walked in the order releases were (tag, then wheel name): deterministic, and cheaper than a sort of
    # every (world, filename); each page's links are sorted by the caller.
    for (world, filename), (_, package, version, release, wheel, sidecar, _, statement, rehosted) in chosen.items():
        tag = release.tag
        advertise, meta_sha, meta = False, None, None
        if sidecar is not None:  # first: comparing it with the wheel hashes a digest-less wheel on the way
            advertise, meta_sha, meta = builder.sidecar(wheel, sidecar, tag)
        sha, problem = builder.sha256(wheel)
        if sha is None:
            missing.setdefault((world, package), []).append(f"{filename}: {problem}")
        url = wheel.url
        folder, slash, _ = url.rpartition("/")
        link = wheel_entry(  # positional: one per link, and keywords cost a third more
            filename,
            url,
            sha,
            wheel.size,
            tag,
            _release_page(folder, tag) if slash else release_page(url, tag),
            version,
            meta.requires_python if meta is not None else None,
            yanked.get(filename),
            facts(sha) if sha is not None else None,
            advertise,
            meta_sha if advertise else None,
            statement.url if statement is not None else None,
            rehosted,
        )
        page = pages.get((world, package))
        if page is None:
            pages[(world, package)] = page = []
        page.append(link)
    return pages, missing


# --------------------------------------------------------------------------- rendering


def _page(title: str, body: list[str], status: Status | None = None) -> bytes:
    # PEP 792: a page that carries a project status declares the API version that defines it
    marked = status is not None and not status.active
    lines = [
        "<!DOCTYPE html>",
        "<html>",
        "<head>",
        '<meta charset="utf-8">',
        f'<meta name="pypi:repository-version" content="{"1.4" if marked else "1.0"}">',
    ]
    if marked and status is not None:
        lines.append(f'<meta name="pypi:project-status" content="{_esc(status.value)}">')
        lines.append(f'<meta name="pypi:project-status-reason" content="{_esc(status.reason)}">')
    lines += [
        f"<title>{_esc(title)}</title>",
        "</head>",
        "<body>",
        *body,
        "</body>",
        "</html>",
        "",
    ]
    return "\n".join(lines).encode("utf-8")


def _link_html(link: WheelEntry) -> str:
    href = link.url + "#sha256=" + link.sha256 if link.sha256 else link.url
    rendered = 'href="' + _esc(href) + '"'
    if link.requires_python:
        rendered += ' data-requires-python="' + _esc(link.requires_python) + '"'
    if link.metadata:
        value = _esc(f"sha256={link.metadata_sha256}" if link.metadata_sha256 else "true")
        rendered += f' data-dist-info-metadata="{value}" data-core-metadata="{value}"'
    if link.yanked is not None:
        rendered += ' data-yanked="' + _esc(link.yanked) + '"'
    if link.provenance:
        rendered += ' data-wheelhouse-provenance="' + _esc(link.provenance) + '"'
    if link.rehosted:
        rendered += ' data-wheelhouse-rehosted="upstream"'
    return "<a " + rendered + ">" + _esc(link.filename) + "</a><br>"


def _root_page(names: Iterable[str], *, label: str, site_name: str) -> bytes:
    return _page(
        f"{site_name} {label} simple index",
        [f"<h1>{_esc(site_name)} {_esc(label)}</h1>"] + [f'<a href="{_esc(n)}/">{_esc(n)}</a><br>' for n in names],
    )


def render_world(world: World | None, *, label: str, site_name: str,
                 statuses: Mapping[str, Status] | None = None) -> dict[str, bytes]:
    """``simple/index.html`` and ``simple/<pkg>/index.html`` of one world, keyed by relative path.

    ``statuses``: each project's PEP 792 status; a project it names that has no files here (archived)
    keeps a page without links."""
    statuses = statuses or {}
    packages = {p.name: p for p in (world.packages if world is not None else ())}
    names = sorted(set(packages) | set(statuses))
    files = {"simple/index.html": _root_page(names, label=label, site_name=site_name)}
    for name in names:
        links = packages[name].links if name in packages else ()
        files[f"simple/{name}/index.html"] = _page(
            f"Links for {name}",
            [f"<h1>Links for {_esc(name)}</h1>"] + [_link_html(link) for link in links],
            statuses.get(name),
        )
    return files


def site_catalog(site: Site, *, base_url: str, context: Context | None = None) -> Catalog:
    """The catalog (ci/publish/catalog.py) of a built site: what its pages and JSON records say."""
    worlds = [(world.path, {page.name: page.links for page in world.packages}) for world in site.worlds]
    return build_catalog(worlds, base_url=base_url, default_world=site.default_world, context=context or Context())


@functools.lru_cache(maxsize=65536)
def _release_page(folder: str, tag: str) -> str:
    """release_page of an asset in ``folder``: it depends on the folder only (its marker ends with a slash), and
    a release's assets share theirs."""
    return release_page(folder + "/", tag)


def render_site(site: Site, *, base_url: str, site_name: str = "wheelhouse",
                context: Context | None = None) -> dict[str, bytes]:
    """Every file of the site (without the digest cache), keyed by POSIX relative path, sorted: the PEP 503
    pages, the landing page and each world's page (ci/publish/landing.py), the JSON records and lock files."""
    base_url = check_base_url(base_url)
    catalog = site_catalog(site, base_url=base_url, context=context)
    counts = {world.path: world.link_count for world in site.worlds}
    files: dict[str, bytes] = {
        ".nojekyll": b"",
        "index.html": landing.render_landing(catalog, base_url=base_url, site_name=site_name, link_counts=counts),
        **catalog.files(),
        which_wheel.SERVED_NAME: which_wheel.served_copy(base_url),
    }
    for entry in catalog.worlds:
        files[f"{entry.path}/index.html"] = landing.render_world_page(entry, base_url=base_url, site_name=site_name)
        for project in entry.projects:
            lock = install_commands.pylock(project, entry) if project.status.value != ARCHIVED else None
            if lock is not None:
                files[f"{entry.path}/{which_wheel.lock_name(project.name)}"] = lock
        statuses = {project.name: project.status for project in entry.projects}
        for rel, data in render_world(site.world(entry.path), label=entry.path, site_name=site_name,
                                      statuses=statuses).items():
            files[f"{entry.path}/{rel}"] = data
    if site.default_world is not None:
        alias = f"(alias of {site.default_world})"
        default = catalog.world(site.default_world)
        if default is None:
            files.update(render_world(None, label=alias, site_name=site_name))
        else:
            # Package pages do not name their world: the alias reuses the world's bytes, only its root page differs.
            files["simple/index.html"] = _root_page([p.name for p in default.projects], label=alias,
                                                    site_name=site_name)
            for project in default.projects:
                rel = f"simple/{project.name}/index.html"
                files[rel] = files[f"{default.path}/{rel}"]
    return dict(sorted(files.items()))


def check_base_url(base_url: str) -> str:
    """``base_url`` without a trailing slash, or a WheelhouseError naming the fix."""
    problem = which_wheel.url_problem(base_url)
    if problem:  # the URL goes into the commands, records and lock files the site prints
        raise UsageError(f"base URL {which_wheel.shown(repr(base_url))} {problem}: pass e.g. "
                         "https://<owner>.github.io/<repo>")
    return base_url.rstrip("/")


# --------------------------------------------------------------------------- writing


@dataclass(frozen=True)
class WorldSummary:
    path: str
    packages: int
    links: int


@dataclass(frozen=True)
class IndexSummary:
    worlds: tuple[WorldSummary, ...]
    default_world: str | None
    warnings: tuple[str, ...]
    files: tuple[str, ...]
    """Relative POSIX paths written, sorted (digests.json included)."""
    fetches: int
    fetched_bytes: int

    def line(self) -> str:
        worlds = ", ".join(f"{w.path} ({w.packages} package(s))" for w in self.worlds) or "none"
        total = sum(w.links for w in self.worlds)
        return f"Indexed {total} wheel link(s) across {len(self.worlds)} world(s): {worlds}"


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """Pause the cycle collector: a site build makes a dozen acyclic objects per link, all kept to the end,
    and the collector would walk them again and again (a third of the time at 60,000 links)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def site_files(
    releases: Iterable[Release],
    *,
    base_url: str,
    default_world: str | None,
    fetch: Fetch | None = None,
    cache: DigestCache | None = None,
    yanked: Mapping[str, str] | None = None,
    site_name: str = "wheelhouse",
    projects: Mapping[str, frozenset[str]] | None = None,
    context: Context | None = None,
    rehosted: Mapping[str, frozenset[str]] | None = None,
) -> tuple[Site, dict[str, bytes]]:
    """The model and every file of the site, including ``digests.json``; ``context``: what versions.yaml and
    the earlier publish say about worlds and projects (ci/publish/catalog.py)."""
    base_url = check_base_url(base_url)
    cache = cache if cache is not None else DigestCache()
    with _cyclic_gc_paused():
        site = build_site(releases, default_world=default_world, fetch=fetch, cache=cache, yanked=yanked,
                          projects=projects, rehosted=rehosted)
        files = render_site(site, base_url=base_url, site_name=site_name, context=context)
    files[CACHE_FILE] = cache.to_json()
    return site, dict(sorted(files.items()))


def write_files(files: Mapping[str, bytes], out_dir: Path) -> None:
    """Write ``files`` under ``out_dir`` (which must be empty or absent)."""
    if out_dir.exists() and any(out_dir.iterdir()):
        raise WheelhouseError(
            f"{out_dir} is not empty: write the site into an empty directory, or publish it with ci.publish.pages"
        )
    for rel, data in files.items():
        path = out_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


def summarize(site: Site, files: Iterable[str]) -> IndexSummary:
    return IndexSummary(
        worlds=tuple(WorldSummary(w.path, len(w.packages), w.link_count) for w in site.worlds),
        default_world=site.default_world,
        warnings=site.warnings,
        files=tuple(sorted(files)),
        fetches=site.fetches,
        fetched_bytes=site.fetched_bytes,
    )
