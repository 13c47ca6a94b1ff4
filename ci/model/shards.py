"""One build split into N shards, and the shards put back together.

A row whose builder compiles many independent modules (flashinfer's jit-cache: 793 for sm_90 alone)
may not fit one CI job. ``shards: N`` in versions.yaml splits its module list into N shards; each
shard is a build of its own (``nox -s build-<component>-<python> -- --shard 3/16``) that compiles
only its share and leaves it, with a manifest, in ``dist/<world>/shards/<release tag>-<arch>/``;
one more build assembles the wheel from all of them (``invoke assemble-shards``).

Assignment: largest cost first, each module to the shard with the least cost so far (ties: the
lower shard), modules taken in (cost, name) order. The cost is the module's compiles: its CUDA
translation units times the archs it compiles them for, which the module list itself says, so
every shard job computes the same assignment from the same list, on any machine, with nothing
shared between the jobs; and the list stays the same while the sources and the arch list do. A
hash of the module name would keep a module in its shard when others come and go, but cannot
balance the few modules that are a hundred times the others (``fused_moe_90``: 176 translation
units, a decode module 3); measured
times would balance better but differ from run to run and machine to machine, and the jobs of one
run must agree without talking. The time model (ci/timing/shard_model.py) uses measured times to say how
long each shard of this assignment takes.

A shard's manifest (``shard.json``) names its shard, the digest of the module list it was cut
from, the build-input fingerprint, and for each module it compiled the sha256 of its file and its
compile seconds (its format: ``schemas/shard_manifest.schema.json``). :func:`collect` refuses an incomplete or
mixed set in one line naming the shard.
"""

from __future__ import annotations

import heapq
import json
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ci.base import bounded_json, json_schema
from ci.base.digest import sha256_file
from ci.base.errors import UsageError, WheelhouseError

MANIFEST = "shard.json"
SCHEMA = 1
SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "shard_manifest.schema.json"
ASSIGNMENT = "most compiles (CUDA translation units x archs) first, to the least loaded shard"
_SPEC = re.compile(r"^([1-9][0-9]*)/([1-9][0-9]*)$")
_DIR = re.compile(r"^shard-([0-9]+)-of-([0-9]+)$")
BUILDER_DECLARATION = "# wheelhouse-builder: builds-by-shards"
"""The line by which a builder script says that it builds one shard (``WHEELHOUSE_SHARD=I/N``) and assembles the
wheel from every shard (``WHEELHOUSE_ASSEMBLE=1``). A builder without it would run its whole build in each shard
job and leave no shard: ``shards`` above 1 is refused for it when versions.yaml is loaded."""


def builds_by_shards(builder_script: Path) -> bool:
    """Whether the builder script declares :data:`BUILDER_DECLARATION` (a line of its own)."""
    try:
        lines = builder_script.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return False
    return BUILDER_DECLARATION in (line.strip() for line in lines)


@dataclass(frozen=True, order=True)
class ShardSpec:
    """Shard ``index`` of ``count`` (both from 1)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str, *, what: str = "--shard") -> ShardSpec:
        match = _SPEC.match(text.strip())
        if not match or not 1 <= int(match[1]) <= int(match[2]) <= 256:
            raise UsageError(f"{what} {text!r}: write I/N with 1 <= I <= N <= 256, e.g. 3/16")
        return cls(int(match[1]), int(match[2]))

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    @property
    def dir_name(self) -> str:
        width = len(str(self.count))
        return f"shard-{self.index:0{width}d}-of-{self.count}"


def assign(costs: Mapping[str, float], count: int) -> list[list[str]]:
    """The modules of each of ``count`` shards (shard 1 first), each list sorted by name; see the module doc."""
    if count < 1:
        raise ValueError(f"shard count {count} is not at least 1")
    heap = [(0.0, index) for index in range(count)]  # (load, shard): the least loaded, then the lowest, first
    shards: list[list[str]] = [[] for _ in range(count)]
    for name in sorted(costs, key=lambda n: (-costs[n], n)):
        load, lightest = heapq.heappop(heap)
        shards[lightest].append(name)
        heapq.heappush(heap, (load + costs[name], lightest))
    return [sorted(names) for names in shards]


def select(costs: Mapping[str, float], spec: ShardSpec) -> list[str]:
    """The modules shard ``spec`` compiles."""
    return assign(costs, spec.count)[spec.index - 1]


def shard_of(costs: Mapping[str, float], count: int) -> dict[str, int]:
    """Each module's shard index (from 1)."""
    return {name: index for index, names in enumerate(assign(costs, count), 1) for name in names}


@dataclass(frozen=True)
class ModuleResult:
    path: str
    """The module's file, relative to the shard directory."""
    sha256: str
    size: int
    seconds: float | None
    """Its compile steps' seconds from the ninja log (None when the log does not name it)."""


@dataclass(frozen=True)
class ShardManifest:
    spec: ShardSpec
    modules_sha256: str
    """The digest of the module list the shard was cut from (every shard of a set has the same)."""
    modules: Mapping[str, ModuleResult]
    fingerprint: str | None = None
    """The build-input fingerprint of the build that compiled it; written when the shard leaves its build."""
    durations: Mapping[str, float] = field(default_factory=dict)
    """Seconds per phase of the shard's build (toolchain_s, source_s, build_s, total_s), when it left one."""
    cache: Mapping[str, int] | None = None
    """The compiler cache's counts in the shard's build (requests, hits, misses), when it had one."""

    def to_json(self) -> str:
        return json.dumps({
            "schema": SCHEMA,
            "shard": self.spec.index,
            "shards": self.spec.count,
            "assignment": ASSIGNMENT,
            "modules_sha256": self.modules_sha256,
            "fingerprint": self.fingerprint,
            "durations": dict(self.durations),
            "cache": dict(self.cache) if self.cache is not None else None,
            "modules": {name: {"path": m.path, "sha256": m.sha256, "size": m.size, "seconds": m.seconds}
                        for name, m in sorted(self.modules.items())},
        }, indent=2, sort_keys=True) + "\n"

    def write(self, directory: Path) -> Path:
        path = directory / MANIFEST
        partial = path.with_name(path.name + ".partial")
        partial.write_text(self.to_json(), encoding="utf-8")
        partial.replace(path)
        return path

    @classmethod
    def read(cls, directory: Path) -> ShardManifest:
        raw = read_checked(directory / MANIFEST, "shard manifest", _manifest_problem, "build the shard again")
        modules = {name: ModuleResult(m["path"], m["sha256"], m["size"], m["seconds"])
                   for name, m in raw["modules"].items()}
        cache = raw.get("cache")
        return cls(ShardSpec(raw["shard"], raw["shards"]), raw["modules_sha256"], modules, raw.get("fingerprint"),
                   raw.get("durations") or {}, cache if isinstance(cache, dict) else None)


def read_checked(path: Path, what: str, problem: Callable[[Any], str | None], fix: str) -> Any:
    """The JSON document at ``path`` once ``problem`` finds nothing wrong with it; UsageError (one line ending in
    ``fix``) for a file that cannot be read or parsed, or has a problem."""
    try:
        raw = bounded_json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"{path}: not a readable {what} ({exc}); {fix}") from None
    found = problem(raw)
    if found:
        raise UsageError(f"{path}: {found}; {fix}")
    return raw


def _manifest_problem(raw: Any) -> str | None:
    """What is wrong with a parsed manifest, naming the JSON path of the bad value (``schemas/shard_manifest.schema.json``),
    then what a schema cannot say: the shard within its count, each module's file inside the shard."""
    if not isinstance(raw, dict):
        return "holds no JSON object"
    if raw.get("schema") != SCHEMA:
        return f"shard manifest schema {raw.get('schema')!r}, but this checkout reads schema {SCHEMA}"
    problem = json_schema.problem(raw, SCHEMA_FILE)
    if problem:
        return f"shard manifest {problem}"
    if raw["shard"] > raw["shards"]:
        return f"shard {raw['shard']} of {raw['shards']} is out of range"
    for name, module in raw["modules"].items():
        parts = Path(module["path"]).parts
        if Path(module["path"]).is_absolute() or ".." in parts:
            return f"module {name!r} names the path {module['path']!r} outside the shard"
    return None


@dataclass(frozen=True)
class ShardSet:
    """Every shard of one build, complete and from one module list."""

    directory: Path
    shards: tuple[tuple[Path, ShardManifest], ...]

    @property
    def count(self) -> int:
        return self.shards[0][1].spec.count

    @property
    def modules_sha256(self) -> str:
        return self.shards[0][1].modules_sha256

    @property
    def fingerprint(self) -> str | None:
        return self.shards[0][1].fingerprint

    def modules(self) -> dict[str, tuple[Path, ShardManifest, ModuleResult]]:
        return {name: (path / result.path, manifest, result)
                for path, manifest in self.shards for name, result in manifest.modules.items()}


def shard_dirs(directory: Path) -> list[Path]:
    """The ``shard-<i>-of-<n>`` directories of ``directory``, by name."""
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if p.is_dir() and _DIR.match(p.name))


def collect(directory: Path, *, how_to_build: str = "", verify_files: bool = True) -> ShardSet:
    """The complete set of shards in ``directory``; UsageError (one line, naming the shard) when one is
    missing, appears twice, belongs to another split or module list, or a module file is not the one
    its manifest names. ``how_to_build``: the command that builds a shard, with ``{shard}`` for I/N."""
    found = [(path, ShardManifest.read(path)) for path in shard_dirs(directory)]
    if not found:
        raise UsageError(f"{directory}: holds no shard-<i>-of-<n> directory; build the shards first"
                         + (f" ({how_to_build.format(shard='I/N')})" if how_to_build else ""))
    for path, manifest in found:
        if path.name != manifest.spec.dir_name:
            raise UsageError(f"{path}: its manifest says shard {manifest.spec}; the directory of a shard is named "
                             f"{manifest.spec.dir_name}")
    counts = sorted({manifest.spec.count for _, manifest in found})
    if len(counts) > 1:
        raise UsageError(f"{directory}: holds shards of {' and of '.join(map(str, counts))}; keep the shards of "
                         "one split only")
    count = counts[0]
    have = {manifest.spec.index for _, manifest in found}
    missing = [index for index in range(1, count + 1) if index not in have]
    if missing:
        absent = ShardSpec(missing[0], count)
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        fix = f"; build it: {how_to_build.format(shard=absent)}" if how_to_build else "; build it again"
        raise UsageError(f"shard {absent} is missing{more} from {directory}: its job failed or its files were not "
                         f"brought here{fix}")
    first = found[0][1]
    for label, key in (("module list", "modules_sha256"), ("build inputs (fingerprint)", "fingerprint")):
        odd = next((m for _, m in found if getattr(m, key) != getattr(first, key)), None)
        if odd is not None:
            raise UsageError(f"shard {odd.spec} in {directory} was built from other {label} than shard "
                             f"{first.spec}; build every shard of one set again from the same sources")
    seen: dict[str, ShardSpec] = {}
    for path, manifest in found:
        for name, result in manifest.modules.items():
            if name in seen:
                raise UsageError(f"module {name} is in shard {seen[name]} and in shard {manifest.spec} of {directory}; "
                                 "keep the shards of one split only")
            seen[name] = manifest.spec
            if verify_files:
                _verify_file(path, manifest, name, result)
    return ShardSet(directory, tuple(sorted(found, key=lambda item: item[1].spec)))


def _verify_file(path: Path, manifest: ShardManifest, name: str, result: ModuleResult) -> None:
    file = path / result.path
    if not file.is_file():
        raise UsageError(f"shard {manifest.spec}: {file} is missing, which its manifest lists for module {name}; "
                         "bring the shard's files again or build it again")
    if file.stat().st_size != result.size or sha256_file(file) != result.sha256:
        raise UsageError(f"shard {manifest.spec}: {file} is not the file its manifest names (sha256); "
                         "bring the shard's files again or build it again")


def check_covers(shard_set: ShardSet, expected: Iterable[str], costs: Mapping[str, float]) -> None:
    """Refuse, naming the first module and its shard, a set that lacks a module of ``expected`` or holds
    one it does not name."""
    have = shard_set.modules()
    wanted = set(expected)
    missing = sorted(wanted - set(have))
    if missing:
        where = shard_of(costs, shard_set.count).get(missing[0])
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise WheelhouseError(f"module {missing[0]}{more} is in no shard of {shard_set.directory}, though shard "
                              f"{ShardSpec(where or 1, shard_set.count)} should hold it; build that shard again")
    extra = sorted(set(have) - wanted)
    if extra:
        raise WheelhouseError(f"shard {have[extra[0]][1].spec} holds module {extra[0]}, which the module list of "
                              "these sources does not name; build the shards again from the same sources")


def matrix_entries(rows: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The CI matrix of the shard jobs: each entry of ``rows`` (MatrixRow.to_json()) split into more than one
    shard, once per shard, with ``shard`` (``3/16``) and ``shard_index`` (3) added."""
    return [{**row, "shard": str(ShardSpec(index, row["shards"])), "shard_index": index}
            for row in rows if int(row.get("shards", 1)) > 1 for index in range(1, int(row["shards"]) + 1)]


__all__ = ["ASSIGNMENT", "MANIFEST", "ModuleResult", "ShardManifest", "ShardSet", "ShardSpec", "assign",
           "check_covers", "collect", "matrix_entries", "select", "shard_dirs", "shard_of"]
