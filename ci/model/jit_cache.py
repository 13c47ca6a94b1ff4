"""flashinfer-jit-cache built here: its module lists, one shard of them, and the wheels assembled from every shard.

The wheels are upstream's current layout (flashinfer PR 4514): one provider wheel per arch target of the row's
list, ``flashinfer-jit-cache-sm90a`` (package ``flashinfer_jit_cache.providers.sm90a``, registered in the
``flashinfer.jit_cache.providers`` entry-point group with a ``manifest.json`` of its modules), each the AOT
inventory compiled for that one target, and the ``flashinfer-jit-cache`` shim, whose ``get_jit_cache_dir()``
serves the installed provider that fits the machine's GPUs (exact target, else family, else baseline;
build_scripts/lib/flashinfer_jit_cache_shim.py). One wheel of every arch grew past GitHub's 2 GiB asset limit
upstream; one per arch is a quarter of it (ci/timing/size_model.py).

build_scripts/flashinfer.sh gets a module list per target from flashinfer's own ahead-of-time entry point
(build_scripts/lib/flashinfer_aot.py ``list`` with FLASHINFER_CUDA_ARCH_LIST set to that target), then runs
these steps under the wheelhouse's interpreter:

    python -m ci jit-cache merge --lists sm90a.json sm100a.json --out modules.json
    python -m ci jit-cache select --modules modules.json --shard 3/16 --out keys.txt --shards-dir DIR
    python -m ci jit-cache finish-shard --modules modules.json --shard 3/16 --dir SHARD --ninja-log sm90a=LOG
    python -m ci jit-cache pack --modules modules.json --shards DIR --version V --git-version G --arch x86_64 \
        --dist DIST --wheel-packages "flashinfer-jit-cache flashinfer-jit-cache-sm90a ..."

``merge`` tags each list's modules with their provider; a module is ``<provider>/<name>`` from then on (every
provider has its own ``norm``). ``select`` names the modules of one shard (ci/model/shards.py assigns them);
``finish-shard`` checks what the compile left in ``SHARD/jit_cache/<provider>/<module>/<module>.so`` (every
module of the shard, each with a cubin of every arch its ninja file names), and writes the shard's manifest
with each module's sha256 and compile seconds (from each provider's ninja log); ``pack`` takes the shards
(complete, from this module list, each file the one its manifest names) and writes the shim and the providers,
each provider's dist-info holding :data:`WHEEL_MANIFEST`, the modules it was built to hold, which the wheel
checks (ci/checks/contents.py) compare with its members. ``--patterns`` (``WHEELHOUSE_JIT_CACHE_MODULES``,
shell-style globs of module names) narrows the list to a subset: a machine with minutes to spare builds a few
real modules through the same path; the manifests record the patterns.
"""

from __future__ import annotations

import fnmatch
import hashlib
import json
import shutil
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from ci.base import log
from ci.base.digest import sha256_file
from ci.base.errors import ConfigError, UsageError, WheelhouseError
from ci.formats import ninja_log
from ci.formats.archs import CudaArch, format_archs, missing_archs, parse_arch, parse_arch_list
from ci.formats.elf import ElfFile
from ci.formats.fatbin import scan_elf
from ci.formats.record import file_record_hash, record_hash
from ci.model import shards

_LOG = log.get("jit-cache")

MODULE_LIST = "modules.json"
WHEEL_MANIFEST = "wheelhouse-jit-cache.json"
"""The member of a wheel's dist-info naming what it was built to hold: a provider's modules, the shim's providers."""
PACKAGE = "flashinfer_jit_cache"
PROJECT = "flashinfer-jit-cache"
JIT_CACHE_DIR = f"{PACKAGE}/jit_cache"
PROVIDERS_PACKAGE = f"{PACKAGE}/providers"
ENTRY_POINT_GROUP = "flashinfer.jit_cache.providers"
"""Upstream's entry-point group: the shim (and a flashinfer that knows providers) finds them through it."""
PROVIDER_SCHEMA = 1
"""Upstream's provider manifest schema (``schema_version``)."""
WHEEL_TAG = "cp39-abi3-linux_{arch}"
"""Upstream's tag, but for the platform: its modules are no Python extensions (any CPython 3.9+ loads them
through tvm-ffi), and nothing here repairs them to a manylinux policy."""
SCHEMA = 2
"""The merged module list (``merge``); flashinfer_aot.py writes each target's list as schema 1."""
TARGET_SCHEMA = 1
RUNTIME = Path(__file__).resolve().parents[2] / "build_scripts" / "lib"
SHIM_SOURCE = RUNTIME / "flashinfer_jit_cache_shim.py"
PROVIDER_SOURCE = RUNTIME / "flashinfer_jit_cache_provider.py"
CUDA_COMPAT = Path(__file__).resolve().parents[1] / "formats" / "cuda_compat.json"


@dataclass(frozen=True)
class Module:
    name: str
    sources: int
    cuda_sources: int
    archs: tuple[str, ...]
    """The ``code=`` archs of the module's -gencode flags (``sm_90a``); empty for a module without CUDA sources."""
    family: str = ""
    """Modules made from the same sources share it (the time model extrapolates within a family)."""
    provider: str = ""
    """The provider wheel it goes into (``sm90a``): the one arch target its list was made for."""

    @property
    def cost(self) -> int:
        """What shard assignment balances: :func:`compile_units`."""
        return compile_units(self.cuda_sources, self.archs)

    @property
    def key(self) -> str:
        """``sm90a/norm``: unique across providers, each of which has its own ``norm``."""
        return f"{self.provider}/{self.name}"

    @property
    def member(self) -> str:
        """Where a shard holds it, and where its provider package does below ``jit_cache/``."""
        return f"jit_cache/{self.key}/{self.name}.so"


@dataclass(frozen=True)
class ModuleList:
    path: Path
    document: dict[str, Any]
    modules: tuple[Module, ...]

    @property
    def cuda_arch_list(self) -> str:
        return str(self.document["cuda_arch_list"])

    @property
    def providers(self) -> dict[str, str]:
        """Provider tag -> the arch target it was compiled for (``sm90a`` -> ``9.0a``), in the arch list's order."""
        by_target = {str(entry["target"]): tag for tag, entry in self.document["providers"].items()}
        return {by_target[target]: target for target in self.cuda_arch_list.split() if target in by_target}

    @classmethod
    def read(cls, path: Path) -> ModuleList:
        document = shards.read_checked(path, "module list", _list_problem,
                                       "run build_scripts/flashinfer.sh again (its lists, then ci.model.jit_cache merge)")
        modules = tuple(Module(m["name"], m["sources"], m["cuda_sources"], tuple(m["archs"]), str(m.get("family", "")),
                               str(m["provider"])) for m in document["modules"])
        return cls(path, document, modules)

    def selected(self, patterns: Sequence[str] = ()) -> list[Module]:
        """The modules ``patterns`` (globs of module names) select, in list order; all without patterns."""
        if not patterns:
            return list(self.modules)
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(m.name, pattern) for m in self.modules):
                raise UsageError(f"WHEELHOUSE_JIT_CACHE_MODULES: {pattern!r} matches no module of the "
                                 f"{len(self.modules)} flashinfer's AOT list names for {self.cuda_arch_list}; "
                                 "write a glob of module names, e.g. 'single_decode_with_kv_cache_*'")
        return [m for m in self.modules if any(fnmatch.fnmatchcase(m.name, p) for p in patterns)]

    def costs(self, patterns: Sequence[str] = ()) -> dict[str, int]:
        return {m.key: m.cost for m in self.selected(patterns)}

    def digest(self, patterns: Sequence[str] = ()) -> str:
        """One digest of the list and the selection: shards of one set must share it."""
        canonical = json.dumps({"list": self.document, "selection": list(patterns)}, sort_keys=True,
                               separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def _list_problem(document: Any, schema: int = SCHEMA) -> str | None:
    if not isinstance(document, dict) or document.get("schema") != schema:
        return f"not a module list of schema {schema}"
    for key in ("cuda_arch_list", "flashinfer_version", "package", "modules", *(("providers",) if schema == SCHEMA else ())):
        if key not in document:
            return f"has no {key!r}"
    keys = set()
    for index, module in enumerate(document["modules"]):
        if not isinstance(module, dict) or not isinstance(module.get("name"), str) or "/" in module["name"] \
                or module["name"] in ("", ".", "..") or not isinstance(module.get("cuda_sources"), int) \
                or not isinstance(module.get("sources"), int) or not isinstance(module.get("archs"), list):
            return f"modules[{index}] lacks a name, source counts or archs"
        provider = module.get("provider", "")
        if schema == SCHEMA and provider not in document["providers"]:
            return f"modules[{index}] names no provider of the list"
        key = f"{provider}/{module['name']}"
        if key in keys:
            return f"names module {key!r} twice"
        keys.add(key)
    return None


def _target_list_problem(document: Any) -> str | None:
    problem = _list_problem(document, TARGET_SCHEMA)
    if problem is None and len(parse_arch_list(str(document["cuda_arch_list"])).archs) != 1:
        return f"is the list of {document['cuda_arch_list']!r}, not of one arch target"
    return problem


def merge(lists: Sequence[Path], out: Path) -> dict[str, Any]:
    """One module list of several targets' lists (flashinfer_aot.py ``list``, one target each), every module
    tagged with the provider of its target; written to ``out``."""
    merged: dict[str, Any] | None = None
    for path in lists:
        document = shards.read_checked(path, "module list", _target_list_problem,
                                       "run build_scripts/lib/flashinfer_aot.py list again for one target")
        (target,) = parse_arch_list(str(document["cuda_arch_list"])).archs
        tag = provider_tag(target)
        if merged is None:
            merged = {**{k: v for k, v in document.items() if k not in ("modules", "sm_capabilities")},
                      "schema": SCHEMA, "cuda_arch_list": "", "providers": {}, "modules": []}
        elif document["flashinfer_version"] != merged["flashinfer_version"]:
            raise UsageError(f"{path}: a list of flashinfer {document['flashinfer_version']}, the others "
                             f"{merged['flashinfer_version']}; make every list from the same sources")
        if tag in merged["providers"]:
            raise UsageError(f"{path}: a second list for {target}; give one list per arch target")
        merged["providers"][tag] = {"target": str(target), "sm_capabilities": document.get("sm_capabilities", {})}
        merged["modules"] += [{**module, "provider": tag} for module in document["modules"]]
    if merged is None:
        raise UsageError("merge: no module list given")
    merged["cuda_arch_list"] = " ".join(entry["target"] for entry in merged["providers"].values())
    out.write_text(json.dumps(merged, indent=1, sort_keys=True) + "\n")
    return merged


def compile_units(cuda_sources: int, archs: Sequence[str]) -> int:
    """A module's compiles: each CUDA translation unit once per arch it is compiled for (at least one: the link,
    a host source). Known from the module list alone, so every shard job computes the same."""
    return max(1, cuda_sources) * max(1, sum(1 for code in archs if not code.startswith("compute_")))


def provider_tag(target: CudaArch) -> str:
    """Upstream's name of the provider wheel of one arch target: ``sm90a`` for 9.0a, ``sm120f`` for 12.0f."""
    return f"sm{target.major}{target.minor}{target.suffix}"


def provider_project(tag: str) -> str:
    """``flashinfer-jit-cache-sm90a``: a provider's distribution, as upstream names it."""
    return f"{PROJECT}-{tag}"


def provider_compiles(modules: Sequence[Mapping[str, Any]], cuda_arch_list: str) -> dict[str, int]:
    """Compiles per provider of a module list (a record's ``modules`` or a module list's): each module's CUDA
    sources once per arch it compiles for, given to the list's target of that arch (a module's own ``sm_120a``
    goes to the 12.0f provider), or to a provider of its own where the list names none."""
    targets = {t.base: t for t in parse_arch_list(cuda_arch_list).archs} if cuda_arch_list.strip() else {}
    counts: dict[str, int] = {}
    for module in modules:
        for code in module.get("archs") or ():
            if code.startswith("compute_"):
                continue
            arch = parse_arch(code)
            tag = provider_tag(targets.get(arch.base, arch))
            counts[tag] = counts.get(tag, 0) + max(1, int(module.get("cuda_sources") or 0))
    return counts


def parse_patterns(text: str | None) -> tuple[str, ...]:
    return tuple((text or "").split())


# --- one shard ------------------------------------------------------------------------------------


def select_shard(modules: ModuleList, spec: shards.ShardSpec, patterns: Sequence[str]) -> list[str]:
    return shards.select(modules.costs(patterns), spec)


def finish_shard(modules: ModuleList, spec: shards.ShardSpec, patterns: Sequence[str], directory: Path,
                 logs: Mapping[str, Path] | None = None) -> shards.ShardManifest:
    """Check what the compile left in ``directory`` and write the shard's manifest (see the module doc);
    ``logs``: each provider's ninja log."""
    by_key = {m.key: m for m in modules.modules}
    wanted = select_shard(modules, spec, patterns)
    root = directory / "jit_cache"
    present = sorted(f"{p.parent.name}/{p.name}" for p in root.glob("*/*") if p.is_dir()) if root.is_dir() else []
    missing = [key for key in wanted if not (directory / by_key[key].member).is_file()]
    if missing:
        raise WheelhouseError(f"shard {spec}: module {missing[0]} was not compiled ({len(missing)} of {len(wanted)} "
                              f"missing from {root}); see the compile's log above")
    extra = sorted(set(present) - set(wanted))
    if extra:
        raise WheelhouseError(f"shard {spec}: {root / extra[0]} is no module of this shard; "
                              "compile the shard in an empty directory")
    seconds = {f"{tag}/{name}": value for tag, log in (logs or {}).items() if log.is_file()
               for name, value in ninja_log.seconds_by_directory(log).items()}
    results = {}
    for key in wanted:
        module = by_key[key]
        file = directory / module.member
        problem = arch_problem(key, module.archs, _cubins(file) if module.archs else ())
        if problem:
            raise WheelhouseError(f"shard {spec}: {problem}")
        results[key] = shards.ModuleResult(module.member, sha256_file(file), file.stat().st_size, seconds.get(key))
    shutil.copyfile(modules.path, directory / MODULE_LIST)
    manifest = shards.ShardManifest(spec, modules.digest(patterns), results)
    manifest.write(directory)
    timed = [s for s in (r.seconds for r in results.values()) if s is not None]
    _LOG.info(f"shard {spec}: {len(results)} modules, {sum(by_key[k].cost for k in wanted)} "
              f"compiles (CUDA sources x archs), {sum(timed):.0f} s of compile steps")
    return manifest


def arch_problem(name: str, archs: Sequence[str], found: Sequence[CudaArch]) -> str | None:
    """Why module ``name``, compiled for ``archs`` (``sm_90a``), lacks a cubin of one of them among the
    cubins ``found`` in its shared object; None when it has all."""
    try:
        wanted = [parse_arch(code) for code in archs if not code.startswith("compute_")]  # compute_: PTX, not asked
    except ConfigError as error:
        return f"module {name}: its archs {list(archs)} are not what nvcc's code= names ({error})"
    lacking = missing_archs(wanted, found)
    if lacking:
        return (f"module {name} has cubins for {format_archs(found)} but not for {format_archs(lacking)}, "
                "which its ninja file compiles for")
    return None


def _cubins(file: Path) -> tuple[CudaArch, ...]:
    with open(file, "rb") as stream:
        scanned = scan_elf(file.name, ElfFile(stream, str(file)))
    return scanned.cubins if scanned is not None else ()


# --- the wheel ------------------------------------------------------------------------------------


def pack(modules: ModuleList, patterns: Sequence[str], shards_dir: Path, *, version: str, git_version: str,
         arch: str, dist: Path, how_to_build: str = "", wheel_packages: Sequence[str] | None = None) -> list[Path]:
    """The shim and one provider wheel per arch target from every shard in ``shards_dir``, written to ``dist`` (each
    atomically); see the module doc. ``wheel_packages``: the component's, which must name exactly these providers."""
    shard_set = shards.collect(shards_dir, how_to_build=how_to_build)
    if shard_set.modules_sha256 != modules.digest(patterns):
        raise WheelhouseError(f"the shards in {shards_dir} were cut from another module list than these sources "
                              f"give ({modules.path}); build the shards again from the same sources")
    expected = modules.selected(patterns)
    shards.check_covers(shard_set, [m.key for m in expected], modules.costs(patterns))
    _check_published(modules, wheel_packages)
    files = {key: found[0] for key, found in shard_set.modules().items()}
    meta = (f'"""Build metadata for flashinfer-jit-cache package."""\n'
            f'__version__ = "{version}"\n__git_version__ = "{git_version}"\n').encode()
    wheels = []
    for tag, target in modules.providers.items():
        held = sorted((m for m in expected if m.provider == tag), key=lambda m: m.name)
        if not held:
            raise WheelhouseError(f"WHEELHOUSE_JIT_CACHE_MODULES: {' '.join(patterns)} select no module of the {target} "
                                  f"list, so provider {provider_project(tag)} would be empty; widen the patterns")
        wheels.append(_pack_provider(modules, tag, held, files, meta, version=version, arch=arch, dist=dist,
                                     shards=shard_set.count, patterns=patterns))
    wheels.insert(0, _pack_shim(modules, expected, meta, version=version, arch=arch, dist=dist, shards=shard_set.count,
                                patterns=patterns))
    return wheels


def _check_published(modules: ModuleList, wheel_packages: Sequence[str] | None) -> None:
    """The component publishes exactly the providers its arch list makes: a wheel it does not list would be refused
    after hours of compiling, one it lists but nobody builds would leave every release incomplete."""
    if wheel_packages is None:
        return
    listed = sorted(p for p in map(canonicalize_name, wheel_packages) if p.startswith(PROJECT + "-"))
    built = sorted(provider_project(tag) for tag in modules.providers)
    if listed != built:
        raise WheelhouseError(f"the arch list {modules.cuda_arch_list} makes the provider wheels {', '.join(built)}, "
                              f"but wheel_packages lists {', '.join(listed) or 'none'}: list exactly those (with "
                              "flashinfer-jit-cache, the shim) in the component's wheel_packages, per CPU arch in "
                              "arch_overrides")


def _pack_provider(modules: ModuleList, tag: str, held: list[Module], files: Mapping[str, Path], meta: bytes, *,
                   version: str, arch: str, dist: Path, shards: int, patterns: Sequence[str]) -> Path:
    project = provider_project(tag)
    package = f"{PROVIDERS_PACKAGE}/{tag}"
    dist_info = f"{PACKAGE}_{tag}-{version}.dist-info"
    runtime_manifest = {"schema_version": PROVIDER_SCHEMA, "provider_id": tag, "distribution": project,
                        "version": version, "cuda_architectures": [tag], "modules": [m.name for m in held]}
    checked = {"schema": SCHEMA, "provider": tag, "target": modules.providers[tag],
               "flashinfer_version": modules.document["flashinfer_version"], "cuda_arch_list": modules.providers[tag],
               "listed": sum(1 for m in modules.modules if m.provider == tag), "selection": list(patterns),
               "shards": shards,
               "modules": {m.name: {"archs": list(m.archs), "sha256": sha256_file(files[m.key])} for m in held}}
    described = {**modules.document["package"], "name": project,
                 "summary": f"{modules.document['package'].get('summary') or 'flashinfer-jit-cache'}: the "
                            f"{modules.providers[tag]} provider"}
    members: list[tuple[str, Path | bytes]] = [
        (f"{package}/__init__.py", PROVIDER_SOURCE),
        (f"{package}/_build_meta.py", meta),
        (f"{package}/manifest.json", (json.dumps(runtime_manifest, indent=1, sort_keys=True) + "\n").encode()),
    ]
    members += [(f"{package}/jit_cache/{m.name}/{m.name}.so", files[m.key]) for m in held]
    members += [
        (f"{dist_info}/METADATA", _metadata(described, version)),
        (f"{dist_info}/WHEEL", _wheel_file(arch)),
        (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode()),
        (f"{dist_info}/entry_points.txt",
         f"[{ENTRY_POINT_GROUP}]\n{tag} = {package.replace('/', '.')}:get_provider\n".encode()),
        (f"{dist_info}/{WHEEL_MANIFEST}", (json.dumps(checked, indent=1, sort_keys=True) + "\n").encode()),
    ]
    return _written(dist / f"{PACKAGE}_{tag}-{version}-{WHEEL_TAG.format(arch=arch)}.whl", members, dist_info,
                    f"{len(held)} modules for {modules.providers[tag]}")


def _pack_shim(modules: ModuleList, expected: list[Module], meta: bytes, *, version: str, arch: str, dist: Path,
               shards: int, patterns: Sequence[str]) -> Path:
    dist_info = f"{PACKAGE}-{version}.dist-info"
    manifest = {"schema": SCHEMA, "generator": modules.document.get("generator", ""),
                "flashinfer_version": modules.document["flashinfer_version"], "cuda_arch_list": modules.cuda_arch_list,
                "listed": len(modules.modules), "selection": list(patterns), "shards": shards,
                "providers": {tag: {"project": provider_project(tag), "target": target,
                                    "modules": sum(1 for m in expected if m.provider == tag)}
                              for tag, target in modules.providers.items()}}
    members: list[tuple[str, Path | bytes]] = [
        (f"{PACKAGE}/__init__.py", SHIM_SOURCE),
        (f"{PACKAGE}/_build_meta.py", meta),
        (f"{PACKAGE}/_cuda_compat.json", CUDA_COMPAT),
        (f"{dist_info}/METADATA", _metadata(modules.document["package"], version)),
        (f"{dist_info}/WHEEL", _wheel_file(arch)),
        (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode()),
        (f"{dist_info}/{WHEEL_MANIFEST}", (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()),
    ]
    return _written(dist / f"{PACKAGE}-{version}-{WHEEL_TAG.format(arch=arch)}.whl", members, dist_info,
                    f"the shim of {len(modules.providers)} provider(s)")


def _written(target: Path, members: list[tuple[str, Path | bytes]], dist_info: str, what: str) -> Path:
    _write_wheel(target, members, f"{dist_info}/RECORD")
    _LOG.info(f"{target.name}: {what}, {target.stat().st_size / 2**20:.1f} MiB")
    return target


def _metadata(package: dict[str, Any], version: str) -> bytes:
    lines = ["Metadata-Version: 2.1", f"Name: {package['name']}", f"Version: {version}"]
    if package.get("summary"):
        lines.append(f"Summary: {package['summary']}")
    lines += [f"Author: {author}" for author in package.get("authors", []) if author]
    if package.get("license"):
        lines.append(f"License: {package['license']}")
    lines += [f"Project-URL: {label}, {url}" for label, url in package.get("urls", {}).items()]
    lines += [f"Classifier: {classifier}" for classifier in package.get("classifiers", [])]
    if package.get("requires_python"):
        lines.append(f"Requires-Python: {package['requires_python']}")
    text = "\n".join(lines) + "\n"
    if package.get("description"):
        text += "Description-Content-Type: text/plain\n\n" + package["description"] + "\n"
    return text.encode()


def _wheel_file(arch: str) -> bytes:
    return (f"Wheel-Version: 1.0\nGenerator: wheelhouse (ci/model/jit_cache.py)\nRoot-Is-Purelib: false\n"
            f"Tag: {WHEEL_TAG.format(arch=arch)}\n").encode()


def _write_wheel(target: Path, members: list[tuple[str, Path | bytes]], record_name: str) -> None:
    """A wheel of ``members`` and its RECORD, written beside ``target`` and renamed over it when whole."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    record = []
    with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in members:
            info = zipfile.ZipInfo(member, date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (0o100755 if member.endswith(".so") else 0o100644) << 16
            if isinstance(data, Path):
                digest, size = file_record_hash(data)
                with open(data, "rb") as source, zf.open(info, "w", force_zip64=True) as out:
                    shutil.copyfileobj(source, out, 1 << 20)
            else:
                digest, size = record_hash(data), len(data)
                zf.writestr(info, data)
            record.append(f"{member},{digest},{size}")
        record.append(f"{record_name},,")
        zf.writestr(zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0)), "\n".join(record) + "\n")
    partial.replace(target)


CACHED_SHARE = 0.1
"""A shard whose compiler cache served more than this share of its compiles (an earlier build's objects, not
only its own repeats) measured no compile times."""


def record_modules(shards_dir: Path, *, cache: dict[str, int] | None = None) -> dict[str, Any] | None:
    """The build record's ``modules``: every module of the list the shards in ``shards_dir`` were cut from,
    with its CUDA sources, family, shard and compile seconds (None where no shard there compiled it: a
    subset, or a shard not here), and whether the compiler cache served more than :data:`CACHED_SHARE` of its
    shard's compiles (``cached``: its seconds are then not compile times); None without shards. ``cache``:
    the counts for shards whose manifest has none. What the time model (ci/timing/shard_model.py) reads."""
    found = [(path, shards.ShardManifest.read(path)) for path in shards.shard_dirs(shards_dir)]
    if not found or not (found[0][0] / MODULE_LIST).is_file():
        return None
    listing = ModuleList.read(found[0][0] / MODULE_LIST)
    compiled = {name: (manifest.spec.index, result.seconds) for _, manifest in found
                for name, result in manifest.modules.items()}
    cached = {name for _, manifest in found if _mostly_cached(manifest.cache if manifest.cache is not None else cache)
              for name in manifest.modules}
    return {
        "cuda_arch_list": listing.cuda_arch_list,
        "flashinfer_version": listing.document["flashinfer_version"],
        "shards": found[0][1].spec.count,
        "shards_present": sorted(manifest.spec.index for _, manifest in found),
        "durations": {str(manifest.spec): dict(manifest.durations) for _, manifest in found if manifest.durations},
        "modules": [{"name": m.key, "provider": m.provider, "cuda_sources": m.cuda_sources, "archs": list(m.archs),
                     "family": m.family, "shard": compiled.get(m.key, (None, None))[0],
                     "seconds": compiled.get(m.key, (None, None))[1], "cached": m.key in cached}
                    for m in listing.modules],
    }


def _mostly_cached(counts: dict[str, int] | Any) -> bool:
    if not counts:
        return False
    hits, misses = int(counts.get("hits", 0)), int(counts.get("misses", 0))
    return hits > CACHED_SHARE * (hits + misses)


# --- the builder's commands -------------------------------------------------------------------------


def add_command(commands: Any) -> None:
    """``python -m ci jit-cache <merge|select|finish-shard|pack>``: the flashinfer builder's steps."""
    parser = commands.add_parser("jit-cache", help="flashinfer-jit-cache's module lists, shards and wheels",
                                 description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="step", required=True)
    merging = sub.add_parser("merge")
    merging.add_argument("--lists", type=Path, nargs="+", required=True, help="one flashinfer_aot.py list per target")
    merging.add_argument("--out", type=Path, required=True)
    for name in ("select", "finish-shard", "pack"):
        command = sub.add_parser(name)
        command.add_argument("--modules", type=Path, required=True, help="modules.json of jit-cache merge")
        command.add_argument("--patterns", default="", help="globs of module names (WHEELHOUSE_JIT_CACHE_MODULES)")
        if name in ("select", "finish-shard"):
            command.add_argument("--shard", required=True, help="I/N")
    sub.choices["select"].add_argument("--out", type=Path, required=True, help="the shard's modules, provider/name")
    sub.choices["select"].add_argument("--shards-dir", type=Path, required=True,
                                       help="where the shard's (empty) directory is made; printed on stdout")
    sub.choices["finish-shard"].add_argument("--dir", type=Path, required=True)
    sub.choices["finish-shard"].add_argument("--ninja-log", action="append", default=[],
                                             help="PROVIDER=LOG: a provider's ninja log (repeat it)")
    for flag in ("--shards", "--dist"):
        sub.choices["pack"].add_argument(flag, type=Path, required=True)
    for flag in ("--version", "--git-version", "--arch"):
        sub.choices["pack"].add_argument(flag, required=True)
    sub.choices["pack"].add_argument("--how-to-build", default="", help="the command that builds shard {shard}")
    sub.choices["pack"].add_argument("--wheel-packages", help="the component's wheel_packages (WHEEL_PACKAGES)")
    parser.set_defaults(run=_step)


def _step(args: Any) -> None:
    if args.step == "merge":
        merged = merge(args.lists, args.out)
        _LOG.info(f"{args.out}: {len(merged['modules'])} modules of {len(merged['providers'])} provider(s) "
                  f"({merged['cuda_arch_list']})")
        return
    modules = ModuleList.read(args.modules)
    patterns = parse_patterns(args.patterns)
    if args.step == "select":
        _select(modules, shards.ShardSpec.parse(args.shard), patterns, args.out, args.shards_dir)
    elif args.step == "finish-shard":
        logs = dict(_provider_log(text) for text in args.ninja_log)
        finish_shard(modules, shards.ShardSpec.parse(args.shard), patterns, args.dir, logs)
    else:
        published = args.wheel_packages.split() if args.wheel_packages is not None else None
        pack(modules, patterns, args.shards, version=args.version, git_version=args.git_version, arch=args.arch,
             dist=args.dist, how_to_build=args.how_to_build, wheel_packages=published)


def _select(modules: ModuleList, spec: shards.ShardSpec, patterns: Sequence[str], out: Path, shards_dir: Path) -> None:
    keys = select_shard(modules, spec, patterns)
    out.write_text("".join(f"{key}\n" for key in keys))
    directory = shards_dir / spec.dir_name  # empty: a shard never keeps an earlier attempt's modules
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    _LOG.info(f"shard {spec}: {len(keys)} of {len(modules.selected(patterns))} modules")
    log.out(str(directory))


def _provider_log(text: str) -> tuple[str, Path]:
    tag, sep, path = text.partition("=")
    if not sep or not tag or not path:
        raise UsageError(f"--ninja-log {text!r}: write PROVIDER=LOG, e.g. sm90a=build/aot/sm90a/cached_ops/.ninja_log")
    return tag, Path(path)
