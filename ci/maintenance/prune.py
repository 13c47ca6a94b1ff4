"""Delete releases versions.yaml no longer names, by a policy the dry run prints.

Policy, in the order it is applied to each published release:

1. KEEP every release whose tag a current matrix row maps to (any row's ``release_tag``). Nothing
   below can override this.
2. KEEP releases whose title does not follow the naming scheme: nothing is known about them.
3. KEEP releases with a segment in a ``keep_worlds`` world (``cu130/torch2.13``).
4. DELETE, with the reason:
   - ``retired component``: the component is not in versions.yaml any more;
   - ``superseded ref``: the component is now at another ref;
   - ``dropped torch``: no row of the component builds that torch any more;
   - ``dropped Python``: no row of the component builds that Python (set) any more.
   A release that matches the current component, ref, Python and torch under another tag (an old
   tag scheme) is KEPT: migrate-tags renames it.
5. With ``older_than``, a release to delete is kept unless it was published before ``now -
   older_than``; a release of unknown age is kept.

A plan that would delete every release, more than :data:`MAX_DELETED_SHARE` of them, or releases of
components the versions file does not name at all (the signs of a wrong versions file or store) is
refused unless ``force``. Apply first re-publishes the index without the releases it deletes, to the
target the caller passes, then deletes them (the GitHub store deletes their git tags too): a kill in
between leaves releases no index links to, never an index linking to deleted wheels.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

from ci.base.errors import UsageError, WheelhouseError
from ci.model import matrix, naming
from ci.model.versions import Versions
from ci.publish.index import check_world
from ci.publish.pages import IndexWhere, PublishOutcome, publish
from ci.store.model import Release, ReleaseStore

MAX_DELETED_SHARE = 0.5
"""Share of the store's releases one prune may delete without ``force``."""
_AGE = re.compile(r"^\s*(\d+)\s*([dhw])\s*$")
_UNITS = {"h": "hours", "d": "days", "w": "weeks"}


def parse_age(text: str) -> timedelta:
    """``90d``, ``12h``, ``2w``."""
    m = _AGE.match(text or "")
    if not m:
        raise UsageError(f"--older-than {text!r}: give a number and a unit, e.g. 90d, 12h or 2w")
    return timedelta(**{_UNITS[m[2]]: int(m[1])})


def parse_worlds(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """``cu130/torch2.13,cpu/torch2.13`` -> the worlds, each checked."""
    if text is None:
        return ()
    items = text.split(",") if isinstance(text, str) else list(text)
    out = []
    for raw in items:
        world = raw.strip()
        if world:
            try:
                out.append(check_world(world))
            except WheelhouseError:
                raise UsageError(f"--keep-worlds: {world!r} is not a world; use cu<major><minor>/torch<X.Y> "
                                 "or cpu/torch<X.Y>, e.g. cu130/torch2.13") from None
    return tuple(dict.fromkeys(out))


def _parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    try:
        value = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return value if value.tzinfo else value.replace(tzinfo=timezone.utc)


@dataclass(frozen=True)
class Decision:
    tag: str
    title: str
    delete: bool
    reason: str
    created_at: str | None = None

    def render(self) -> str:
        return f"  {'delete' if self.delete else 'keep  '}  {self.tag}  ({self.reason})"


@dataclass(frozen=True)
class PrunePlan:
    store: str
    policy: tuple[str, ...]
    decisions: tuple[Decision, ...]
    versions: str = ""
    """The versions file the plan was made from."""
    unnamed: tuple[str, ...] = ()
    """Components with releases to delete that the versions file does not name at all."""

    @property
    def to_delete(self) -> tuple[Decision, ...]:
        return tuple(d for d in self.decisions if d.delete)

    def refusal(self) -> WheelhouseError | None:
        """Why applying this plan needs ``force``: it deletes every release, more than
        :data:`MAX_DELETED_SHARE` of them, or releases of components the versions file does not name."""
        doomed, total = len(self.to_delete), len(self.decisions)
        problems = []
        if doomed and doomed == total:
            problems.append(f"all {total} release(s) of {self.store}")
        elif doomed > MAX_DELETED_SHARE * total:
            problems.append(f"{doomed} of the {total} releases of {self.store} (more than {MAX_DELETED_SHARE:.0%})")
        if self.unnamed:
            more = f" and {len(self.unnamed) - 3} more" if len(self.unnamed) > 3 else ""
            problems.append(f"releases of {', '.join(self.unnamed[:3])}{more}, which {self.versions} does not name")
        if not problems:
            return None
        return WheelhouseError(
            f"prune would delete {'; and '.join(problems)}: check that the versions file ({self.versions}, "
            "WHEELHOUSE_VERSIONS) and the store (--store / WHEELHOUSE_STORE) are the right ones; pass --force if "
            "this is intended")

    def render(self) -> str:
        lines = [f"prune: {len(self.decisions)} release(s) in {self.store}, against {self.versions}", "policy:"]
        lines += [f"  {p}" for p in self.policy]
        lines += [d.render() for d in self.decisions]
        lines.append(f"{len(self.to_delete)} to delete, {len(self.decisions) - len(self.to_delete)} to keep")
        return "\n".join(lines)


def _delete_reason(versions: Versions, release: Release) -> tuple[bool, str]:
    parsed = naming.parse_title(release.title)
    if parsed is None:
        return False, "title does not follow the naming scheme; delete it by hand if unwanted"
    component = versions.components.get(parsed.component)
    if component is None:
        return True, f"retired component: {parsed.component} is not in {versions.path.name}"
    if naming.sanitize_ref(parsed.ref) != naming.sanitize_ref(component.ref):
        return True, f"superseded ref: {parsed.component} is now at {component.ref} (this is {parsed.ref})"
    rows = matrix.component_rows(versions, component)
    torches = {r.torch for r in rows}
    dropped = sorted({s.torch for s in parsed.segments} - torches)
    if dropped:
        return True, (f"dropped torch {', '.join(dropped)}: no build_matrix row of {parsed.component} builds it "
                      f"(now: {', '.join(sorted(torches))})")
    built = {p for r in rows for p in r.pythons}
    pythons = sorted({s.python for s in parsed.segments}, key=naming.version_key)
    missing = [p for p in pythons if p not in built]
    if missing:
        return True, (f"dropped Python {', '.join(missing)}: no build_matrix row of {parsed.component} builds it "
                      f"(now: {', '.join(sorted(built, key=naming.version_key))})")
    if "-".join(pythons) not in {r.release_python for r in rows}:
        return False, (f"holds Python {'+'.join(pythons)} in one release (an older scheme); delete it by hand once "
                       "the current releases are published")
    return False, "matches the current component, ref, Python and torch under an old tag; run migrate-tags"


def age_text(age: timedelta) -> str:
    """``90d``, ``12h``: the form parse_age reads (weeks shown as days)."""
    seconds = int(age.total_seconds())
    if seconds % 86400 == 0:
        return f"{seconds // 86400}d"
    return f"{seconds // 3600}h" if seconds % 3600 == 0 else f"{seconds}s"


def plan(versions: Versions, releases: Sequence[Release], *, keep_worlds: Sequence[str] = (),
         older_than: timedelta | None = None, now: datetime | None = None, store: str = "") -> PrunePlan:
    current = {row.release_tag for row in matrix.expand(versions)}
    now = now or datetime.now(timezone.utc)
    cutoff = now - older_than if older_than is not None else None
    policy = [
        f"keep every release a build_matrix row of {versions.path.name} maps to ({len(current)} tag(s))",
        "keep releases whose title does not follow the naming scheme",
    ]
    if keep_worlds:
        policy.append(f"keep releases in the world(s) {', '.join(keep_worlds)}")
    policy.append("delete releases of retired components, superseded refs, dropped torch versions and Pythons")
    if cutoff is not None and older_than is not None:  # one is set exactly when the other is
        policy.append(f"but only those published before {cutoff:%Y-%m-%d %H:%M} UTC (older than {age_text(older_than)}); "
                      "a release of unknown age is kept")
    decisions = []
    for release in sorted((r for r in releases if not r.draft), key=lambda r: r.tag):
        def keep(reason: str, release: Release = release) -> Decision:
            return Decision(release.tag, release.title, False, reason, release.created_at)

        if release.tag in current:
            decisions.append(keep("current: a build_matrix row maps to this tag"))
            continue
        parsed = naming.parse_title(release.title)
        worlds = sorted({naming.world_path(s.cuda, s.torch) for s in parsed.segments}) if parsed else []
        kept_world = [w for w in worlds if w in keep_worlds]
        if kept_world:
            decisions.append(keep(f"in kept world {', '.join(kept_world)}"))
            continue
        delete, reason = _delete_reason(versions, release)
        if delete and cutoff is not None and older_than is not None:
            published = _parse_time(release.created_at)
            if published is None:
                delete, reason = False, f"{reason}; but its age is unknown, and --older-than is set"
            elif published >= cutoff:
                delete, reason = False, f"{reason}; but published {published:%Y-%m-%d}, within {age_text(older_than)}"
        decisions.append(Decision(release.tag, release.title, delete, reason, release.created_at))
    unnamed = {parsed.component for d in decisions if d.delete and (parsed := naming.parse_title(d.title)) is not None
               and parsed.component not in versions.components}
    return PrunePlan(store, tuple(policy), tuple(decisions), str(versions.path), tuple(sorted(unnamed)))


@dataclass(frozen=True)
class PruneResult:
    deleted: tuple[str, ...]
    index: PublishOutcome | None
    """The re-publish's outcome, None when no target was given."""

    def render(self) -> str:
        lines = []
        if self.index is not None:
            lines.append(f"index: {self.index.summary.line()}; "
                         f"{self.index.result.target}: {self.index.result.changes.line()}")
        lines += [f"deleted {tag}" for tag in self.deleted]
        lines.append(f"{len(self.deleted)} release(s) deleted")
        return "\n".join(lines)


def apply(prune: PrunePlan, store: ReleaseStore, *, index: IndexWhere | None = None,
          force: bool = False) -> PruneResult:
    """Re-publish the index without the planned releases, then delete them (a missing one is fine).

    ``index``: where to re-publish it (:func:`ci.publish.pages.publish`, the flow publish-index runs). Refused, with
    nothing changed, when :meth:`PrunePlan.refusal` objects and not ``force``, or when the index would lose
    more wheel links than the deletions explain (see ci.publish.pages)."""
    refusal = None if force else prune.refusal()
    if refusal is not None:
        raise refusal
    doomed = {decision.tag for decision in prune.to_delete}
    outcome = None
    if index is not None:
        remaining = [release for release in store.list_releases() if release.tag not in doomed]
        outcome = publish(store, index, releases=remaining, allow_shrink=force, force=force, shrink_flag="--force")
    deleted = []
    for decision in prune.to_delete:
        store.delete_release(decision.tag)
        deleted.append(decision.tag)
    return PruneResult(tuple(deleted), outcome)
