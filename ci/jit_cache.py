"""flashinfer-jit-cache built here: its module list, one shard of it, and the wheel assembled from every shard.

build_scripts/flashinfer.sh gets the module list from flashinfer's own ahead-of-time entry point
(build_scripts/lib/flashinfer_aot.py ``list``: ``modules.json``, every module ``gen_all_modules``
names for the row's archs, with its CUDA sources and the archs its ninja file compiles for) and
then runs these steps under the wheelhouse's interpreter:

    python -m ci.jit_cache select --modules modules.json --shard 3/16 --out names.txt
    python -m ci.jit_cache finish-shard --modules modules.json --shard 3/16 --dir SHARD --ninja-log LOG
    python -m ci.jit_cache pack --modules modules.json --shards DIR --package-dir DIR --version V \\
        --git-version G --arch x86_64 --dist DIST

``select`` names the modules of one shard (ci/shards.py assigns them); ``finish-shard`` checks what
the compile left in ``SHARD/jit_cache/<module>/<module>.so`` (every module of the shard, each with a
cubin for every arch its ninja file names), and writes the shard's manifest with each module's
sha256 and compile seconds (from the ninja log); ``pack`` takes the shards (complete, from this
module list, each file the one its manifest names) and writes the wheel upstream's layout has:
``flashinfer_jit_cache/__init__.py`` (upstream's, from the sources), ``_build_meta.py`` (as
upstream's backend writes it), ``flashinfer_jit_cache/jit_cache/<module>/<module>.so``, and in its
dist-info :data:`WHEEL_MANIFEST`: the module list it was built to hold, which the wheel checks
(ci/wheels/contents.py) compare with its members. ``--patterns`` (``WHEELHOUSE_JIT_CACHE_MODULES``,
shell-style globs of module names) narrows the list to a subset: a machine with minutes to spare
builds a few real modules through the same path; the manifest records the patterns.
"""

from __future__ import annotations

import argparse
import fnmatch
import hashlib
import json
import shutil
import sys
import zipfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci import ninja_log, shards
from ci.digest import sha256_file
from ci.errors import ConfigError, UsageError, WheelhouseError
from ci.wheels.archs import CudaArch, format_archs, missing_archs, parse_arch, parse_arch_list
from ci.wheels.elf import ElfFile
from ci.wheels.fatbin import scan_elf
from ci.wheels.record import file_record_hash, record_hash

MODULE_LIST = "modules.json"
WHEEL_MANIFEST = "wheelhouse-jit-cache.json"
"""The member of the wheel's dist-info naming the modules it was built to hold."""
PACKAGE = "flashinfer_jit_cache"
PROJECT = "flashinfer-jit-cache"
JIT_CACHE_DIR = f"{PACKAGE}/jit_cache"
WHEEL_TAG = "cp39-abi3-linux_{arch}"
"""Upstream's tag, but for the platform: its modules are no Python extensions (any CPython 3.9+ loads them
through tvm-ffi), and nothing here repairs them to a manylinux policy."""
SCHEMA = 1


@dataclass(frozen=True)
class Module:
    name: str
    sources: int
    cuda_sources: int
    archs: tuple[str, ...]
    """The ``code=`` archs of the module's -gencode flags (``sm_90a``); empty for a module without CUDA sources."""
    family: str = ""
    """Modules made from the same sources share it (the time model extrapolates within a family)."""

    @property
    def cost(self) -> int:
        """What shard assignment balances: :func:`compile_units`."""
        return compile_units(self.cuda_sources, self.archs)

    @property
    def member(self) -> str:
        return f"jit_cache/{self.name}/{self.name}.so"


@dataclass(frozen=True)
class ModuleList:
    path: Path
    document: dict[str, Any]
    modules: tuple[Module, ...]

    @property
    def cuda_arch_list(self) -> str:
        return str(self.document["cuda_arch_list"])

    @classmethod
    def read(cls, path: Path) -> ModuleList:
        document = shards.read_checked(path, "module list", _list_problem,
                                       "run build_scripts/lib/flashinfer_aot.py list again")
        modules = tuple(Module(m["name"], m["sources"], m["cuda_sources"], tuple(m["archs"]), str(m.get("family", "")))
                        for m in document["modules"])
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
        return {m.name: m.cost for m in self.selected(patterns)}

    def digest(self, patterns: Sequence[str] = ()) -> str:
        """One digest of the list and the selection: shards of one set must share it."""
        canonical = json.dumps({"list": self.document, "selection": list(patterns)}, sort_keys=True,
                               separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


def _list_problem(document: Any) -> str | None:
    if not isinstance(document, dict) or document.get("schema") != SCHEMA:
        return f"not a module list of schema {SCHEMA}"
    for key in ("cuda_arch_list", "flashinfer_version", "package", "modules"):
        if key not in document:
            return f"has no {key!r}"
    names = set()
    for index, module in enumerate(document["modules"]):
        if not isinstance(module, dict) or not isinstance(module.get("name"), str) or "/" in module["name"] \
                or module["name"] in ("", ".", "..") or not isinstance(module.get("cuda_sources"), int) \
                or not isinstance(module.get("sources"), int) or not isinstance(module.get("archs"), list):
            return f"modules[{index}] lacks a name, source counts or archs"
        if module["name"] in names:
            return f"names module {module['name']!r} twice"
        names.add(module["name"])
    return None


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
                 log: Path | None) -> shards.ShardManifest:
    """Check what the compile left in ``directory`` and write the shard's manifest (see the module doc)."""
    by_name = {m.name: m for m in modules.modules}
    wanted = select_shard(modules, spec, patterns)
    present = sorted(p.name for p in (directory / "jit_cache").iterdir()) if (directory / "jit_cache").is_dir() else []
    missing = [name for name in wanted if not (directory / by_name[name].member).is_file()]
    if missing:
        raise WheelhouseError(f"shard {spec}: module {missing[0]} was not compiled ({len(missing)} of {len(wanted)} "
                              f"missing from {directory / 'jit_cache'}); see the compile's log above")
    extra = sorted(set(present) - set(wanted))
    if extra:
        raise WheelhouseError(f"shard {spec}: {directory / 'jit_cache' / extra[0]} is no module of this shard; "
                              "compile the shard in an empty directory")
    seconds = ninja_log.seconds_by_directory(log) if log is not None and log.is_file() else {}
    results = {}
    for name in wanted:
        module = by_name[name]
        file = directory / module.member
        problem = arch_problem(name, module.archs, _cubins(file) if module.archs else ())
        if problem:
            raise WheelhouseError(f"shard {spec}: {problem}")
        results[name] = shards.ModuleResult(module.member, sha256_file(file), file.stat().st_size, seconds.get(name))
    shutil.copyfile(modules.path, directory / MODULE_LIST)
    manifest = shards.ShardManifest(spec, modules.digest(patterns), results)
    manifest.write(directory)
    timed = [s for s in (r.seconds for r in results.values()) if s is not None]
    print(f"[wheelhouse] shard {spec}: {len(results)} modules, {sum(m.cost for m in map(by_name.get, wanted) if m)} "
          f"compiles (CUDA sources x archs), {sum(timed):.0f} s of compile steps", file=sys.stderr)
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


def pack(modules: ModuleList, patterns: Sequence[str], shards_dir: Path, *, package_dir: Path, version: str,
         git_version: str, arch: str, dist: Path, how_to_build: str = "") -> Path:
    """The wheel of every shard in ``shards_dir``, written to ``dist`` (atomically); see the module doc."""
    shard_set = shards.collect(shards_dir, how_to_build=how_to_build)
    if shard_set.modules_sha256 != modules.digest(patterns):
        raise WheelhouseError(f"the shards in {shards_dir} were cut from another module list than these sources "
                              f"give ({modules.path}); build the shards again from the same sources")
    expected = modules.selected(patterns)
    shards.check_covers(shard_set, [m.name for m in expected], modules.costs(patterns))
    init = package_dir / "__init__.py"
    if not init.is_file():
        raise WheelhouseError(f"{init} is missing: the sources lack flashinfer-jit-cache/{PACKAGE}; build from "
                              "flashinfer's git sources (its sdist has no flashinfer-jit-cache/)")
    files = shard_set.modules()
    name = f"{PACKAGE}-{version}"
    dist_info = f"{name}.dist-info"
    manifest = {
        "schema": SCHEMA,
        "generator": modules.document.get("generator", ""),
        "flashinfer_version": modules.document["flashinfer_version"],
        "cuda_arch_list": modules.cuda_arch_list,
        "sm_capabilities": modules.document.get("sm_capabilities", {}),
        "listed": len(modules.modules),
        "selection": list(patterns),
        "shards": shard_set.count,
        "modules": {m.name: {"archs": list(m.archs), "sha256": files[m.name][2].sha256} for m in expected},
    }
    members: list[tuple[str, Path | bytes]] = [
        (f"{PACKAGE}/__init__.py", init),
        (f"{PACKAGE}/_build_meta.py", (f'"""Build metadata for flashinfer-jit-cache package."""\n'
                                       f'__version__ = "{version}"\n__git_version__ = "{git_version}"\n').encode()),
    ]
    members += [(f"{PACKAGE}/{m.member}", files[m.name][0]) for m in sorted(expected, key=lambda m: m.name)]
    members += [
        (f"{dist_info}/METADATA", _metadata(modules.document["package"], version)),
        (f"{dist_info}/WHEEL", _wheel_file(arch)),
        (f"{dist_info}/top_level.txt", f"{PACKAGE}\n".encode()),
        (f"{dist_info}/{WHEEL_MANIFEST}", (json.dumps(manifest, indent=1, sort_keys=True) + "\n").encode()),
    ]
    target = dist / f"{name}-{WHEEL_TAG.format(arch=arch)}.whl"
    _write_wheel(target, members, f"{dist_info}/RECORD")
    print(f"[wheelhouse] {target.name}: {len(expected)} modules from {shard_set.count} shard(s), "
          f"{target.stat().st_size / 2**20:.1f} MiB", file=sys.stderr)
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
    return (f"Wheel-Version: 1.0\nGenerator: wheelhouse (ci/jit_cache.py)\nRoot-Is-Purelib: false\n"
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
    the counts for shards whose manifest has none. What the time model (ci/shard_model.py) reads."""
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
        "modules": [{"name": m.name, "cuda_sources": m.cuda_sources, "archs": list(m.archs), "family": m.family,
                     "shard": compiled.get(m.name, (None, None))[0], "seconds": compiled.get(m.name, (None, None))[1],
                     "cached": m.name in cached}
                    for m in listing.modules],
    }


def _mostly_cached(counts: dict[str, int] | Any) -> bool:
    if not counts:
        return False
    hits, misses = int(counts.get("hits", 0)), int(counts.get("misses", 0))
    return hits > CACHED_SHARE * (hits + misses)


# --- the builder's commands -------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ci.jit_cache", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("select", "finish-shard", "pack"):
        command = sub.add_parser(name)
        command.add_argument("--modules", type=Path, required=True, help="modules.json of flashinfer_aot.py list")
        command.add_argument("--patterns", default="", help="globs of module names (WHEELHOUSE_JIT_CACHE_MODULES)")
        if name in ("select", "finish-shard"):
            command.add_argument("--shard", required=True, help="I/N")
    sub.choices["select"].add_argument("--out", type=Path, required=True, help="the shard's module names")
    sub.choices["select"].add_argument("--shards-dir", type=Path, required=True,
                                       help="where the shard's (empty) directory is made; printed on stdout")
    sub.choices["finish-shard"].add_argument("--dir", type=Path, required=True)
    sub.choices["finish-shard"].add_argument("--ninja-log", type=Path)
    for flag in ("--shards", "--package-dir", "--dist"):
        sub.choices["pack"].add_argument(flag, type=Path, required=True)
    for flag in ("--version", "--git-version", "--arch"):
        sub.choices["pack"].add_argument(flag, required=True)
    sub.choices["pack"].add_argument("--how-to-build", default="", help="the command that builds shard {shard}")
    args = parser.parse_args(argv)
    try:
        modules = ModuleList.read(args.modules)
        patterns = parse_patterns(args.patterns)
        if args.command == "select":
            spec = shards.ShardSpec.parse(args.shard)
            names = select_shard(modules, spec, patterns)
            args.out.write_text("".join(f"{name}\n" for name in names))
            directory = args.shards_dir / spec.dir_name  # empty: a shard never keeps an earlier attempt's modules
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
            print(f"[wheelhouse] shard {spec}: {len(names)} of {len(modules.selected(patterns))} modules",
                  file=sys.stderr)
            print(directory)
        elif args.command == "finish-shard":
            finish_shard(modules, shards.ShardSpec.parse(args.shard), patterns, args.dir, args.ninja_log)
        else:
            pack(modules, patterns, args.shards, package_dir=args.package_dir, version=args.version,
                 git_version=args.git_version, arch=args.arch, dist=args.dist, how_to_build=args.how_to_build)
    except WheelhouseError as error:
        print(f"[wheelhouse] error: {error}", file=sys.stderr)
        return error.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
