"""Publish one built row onto its release: plan first, then apply.

Order matters: ensure the release, upload the wheels, then their ``.metadata``
files, the arch's provenance statement (ci/publish/provenance.py), and the arch's build
manifest LAST. A manifest is the claim "these exact wheels passed the checks",
so it must never precede them (the anchor uploaded it first, and a failed wheel
upload then looked complete). The provenance follows the wheels it names and
precedes the manifest: a release that stopped part way has no statement naming
a missing wheel, and without its manifest the row is planned again, so the
next run uploads the statement too.

The build output is not trusted beyond its digests: every wheel must be a
project the component publishes (ci/model/wheel_packages.py), and each ``.metadata``
is made here from the wheel's own METADATA; a sidecar in the dist folder is
never uploaded (pip resolves dependencies from it, not from the wheel).

What a pinned URL serves does not change behind it: before anything is
uploaded, each asset of the plan is compared with what the release holds under
its name. A wheel or ``.metadata`` whose published bytes differ is refused,
naming both sha256, unless ``replace`` is asked for (``--replace``); the
manifest and the provenance statement describe the wheels and follow them. The
log says of every asset whether it is new, identical or replaced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci.base import log
from ci.base.digest import sha256_file
from ci.base.errors import ConfigError, UsageError, WheelhouseError
from ci.model import build_record, manifest, matrix, wheel_packages
from ci.model.build_record import BuildRecord
from ci.model.matrix import MatrixRow
from ci.model.naming import cuda_tag
from ci.model.versions import Versions
from ci.publish import provenance, signature
from ci.store.model import Asset, ReleaseStore, newest_by_name


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
    served: bool = False
    """A wheel or its ``.metadata``: what installers fetch by URL; other bytes replace it only with ``--replace``."""

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
    statement: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The provenance statement of the row's wheels (its predicate is what the publish job signs)."""

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
        # the same row built into another world's folder: a build of another versions file's row, whose
        # record names that world's CUDA in its tag
        same_row_elsewhere = path.name.replace(f"-{cuda_tag(row.cuda)}-py", "-*-py", 1)
        other = sorted(p for p in dist_root.glob(f"*/*/{same_row_elsewhere}") if p != path)
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


def plan(versions: Versions, row: MatrixRow, dist_root: Path, *, env: Mapping[str, str] | None = None,
         bundle: Path | None = None) -> ReleasePlan:
    """The steps that publish ``row``; ``env`` (default: this process's) names the workflow run for the
    provenance statement; ``bundle``, the Sigstore bundle the publish job's signing step made of that statement,
    is uploaded in its place (checked to carry exactly that statement)."""
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
        steps.append(Step("upload", row.release_tag, wheel.name, path, served=True))
    for wheel in built.wheels:
        steps.append(Step("upload", row.release_tag, f"{wheel.name}.metadata", data=metadata[wheel.name],
                          served=True))
    released = built.to_manifest()
    run = provenance.workflow_run(os.environ if env is None else env)
    statement = provenance.statement(released, row.to_json(), run=run, facts=built.sbom or None)
    steps.append(_provenance_step(row, statement, bundle))
    steps.append(Step("upload", row.release_tag, manifest.asset_name(row.arch), data=released.to_json().encode()))
    return ReleasePlan(row, tuple(steps), statement)


def _provenance_step(row: MatrixRow, statement: Mapping[str, Any], bundle: Path | None) -> Step:
    """The unsigned statement, or the bundle that signs it (refused, before anything is uploaded, unless it signs
    exactly this statement: these wheels, this predicate)."""
    if bundle is None:
        return Step("upload", row.release_tag, provenance.asset_name(row.arch), data=provenance.dumps(statement))
    try:
        data = bundle.read_bytes()
    except OSError as exc:
        raise WheelhouseError(f"--provenance-bundle {bundle}: cannot read it ({exc.strerror}); name the file the "
                              "signing step wrote (its bundle-path)") from None
    signed = signature.statement_of(signature.read_bundle(data, where=str(bundle)), where=str(bundle))
    problem = provenance.same_statement(signed, statement)
    if problem:
        raise WheelhouseError(f"{bundle}: the bundle does not sign this release's provenance statement: {problem}; "
                              f"sign what `invoke release --predicate-out` wrote, over dist/{row.world}/*.whl")
    return Step("upload", row.release_tag, provenance.bundle_asset_name(row.arch), data=data)


NEW = "new"
IDENTICAL = "identical"
REPLACED = "replaced"


@dataclass(frozen=True)
class Outcome:
    """What uploading one asset does to its release: what the release holds under the name now, and ours."""

    kind: str
    """``new``, ``identical`` or ``replaced``."""
    ours: str
    published: str | None = None
    """The sha256 the release serves under the name now; None for a new asset."""

    def render(self) -> str:
        if self.kind == REPLACED:
            return f"replaced (sha256 {self.published} -> {self.ours})"
        return f"{self.kind} (sha256 {self.ours})"


def _sha256_of(step: Step) -> str:
    return hashlib.sha256(step.data).hexdigest() if step.data is not None else sha256_file(step.file)


def _published_sha256(store: ReleaseStore, asset: Asset) -> str:
    """The sha256 of what the asset's URL serves: its digest, or for an asset uploaded before GitHub kept digests,
    its bytes hashed as they stream."""
    if asset.sha256 is not None:
        return asset.sha256
    digest = hashlib.sha256()
    for chunk in store.fetch(asset):
        digest.update(chunk)
    return digest.hexdigest()


def outcomes(release_plan: ReleasePlan, store: ReleaseStore) -> dict[str, Outcome]:
    """Per uploaded asset name, what its upload would do to the release as the store holds it now."""
    existing = store.get_release(release_plan.row.release_tag)
    found: dict[str, Outcome] = {}
    for step in release_plan.steps:
        if step.action != "upload":
            continue
        ours = _sha256_of(step)
        asset = newest_by_name(existing.assets).get(step.name) if existing is not None else None  # what is served
        if asset is None:
            found[step.name] = Outcome(NEW, ours)
            continue
        published = _published_sha256(store, asset)
        found[step.name] = Outcome(IDENTICAL if published == ours else REPLACED, ours, published)
    return found


def _refuse_replacements(release_plan: ReleasePlan, found: dict[str, Outcome]) -> None:
    """Without --replace, a wheel or .metadata the release serves with other bytes stops the release before anything
    is uploaded: one line naming both digests."""
    tag = release_plan.row.release_tag
    for step in release_plan.steps:
        outcome = found.get(step.name)
        if step.served and outcome is not None and outcome.kind == REPLACED:
            raise WheelhouseError(
                f"release {tag}: {step.name} is published with sha256 {outcome.published}, this build's is "
                f"{outcome.ours}: its URL would serve other bytes; pass --replace to replace it, or bump the version")


def apply(release_plan: ReleasePlan, store: ReleaseStore, *, replace: bool = False,
          dry_run: bool = False) -> dict[str, Outcome]:
    """Carry out the steps in order, each a named step of the log saying what it does to its asset (new, identical,
    replaced); with a dry-run store each step only records its API calls. Without ``replace``, a served asset with
    other bytes is refused first (nothing is uploaded then)."""
    found = outcomes(release_plan, store)
    if not replace:
        _refuse_replacements(release_plan, found)
    with log.Steps(log.get("release")) as steps:
        for step in release_plan.steps:
            outcome = found.get(step.name)
            steps.start(f"{'plan' if dry_run else 'release'}: {step.render()}" + (f": {outcome.render()}" if outcome
                                                                                   else ""))
            # identical bytes may be written over (an asset uploaded before GitHub kept digests is hashed to know)
            _apply_step(step, store, clobber=replace or not step.served or (outcome is not None
                                                                            and outcome.kind == IDENTICAL))
    return found


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
