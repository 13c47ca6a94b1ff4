"""Restore release wheels from the workflow artifacts of earlier CI runs.

When a release lost its wheels (clobbered by a later build, deleted by hand), the build jobs'
artifacts (``wheel-<component>-<arch>-cu<cuda>-py<python>-torch<torch>``, kept 90 days) still hold
them. This task puts them back:

1. list each run's artifacts (every page: ``per_page=100`` and the Link header; the listing is an
   object, ``{total_count, artifacts}``), and drop expired ones, artifacts of another torch and
   names that are not wheel artifacts, each with a line saying so;
2. map each artifact to its release through versions.yaml *as it was* at ``--versions-ref`` (the
   matrix row with the artifact's component, arch, CUDA, Python and torch gives tag and title);
3. the same artifact name in several runs: the newest artifact (``created_at``, then the higher
   run id) wins, with a warning naming the others -- each artifact is downloaded into its own
   directory, so two runs never mix files;
4. per artifact: download the zip (streamed), verify its sha256 against the artifact's ``digest``
   (a mismatch refuses the artifact, and so does a missing digest unless ``accept_undigested``),
   refuse any member that is absolute, has a ``..`` component or is a symbolic link, take the
   ``*.whl`` (and ``*.whl.metadata``) members, and run the wheel checks on every wheel (all but
   the torch ABI check, which needs the row's torch); every wheel must be a project the component
   publishes (ci/model/wheel_packages.py, the component's ``wheel_packages`` for that arch); a ``.metadata``
   must equal its wheel's METADATA, and a wheel without one gets it, made from that METADATA;
5. per release: create it if missing, upload the wheels (an existing asset with other bytes is
   refused unless ``clobber``, which replaces it through the store's safe clobber; an existing
   release keeps its title and notes), then attach
   one ``wheelhouse-build-manifest-<arch>.json`` per arch marked ``restored: true``, so the skip
   plan (ci/flows/plan.py) rebuilds the release instead of trusting wheels no build of ours checked.
   An existing manifest is left alone when none of that arch's wheels changed.

Idempotent: a second run finds the same bytes everywhere and changes nothing.
"""

from __future__ import annotations

import hashlib
import re
import subprocess
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from ci.base import log
from ci.base.digest import sha256_file
from ci.base.errors import CheckFailed, ConfigError, WheelhouseError
from ci.formats.archive import unsafe_member
from ci.model import manifest, matrix, naming, wheel_packages
from ci.model.naming import wheel_covers_arch
from ci.model.versions import REPO_ROOT, Versions
from ci.store.artifacts import Artifact, ArtifactSource
from ci.store.model import Release, ReleaseStore

ARTIFACT_NAME = re.compile(
    r"^wheel-(?P<component>.+)-(?P<arch>x86_64|aarch64)-cu(?P<cuda>[\w.]+)-py(?P<python>[\w.]+)"
    r"-torch(?P<torch>[\w.+]+)$"
)
"""Inverse of :func:`ci.model.naming.artifact_name`."""

Log = Callable[[str], None]


class ArtifactRefused(WheelhouseError):
    """One artifact cannot be used (digest mismatch, unsafe member, no wheel)."""


# --------------------------------------------------------------------------- versions at a ref


def versions_text_at(ref: str, *, repo_root: Path = REPO_ROOT, path: str = "versions.yaml") -> str:
    """``git show REF:versions.yaml`` in the repository."""
    try:
        done = subprocess.run(["git", "show", "--end-of-options", f"{ref}:{path}"], cwd=repo_root, capture_output=True, text=True,
                              check=False)
    except OSError as exc:
        raise WheelhouseError(f"git show {ref}:{path}: cannot run git ({exc}); install git") from None
    if done.returncode != 0:
        detail = (done.stderr.strip().splitlines() or ["unknown error"])[-1]
        raise WheelhouseError(f"--versions-ref {ref}: git show {ref}:{path} failed ({detail}); "
                              f"fetch that ref (git fetch origin {ref}) or name a commit that has {path}")
    return done.stdout


def versions_from_text(text: str, *, ref: str) -> Versions:
    """Read a versions file given as text (from another commit): schema-checked and typed.

    The semantic checks that look at the working tree (builder scripts, patch files) are left out:
    they concern building, and the tree has moved on since ``ref``.
    """
    from ci.model import versions as versions_module

    with tempfile.TemporaryDirectory(prefix="wheelhouse-versions-") as tmp:
        path = Path(tmp) / "versions.yaml"
        path.write_text(text, encoding="utf-8")
        try:
            loaded = versions_module.load(path, check_tree=False)
        except ConfigError as exc:
            raise ConfigError(f"versions.yaml at {ref}: {exc}") from None
    return Versions(Path(f"versions.yaml@{ref}"), loaded.build_matrix, loaded.components, loaded.reference_versions)


# --------------------------------------------------------------------------- plan


@dataclass(frozen=True)
class Item:
    artifact: Artifact
    component: str
    arch: str
    cuda: str
    python: str
    torch: str
    projects: frozenset[str]
    """The projects the component publishes on this arch (PEP 503 names)."""


@dataclass(frozen=True)
class ReleaseRestore:
    tag: str
    title: str
    component: str
    pythons: tuple[str, ...]
    torch: str
    exists: bool
    items: tuple[Item, ...]

    def render(self) -> str:
        head = f"{self.tag}  ({'exists: title and notes kept' if self.exists else f'will be created, title {self.title!r}'})"
        rows = [f"    {i.artifact.name}  (run {i.artifact.run_id}, id {i.artifact.id}, {i.artifact.size} bytes, "
                f"{i.artifact.digest or 'no digest: not verifiable'})" for i in self.items]
        return "\n".join([f"  {head}", *rows])


@dataclass(frozen=True)
class RestorePlan:
    runs: tuple[str, ...]
    torch: str
    versions_ref: str
    source: str
    store: str
    releases: tuple[ReleaseRestore, ...]
    skipped: tuple[str, ...]
    warnings: tuple[str, ...]
    clobber: bool = False
    accept_undigested: bool = False
    """Restore artifacts that carry no digest (their download cannot be verified)."""

    def nothing_to_restore(self) -> WheelhouseError | None:
        """The error to raise when no artifact is left to restore (the skips say why)."""
        if self.releases:
            return None
        return WheelhouseError(f"no unexpired wheel artifacts for torch {self.torch} in run(s) {', '.join(self.runs)}; "
                               "check --run and --torch against the skipped artifacts listed")

    def render(self) -> str:
        lines = [f"restore-wheels: torch {self.torch}, run(s) {', '.join(self.runs)}, versions.yaml at "
                 f"{self.versions_ref}, from {self.source} into {self.store}"]
        lines += [f"  skip: {s}" for s in self.skipped]
        lines += [f"  warning: {w}" for w in self.warnings]
        lines += [r.render() for r in self.releases]
        n = sum(len(r.items) for r in self.releases)
        lines.append(f"{n} artifact(s) into {len(self.releases)} release(s); each arch gets a manifest marked "
                     f"restored: true; existing assets with other bytes are "
                     f"{'replaced (--clobber)' if self.clobber else 'refused (pass --clobber to replace them)'}")
        return "\n".join(lines)


def collect(source: ArtifactSource, runs: Sequence[str]) -> dict[str, list[Artifact]]:
    """Every artifact of each run (all pages)."""
    return {str(run): source.list_artifacts(str(run)) for run in runs}


def _newest_key(artifact: Artifact) -> tuple[str, int, str]:
    run = int(artifact.run_id) if artifact.run_id.isdigit() else -1
    return (artifact.created_at or "", run, str(artifact.id))


def plan(versions: Versions, listings: Mapping[str, Sequence[Artifact]], *, torch: str, versions_ref: str,  # noqa: C901 - one case per artifact outcome, in the order the plan reports them
         releases: Sequence[Release] = (), clobber: bool = False, source: str = "", store: str = "",
         accept_undigested: bool = False) -> RestorePlan:
    """Which artifacts go into which release (none: see :meth:`RestorePlan.nothing_to_restore`)."""
    skipped: list[str] = []
    warnings: list[str] = []
    candidates: dict[str, list[Artifact]] = {}
    for run, artifacts in listings.items():
        for a in sorted(artifacts, key=lambda a: a.name):
            m = ARTIFACT_NAME.match(a.name)
            if m is None:
                skipped.append(f"{a.name} (run {run}): not a wheel artifact (wheel-<component>-<arch>-cu<cuda>-"
                               "py<python>-torch<torch>)")
            elif m["torch"] != torch:
                skipped.append(f"{a.name} (run {run}): torch {m['torch']}, not {torch}")
            elif a.expired:
                skipped.append(f"{a.name} (run {run}): expired (GitHub keeps artifacts 90 days by default)")
            else:
                candidates.setdefault(a.name, []).append(a)
    chosen: list[Artifact] = []
    for name, found in sorted(candidates.items()):
        found = sorted(found, key=_newest_key, reverse=True)
        if len(found) > 1:
            others = ", ".join(f"run {a.run_id}" for a in found[1:])
            warnings.append(f"{name} is in {len(found)} runs: using run {found[0].run_id} (newest), ignoring {others}")
        chosen.append(found[0])

    groups: dict[str, dict] = {}
    for a in chosen:
        m = ARTIFACT_NAME.match(a.name)
        if m is None:  # chosen holds only names ARTIFACT_NAME matched above
            raise RuntimeError(f"artifact {a.name!r} no longer matches ARTIFACT_NAME")
        component = versions.components.get(m["component"])
        if component is None:
            skipped.append(f"{a.name} (run {a.run_id}): component {m['component']} is not in versions.yaml at "
                           f"{versions_ref}")
            continue
        projects = wheel_packages.allowed(m["component"], component.settings_for(m["arch"]).wheel_packages)
        item = Item(a, m["component"], m["arch"], m["cuda"], m["python"], m["torch"], projects)
        rows = [r for r in matrix.component_rows(versions, component)
                if (r.arch, r.cuda, r.python, r.torch) == (item.arch, item.cuda, item.python, item.torch)]
        if rows:
            row = rows[0]
            tag, title, pythons = row.release_tag, matrix.release_title(versions, row), row.pythons
        else:
            tag = naming.release_tag(item.component, component.ref, item.cuda, item.python, item.torch)
            title, pythons = "", (item.python,)
            warnings.append(f"{a.name}: no build_matrix row at {versions_ref} builds it; release {tag} "
                            "named from the artifact")
        group = groups.setdefault(tag, {"title": title, "component": item.component, "pythons": pythons,
                                        "items": []})
        group["items"].append(item)
    existing = {r.tag for r in releases}
    out = []
    for tag, g in sorted(groups.items()):
        items = tuple(sorted(g["items"], key=lambda i: (i.arch != naming.DEFAULT_ARCH, i.arch, i.artifact.name)))
        title = g["title"] or naming.release_title(
            g["component"], versions.components[g["component"]].ref,
            sorted({naming.TitleSegment(i.arch, i.cuda, i.python, i.torch) for i in items},
                   key=lambda s: (s.arch != naming.DEFAULT_ARCH, s.arch, s.python)))
        out.append(ReleaseRestore(tag, title, g["component"], tuple(g["pythons"]), torch, tag in existing, items))
    runs = tuple(str(r) for r in listings)
    return RestorePlan(runs, torch, versions_ref, source, store, tuple(out), tuple(skipped), tuple(warnings), clobber,
                       accept_undigested)


# --------------------------------------------------------------------------- safe extraction


def extract_wheels(zip_path: Path, dest: Path, *, what: str) -> list[Path]:
    """The ``*.whl`` / ``*.whl.metadata`` members of an artifact zip, copied (streamed) into ``dest``.

    Any unsafe member refuses the whole artifact: its producer is not to be trusted.
    """
    try:
        archive = zipfile.ZipFile(zip_path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArtifactRefused(f"{what}: not a readable zip ({exc}); refused") from None
    with archive:
        infos = archive.infolist()
        for info in infos:
            reason = unsafe_member(info)
            if reason:
                raise ArtifactRefused(f"{what}: member {info.filename!r} {reason}; refused (nothing extracted)")
        wanted = [i for i in infos if not i.is_dir() and i.filename.endswith((".whl", ".whl.metadata"))]
        names = [PurePosixPath(i.filename.replace("\\", "/")).name for i in wanted]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ArtifactRefused(f"{what}: {', '.join(dupes)} occur(s) twice in the zip; refused")
        dest.mkdir(parents=True, exist_ok=True)
        out = []
        for info, name in zip(wanted, names, strict=True):
            target = dest / name
            try:
                with archive.open(info) as src, target.open("wb") as handle:
                    while chunk := src.read(1 << 20):
                        handle.write(chunk)
            except (zipfile.BadZipFile, OSError) as exc:  # CRC mismatch, truncated member
                raise ArtifactRefused(f"{what}: member {info.filename!r} is corrupt ({exc}); refused") from None
            out.append(target)
        return out


# --------------------------------------------------------------------------- apply


@dataclass(frozen=True)
class RestoreResult:
    uploaded: tuple[str, ...]
    """``tag/name`` of every asset added or replaced."""
    unchanged: tuple[str, ...]
    manifests: tuple[str, ...]
    refused: tuple[str, ...]
    warnings: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.refused

    def render(self) -> str:
        lines = [f"uploaded {u}" for u in self.uploaded]
        lines += [f"manifest {m}" for m in self.manifests]
        lines += [f"warning: {w}" for w in self.warnings]
        lines += [f"refused: {r}" for r in self.refused]
        lines.append(f"{len(self.uploaded)} asset(s) uploaded, {len(self.unchanged)} already there, "
                     f"{len(self.manifests)} manifest(s) written, {len(self.refused)} refused")
        return "\n".join(lines)


@dataclass
class _File:
    name: str
    path: Path
    sha256: str
    size: int
    arch: str
    item: Item


@dataclass
class _Outcome:
    uploaded: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    manifests: list[str] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def notes(restore: RestorePlan) -> str:
    return (f"Restored from the workflow artifacts of run(s) {', '.join(restore.runs)} (versions.yaml at "
            f"{restore.versions_ref}). Each arch's wheelhouse-build-manifest-<arch>.json is marked restored: the "
            "next build of this release rebuilds these wheels and replaces them.\n")


def _fetch(group: ReleaseRestore, source: ArtifactSource, tmp: Path, out: _Outcome, log: Log, *,
           accept_undigested: bool) -> dict[str, _File]:
    files: dict[str, _File] = {}
    for n, item in enumerate(group.items):
        a = item.artifact
        what = f"artifact {a.name} (run {a.run_id}, id {a.id})"
        folder = tmp / f"{n:03d}"  # one folder per artifact: equal names from two runs never mix
        folder.mkdir()
        zpath = folder / "artifact.zip"
        log(f"download {what}")
        got = source.download(a, zpath)
        try:
            if a.sha256 is None and not accept_undigested:
                raise ArtifactRefused(f"{what} has no digest (uploaded before upload-artifact v4), so its download "
                                      "cannot be verified; refused (pass --accept-undigested to restore it anyway)")
            if a.sha256 is None:
                out.warnings.append(f"{what} has no digest (uploaded before upload-artifact v4): not verified")
            elif got != a.sha256:
                raise ArtifactRefused(f"{what}: sha256 {got} does not match its digest {a.digest}; refused "
                                      "(a corrupted download or a changed artifact: re-run, or rebuild the row)")
            extracted = extract_wheels(zpath, folder / "files", what=what)
            wheels = [p for p in extracted if p.name.endswith(".whl")]
            if not wheels:
                raise ArtifactRefused(f"{what}: holds no .whl file; refused")
            for p in wheels:
                if not wheel_covers_arch(p.name, item.arch):
                    raise ArtifactRefused(f"{what}: {p.name} is not a wheel for {item.arch}; refused "
                                          "(the artifact name and its contents disagree)")
            extracted = wheels + _check_restored(what, item, wheels,
                                                 [p for p in extracted if p.name.endswith(".whl.metadata")])
            staged = []
            for p in extracted:
                f = _File(p.name, p, sha256_file(p), p.stat().st_size, item.arch, item)
                prior = files.get(p.name)
                if prior is not None and prior.sha256 != f.sha256:
                    raise ArtifactRefused(f"{what}: {p.name} is also in {prior.item.artifact.name} with other "
                                          "bytes; refused")
                staged.append(f)
        except ArtifactRefused as exc:
            out.refused.append(str(exc))
            continue
        for f in staged:
            files.setdefault(f.name, f)
        zpath.unlink()
    return files


def _check_restored(what: str, item: Item, wheels: list[Path], sidecars: list[Path]) -> list[Path]:
    """The checks a build runs (but the torch ABI: no torch here) and the component's projects; returns the
    ``.metadata`` of every wheel, each equal to its wheel's METADATA (written from it where the artifact had none).

    Nothing reaches a release unchecked: an artifact is other people's bytes until it passes.
    """
    from ci.checks.check import check_wheels

    report = check_wheels(wheels)
    if not report.ok:
        more = f" (and {len(report.problems) - 1} more)" if len(report.problems) > 1 else ""
        raise ArtifactRefused(f"{what}: fails the wheel checks: {report.problems[0]}{more}; refused")
    try:
        metadata = wheel_packages.check_all(wheels, item.component, item.projects)
    except CheckFailed as error:
        raise ArtifactRefused(f"{what}: {error}; refused") from None
    for sidecar in sidecars:
        wheel_name = sidecar.name.removesuffix(".metadata")
        if wheel_name not in metadata:
            raise ArtifactRefused(f"{what}: {sidecar.name} has no wheel beside it; refused")
        if metadata[wheel_name] != sidecar.read_bytes():
            raise ArtifactRefused(f"{what}: {sidecar.name} differs from the METADATA inside {wheel_name}; refused")
    out = []
    for wheel in wheels:
        sidecar = wheel.with_name(f"{wheel.name}.metadata")
        sidecar.write_bytes(metadata[wheel.name])  # the same bytes where the artifact had it
        out.append(sidecar)
    return out


def _restored_manifest(group: ReleaseRestore, arch: str, wheels: list[_File], restore: RestorePlan) -> bytes:
    items = sorted({w.item.artifact.id: w.item for w in wheels}.values(), key=lambda i: i.artifact.name)
    data = manifest.Manifest(
        component=group.component,
        release_tag=group.tag,
        arch=arch,
        pythons=group.pythons,
        torch=group.torch,
        fingerprint="",
        build_config={},
        wheels=tuple(manifest.WheelEntry(w.name, w.sha256, w.size) for w in sorted(wheels, key=lambda w: w.name)),
        checks_passed=False,
        source={"kind": "restored-from-artifacts", "versions_ref": restore.versions_ref,
                "artifacts": [{"name": i.artifact.name, "run": i.artifact.run_id, "id": i.artifact.id,
                               "digest": i.artifact.digest} for i in items]},
        restored=True,
    )
    return data.to_json().encode()


def apply(restore: RestorePlan, store: ReleaseStore, source: ArtifactSource, *,  # noqa: C901 - per release: download, verify, extract, upload; each refusal recorded where it arises
          workdir: Path | None = None) -> RestoreResult:
    """Download, verify, extract and upload, release by release; refusals are collected, not raised."""
    empty = restore.nothing_to_restore()
    if empty is not None:
        raise empty
    say: Log = log.get("restore").info
    out = _Outcome()
    for group in restore.releases:
        with tempfile.TemporaryDirectory(prefix="wheelhouse-restore-", dir=workdir) as tmp:
            files = _fetch(group, source, Path(tmp), out, say, accept_undigested=restore.accept_undigested)
            if not files:
                out.refused.append(f"release {group.tag}: no artifact could be used; nothing restored")
                continue
            existing = store.get_release(group.tag)
            usable: list[_File] = []
            changed: set[str] = set()
            held_back: set[str] = set()
            for f in sorted(files.values(), key=lambda f: f.name):  # a wheel sorts before its .metadata
                if f.name.removesuffix(".metadata") in held_back:
                    continue  # the metadata of a refused wheel stays out too
                asset = existing.asset(f.name) if existing else None
                if asset is not None and asset.sha256 == f.sha256:
                    out.unchanged.append(f"{group.tag}/{f.name}")
                    usable.append(f)
                    continue
                if asset is not None and not restore.clobber:
                    out.refused.append(
                        f"release {group.tag}: asset {f.name} exists with other bytes "
                        f"({asset.digest or 'no digest'}; {f.item.artifact.name} has sha256:{f.sha256}); "
                        "pass --clobber to replace it")
                    held_back.add(f.name)
                    continue
                usable.append(f)
                changed.add(f.name)
            if not usable:
                continue
            if existing is None:
                store.ensure_release(group.tag, group.title, notes(restore))
            for f in usable:
                if f.name in changed:
                    say(f"upload {f.name} to {group.tag}")
                    store.upload_asset(group.tag, f.path, name=f.name, clobber=restore.clobber)
                    out.uploaded.append(f"{group.tag}/{f.name}")
            current = store.get_release(group.tag)
            for arch in sorted({f.arch for f in usable}):
                wheels = [f for f in usable if f.arch == arch and f.name.endswith(".whl")]
                name = manifest.asset_name(arch)
                data = _restored_manifest(group, arch, wheels, restore)
                have = current.asset(name) if current else None
                if have is not None and have.sha256 == hashlib.sha256(data).hexdigest():
                    continue
                if have is not None and not any(w.name in changed for w in wheels):
                    continue  # this arch's wheels were already there: its manifest stays valid
                if have is not None and not restore.clobber:
                    out.warnings.append(f"release {group.tag}: kept the existing {name} (it differs from the "
                                        "restored one); pass --clobber to replace it")
                    continue
                path = Path(tmp) / name
                path.write_bytes(data)
                store.upload_asset(group.tag, path, name=name, clobber=True)
                out.manifests.append(f"{group.tag}/{name}")
    return RestoreResult(tuple(out.uploaded), tuple(out.unchanged), tuple(out.manifests), tuple(out.refused),
                         tuple(out.warnings))


def artifact_summary(listings: Mapping[str, Sequence[Artifact]]) -> str:
    """One line: how many artifacts each run lists (for logs)."""
    return ", ".join(f"run {run}: {len(items)} artifact(s)" for run, items in listings.items())


__all__ = ["ARTIFACT_NAME", "ArtifactRefused", "ReleaseRestore", "RestorePlan", "RestoreResult", "apply",
           "artifact_summary", "collect", "extract_wheels", "notes", "plan", "versions_from_text",
           "versions_text_at"]
