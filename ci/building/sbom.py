"""The SBOM every built wheel carries (PEP 770): ``<name>.dist-info/sboms/wheelhouse.cdx.json``, CycloneDX 1.6.

It says where the wheel came from and what made it:

- the source: a git URL and commit with each submodule's path and commit, an sdist's name and
  sha256, or a local directory's digest; each patch applied, with its sha256;
- the torch it was built against (version, ``torch.version.git_version``, CUDA, C++11 ABI) and the
  torch pin its METADATA declares;
- the CUDA toolkit and host compiler versions (``formulation``);
- every shared object with its sha256, whether it links torch, and the cubin and PTX archs our
  fatbin parser found in it (ci/formats/fatbin.py; the parser, not cuobjdump, so the document does
  not depend on which tools a build machine has);
- the build-input fingerprint (ci/model/fingerprint.py): the row's settings, the resolved source revision,
  the builder and its helpers, the patches.

Nothing of the maintainer's checkout that is not a build input reaches the document: not this
repository's commit, nor whether its tree has uncommitted changes (an unrelated edit flipped that and
changed the bytes of a wheel published under the same name), nor which versions file was read. The
build record keeps those (``versions``, for the provenance statement, which is not in the wheel). The
document is deterministic: no wall-clock time. Its timestamp is ``SOURCE_DATE_EPOCH`` when set,
else the source commit's time, else absent; its serial number is derived from its contents. What the
build knows is gathered once by :func:`build_facts` and kept in the build record (key ``sbom``);
:func:`document` writes it for one wheel; :func:`read_sbom` reads it back (the provenance check).
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from packaging.utils import canonicalize_name

from ci.base import bounded_json, log
from ci.base.digest import sha256_file
from ci.base.errors import CheckFailed
from ci.building import toolchain
from ci.building.sources import Checkout
from ci.checks import toolkit
from ci.formats.archive import open_wheel
from ci.formats.archs import CudaArch, parse_arch_list
from ci.model import fingerprint
from ci.model.matrix import MatrixRow
from ci.model.versions import REPO_ROOT, Versions

SBOM_NAME = "sboms/wheelhouse.cdx.json"
"""Where the SBOM lives, relative to the wheel's ``.dist-info`` directory."""
SPEC_VERSION = "1.6"
_PREFIX = "wheelhouse:"
_GIT_VERSION = re.compile(r"""^git_version\s*(?::\s*str\s*)?=\s*['"]([^'"]*)['"]""", re.M)
_NVCC_FULL_VERSION = re.compile(r"\bV(\d+\.\d+\.\d+)\b")
# `git submodule status`: a state character (' ', '-' not checked out, '+', 'U'), the commit, the path,
# then its `git describe` in parentheses
_SUBMODULE_STATUS = re.compile(r"^([ +U-]?)([0-9a-f]{40,64}) (.+?)(?: \(.*\))?$")
_DOTTED = re.compile(r"\b\d+\.\d+(?:\.\d+)*\b")


@dataclass(frozen=True)
class SharedObject:
    """One ELF member of a wheel as the SBOM lists it."""

    member: str
    sha256: str
    torch_libraries: tuple[str, ...]
    """The torch libraries it needs (DT_NEEDED libtorch*/libc10*); empty when it does not link torch."""
    cubins: tuple[CudaArch, ...] = ()
    ptx: tuple[CudaArch, ...] = ()


# --- what the build knows ------------------------------------------------------------------------


def _git_output(args: list[str], cwd: Path) -> str | None:
    try:
        result = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def submodule_commits(checkout: Path) -> list[dict[str, str]]:
    """Path and commit of every checked-out submodule of a git checkout, recursively, sorted by path."""
    status = _git_output(["submodule", "status", "--recursive"], checkout) or ""
    found = []
    for line in status.splitlines():
        match = _SUBMODULE_STATUS.match(line)
        if match and match.group(1) != "-":  # '-': not checked out, so not part of the build
            found.append({"path": match.group(3), "commit": match.group(2)})
    return sorted(found, key=lambda entry: entry["path"])


def repository_state(repo_root: Path = REPO_ROOT) -> dict[str, Any]:
    """The commit of this repository and whether tracked files differ from it."""
    commit = _git_output(["rev-parse", "HEAD"], repo_root)
    if commit is None:
        return {"commit": "uncommitted", "dirty": True}
    changes = _git_output(["status", "--porcelain", "--untracked-files=no"], repo_root)
    return {"commit": commit, "dirty": bool(changes)}


def torch_git_version(torch_dir: Path) -> str | None:
    """``torch.version.git_version`` of the torch at ``torch_dir``, read from its version.py (no import)."""
    version_py = torch_dir / "version.py"
    if not version_py.is_file():
        return None
    match = _GIT_VERSION.search(version_py.read_text(errors="replace"))
    return match.group(1) if match else None


def _first_line(command: list[str], env: Mapping[str, str]) -> str | None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, env=dict(env), timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = result.stdout.strip().splitlines()
    return lines[0].strip() if result.returncode == 0 and lines else None


def _compiler(variable: str, command: str, env: Mapping[str, str]) -> dict[str, str] | None:
    line = _first_line([*shlex.split(command), "--version"], env)
    if line is None:
        return None
    versions = _DOTTED.findall(line)
    return {"variable": variable, "name": Path(shlex.split(command)[0]).name, "version": versions[-1] if versions else line,
            "description": line}


def toolchain_versions(row: MatrixRow, nvcc: Path | None, env: Mapping[str, str]) -> dict[str, Any]:
    """The CUDA toolkit (full nvcc release, CUDA rows only) and the host compilers (CXX, CUDAHOSTCXX)."""
    cuda = None
    if nvcc is not None and row.cuda != "cpu":
        line = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
        match = _NVCC_FULL_VERSION.search(line)
        cuda = match.group(1) if match else toolkit.nvcc_version(nvcc)
    compilers = [found for variable, command in (("CXX", env.get("CXX") or "c++"), ("CUDAHOSTCXX", env.get("CUDAHOSTCXX")))
                 if command and (found := _compiler(variable, command, env))]
    return {"cuda": cuda, "compilers": compilers}


def build_facts(versions: Versions, row: MatrixRow, checkout: Checkout, interpreter: toolchain.Interpreter,
                env: Mapping[str, str], *, repo_root: Path = REPO_ROOT) -> dict[str, Any]:
    """Everything the SBOM says about one build, as the build record keeps it (JSON-ready, no paths of
    this machine: a rebuild elsewhere gathers the same facts), and the checkout's commit (``versions``), which
    the record and the provenance statement keep and the SBOM leaves out."""
    component = versions.component(row.component)
    source: dict[str, Any] = {"kind": checkout.kind, "ref": checkout.ref, "revision": checkout.revision}
    commit_time = None
    if checkout.kind == "git":
        source["location"] = log.redact(checkout.location)
        source["submodules"] = submodule_commits(checkout.path)
        found = _git_output(["log", "-1", "--format=%ct", "HEAD"], checkout.path)
        commit_time = int(found) if found and found.isdigit() else None
        source["commit_time"] = commit_time
    elif checkout.kind == "sdist":
        source["location"] = checkout.location
    else:  # a directory: the one named in versions.yaml, or a --source checkout (its digest says which)
        source["location"] = component.source.location if component.source.kind == "path" else "--source"
    epoch = env.get("SOURCE_DATE_EPOCH", "").strip()
    versions_file = versions.path.resolve()
    return {
        "component": row.component,
        "source": source,
        "patches": [{"path": patch, "sha256": sha256_file(repo_root / patch)} for patch in row.settings.patches],
        "torch": {"version": interpreter.torch_version, "git_version": torch_git_version(interpreter.torch_dir),
                  "cuda": interpreter.torch_cuda, "cxx11_abi": interpreter.cxx11_abi},
        "toolchain": toolchain_versions(row, interpreter.nvcc, env),
        "versions": {"file": str(versions_file.relative_to(repo_root.resolve()))
                     if versions_file.is_relative_to(repo_root.resolve()) else versions_file.name,
                     **repository_state(repo_root)},
        "source_date_epoch": int(epoch) if epoch.isdigit() else commit_time,
        "fingerprint": fingerprint.fingerprint(fingerprint.build_config(row, checkout.revision, repo_root,
                                                                        submodules=checkout.submodules)),
    }


# --- the document ----------------------------------------------------------------------------------


def _properties(values: Mapping[str, Any]) -> list[dict[str, str]]:
    """CycloneDX properties named ``wheelhouse:<key>``; None values are left out, booleans spelled true/false."""
    out = []
    for key, value in values.items():
        if value is None:
            continue
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out.append({"name": f"{_PREFIX}{key}", "value": text})
    return out


def _purl(name: str, version: str) -> str:
    return f"pkg:pypi/{canonicalize_name(name)}@{version.replace('+', '%2B')}"


def _source_component(facts: Mapping[str, Any]) -> dict[str, Any]:
    source = facts["source"]
    component: dict[str, Any] = {"type": "library", "bom-ref": "source", "name": facts["component"],
                                 "version": source["ref"]}
    common = {"source_kind": source["kind"], "source_location": source["location"]}
    if source["kind"] == "git":
        component["externalReferences"] = [{"type": "vcs", "url": source["location"]}]
        component["pedigree"] = {"commits": [{"uid": source["revision"], "url": source["location"]}]}
        component["properties"] = _properties({**common, "source_commit": source["revision"],
                                               "source_commit_time": source.get("commit_time")})
        component["components"] = [
            {"type": "library", "bom-ref": f"source/{sub['path']}", "name": sub["path"], "version": sub["commit"],
             "pedigree": {"commits": [{"uid": sub["commit"]}]},
             "properties": _properties({"submodule_path": sub["path"], "submodule_commit": sub["commit"]})}
            for sub in source.get("submodules", [])
        ]
    elif source["kind"] == "sdist":
        component.update(name=source["location"], purl=_purl(source["location"], source["ref"]),
                         hashes=[{"alg": "SHA-256", "content": source["revision"]}])
        component["properties"] = _properties({**common, "source_sha256": source["revision"]})
    else:
        component["properties"] = _properties({**common, "source_digest": source["revision"]})
    return component


def _file_component(shared: SharedObject) -> dict[str, Any]:
    return {
        "type": "file", "bom-ref": f"file:{shared.member}", "name": shared.member,
        "hashes": [{"alg": "SHA-256", "content": shared.sha256}],
        "properties": _properties({
            "links_torch": bool(shared.torch_libraries),
            "torch_libraries": " ".join(shared.torch_libraries) or None,
            "cuda_cubins": ";".join(str(a) for a in shared.cubins),
            "cuda_ptx": ";".join(str(a) for a in shared.ptx),
        }),
    }


def _formulation(facts: Mapping[str, Any]) -> list[dict[str, Any]]:
    tools = []
    if facts["toolchain"].get("cuda"):
        tools.append({"type": "application", "bom-ref": "toolchain/nvcc", "name": "nvcc",
                      "version": facts["toolchain"]["cuda"], "description": "CUDA toolkit compiler"})
    for compiler in facts["toolchain"].get("compilers", []):
        tools.append({"type": "application", "bom-ref": f"toolchain/{compiler['variable']}", "name": compiler["name"],
                      "version": compiler["version"], "description": compiler["description"],
                      "properties": _properties({"compiler_variable": compiler["variable"]})})
    return [{"bom-ref": "build", "components": tools,
             "properties": _properties({"source_date_epoch": facts.get("source_date_epoch")})}]


def document(name: str, version: str, filename: str, facts: Mapping[str, Any], shared_objects: Sequence[SharedObject],
             torch_pin: str | None) -> dict[str, Any]:
    """The CycloneDX 1.6 document of one wheel (``name``/``version`` as its METADATA says)."""
    torch = facts["torch"]
    patches = facts["patches"]
    wheel: dict[str, Any] = {
        "type": "library", "bom-ref": "wheel", "name": name, "version": version, "purl": _purl(name, version),
        "properties": _properties({"wheel": filename, "component": facts["component"],
                                   "torch_pin": f"torch{torch_pin}" if torch_pin else "none"}),
    }
    if patches:
        wheel["pedigree"] = {"patches": [{"type": "unofficial", "diff": {"url": patch["path"]}} for patch in patches]}
    metadata: dict[str, Any] = {
        "tools": {"components": [{"type": "application", "name": "wheelhouse"}]},
        "component": wheel,
        "properties": _properties({"build_fingerprint": facts.get("fingerprint")}),
    }
    epoch = facts.get("source_date_epoch")
    if epoch is not None:
        metadata["timestamp"] = datetime.fromtimestamp(int(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    components = [
        _source_component(facts),
        {"type": "framework", "bom-ref": "torch", "name": "torch", "version": torch["version"],
         "purl": _purl("torch", torch["version"]),
         "properties": _properties({"torch_git_version": torch.get("git_version"), "torch_cuda": torch.get("cuda") or "none",
                                    "torch_cxx11_abi": torch.get("cxx11_abi")})},
        *[{"type": "file", "bom-ref": f"patch:{patch['path']}", "name": patch["path"],
           "hashes": [{"alg": "SHA-256", "content": patch["sha256"]}], "properties": _properties({"role": "patch"})}
          for patch in patches],
        *[_file_component(shared) for shared in sorted(shared_objects, key=lambda s: s.member)],
    ]
    linking = sorted(f"file:{s.member}" for s in shared_objects if s.torch_libraries)
    bom: dict[str, Any] = {
        "$schema": f"http://cyclonedx.org/schema/bom-{SPEC_VERSION}.schema.json",
        "bomFormat": "CycloneDX",
        "specVersion": SPEC_VERSION,
        "version": 1,
        "metadata": metadata,
        "components": components,
        "formulation": _formulation(facts),
        "dependencies": [{"ref": "wheel", "dependsOn": ["torch"] if linking else []},
                         *[{"ref": ref, "dependsOn": ["torch"]} for ref in linking]],
    }
    # unique for other contents, the same for the same ones (a rebuild gives the same bytes)
    bom["serialNumber"] = f"urn:uuid:{uuid.uuid5(uuid.NAMESPACE_URL, 'wheelhouse-sbom:' + _canonical(bom))}"
    return bom


def _canonical(bom: Mapping[str, Any]) -> str:
    return json.dumps(bom, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def dumps(bom: Mapping[str, Any]) -> bytes:
    """The bytes written into the wheel: sorted keys, two-space indent, one trailing newline."""
    return (json.dumps(bom, sort_keys=True, indent=2, ensure_ascii=False) + "\n").encode("utf-8")


# --- reading it back -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SbomSummary:
    """What a wheel's own SBOM says, in the terms a verifier compares."""

    source_kind: str
    source_location: str
    source_revision: str
    """The git commit, the sdist's sha256 or the directory's digest."""
    submodules: Mapping[str, str]
    """path -> commit"""
    patches: Mapping[str, str]
    """path -> sha256"""
    torch: Mapping[str, str]
    """version, git_version, cuda, cxx11_abi"""
    torch_pin: str | None
    """``torch==2.13.*`` or None"""
    fingerprint: str
    """The build-input fingerprint; empty in a wheel built before the SBOM carried it."""
    archs: Mapping[str, tuple[tuple[CudaArch, ...], tuple[CudaArch, ...]]]
    """shared object -> (cubin archs, PTX archs)"""

    @property
    def cubin_archs(self) -> tuple[CudaArch, ...]:
        return tuple(sorted({a for cubins, _ in self.archs.values() for a in cubins}))

    @property
    def ptx_archs(self) -> tuple[CudaArch, ...]:
        return tuple(sorted({a for _, ptx in self.archs.values() for a in ptx}))


def _props(item: Mapping[str, Any]) -> dict[str, str]:
    return {p["name"][len(_PREFIX):]: p.get("value", "") for p in item.get("properties", [])
            if p.get("name", "").startswith(_PREFIX)}


def _archs(text: str) -> tuple[CudaArch, ...]:
    return parse_arch_list(text).archs if text else ()


def summarize(bom: Mapping[str, Any]) -> SbomSummary:
    """The :class:`SbomSummary` of a parsed document this module wrote."""
    components = {c.get("bom-ref"): c for c in bom.get("components", [])}
    source, torch = components["source"], components["torch"]
    source_props, torch_props = _props(source), _props(torch)
    revision = (source_props.get("source_commit") or source_props.get("source_sha256")
                or source_props.get("source_digest", ""))
    files = [c for ref, c in components.items() if str(ref).startswith("file:")]
    patches = {c["name"]: c["hashes"][0]["content"] for ref, c in components.items() if str(ref).startswith("patch:")}
    pin = _props(bom["metadata"]["component"]).get("torch_pin", "none")
    return SbomSummary(
        source_kind=source_props.get("source_kind", ""),
        source_location=source_props.get("source_location", ""),
        source_revision=revision,
        submodules={c["name"]: c["version"] for c in source.get("components", [])},
        patches=patches,
        torch={"version": torch.get("version", ""), "git_version": torch_props.get("torch_git_version", ""),
               "cuda": torch_props.get("torch_cuda", ""), "cxx11_abi": torch_props.get("torch_cxx11_abi", "")},
        torch_pin=None if pin == "none" else pin,
        fingerprint=_props(bom["metadata"]).get("build_fingerprint", ""),
        archs={c["name"]: (_archs(_props(c).get("cuda_cubins", "")), _archs(_props(c).get("cuda_ptx", ""))) for c in files},
    )


def read_document(wheel: Path | str) -> dict[str, Any]:
    """A wheel's own SBOM, parsed; one line when it has none or it is not JSON."""
    with open_wheel(wheel) as archive:
        name = f"{archive.dist_info}/{SBOM_NAME}"
        if name not in archive.names():
            raise CheckFailed(f"{archive.wheel_name.filename}: has no {name}; it was not built by this wheelhouse, "
                              "or its SBOM was removed")
        data = archive.read_small(name)
        label = archive.wheel_name.filename
    try:
        return bounded_json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise CheckFailed(f"{label}: {name} is not JSON ({exc}); rebuild the wheel") from None


def read_sbom(wheel: Path | str) -> SbomSummary:
    """What a wheel's SBOM says: source commit, submodules, patches, torch, torch pin, archs."""
    bom = read_document(wheel)
    try:
        return summarize(bom)
    except (KeyError, IndexError, TypeError, AttributeError) as exc:
        raise CheckFailed(f"{Path(wheel).name}: its SBOM lacks {exc}; it was not written by this wheelhouse") from None

