"""which-wheel: which world and wheels of a published wheelhouse index fit this interpreter, and how to install them.

One file, standard library only, so that it runs in the user's own environment with nothing cloned: every
published site serves a copy as ``which-wheel.py`` (publish-index writes it, with the site's URL as the
default ``--index``)::

    python3 <(curl -fsSL https://<owner>.github.io/<repo>/which-wheel.py)
    uv run https://<owner>.github.io/<repo>/which-wheel.py          # with the environment's venv active

``invoke which-wheel --index SITE`` runs this module, the same code. It reads the user's side: the installed
torch (version, ``torch.version.cuda``, the C++11 ABI, ``torch.version.git_version``), the Python and
platform (the wheel tags this interpreter installs), and each GPU's compute capability (``torch.cuda``, else
``nvidia-smi``; both optional). It reads the published records, ``wheelhouse-index.json`` and each world's
``wheelhouse-world.json`` (written by ci/publish/catalog.py), from a directory or a ``file://``/``http(s)://`` URL,
and prints the matching world, the wheels that fit with the CUDA archs our fatbin scan found in them, the
pip and uv commands that install them, and for each wheel that does not fit, why.

The records come from a server the user does not control, so nothing in them is trusted: each record is
read up to :data:`MAX_RECORD_BYTES`, every value is checked where it is loaded (names, versions, URLs,
digests, wheel file names; no control characters anywhere), a record that fails is one line naming the
file and the key, and every value a printed command holds is quoted with :func:`shlex.quote`.

No torch, a torch no world of the index matches, an index that cannot be read or holds a malformed
record: one line on stderr, exit status 2. No wheel fits, or a ``--package`` asked for does not: exit 1.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import unquote, urlsplit

DEFAULT_INDEX: str | None = None
"""The site this copy is served from; publish-index sets it in the ``which-wheel.py`` it publishes."""

INDEX_RECORD = "wheelhouse-index.json"
WORLD_RECORD = "wheelhouse-world.json"
INDEX_FORMAT = "wheelhouse-index"
WORLD_FORMAT = "wheelhouse-world"
RECORD_VERSION = 1
ACTIVE, DEPRECATED, ARCHIVED = "active", "deprecated", "archived"
STATUSES = (ACTIVE, DEPRECATED, ARCHIVED)
LOCK_PIP = "26.1"
"""The first pip that installs from a PEP 751 lock file (``pip install -r pylock.<name>.toml``)."""

MAX_RECORD_BYTES = 8 * 1024 * 1024
"""The most read of one record: the real world records are a few KiB; a few thousand wheels fit."""
_HTTP_TIMEOUT_S = 30
_WORLD = re.compile(r"(?:cpu|cu\d{2,4})/torch\d{1,3}\.\d{1,3}", re.ASCII)
_PROJECT = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*", re.ASCII)
SAFE_URL = re.compile(r"(?:https?|file)://[A-Za-z0-9._~:/?#@%+=,-]+", re.ASCII)
"""A URL without what a shell or an HTML attribute acts on (``$;&|()`'"<>\\``, space, control characters); the
printed commands quote it all the same."""
_WHEEL_NAME = re.compile(r"(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?)-(?P<version>[A-Za-z0-9.!+_]+)"
                         r"(?:-(?P<build>\d[A-Za-z0-9_]*))?-(?P<tags>[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+)\.whl", re.ASCII)
_RELEASE_TAG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,199}", re.ASCII)
_SHA256 = re.compile(r"[0-9a-f]{64}", re.ASCII)
_ARCH = re.compile(r"(?P<major>\d{1,2})\.(?P<minor>\d)(?P<suffix>[af]?)", re.ASCII)
_SPECIFIER_TEXT = re.compile(r"[A-Za-z0-9.,<>=!~*+ _-]{0,200}", re.ASCII)
_MAX_TEXT = 1000


class IndexProblem(Exception):
    """A problem the user can fix, in one line: the index, their environment or the arguments. Exit status 2."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be printed in a command or written into a record; None when it can."""
    if SAFE_URL.fullmatch(url):
        return None
    bad = next((c for c in url if not re.fullmatch(r"[A-Za-z0-9._~:/?#@%+=,-]", c, re.ASCII)), None)
    if bad is None:
        return "is not an http(s):// or file:// URL"
    return f"holds {shown(repr(bad))} (a URL here has letters, digits and ._~:/?#@%+=,- only; percent-encode the rest)"


SERVED_NAME = "which-wheel.py"
"""The name the site serves this file under."""
_DEFAULT_LINE = "DEFAULT_INDEX: str | None = None\n"


def served_copy(site_url: str) -> bytes:
    """This file as the site at ``site_url`` serves it: the same code, with that site as the default ``--index``."""
    if url_problem(site_url):
        raise ValueError(f"{site_url!r} {url_problem(site_url)}")
    source = Path(__file__).read_text(encoding="utf-8")
    if source.count(_DEFAULT_LINE) != 1:
        raise ValueError(f"{__file__} has no line {_DEFAULT_LINE.strip()!r} to set")
    return source.replace(_DEFAULT_LINE, f"DEFAULT_INDEX: str | None = {site_url!r}\n", 1).encode("utf-8")


def shown(text: object) -> str:
    """``text`` with every character a terminal would act on (escapes, newlines, DEL) written as ``\\x..``."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(text))


# --------------------------------------------------------------------------- PEP 440 versions and specifiers


_VERSION = re.compile(
    r"v?(?:(?P<epoch>[0-9]+)!)?(?P<release>[0-9]+(?:\.[0-9]+)*)"
    r"(?P<pre>[-_.]?(?P<pre_l>alpha|a|beta|b|preview|pre|c|rc)[-_.]?(?P<pre_n>[0-9]+)?)?"
    r"(?P<post>(?:-(?P<post_n1>[0-9]+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>[0-9]+)?))?"
    r"(?P<dev>[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>[0-9]+)?)?"
    r"(?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?", re.IGNORECASE | re.ASCII)
_PRE_RANK = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


@dataclass(frozen=True)
class Version:
    """A PEP 440 version, ordered as pip orders them."""

    epoch: int
    release: tuple[int, ...]
    pre: tuple[int, int] | None
    post: int | None
    dev: int | None
    local: tuple[int | str, ...] | None
    text: str

    @classmethod
    def parse(cls, text: str) -> Version | None:
        m = _VERSION.fullmatch(text.strip())
        if m is None:
            return None
        pre = (_PRE_RANK[m["pre_l"].lower()], int(m["pre_n"] or 0)) if m["pre_l"] else None
        post = None
        if m["post"]:
            post = int(m["post_n1"] or m["post_n2"] or 0)
        local = tuple(int(p) if p.isdigit() else p.lower() for p in re.split(r"[-_.]", m["local"])) if m["local"] else None
        return cls(int(m["epoch"] or 0), tuple(int(p) for p in m["release"].split(".")), pre, post,
                   int(m["dev_n"] or 0) if m["dev"] else None, local, text.strip())

    @property
    def public(self) -> Version:
        return Version(self.epoch, self.release, self.pre, self.post, self.dev, None, self.text.split("+")[0])

    @property
    def key(self) -> tuple[Any, ...]:
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        if self.pre is None and self.post is None and self.dev is not None:
            pre: tuple[int, ...] = (0,)
        else:
            pre = (1, *self.pre) if self.pre is not None else (2,)
        local = (0,) if self.local is None else (1, tuple((1, p, "") if isinstance(p, int) else (0, 0, p)
                                                          for p in self.local))
        return (self.epoch, tuple(release), pre, (0,) if self.post is None else (1, self.post),
                (2,) if self.dev is None else (1, self.dev), local)

    @property
    def base(self) -> tuple[int, tuple[int, ...]]:
        return self.epoch, self.public_release

    @property
    def public_release(self) -> tuple[int, ...]:
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        return tuple(release)

    def __str__(self) -> str:
        return self.text


_SPECIFIER = re.compile(r"\s*(?P<op>~=|===|==|!=|<=|>=|<|>)\s*(?P<version>[^\s,;]+)\s*", re.ASCII)


def _padded(release: tuple[int, ...], length: int) -> tuple[int, ...]:
    return (release + (0,) * length)[:length]


def _equal(version: Version, spec: str) -> bool:
    if spec.endswith(".*"):
        prefix = Version.parse(spec[:-2])
        if prefix is None:
            return False
        return version.epoch == prefix.epoch and _padded(version.release, len(prefix.release)) == prefix.release
    wanted = Version.parse(spec)
    if wanted is None:
        return False
    return (version if wanted.local is not None else version.public).key == wanted.key


def _ordered(op: str, version: Version, spec: str) -> bool:
    wanted = Version.parse(spec)
    if wanted is None:
        return False
    mine = version.public.key
    if op == "<=":
        return mine <= wanted.key
    if op == ">=":
        return mine >= wanted.key
    if op == "<":
        return mine < wanted.key and not (wanted.pre is None and wanted.dev is None
                                           and (version.pre is not None or version.dev is not None)
                                           and version.base == wanted.base)
    return mine > wanted.key and not (wanted.post is None and version.post is not None
                                      and version.base == wanted.base) and not (
        version.local is not None and version.base == wanted.base)


def _matches(version: Version, op: str, spec: str) -> bool:
    if op == "===":
        return version.text.lower() == spec.lower()
    if op == "==":
        return _equal(version, spec)
    if op == "!=":
        return not _equal(version, spec)
    if op == "~=":
        wanted = Version.parse(spec)
        if wanted is None or len(wanted.release) < 2:
            return False
        prefix = ".".join(str(p) for p in wanted.release[:-1]) + ".*"
        epoch = f"{wanted.epoch}!" if wanted.epoch else ""
        return _ordered(">=", version, spec) and _equal(version, epoch + prefix)
    return _ordered(op, version, spec)


def version_in(version: str, specifiers: str) -> bool | None:
    """Whether ``version`` satisfies every specifier of ``specifiers`` (``>=3.10,!=3.11.*``), as pip decides;
    None when either cannot be parsed."""
    parsed = Version.parse(version)
    clauses = [c for c in specifiers.split(",") if c.strip()]
    found = [_SPECIFIER.fullmatch(c) for c in clauses]
    if parsed is None or any(m is None for m in found):
        return None
    return all(_matches(parsed, m["op"], m["version"]) for m in found if m is not None)


# --------------------------------------------------------------------------- wheel tags


@dataclass(frozen=True)
class WheelName:
    name: str
    version: Version
    tags: frozenset[tuple[str, str, str]]
    """(interpreter, abi, platform) of every compressed tag set expanded."""


def canonical_name(name: str) -> str:
    """PEP 503's normalised project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def parse_wheel_name(filename: str) -> WheelName | None:
    """The parts of a wheel file name, None when it is not one (nothing else is accepted: no path, no quote)."""
    m = _WHEEL_NAME.fullmatch(filename)
    version = Version.parse(m["version"]) if m else None
    if m is None or version is None:
        return None
    interpreters, abis, platforms = (part.split(".") for part in m["tags"].split("-"))
    return WheelName(canonical_name(m["name"]), version,
                     frozenset((i, a, p) for i in interpreters for a in abis for p in platforms))


def _glibc() -> tuple[int, int] | None:
    try:
        found = os.confstr("CS_GNU_LIBC_VERSION") or ""
    except (AttributeError, OSError, ValueError):
        return None
    m = re.fullmatch(r"glibc (\d+)\.(\d+).*", found)
    return (int(m[1]), int(m[2])) if m else None


def _musl() -> tuple[int, int] | None:
    """musl's version from the loader this interpreter names (``/lib/ld-musl-*.so.1``), as pip finds it."""
    try:
        with open(sys.executable, "rb") as binary:
            head = binary.read(4096)
    except OSError:
        return None
    loader = re.search(rb"/lib/ld-musl-[^\x00]*", head)
    if loader is None:
        return None
    proc = subprocess.run([loader[0].decode()], capture_output=True, text=True, check=False)
    m = re.search(r"Version (\d+)\.(\d+)", proc.stderr)
    return (int(m[1]), int(m[2])) if m else None


_LEGACY_MANYLINUX = {(2, 17): "manylinux2014", (2, 12): "manylinux2010", (2, 5): "manylinux1"}


def _linux_platforms(arch: str) -> Iterator[str]:
    """As pip: ``linux_<arch>``, then manylinux from this glibc down (with the legacy names), then musllinux."""
    yield f"linux_{arch}"
    glibc = _glibc()
    if glibc is not None and glibc[0] == 2:
        oldest = 5 if arch in ("x86_64", "i686") else 17
        for minor in range(glibc[1], oldest - 1, -1):
            yield f"manylinux_2_{minor}_{arch}"
            if (2, minor) in _LEGACY_MANYLINUX:
                yield f"{_LEGACY_MANYLINUX[(2, minor)]}_{arch}"
    musl = _musl() if glibc is None else None
    if musl is not None:
        yield from (f"musllinux_{musl[0]}_{minor}_{arch}" for minor in range(musl[1], -1, -1))


def _platforms() -> list[str]:
    plat = re.sub(r"[.-]", "_", sysconfig.get_platform())
    if platform.system() == "Linux" and plat.startswith("linux_"):
        arch = plat.split("_", 1)[1]
        if sys.maxsize <= 2**32:
            arch = {"x86_64": "i686", "aarch64": "armv8l"}.get(arch, arch)
        return list(_linux_platforms(arch))
    return [plat]


def interpreter_tags() -> tuple[tuple[str, str, str], ...]:
    """The wheel tags this (CPython) interpreter installs, most preferred first, in pip's order."""
    major, minor = sys.version_info[:2]
    plats = _platforms()
    cp = f"cp{major}{minor}"
    threaded = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    debug = "d" if sysconfig.get_config_var("Py_DEBUG") else ""
    abis = [f"{cp}{'t' if threaded else ''}{debug}"] + ([f"{cp}{'t' if threaded else ''}"] if debug else [])
    tags = [(cp, abi, p) for abi in abis for p in plats]
    if not threaded:
        tags += [(cp, "abi3", p) for p in plats]
    tags += [(cp, "none", p) for p in plats]
    if not threaded:
        tags += [(f"cp{major}{m}", "abi3", p) for m in range(minor - 1, 1, -1) for p in plats]
    pythons = [f"py{major}{minor}", f"py{major}", *(f"py{major}{m}" for m in range(minor - 1, -1, -1))]
    tags += [(py, "none", p) for py in pythons for p in plats]
    tags.append((cp, "none", "any"))
    tags += [(py, "none", "any") for py in pythons]
    return tuple(dict.fromkeys(tags))


# --------------------------------------------------------------------------- the published records


@dataclass(frozen=True)
class Status:
    value: str = ACTIVE
    reason: str = ""

    @property
    def active(self) -> bool:
        return self.value == ACTIVE


@dataclass(frozen=True, order=True)
class Arch:
    """A CUDA arch as the records write it: ``9.0``, ``9.0a``, ``12.0f``."""

    major: int
    minor: int
    suffix: str = ""

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"


@dataclass(frozen=True)
class Facts:
    """What the wheel says about itself (ci/publish/wheel_facts.py wrote it): its CUDA archs, torch build and pin."""

    archs_known: bool
    cubins: tuple[Arch, ...] = ()
    ptx: tuple[Arch, ...] = ()
    torch_pin: str | None = None
    built_with: Mapping[str, str] | None = None

    @property
    def has_device_code(self) -> bool:
        return bool(self.cubins or self.ptx)


@dataclass(frozen=True)
class Wheel:
    filename: str
    url: str
    sha256: str | None
    size: int
    release: str
    release_url: str
    requires_python: str | None
    yanked: str | None
    facts: Facts | None
    name: WheelName = field(repr=False, compare=False)

    @property
    def version(self) -> Version:
        return self.name.version

    def python_admits(self, python: str) -> bool:
        """Whether ``Requires-Python`` admits ``python`` (``3.12``); True without one, or one that cannot be read."""
        return not self.requires_python or version_in(python, self.requires_python) is not False


@dataclass(frozen=True)
class Project:
    name: str
    status: Status
    wheels: tuple[Wheel, ...]

    def newest_wheels(self) -> tuple[Wheel, ...]:
        """The wheels, not yanked, of the newest version that has any."""
        listed = [w for w in self.wheels if w.yanked is None]
        if not listed:
            return ()
        newest = max(w.version.key for w in listed)
        return tuple(w for w in listed if w.version.key == newest)


class WorldPath:
    """What a world's path (``cu130/torch2.13``) says, for the records here and the catalog that writes them."""

    path: str

    @property
    def cuda(self) -> str:
        """``13.0``, ``12.9``, or ``cpu``."""
        tag = self.path.split("/")[0]
        return "cpu" if tag == "cpu" else f"{tag[2:-1]}.{tag[-1]}"

    @property
    def torch(self) -> str:
        """The torch line, ``2.13``."""
        return self.path.split("/")[1].removeprefix("torch")

    @property
    def torch_requirement(self) -> str:
        return f"torch=={self.torch}.*"


@dataclass(frozen=True)
class World(WorldPath):
    path: str
    """``cu130/torch2.13``"""
    index_url: str
    """Its PEP 503 index, ``<base>/<path>/simple/``."""
    torch_index: str | None
    """Where its torch comes from; None: the installer's own configured index."""
    status: Status
    projects: tuple[Project, ...]

    def project(self, name: str) -> Project | None:
        return next((p for p in self.projects if p.name == name), None)


@dataclass(frozen=True)
class Catalog:
    worlds: tuple[World, ...]
    default_world: str | None = None

    def world(self, path: str) -> World | None:
        return next((w for w in self.worlds if w.path == path), None)


def _bad(where: str, key: str, problem: str) -> IndexProblem:
    return IndexProblem(f"{where}: {key} {problem}: not a record publish-index wrote; publish the index again "
                        "(invoke publish-index), or use a site you trust")


def _value(raw: Mapping[str, Any], key: str, at: str, kind: type | tuple[type, ...], *, optional: bool = False) -> Any:
    """``raw[key]`` of the type ``kind``; ``at``: ``<where>|<path of raw>`` for the message."""
    where, path = at.split("|", 1)
    value = raw.get(key)
    if optional and value is None:
        return None
    if key not in raw:
        raise _bad(where, path + key, "is missing")
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise _bad(where, path + key, f"is not of type {names}")
    return value


def _text(raw: Mapping[str, Any], key: str, at: str, pattern: re.Pattern[str] | None = None, *,
          optional: bool = False) -> Any:
    value = _value(raw, key, at, str, optional=optional)
    if value is None:
        return None
    where, path = at.split("|", 1)
    if not value.isprintable():
        raise _bad(where, path + key, f"holds a control character ({shown(value[:120])})")
    if len(value) > _MAX_TEXT:
        raise _bad(where, path + key, f"is longer than {_MAX_TEXT} characters")
    if pattern is not None and not pattern.fullmatch(value):
        raise _bad(where, path + key, f"is not a valid value ({shown(value[:120])})")
    return value


def _items(raw: Mapping[str, Any], key: str, at: str, limit: int = 100_000) -> list[Any]:
    value = _value(raw, key, at, list)
    if len(value) > limit:
        where, path = at.split("|", 1)
        raise _bad(where, path + key, f"holds {len(value)} entries (more than {limit})")
    return value


def _mapping(value: Any, at: str, key: str) -> Mapping[str, Any]:
    if not isinstance(value, dict):
        where, path = at.split("|", 1)
        raise _bad(where, path + key, "is not an object")
    return value


def _status(raw: Mapping[str, Any], at: str) -> Status:
    value = _text(raw, "status", at, optional=True) or ACTIVE
    if value not in STATUSES:
        where, path = at.split("|", 1)
        raise _bad(where, path + "status", f"is not one of {', '.join(STATUSES)} ({shown(value[:40])})")
    return Status(value, _text(raw, "status_reason", at, optional=True) or "")


def _archs(raw: Mapping[str, Any], key: str, at: str) -> tuple[Arch, ...]:
    if raw.get(key) is None:
        return ()
    where, path = at.split("|", 1)
    found = []
    for i, item in enumerate(_items(raw, key, at, limit=64)):
        m = _ARCH.fullmatch(item) if isinstance(item, str) else None
        if m is None:
            raise _bad(where, f"{path}{key}[{i}]", f"is not a CUDA arch such as 9.0a ({shown(str(item)[:40])})")
        found.append(Arch(int(m["major"]), int(m["minor"]), m["suffix"]))
    return tuple(sorted(set(found)))


_BUILT_WITH_KEY = re.compile(r"[a-z0-9_]{1,40}", re.ASCII)


def _facts(raw: Any, at: str) -> Facts | None:
    if raw is None:
        return None
    raw = _mapping(raw, at, "facts")
    at = at + "facts."
    built = _value(raw, "built_with", at, dict, optional=True)
    if built is not None:
        if len(built) > 16 or not all(isinstance(k, str) and _BUILT_WITH_KEY.fullmatch(k) for k in built):
            where, path = at.split("|", 1)
            raise _bad(where, path + "built_with", "is not a mapping of up to 16 lower-case keys")
        built = {k: _text(built, k, at + "built_with.") for k in built}
    return Facts(_value(raw, "archs_known", at, bool), _archs(raw, "cubins", at), _archs(raw, "ptx", at),
                 _text(raw, "torch_pin", at, _SPECIFIER_TEXT, optional=True), built)


def _wheel(raw: Any, at: str, project: str) -> Wheel:
    raw = _mapping(raw, at, "")
    where, path = at.split("|", 1)
    filename = _text(raw, "filename", at)
    name = parse_wheel_name(filename)
    if name is None or name.name != project:
        raise _bad(where, path + "filename", f"is not a wheel file name of {project} ({shown(filename[:120])})")
    url = _text(raw, "url", at, SAFE_URL)
    if unquote(urlsplit(url).path).rsplit("/", 1)[-1] != filename:
        raise _bad(where, path + "url", f"does not end in the wheel's file name {filename} ({shown(url[:160])})")
    size = _value(raw, "size", at, int)
    if size < 0:
        raise _bad(where, path + "size", "is negative")
    return Wheel(filename, url, _text(raw, "sha256", at, _SHA256, optional=True), size,
                 _text(raw, "release", at, _RELEASE_TAG), _text(raw, "release_url", at, SAFE_URL),
                 _text(raw, "requires_python", at, _SPECIFIER_TEXT, optional=True),
                 _text(raw, "yanked", at, optional=True), _facts(raw.get("facts"), at), name)


def _project(raw: Any, at: str) -> Project:
    raw = _mapping(raw, at, "")
    name = _text(raw, "name", at, _PROJECT)
    wheels = tuple(_wheel(w, f"{at}wheels[{i}].", name)
                   for i, w in enumerate(_items(raw, "wheels", at)))
    return Project(name, _status(raw, at), wheels)


def _json(data: bytes, where: str) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except RecursionError:
        raise IndexProblem(f"{where} is nested too deeply to be a record of ours; publish the index again "
                           "(invoke publish-index), or use a site you trust") from None
    except (UnicodeDecodeError, ValueError) as exc:
        raise IndexProblem(f"{where} is not JSON ({shown(exc)}); publish the index again (invoke publish-index)") from None
    if not isinstance(doc, dict):
        raise IndexProblem(f"{where} is not an index record; publish the index again (invoke publish-index)")
    return doc


def _format(doc: Mapping[str, Any], where: str, expected: str) -> None:
    if doc.get("format") != expected or doc.get("version") != RECORD_VERSION:
        raise _bad(where, "format", f'is not "{expected}", version {RECORD_VERSION}')


def parse_world(data: bytes, where: str, expected: str | None = None) -> World:
    """The world record ``data`` read from ``where``; ``expected``: the world the index record names for it."""
    doc = _json(data, where)
    _format(doc, where, WORLD_FORMAT)
    at = f"{where}|"
    path = _text(doc, "world", at, _WORLD)
    if expected is not None and path != expected:
        raise _bad(where, "world", f"is {path}, where {INDEX_RECORD} names {expected}")
    index = _text(doc, "index", at, SAFE_URL)
    if not index.endswith(f"/{path}/simple/"):
        raise _bad(where, "index", f"is not the simple index of {path} (<site>/{path}/simple/): {shown(index[:160])}")
    projects = tuple(_project(p, f"{where}|projects[{i}].") for i, p in enumerate(_items(doc, "projects", at)))
    names = [p.name for p in projects]
    if len(set(names)) != len(names):
        raise _bad(where, "projects", "names a project twice")
    return World(path, index, _text(doc, "torch_index", at, SAFE_URL, optional=True), _status(doc, at), projects)


def parse_index(data: bytes, where: str) -> tuple[list[str], str | None]:
    """(the worlds, the default world) of the index record ``data`` read from ``where``."""
    doc = _json(data, where)
    _format(doc, where, INDEX_FORMAT)
    worlds = []
    for i, raw in enumerate(_items(doc, "worlds", f"{where}|", limit=1000)):
        at = f"{where}|worlds[{i}]."
        world = _text(_mapping(raw, at, ""), "world", at, _WORLD)
        record = _text(raw, "record", at)
        if record != f"{world}/{WORLD_RECORD}":
            raise _bad(where, f"worlds[{i}].record", f"is not {world}/{WORLD_RECORD} ({shown(record[:120])})")
        worlds.append(world)
    return worlds, _text(doc, "default_world", f"{where}|", _WORLD, optional=True)


def _read_at_most(stream: Any, what: str) -> bytes:
    data: bytes = stream.read(MAX_RECORD_BYTES + 1)
    if len(data) > MAX_RECORD_BYTES:
        raise IndexProblem(f"{what} is larger than {MAX_RECORD_BYTES // 2**20} MiB, more than any record of ours; "
                           "check the URL, or use a site you trust")
    return data


def _url_reader(location: str) -> Callable[[str], bytes | None]:
    base = location.rstrip("/")

    def read_url(rel: str) -> bytes | None:
        try:
            with urllib.request.urlopen(f"{base}/{rel}", timeout=_HTTP_TIMEOUT_S) as response:
                return _read_at_most(response, f"{base}/{rel}")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return None
            raise IndexProblem(f"{shown(location)}: reading {rel} answered HTTP {exc.code}; check the URL") from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise IndexProblem(f"{shown(location)}: cannot be read ({shown(getattr(exc, 'reason', exc))}); check the "
                               "URL or pass the site's directory") from None

    return read_url


def _reader(location: str) -> Callable[[str], bytes | None]:
    """``read(relative path)`` for a site directory or URL: the bytes, or None when there is no such file."""
    if not location.isprintable():
        raise IndexProblem(f"--index {shown(location)}: holds a control character; give the site's directory or URL")
    parts = urlsplit(location)
    if parts.scheme in ("http", "https"):
        return _url_reader(location)
    if parts.scheme == "file":
        root = Path(unquote(parts.path))
    elif not parts.scheme:
        root = Path(location)
    else:
        raise IndexProblem(f"--index {location!r}: give a directory, or a file://, http:// or https:// URL of the site")
    if not root.is_dir():
        raise IndexProblem(f"--index {location}: no such directory; pass the folder invoke publish-index wrote "
                           "(e.g. wheelhouse/site) or its URL")

    def read_file(rel: str) -> bytes | None:
        try:
            with open(root / rel, "rb") as stream:
                return _read_at_most(stream, str(root / rel))
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as exc:
            raise IndexProblem(f"{root / rel}: cannot be read ({exc.strerror})") from None

    return read_file


def read_index(location: str) -> Catalog:
    """The catalog the site at ``location`` publishes (its root, or one world's folder)."""
    read = _reader(location)
    index = read(INDEX_RECORD)
    if index is None:
        single = read(WORLD_RECORD)
        if single is None:
            raise IndexProblem(f"{location}: holds no {INDEX_RECORD}; pass the root of a site invoke publish-index "
                               "wrote (the folder or URL with its index.html)")
        return Catalog((parse_world(single, f"{location}/{WORLD_RECORD}"),))
    paths, default = parse_index(index, f"{location}/{INDEX_RECORD}")
    worlds = []
    for path in paths:
        rel = f"{path}/{WORLD_RECORD}"
        data = read(rel)
        if data is None:
            raise IndexProblem(f"{location}: {INDEX_RECORD} names {rel}, which is not there; publish the index again")
        worlds.append(parse_world(data, f"{location}/{rel}", path))
    return Catalog(tuple(worlds), default)


# --------------------------------------------------------------------------- the user's side


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: Arch


@dataclass(frozen=True)
class UserEnvironment:
    python: str
    """``3.11``"""
    machine: str
    """``x86_64``"""
    torch: str | None = None
    torch_cuda: str | None = None
    torch_hip: str | None = None
    cxx11_abi: bool | None = None
    torch_git: str | None = None
    gpus: tuple[Gpu, ...] = ()
    gpu_source: str = "none"
    """Where the GPUs were read: ``torch.cuda``, ``nvidia-smi`` or ``none``."""
    tags: tuple[tuple[str, str, str], ...] = field(default=(), repr=False)
    """The wheel tags this interpreter installs, most preferred first."""

    @property
    def world(self) -> str | None:
        """The world of this torch (``cu130/torch2.13``, ``cpu/torch2.13``); None for a ROCm build or a version
        that is not one."""
        version = Version.parse(self.torch or "")
        if version is None or self.torch_hip or len(version.release) < 2:
            return None
        cuda = "cpu" if not self.torch_cuda else "cu" + "".join(self.torch_cuda.split(".")[:2])
        world = f"{cuda}/torch{version.release[0]}.{version.release[1]}"
        return world if _WORLD.fullmatch(world) else None

    def line(self) -> str:
        torch = f"torch {self.torch}" if self.torch else "no torch"
        if self.torch:
            build = f"CUDA {self.torch_cuda}" if self.torch_cuda else (f"ROCm {self.torch_hip}" if self.torch_hip else "CPU")
            abi = {True: "C++11 ABI on", False: "C++11 ABI off", None: "C++11 ABI unknown"}[self.cxx11_abi]
            torch += f" ({build}, {abi}, git {(self.torch_git or 'unknown')[:12]})"
        gpus = ", ".join(f"{g.name} (sm_{g.capability.major}{g.capability.minor})" for g in self.gpus) or "none seen"
        return shown(f"environment: Python {self.python} on {self.machine}; {torch}; GPUs: {gpus}"
                     + (f" (from {self.gpu_source})" if self.gpus else ""))


def _nvidia_smi_gpus() -> tuple[Gpu, ...]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        proc = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    found = []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        name, _, cap = line.rpartition(",")
        major, _, minor = cap.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            found.append(Gpu(name.strip(), Arch(int(major), int(minor))))
    return tuple(found)


def _torch_gpus(torch: Any) -> tuple[Gpu, ...]:
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_available():
            return tuple(Gpu(str(cuda.get_device_name(i)), Arch(*cuda.get_device_capability(i)))
                         for i in range(cuda.device_count()))
    except Exception:  # a driver that torch cannot talk to: nvidia-smi may still say what is there
        return ()
    return ()


def read_environment(*, nvidia_smi: Callable[[], tuple[Gpu, ...]] = _nvidia_smi_gpus) -> UserEnvironment:
    """The environment of this interpreter; torch is imported here (its absence is not an error yet)."""
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    machine = platform.machine()
    tags = interpreter_tags()
    try:
        with warnings.catch_warnings():  # torch's own import-time warnings (no numpy) are not the answer
            warnings.simplefilter("ignore")
            torch = importlib.import_module("torch")
    except ImportError:
        return UserEnvironment(python, machine, tags=tags, gpus=nvidia_smi(), gpu_source="nvidia-smi")
    version = getattr(torch, "version", None)
    cxx11 = getattr(torch, "compiled_with_cxx11_abi", None)
    gpus = _torch_gpus(torch)
    source = "torch.cuda" if gpus else "none"
    if not gpus:
        gpus = nvidia_smi()
        source = "nvidia-smi" if gpus else "none"
    return UserEnvironment(
        python, machine, str(torch.__version__), getattr(version, "cuda", None), getattr(version, "hip", None),
        bool(cxx11()) if callable(cxx11) else None, getattr(version, "git_version", None), gpus, source, tags)


# --------------------------------------------------------------------------- what a wheel says, in words


class _ArchLike(Protocol):
    @property
    def major(self) -> int: ...

    @property
    def minor(self) -> int: ...

    @property
    def suffix(self) -> str: ...


class FactsLike(Protocol):
    """The facts of a wheel, as the records hold them (:class:`Facts`) or the index built them (ci/publish/wheel_facts.py)."""

    @property
    def archs_known(self) -> bool: ...

    @property
    def cubins(self) -> Sequence[_ArchLike]: ...

    @property
    def ptx(self) -> Sequence[_ArchLike]: ...

    @property
    def torch_pin(self) -> str | None: ...


def format_archs(archs: Sequence[_ArchLike]) -> str:
    ordered = sorted({(a.major, a.minor, a.suffix) for a in archs})
    return ", ".join(f"{major}.{minor}{suffix}" for major, minor, suffix in ordered) or "none"


def archs_text(facts: FactsLike | None) -> str:
    if facts is None or not facts.archs_known:
        return "CUDA archs not recorded"
    if not (facts.cubins or facts.ptx):
        return "no CUDA code"
    text = "sm " + format_archs(facts.cubins) if facts.cubins else "no cubins"
    return text + (f"; PTX {format_archs(facts.ptx)}" if facts.ptx else "")


def size_text(size: int) -> str:
    return f"{size / (1024 * 1024):.1f} MiB" if size >= 1024 * 1024 else f"{size / 1024:.0f} KiB"


def pin_text(facts: FactsLike | None) -> str:
    if facts is None:
        return "torch pin not recorded"
    return f"torch{facts.torch_pin}" if facts.torch_pin else "no torch pin"


ANY = "any"


def _python_of(interpreter: str, abi: str) -> str:
    """``3.11`` for cp311, ``>=3.9`` for an abi3 wheel, ``any`` for py3."""
    if interpreter.startswith("cp") and interpreter[2:].isdigit():
        version = f"{interpreter[2]}.{interpreter[3:]}"
        return f">={version}" if abi == "abi3" else version
    return ANY


def _arch_of(platform_tag: str) -> str:
    if platform_tag == ANY:
        return ANY
    for machine in ("x86_64", "aarch64", "ppc64le", "s390x", "armv7l", "i686"):
        if platform_tag.endswith("_" + machine):
            return machine
    return platform_tag


def wheel_axes(filename: str) -> tuple[frozenset[str], frozenset[str]]:
    """The Pythons (``3.11``, ``>=3.9``, ``any``) and CPU archs (``x86_64``, ``any``) a wheel's tags name."""
    name = parse_wheel_name(filename)
    tags = name.tags if name is not None else frozenset()
    return frozenset(_python_of(i, a) for i, a, _ in tags), frozenset(_arch_of(p) for _, _, p in tags)


# --------------------------------------------------------------------------- the commands


class WorldLike(Protocol):
    """A world as the pages (ci/publish/catalog.py) and the records (:class:`World`) hold it."""

    @property
    def path(self) -> str: ...

    @property
    def index_url(self) -> str: ...

    @property
    def torch_index(self) -> str | None: ...

    @property
    def torch_requirement(self) -> str: ...


def lock_name(project: str) -> str:
    """``pylock.<project>.toml``: the PEP 751 name of a named lock file."""
    return f"pylock.{project}.toml"


@dataclass(frozen=True)
class InstallCommands:
    """Each form as the lines to run, in order."""

    pip: tuple[str, ...]
    uv: tuple[str, ...]
    pip_locked: tuple[str, ...]
    uv_locked: tuple[str, ...]


def commands(world: WorldLike, requirements: Sequence[str], *, lock_base: str,
             torch_installed: bool = False) -> InstallCommands:
    """The commands that install ``requirements`` (``flash-attn==2.8.3``, names of ``world``'s projects) from
    ``world``; ``lock_base``: the URL of the world's folder (its lock files). Every value is quoted for the shell.

    pip merges every index it is given and takes the highest version of a name across them, so its form is
    three one-index steps: torch from the world's torch index, our wheels ``--no-deps`` from our index alone,
    then their other dependencies from the installer's default index (what is installed stays). uv takes each
    name from the first index that has it, so one command with our index first does the same. With
    ``torch_installed`` (which-wheel found the world's torch), nothing touches torch: no torch step, and uv
    is not pointed at a torch index (the installed torch satisfies the pin and stays)."""
    q = shlex.quote
    wanted = " ".join(q(r) for r in requirements)
    names = [r.split("==", 1)[0] for r in requirements]
    torch = q(world.torch_requirement)
    ours = q(world.index_url)
    torch_index = None if torch_installed else world.torch_index
    pip_torch = () if torch_installed else (
        f"pip install --index-url {q(world.torch_index)} {torch}" if world.torch_index else f"pip install {torch}",)
    uv_torch = () if torch_installed else (
        f"uv pip install --index {q(world.torch_index)} {torch}" if world.torch_index else f"uv pip install {torch}",)
    uv_indexes = f"--index {ours}" + (f" --index {q(torch_index)}" if torch_index else "")
    locks = " ".join(f"-r {q(f'{lock_base}/{lock_name(n)}')}" for n in names)
    return InstallCommands(
        pip=(*pip_torch, f"pip install --no-deps --index-url {ours} {wanted}", f"pip install {wanted}"),
        uv=(f"uv pip install {uv_indexes} {wanted}",),
        pip_locked=(f"pip install {q(f'pip>={LOCK_PIP}')}", *pip_torch, f"pip install --no-deps {locks}",
                    f"pip install {wanted}"),
        uv_locked=(*uv_torch, f"uv pip install {locks}", f"uv pip install {uv_indexes} {wanted}"))


# --------------------------------------------------------------------------- the answer


@dataclass(frozen=True)
class Fit:
    project: str
    wheel: Wheel | None
    problems: tuple[str, ...] = ()
    """Why it does not fit (empty: it fits)."""
    notes: tuple[str, ...] = ()


FORMS = (("pip", "pip"), ("uv", "uv"),
         ("pip_locked", f"verifiable, from the PEP 751 lock files (pip {LOCK_PIP} or later; the first line brings it)"),
         ("uv_locked", "verifiable, from the PEP 751 lock files (uv)"))
"""The printed forms, by their heading line."""


@dataclass(frozen=True)
class Answer:
    environment: UserEnvironment
    world: World
    fits: tuple[Fit, ...]
    requested: bool

    @property
    def fitting(self) -> tuple[Fit, ...]:
        return tuple(f for f in self.fits if not f.problems)

    @property
    def exit_code(self) -> int:
        if not self.fitting:
            return 1
        return 1 if self.requested and any(f.problems for f in self.fits) else 0

    def install(self) -> InstallCommands | None:
        """The commands for the wheels that fit; None when none does."""
        requirements = [f"{f.project}=={f.wheel.version}" for f in self.fitting if f.wheel is not None]
        if not requirements:
            return None
        base = self.world.index_url.removesuffix("/").removesuffix("/simple")
        return commands(self.world, requirements, lock_base=base, torch_installed=True)

    def render(self) -> str:
        world = self.world
        lines = [self.environment.line(),
                 f"world: {world.path} (torch {world.torch}.x, "
                 f"{'CPU' if world.cuda == 'cpu' else 'CUDA ' + world.cuda}; index {world.index_url})"]
        if not world.status.active:
            lines.append(f"note: the world {world.path} is {world.status.value}: {world.status.reason}")
        for fit in self.fitting:
            wheel = fit.wheel
            if wheel is not None:
                lines.append(f"fits: {fit.project} {wheel.version}: {wheel.filename} ({archs_text(wheel.facts)}, "
                             f"{size_text(wheel.size)}, {pin_text(wheel.facts)}; release {wheel.release})")
        lines += [f"note: {note}" for fit in self.fits for note in fit.notes]
        forms = self.install()
        if forms is not None:
            lines.append(f"torch {self.environment.torch} is installed and on the world's line: the commands keep it")
            for attribute, title in FORMS:
                lines.append(f"{title}:")
                lines += [f"  {command}" for command in getattr(forms, attribute)]
        unfit = [problem for fit in self.fits for problem in fit.problems]
        if unfit:
            lines.append("does not fit:")
            lines += [f"  {problem}" for problem in unfit]
        return "\n".join(shown(line) for line in lines)


def _abi(value: str | None) -> bool | None:
    if value is None or value == "":
        return None
    return value.strip().lower() in ("true", "1", "yes")


def runs_on(facts: FactsLike, gpu: _ArchLike) -> bool:
    """Whether a GPU of compute capability ``gpu`` runs the wheel's device code: a cubin of its major and a
    minor at most its own (an arch-specific ``a`` cubin only on its exact arch), or PTX it can compile."""
    for cubin in facts.cubins:
        if cubin.major == gpu.major and cubin.minor <= gpu.minor and (cubin.suffix != "a" or cubin.minor == gpu.minor):
            return True
    return any(p.suffix == "" and (p.major, p.minor) <= (gpu.major, gpu.minor) for p in facts.ptx)


def _axes_text(wheels: Sequence[Wheel]) -> str:
    labels = set()
    for wheel in wheels:
        pythons, archs = wheel_axes(wheel.filename)
        labels |= {f"Python {p} on {a}" for p in pythons for a in archs}
    return ", ".join(sorted(labels))


def _best_wheel(project: Project, env: UserEnvironment) -> Wheel | None:
    rank = {tag: i for i, tag in enumerate(env.tags)}
    compatible = [(min(rank[t] for t in w.name.tags if t in rank), w.filename, w) for w in project.newest_wheels()
                  if any(t in rank for t in w.name.tags) and w.python_admits(env.python)]
    return min(compatible, key=lambda found: found[:2])[2] if compatible else None


def _torch_problems(project: str, facts: Facts, env: UserEnvironment) -> tuple[list[str], list[str]]:
    problems, notes = [], []
    if facts.torch_pin and env.torch and version_in(env.torch, facts.torch_pin) is False:
        problems.append(f"{project}: pins torch{facts.torch_pin}; yours is {env.torch}")
    built = facts.built_with or {}
    built_abi = _abi(built.get("cxx11_abi"))
    if built_abi is not None and env.cxx11_abi is not None and built_abi != env.cxx11_abi:
        problems.append(f"{project}: built with the C++11 ABI {'on' if built_abi else 'off'}, your torch has it "
                        f"{'on' if env.cxx11_abi else 'off'}")
    if built.get("git_version") and env.torch_git and built["git_version"] != env.torch_git:
        notes.append(f"{project}: built against torch {built.get('version')} git {built['git_version'][:12]}, "
                     f"yours is git {env.torch_git[:12]}: the same line, another build of it")
    return problems, notes


def _gpu_problems(project: str, wheel: Wheel, facts: Facts, env: UserEnvironment, where: str) -> tuple[list[str], list[str]]:
    if not facts.archs_known:
        return [], [f"{project}: {wheel.filename} has no record of its CUDA archs"]
    if not facts.has_device_code:
        return [], []
    built_for = format_archs(facts.cubins) + (f"; PTX {format_archs(facts.ptx)}" if facts.ptx else "")
    problems = [f"{project}: no sm_{gpu.capability.major}{gpu.capability.minor} kernels in {where} (built for {built_for})"
                for gpu in env.gpus if not runs_on(facts, gpu.capability)]
    notes = [] if env.gpus else [f"{project}: no GPU seen (torch.cuda, nvidia-smi), so its CUDA archs ({built_for}) "
                                 "were not checked"]
    return problems, notes


def fit(project: Project, world: World, env: UserEnvironment) -> Fit:
    """Whether the project's newest wheel fits ``env``, and if not, why."""
    where = world.path
    if project.status.value == ARCHIVED:
        return Fit(project.name, None, (f"{project.name}: retired from {where} ({project.status.reason})",))
    wheel = _best_wheel(project, env)
    if wheel is None:
        return Fit(project.name, None, (f"{project.name}: no wheel for Python {env.python} on {env.machine} in {where} "
                                        f"(wheels for {_axes_text(project.newest_wheels()) or 'nothing'})",))
    notes = [f"{project.name} is {project.status.value} in {where}: {project.status.reason}"] if not project.status.active else []
    if wheel.facts is None:
        notes.append(f"{project.name}: {wheel.filename} has no record of its CUDA archs and torch build")
        return Fit(project.name, wheel, (), tuple(notes))
    torch_problems, torch_notes = _torch_problems(project.name, wheel.facts, env)
    gpu_problems, gpu_notes = _gpu_problems(project.name, wheel, wheel.facts, env, where)
    return Fit(project.name, wheel, tuple(dict.fromkeys(torch_problems + gpu_problems)),
               tuple(notes + torch_notes + gpu_notes))


def which_wheel(catalog: Catalog, env: UserEnvironment, *, location: str, packages: Sequence[str] = ()) -> Answer:
    """The world of ``env``'s torch in ``catalog`` and the fit of each package (default: every one it serves)."""
    if env.torch is None:
        raise IndexProblem(f"no torch in {sys.executable}: install the torch you will run with first; which-wheel "
                           "matches the wheels to it")
    wanted = env.world
    world = catalog.world(wanted) if wanted else None
    served = [w.path for w in catalog.worlds if w.status.value != ARCHIVED]
    if world is None or world.status.value == ARCHIVED:
        build = "a ROCm build" if env.torch_hip else (wanted or "")
        raise IndexProblem(f"no world of {shown(location)} matches torch {shown(env.torch)} ({build}): it serves "
                           f"{', '.join(served) or 'no world'}; install the torch of one of them from its torch index")
    names = [canonical_name(p) for p in packages]
    bad = [p for p in names if not _PROJECT.fullmatch(p)]
    if bad:
        raise IndexProblem(f"--package {shown(bad[0])}: not a project name; name a component such as flash-attn")
    fits = []
    for name in names or [p.name for p in world.projects if p.status.value != ARCHIVED]:
        project = world.project(name)
        if project is None:
            held = ", ".join(p.name for p in world.projects if p.status.value != ARCHIVED) or "nothing"
            fits.append(Fit(name, None, (f"{name}: not in {world.path} (it holds {held})",)))
        else:
            fits.append(fit(project, world, env))
    return Answer(env, world, tuple(fits), bool(names))


def answer(index: str | None, packages: Sequence[str] = ()) -> Answer:
    """The answer for this interpreter against the site at ``index`` (default: the site this copy came from)."""
    location = index or DEFAULT_INDEX
    if not location:
        raise IndexProblem("name the published index with --index DIR or --index URL (e.g. wheelhouse/site)")
    return which_wheel(read_index(location), read_environment(), location=location, packages=packages)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="which-wheel", description="Which world and wheels of a wheelhouse index fit this interpreter's torch, "
        "Python, platform and GPUs, and the commands that install them.")
    parser.add_argument("--index", default=None, help="the published site: its directory or URL"
                        + (f" (default: {DEFAULT_INDEX})" if DEFAULT_INDEX else ""))
    parser.add_argument("--package", action="append", default=[],
                        help="a component to answer for (repeat for several); default: every one the world serves")
    args = parser.parse_args(argv)
    try:
        found = answer(args.index, args.package)
    except IndexProblem as problem:
        print(f"error: {problem}", file=sys.stderr)
        return problem.exit_code
    print(found.render())
    return found.exit_code


if __name__ == "__main__":
    sys.exit(main())
