"""Retag releases made under the older tag schemes to the current one.

Tag schemes, oldest first (the anchor's history):

- stage A: ``<component>-<ref>`` (one release per component);
- stage B: ``<component>-<ref>-py<X.Y>``, with the bare stage-A form kept for Python 3.12;
- stage C: ``<component>-<sanitized ref>-py<X.Y>-torch<T>``, one release for every world of a
  (Python, torch): a CPU and a CUDA row shared it, and one world's wheel replaced the other's;
- current: ``<component>-<sanitized ref>-<cuXY|cpu>-py<X.Y>-torch<T>`` (:func:`ci.model.naming.release_tag`).

The new tag comes from the release's TITLE (``<component> <ref> - [<arch> ]cu<cuda> py<X.Y>
torch<T>; ...``, :func:`ci.model.naming.parse_title`), which every stage wrote the same way. A title must
name exactly one distinct (Python, torch) pair and one world (CUDA major.minor, or cpu); anything
else is "unparseable" and the release is never touched: a stage-C release whose title names two
worlds holds the wheels of both under one name each, and which world's bytes are left there is for a
person to find out (delete it and release each world again).

Refusals: an unparseable title, or a target tag that two releases claim (a release already at its
target counts as a claim) or that another release already holds. One offender blocks the whole
migration unless ``skip_unparseable``: then every offender is left exactly as it is, listed, and
the rest is migrated. (A colliding pair is skipped too: which of the two should own the tag is a
decision for a person, and leaving both alone is always safe.)

Apply is resumable: a release already at its target is "already migrated", so a run killed after
k renames finishes the others when run again, touching nothing done. GitHub keeps the old git tag
when a release's ``tag_name`` changes; such leftovers (tags no release holds whose name is an old
form of a release's tag) are reported, and deleted with ``delete_old_tags``. The local store has no
git tags.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ci.base.errors import WheelhouseError
from ci.maintenance import delete_git_tag, git_tags
from ci.model import naming
from ci.store.model import Release, ReleaseStore

RENAME = "rename"
ALREADY = "already migrated"
UNPARSEABLE = "unparseable"
COLLISION = "collision"

STAGE_A = "stage A tag"
STAGE_B = "stage B tag"
STAGE_C = "stage C tag, without its world's CUDA part"
OTHER = "tag of no known scheme (renamed by its title)"


class MigrationRefused(WheelhouseError):
    """The plan has offenders and ``skip_unparseable`` is off; ``offenders`` holds one line each."""

    def __init__(self, message: str, offenders: Sequence[str]) -> None:
        super().__init__(message)
        self.offenders = tuple(offenders)


@dataclass(frozen=True)
class Entry:
    tag: str
    title: str
    status: str
    """``rename``, ``already migrated``, ``unparseable`` or ``collision``."""
    target: str | None
    reason: str

    def render(self) -> str:
        if self.status == RENAME:
            return f"  rename            {self.tag} -> {self.target}  ({self.reason})"
        if self.status == ALREADY:
            return f"  already migrated  {self.tag}"
        return f"  {self.status:<17} {self.tag}  ({self.reason})"


@dataclass(frozen=True)
class MigrationPlan:
    store: str
    entries: tuple[Entry, ...]
    leftover_tags: tuple[str, ...]
    """Git tags no release holds whose name is an old form of a release's tag (present now)."""
    has_git_tags: bool
    skip_unparseable: bool = False
    delete_old_tags: bool = False

    @property
    def renames(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.status == RENAME)

    @property
    def offenders(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.status in (UNPARSEABLE, COLLISION))

    @property
    def blocked(self) -> bool:
        return bool(self.offenders) and not self.skip_unparseable

    @property
    def tags_after(self) -> tuple[str, ...]:
        """The leftover git tags once the renames are done (on a store with git tags)."""
        if not self.has_git_tags:
            return ()
        return tuple(sorted({*self.leftover_tags, *(e.tag for e in self.renames)}))

    def offender_lines(self) -> list[str]:
        return [f"{e.status}: {e.tag}: {e.reason}" for e in self.offenders]

    def refusal(self) -> MigrationRefused | None:
        if not self.blocked:
            return None
        bad = [e.tag for e in self.offenders if e.status == UNPARSEABLE]
        clash = [e.tag for e in self.offenders if e.status == COLLISION]
        parts = []
        if bad:
            parts.append(f"{len(bad)} unparseable title(s) ({', '.join(bad)})")
        if clash:
            parts.append(f"{len(clash)} release(s) in tag collisions ({', '.join(clash)})")
        return MigrationRefused(
            f"refusing to migrate: {'; '.join(parts)}; fix their titles or delete them, "
            "or pass --skip-unparseable to migrate the rest and leave these as they are",
            self.offender_lines(),
        )

    def render(self) -> str:
        counts = {s: sum(1 for e in self.entries if e.status == s) for s in (RENAME, ALREADY, UNPARSEABLE, COLLISION)}
        lines = [f"migrate-tags: {len(self.entries)} release(s) in {self.store}"]
        lines += [e.render() for e in self.entries]
        lines.append(
            f"{counts[RENAME]} to rename, {counts[ALREADY]} already migrated, {counts[UNPARSEABLE]} unparseable, "
            f"{counts[COLLISION]} in collisions"
        )
        if self.offenders and self.skip_unparseable:
            lines.append(f"skipped (left as they are): {', '.join(e.tag for e in self.offenders)}")
        if not self.has_git_tags:
            lines.append("git tags: none (this store has no git tags)")
        elif self.leftover_tags:
            verb = "will be deleted" if self.delete_old_tags else "stay; pass --delete-old-tags to delete them"
            lines.append(f"leftover git tags (no release holds them) {verb}: {', '.join(self.leftover_tags)}")
        if self.has_git_tags and self.renames:
            verb = "are deleted after the renames" if self.delete_old_tags else (
                "stay as git tags after the renames; pass --delete-old-tags to delete them")
            lines.append(f"old tags of renamed releases {verb}: {', '.join(e.tag for e in self.renames)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class MigrationResult:
    renamed: tuple[tuple[str, str], ...]
    deleted_tags: tuple[str, ...]
    leftover_tags: tuple[str, ...]
    """Old tags still present (not deleted: ``delete_old_tags`` was off)."""
    skipped: tuple[str, ...]

    def render(self) -> str:
        lines = [f"renamed {old} -> {new}" for old, new in self.renamed]
        lines += [f"deleted git tag {t}" for t in self.deleted_tags]
        if self.leftover_tags:
            lines.append(f"leftover git tags (delete with --delete-old-tags): {', '.join(self.leftover_tags)}")
        if self.skipped:
            lines.append(f"skipped: {', '.join(self.skipped)}")
        lines.append(f"{len(self.renamed)} renamed, {len(self.deleted_tags)} git tag(s) deleted")
        return "\n".join(lines)


def _old_forms(component: str, ref: str, python: str, torch: str) -> dict[str, set[str]]:
    """The tags each earlier scheme gave this release, by scheme."""
    refs = {ref, naming.sanitize_ref(ref)}
    return {STAGE_A: {f"{component}-{r}" for r in refs},
            STAGE_B: {f"{component}-{r}-py{python}" for r in refs},
            STAGE_C: {f"{component}-{r}-py{python}-torch{torch}" for r in refs}}


def _classify(release: Release) -> Entry:
    parsed = naming.parse_title(release.title)
    if parsed is None:
        return Entry(release.tag, release.title, UNPARSEABLE, None,
                     f"title {release.title!r} does not follow '<component> <ref> - [<arch> ]cu<cuda>|cpu py<X.Y> "
                     "torch<T>; ...'")
    pairs = sorted({(s.python, s.torch) for s in parsed.segments})
    if len(pairs) != 1:
        listed = ", ".join(f"py{p} torch{t}" for p, t in pairs)
        return Entry(release.tag, release.title, UNPARSEABLE, None,
                     f"title names {len(pairs)} (Python, torch) pairs ({listed}); a release holds exactly one")
    worlds = sorted({naming.cuda_tag(s.cuda) for s in parsed.segments})
    if len(worlds) != 1:
        return Entry(release.tag, release.title, UNPARSEABLE, None,
                     f"title names {len(worlds)} worlds ({', '.join(worlds)}), whose wheels of one name replaced "
                     "each other in this one release; a release holds exactly one world: delete it and release "
                     "each world again")
    (python, torch), cuda = pairs[0], parsed.segments[0].cuda
    target = naming.release_tag(parsed.component, parsed.ref, cuda, python, torch)
    if release.tag == target:
        return Entry(release.tag, release.title, ALREADY, target, ALREADY)
    forms = _old_forms(parsed.component, parsed.ref, python, torch)
    reason = next((scheme for scheme, tags in forms.items() if release.tag in tags), OTHER)
    return Entry(release.tag, release.title, RENAME, target, reason)


def plan(releases: Sequence[Release], *, tags: Sequence[str] | None, skip_unparseable: bool = False,
         delete_old_tags: bool = False, store: str = "") -> MigrationPlan:
    """The migration of ``releases`` (published ones); ``tags`` are the git tags, None without any."""
    published = sorted((r for r in releases if not r.draft), key=lambda r: r.tag)
    entries = [_classify(r) for r in published]
    holders = {r.tag for r in published}
    claims: dict[str, list[str]] = {}
    for e in entries:
        if e.target is not None:
            claims.setdefault(e.target, []).append(e.tag)
    resolved = []
    for e in entries:
        if e.target is None:
            resolved.append(e)
            continue
        rivals = [t for t in claims[e.target] if t != e.tag]
        if rivals:
            resolved.append(Entry(e.tag, e.title, COLLISION, e.target,
                                  f"target {e.target} is also claimed by {', '.join(rivals)}"))
        elif e.status == RENAME and e.target in holders:
            resolved.append(Entry(e.tag, e.title, COLLISION, e.target,
                                  f"target {e.target} is held by another release (title not of that tag)"))
        else:
            resolved.append(e)
    leftovers: tuple[str, ...] = ()
    if tags is not None:
        candidates: set[str] = set()
        for r in published:
            parsed = naming.parse_title(r.title)
            if parsed is None:
                continue
            for seg in parsed.segments:
                for old_tags in _old_forms(parsed.component, parsed.ref, seg.python, seg.torch).values():
                    candidates |= old_tags
        leftovers = tuple(sorted(t for t in set(tags) if t in candidates and t not in holders))
    return MigrationPlan(store, tuple(resolved), leftovers, tags is not None, skip_unparseable, delete_old_tags)


def plan_for(store: ReleaseStore, *, skip_unparseable: bool = False, delete_old_tags: bool = False) -> MigrationPlan:
    """Read the store (releases, git tags) and plan."""
    return plan(store.list_releases(), tags=git_tags(store), skip_unparseable=skip_unparseable,
                delete_old_tags=delete_old_tags, store=store.description)


def apply(migration: MigrationPlan, store: ReleaseStore) -> MigrationResult:
    """Rename, then (with ``delete_old_tags``) delete the old git tags no release holds any more."""
    refusal = migration.refusal()
    if refusal is not None:
        raise refusal
    renamed = []
    for e in migration.renames:
        if e.target is None:
            raise RuntimeError(f"migration plan: rename of {e.tag} has no target tag")
        store.retag_release(e.tag, e.target)  # idempotent: done before -> returns the moved release
        renamed.append((e.tag, e.target))
    deleted: list[str] = []
    left: tuple[str, ...] = ()
    old = migration.tags_after
    if old:
        held = {r.tag for r in store.list_releases()}
        old = tuple(t for t in old if t not in held)
        if migration.delete_old_tags:
            for tag in old:
                delete_git_tag(store, tag)
                deleted.append(tag)
        else:
            left = old
    return MigrationResult(tuple(renamed), tuple(deleted), left, tuple(e.tag for e in migration.offenders))
