"""Skip detection: which matrix rows must build, and why, without downloading a wheel.

A row is skipped only when all of these hold, and anything unreadable or
ambiguous means "build" (fail closed):

1. its release exists with exactly the expected title;
2. the component lists ``wheel_packages``;
3. the release holds this arch's manifest, and the manifest records this row's
   build-input fingerprint — which includes the commit a moving ref (apex
   ``master``) points at *now*, resolved with ``git ls-remote`` — and passed checks;
4. every wheel the manifest names is an asset of the release whose ``digest``
   equals the manifest's sha256 (so the bytes served are the bytes checked);
5. every ``wheel_packages`` entry has such a wheel for the row's arch.

The cost is one release listing (ceil(N/100) requests) and one small manifest
download per row; the anchor downloaded every platform wheel once per row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from packaging.utils import canonicalize_name

from ci.base.errors import WheelhouseError
from ci.building import sources
from ci.model import fingerprint, manifest, matrix, naming
from ci.model.matrix import MatrixRow
from ci.model.versions import REPO_ROOT, Versions
from ci.store.model import Release, ReleaseStore

Resolver = Callable[[MatrixRow], str | None]



@dataclass(frozen=True)
class Decision:
    row: MatrixRow
    build: bool
    reason: str


@dataclass(frozen=True)
class Plan:
    decisions: tuple[Decision, ...]
    manifest_bytes: int
    """Bytes of manifests read (no wheel is ever downloaded)."""

    @property
    def to_build(self) -> list[MatrixRow]:
        return [d.row for d in self.decisions if d.build]

    def render_text(self) -> str:
        lines = [f"{'build' if d.build else 'skip ':5}  {d.row.label:60}  {_predicted(d) + '  ' if d.build else ''}"
                 f"{d.reason}" for d in self.decisions]
        lines.append(f"{len(self.to_build)} row(s) to build, {len(self.decisions) - len(self.to_build)} to skip")
        lines += _resumable_lines(self.to_build)
        return "\n".join(lines)

    def render_markdown(self) -> str:
        builds = len(self.to_build)
        lines = [
            "## Wheelhouse build plan",
            "",
            f"**{builds} row(s) would build, {len(self.decisions) - builds} row(s) would be skipped.**",
            "",
            "| Component | Ref | Arch | CUDA | Python | Torch | Decision | Predicted build | Reason |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for d in self.decisions:
            r = d.row
            decision = ":hammer: build" if d.build else ":fast_forward: skip"
            reason = d.reason.replace("|", "\\|")
            lines.append(
                f"| {r.component} | `{r.ref}` | {r.arch} | {r.cuda} | {'+'.join(r.pythons)} | {r.torch} | {decision} | "
                f"{_predicted(d) if d.build else ''} | {reason} |"
            )
        resumable = _resumable_lines(self.to_build)
        if resumable:
            lines += ["", *(f"- {line}" for line in resumable)]
        return "\n".join(lines) + "\n"


def _predicted(decision: Decision) -> str:
    """The build's predicted time on its runner and whether it fits build_timeout (ci/timing/time_model.py), and its wheels'
    predicted sizes (ci/timing/size_model.py)."""
    from ci.timing import size_model, time_model

    prediction = time_model.predict(decision.row)
    timed = prediction.short() if prediction else "not timed yet"
    return f"{timed}, {size_model.predict(decision.row).short()}"


def _resumable_lines(rows: list[MatrixRow]) -> list[str]:
    """One line per row the model says does not fit its build_timeout: how many runs the resumable path takes."""
    from ci.timing import time_model

    lines = []
    for row in rows:
        prediction = time_model.predict(row)
        if prediction and not prediction.fits:
            lines.append(f"{row.label}: predicted {prediction.describe()}; re-run its failed job "
                         f"{prediction.runs - 1} time(s): each run resumes the build the one before saved")
    return lines


def resolve_revision(versions: Versions, row: MatrixRow) -> str | None:
    """The source revision the build would use now (git commit, pinned sdist digest, directory digest)."""
    component = versions.component(row.component)
    source = component.source
    if source.kind == "git":
        return sources.resolve_ref(source.location, component.ref)
    if source.kind == "sdist":
        return source.sha256  # unpinned sdists resolve at build time: fail closed
    return sources.local_directory(REPO_ROOT / source.location).revision


def decide(
    versions: Versions,
    rows: Iterable[MatrixRow],
    store: ReleaseStore,
    *,
    resolve: Resolver | None = None,
    releases: list[Release] | None = None,
) -> Plan:
    resolve = resolve or (lambda row: resolve_revision(versions, row))
    by_tag = {r.tag: r for r in (releases if releases is not None else store.list_releases()) if not r.draft}
    decisions = []
    read_bytes = 0
    revisions: dict[str, str | None] = {}
    for row in rows:
        if row.component not in revisions:
            revisions[row.component] = resolve(row)
        decision, size = _decide_row(versions, row, by_tag.get(row.release_tag), store, revisions[row.component])
        read_bytes += size
        decisions.append(decision)
    from ci.timing import size_model

    for decision in decisions:  # a row to build whose wheel could not be uploaded is refused before any build
        if decision.build:
            size_model.refuse_over_budget(decision.row, versions_name=versions.path.name)
    return Plan(tuple(decisions), read_bytes)


def _decide_row(versions: Versions, row: MatrixRow, release: Release | None, store: ReleaseStore,  # noqa: C901 - a flat sequence of build/skip cases, first match wins
                revision: str | None) -> tuple[Decision, int]:
    def build(reason: str, size: int = 0) -> tuple[Decision, int]:
        return Decision(row, True, reason), size

    if revision is None:
        return build(f"cannot resolve {row.ref} to a revision; building")
    if release is None:
        return build(f"release {row.release_tag} does not exist")
    expected_title = matrix.release_title(versions, row)
    if release.title != expected_title:
        return build(f"title mismatch: expected {expected_title!r}, found {release.title!r}")
    if not row.settings.wheel_packages:
        return build("no wheel_packages listed; always built")
    asset = release.asset(manifest.asset_name(row.arch))
    if asset is None:
        return build(f"no {manifest.asset_name(row.arch)} on the release")
    try:
        data = store.read_asset(row.release_tag, asset.name, asset=asset)
        stored = manifest.parse(data, where=f"{row.release_tag}/{asset.name}")
    except WheelhouseError as error:
        return build(f"manifest unreadable: {error}")
    size = len(data)
    wanted = fingerprint.fingerprint(fingerprint.declared_config(versions, row, revision))
    if stored.restored:
        return build("release was restored from artifacts; rebuild to attach a build manifest", size)
    if stored.fingerprint != wanted:
        return build(f"build inputs changed (fingerprint {stored.fingerprint[:12]} -> {wanted[:12]})", size)
    if not stored.checks_passed:
        return build("the stored build did not pass the wheel checks", size)
    for wheel in stored.wheels:
        found = release.asset(wheel.name)
        if found is None:
            return build(f"wheel {wheel.name} is missing from the release", size)
        if found.sha256 is None:
            return build(f"wheel {wheel.name} has no digest to compare; building", size)
        if found.sha256 != wheel.sha256:
            return build(f"wheel {wheel.name} differs from the checked build (sha256)", size)
    present = {
        canonicalize_name(w.name.split("-", 1)[0])
        for w in stored.wheels
        if naming.wheel_covers_arch(w.name, row.arch)
    }
    missing = [p for p in row.settings.wheel_packages if canonicalize_name(p) not in present]
    if missing:
        return build(f"missing wheel package(s) for {row.arch}: {', '.join(missing)}", size)
    return Decision(row, False, f"complete: fingerprint {wanted[:12]}, {len(stored.wheels)} wheel(s) match by digest"), size
