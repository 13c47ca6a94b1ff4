"""Publish one built row onto its release: plan first, then apply.

Order matters: ensure the release, upload the wheels, then their ``.metadata``
files, the arch's provenance statement (ci/provenance.py), and the arch's build
manifest LAST. A manifest is the claim "these exact wheels passed the checks",
so it must never precede them (the anchor uploaded it first, and a failed wheel
upload then looked complete). The provenance follows the wheels it names and
precedes the manifest: a release that stopped part way has no statement naming
a missing wheel, and without its manifest the row is planned again, so the
next run uploads the statement too.

The build output is not trusted beyond its digests: every wheel must be a
project the component publishes (ci/wheel_packages.py), and each ``.metadata``
is made here from the wheel's own METADATA; a sidecar in the dist folder is
never uploaded (pip resolves dependencies from it, not from the wheel).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ci import build_record, log, manifest, matrix, provenance, wheel_packages
from ci.build_record import BuildRecord
from ci.digest import sha256_file
from ci.errors import ConfigError, UsageError, WheelhouseError
from ci.matrix import MatrixRow
from ci.store.model import ReleaseStore
from ci.versions import Versions


@dataclass(frozen=True)
class Step:
    action: str  # "ensure-release" | "upload"
    tag: str
    name: str = ""
    path: Path | None = None
    data: bytes | None = None
    """Content to upload when there is no file (the manifest)."""
    title: str = ""
    body: str = ""

    @property
    def file(self) -> Path:
        """The file an upload step without ``data`` sends."""
        if self.path is None:
            raise RuntimeError(f"upload step for {self.name}: neither data nor a path")
        return self.path

    def render(self) -> str:
        if self.action == "ensure-release":
            return f"ensure release {self.tag} (title: {self.title!r}, make_latest: false)"
        size = len(self.data) if self.data is not None else self.file.stat().st_size
        return f"upload {self.name} to {self.tag} ({size} bytes)"


@dataclass(frozen=True)
class ReleasePlan:
    row: MatrixRow
    steps: tuple[Step, ...]

    def render(self) -> str:
        return "\n".join(f"{i}. {step.render()}" for i, step in enumerate(self.steps, 1))


def notes(row: MatrixRow) -> str:
    """Release body: stable text (no per-build content), so re-runs do not overwrite edits needlessly."""
    pythons = ", ".join(row.pythons)
    return (
        f"Prebuilt CUDA wheel(s) for {row.component} on Python {pythons} / torch {row.torch}, pinned to `{row.ref}`. "
        "Each arch's wheelhouse-build-manifest-<arch>.json records the source revision, the build-input "
        "fingerprint and the sha256 of every wheel that passed the checks.\n"
        + _rehosted_note(row)
    )


def _rehosted_note(row: MatrixRow) -> str:
    """What the release holds that was not built here: the wheels versions.yaml's ``rehost`` names."""
    if not row.settings.rehost:
        return ""
    names = ", ".join(row.settings.rehost)
    return (f"\n{names}: upstream's wheel(s), rehosted unchanged (versions.yaml `rehost`): downloaded from "
            "upstream's index and checked here, not built from the sources; every other wheel is.\n")


def read_record(row: MatrixRow, dist_root: Path) -> tuple[Path, BuildRecord]:
    """The build record of ``row`` under ``dist_root``, validated, and checked to be a build of that row."""
    path = build_record.path_for(row, dist_root)
    if not path.is_file():
        # the same tag built into another world's folder: a build of another versions file's row
        other = sorted(p for p in dist_root.glob(f"*/*/{path.name}") if p != path)
        if other:
            raise UsageError(f"no build record {path}, but {other[0]} is one of another world: it was built with "
                             "another versions file; set WHEELHOUSE_VERSIONS to that file for the release too")
        raise WheelhouseError(
            f"no build record {path}; build the row first (nox -s {row.session}) or point --dist at the build output"
        )
    record = BuildRecord.read(path, fix=f"rebuild the row (nox -s {row.session})")
    wanted = row.to_json()
    for field in build_record.ROW_IDENTITY:
        if record.row[field] != wanted[field]:
            raise ConfigError(f"{path}: records a build with {field} {record.row[field]!r}, but the row to release "
                              f"({row.label}) has {field} {wanted[field]!r}; release the row it was built for, or "
                              f"rebuild this one (nox -s {row.session})")
    return path, record


def plan(versions: Versions, row: MatrixRow, dist_root: Path, *, env: Mapping[str, str] | None = None) -> ReleasePlan:
    """The steps that publish ``row``; ``env`` (default: this process's) names the workflow run for the
    provenance statement."""
    record_path, built = read_record(row, dist_root)
    folder = record_path.parent
    if not built.checks_passed:
        raise WheelhouseError(f"{record_path}: the wheel checks did not pass for this build; it cannot be released")
    steps = [Step("ensure-release", row.release_tag, title=matrix.release_title(versions, row), body=notes(row))]
    projects = wheel_packages.allowed(row.component, row.settings.wheel_packages)
    metadata: dict[str, bytes] = {}
    for wheel in built.wheels:
        path = folder / wheel.name
        if not path.is_file():
            raise WheelhouseError(f"{path}: listed in {record_path.name} but missing; rebuild the row")
        if sha256_file(path) != wheel.sha256:
            raise WheelhouseError(f"{path}: bytes differ from the build record (sha256); rebuild the row")
        metadata[wheel.name] = wheel_packages.checked_metadata(path, row.component, projects)
        steps.append(Step("upload", row.release_tag, wheel.name, path))
    for wheel in built.wheels:
        steps.append(Step("upload", row.release_tag, f"{wheel.name}.metadata", data=metadata[wheel.name]))
    released = built.to_manifest()
    run = provenance.workflow_run(os.environ if env is None else env)
    statement = provenance.statement(released, row.to_json(), run=run, facts=built.sbom or None)
    steps.append(Step("upload", row.release_tag, provenance.asset_name(row.arch), data=provenance.dumps(statement)))
    steps.append(Step("upload", row.release_tag, manifest.asset_name(row.arch), data=released.to_json().encode()))
    return ReleasePlan(row, tuple(steps))


def _refuse_replacements(release_plan: ReleasePlan, store: ReleaseStore) -> None:
    """With --no-clobber, name the first asset that would be replaced, before anything is uploaded."""
    tag = release_plan.row.release_tag
    existing = store.get_release(tag)
    if existing is None:
        return
    for step in release_plan.steps:
        if step.action != "upload":
            continue
        asset = existing.asset(step.name)
        if asset is None or asset.sha256 is None:  # nothing there, or no digest to compare: the store decides
            continue
        ours = hashlib.sha256(step.data).hexdigest() if step.data is not None else sha256_file(step.file)
        if asset.sha256 != ours:
            raise WheelhouseError(f"release {tag}: asset {step.name} exists with other bytes (sha256 "
                                  f"{asset.sha256[:12]}…, this build {ours[:12]}…); drop --no-clobber to replace "
                                  "it, or bump the version")


def apply(release_plan: ReleasePlan, store: ReleaseStore, *, clobber: bool = True, dry_run: bool = False) -> None:
    """Carry out the steps in order, each a named step of the log; with a dry-run store each step
    only records its API calls."""
    if not clobber:
        _refuse_replacements(release_plan, store)
    with log.Steps(log.get("release")) as steps:
        for step in release_plan.steps:
            steps.start(f"{'plan' if dry_run else 'release'}: {step.render()}")
            _apply_step(step, store, clobber=clobber)


def _apply_step(step: Step, store: ReleaseStore, *, clobber: bool) -> None:
    if step.action == "ensure-release":
        store.ensure_release(step.tag, step.title, step.body)
    elif step.data is not None:
        with tempfile.TemporaryDirectory(prefix="wheelhouse-release-") as tmp:
            path = Path(tmp) / step.name
            path.write_bytes(step.data)
            store.upload_asset(step.tag, path, name=step.name, clobber=clobber)
    else:
        store.upload_asset(step.tag, step.file, name=step.name, clobber=clobber)
