"""migrate-tags: old tag schemes to the current one, by title, against the GitHub test server and the
local store; refusals, --skip-unparseable, idempotence, resuming after a kill, leftover git tags."""

from __future__ import annotations

from pathlib import Path

import pytest

from ci.base.errors import WheelhouseError
from ci.maintenance import migrate
from ci.store.github import GitHubStore
from ci.store.local import LocalStore
from tests.github_server import GitHubTestServer
from tests.github_server.pytest_plugin import github_server as server  # noqa: F401 (fixture)

DEEP_EP = "3f601f7ac1c062c46502646ff04c535013bfca00"
FLASH_MLA = "15f13e5030374295491c5ce31b02d7e63a7772c6"

# (tag, title): what the anchor's three stages left behind, plus hand-made trouble.
MIX = [
    # stage A: <component>-<ref>, one release per component (then: py3.12, torch 2.11.0, two arches)
    ("flash-attention-v2.8.3", "flash-attention v2.8.3 - cu13.0.2 py3.12 torch2.11.0; aarch64 cu13.0.2 py3.12 torch2.11.0"),
    ("apex-master", "apex master - cu13.0.2 py3.12 torch2.11.0"),
    # stage B: -pyX.Y for other Pythons, the bare tag for 3.12
    (f"deep-ep-{DEEP_EP}-py3.11", f"deep-ep {DEEP_EP} - cu13.0.2 py3.11 torch2.12.0; aarch64 cu13.0.2 py3.11 torch2.12.0"),
    ("transformer-engine-v2.16.1-py3.11", "transformer-engine v2.16.1 - cu13.0.2 py3.11 torch2.12.0"),
    ("transformer-engine-v2.16.1", "transformer-engine v2.16.1 - cu13.0.2 py3.12 torch2.12.0"),
    # current scheme
    (f"flash-mla-{FLASH_MLA}-cu130-py3.12-torch2.13.0",
     f"flash-mla {FLASH_MLA} - cu13.0.2 py3.12 torch2.13.0; aarch64 cu13.0.2 py3.12 torch2.13.0"),
    ("flash-attention-v2.8.3-cu130-py3.11-torch2.13.0", "flash-attention v2.8.3 - cu13.0.2 py3.11 torch2.13.0"),
    # hand-made: unparseable title, and a title naming two (Python, torch) pairs
    ("apex-custom-build", "apex built by hand for the cluster"),
    ("apex-both", "apex master - cu13.0.2 py3.11 torch2.13.0; cu13.0.2 py3.12 torch2.13.0"),
    # a collision: a stage-A release whose target an already migrated release holds
    ("flashinfer-v0.6.13", "flashinfer v0.6.13 - cu13.0.2 py3.12 torch2.13.0"),
    ("flashinfer-v0.6.13-cu130-py3.12-torch2.13.0", "flashinfer v0.6.13 - cu13.0.2 py3.12 torch2.13.0"),
]
SLASH_REF = ("deep-gemm-release/v1", "deep-gemm release/v1 - cu13.0.2 py3.12 torch2.13.0")
"""Stage A wrote the raw ref into the tag; the current scheme sanitizes it (GitHub store only: the
local store allows no '/' in a tag)."""

EXPECTED = {
    "flash-attention-v2.8.3": ("rename", "flash-attention-v2.8.3-cu130-py3.12-torch2.11.0", "stage A tag"),
    "apex-master": ("rename", "apex-master-cu130-py3.12-torch2.11.0", "stage A tag"),
    f"deep-ep-{DEEP_EP}-py3.11": ("rename", f"deep-ep-{DEEP_EP}-cu130-py3.11-torch2.12.0", "stage B tag"),
    "transformer-engine-v2.16.1-py3.11": ("rename", "transformer-engine-v2.16.1-cu130-py3.11-torch2.12.0",
                                          "stage B tag"),
    "transformer-engine-v2.16.1": ("rename", "transformer-engine-v2.16.1-cu130-py3.12-torch2.12.0", "stage A tag"),
    f"flash-mla-{FLASH_MLA}-cu130-py3.12-torch2.13.0": ("already migrated",
                                                        f"flash-mla-{FLASH_MLA}-cu130-py3.12-torch2.13.0",
                                                        "already migrated"),
    "flash-attention-v2.8.3-cu130-py3.11-torch2.13.0": ("already migrated",
                                                        "flash-attention-v2.8.3-cu130-py3.11-torch2.13.0",
                                                        "already migrated"),
    "apex-custom-build": ("unparseable", None, None),
    "apex-both": ("unparseable", None, None),
    "flashinfer-v0.6.13": ("collision", "flashinfer-v0.6.13-cu130-py3.12-torch2.13.0", None),
    "flashinfer-v0.6.13-cu130-py3.12-torch2.13.0": ("collision", "flashinfer-v0.6.13-cu130-py3.12-torch2.13.0", None),
    "deep-gemm-release/v1": ("rename", "deep-gemm-release-v1-cu130-py3.12-torch2.13.0", "stage A tag"),
}
OFFENDERS = {"apex-custom-build", "apex-both", "flashinfer-v0.6.13", "flashinfer-v0.6.13-cu130-py3.12-torch2.13.0"}
MUTATING = ("retag_release", "delete_tag", "delete_release", "ensure_release", "upload_asset", "delete_asset")


def wheel_name(tag: str) -> str:
    return "pkg-1.0-cp312-cp312-linux_x86_64.whl"


def seed_server(gh: GitHubTestServer) -> None:
    for tag, title in [*MIX, SLASH_REF]:
        gh.seed_release(tag, name=title, assets=[(wheel_name(tag), tag.encode())])
    gh.seed_release("draft-thing", name="apex master - cu13.0.2 py3.10 torch2.13.0", draft=True)
    owner_repo = gh.state.repo("o", "r")
    assert owner_repo is not None
    owner_repo.tags.update({t: owner_repo.head for t in ("apex-master-py3.11", "v1.0")})  # a leftover, an unrelated tag


def seed_local(store: LocalStore, tmp_path: Path) -> None:
    for tag, title in MIX:
        store.ensure_release(tag, title, "")
        f = tmp_path / "w.whl"
        f.write_bytes(tag.encode())
        store.upload_asset(tag, f, name=wheel_name(tag))


def make(gh: GitHubTestServer) -> GitHubStore:
    return GitHubStore("o/r", token=gh.token, api_url=gh.api_url, sleep=lambda s: None, seed=0)


def mutations(gh: GitHubTestServer) -> int:
    return sum(n for k, n in gh.counters.items() if k.split()[0] in ("POST", "PATCH", "DELETE", "PUT"))


class Killed(Exception):
    pass


class KillAfter:
    """A store that dies (like a killed process) before its (k+1)-th mutating call."""

    def __init__(self, inner, k: int) -> None:
        self.inner, self.left = inner, k
        self.description = inner.description

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if name not in MUTATING:
            return attr

        def guarded(*args, **kwargs):
            if self.left <= 0:
                raise Killed(name)
            self.left -= 1
            return attr(*args, **kwargs)

        return guarded


def statuses(p: migrate.MigrationPlan) -> dict[str, tuple[str, str | None, str | None]]:
    return {e.tag: (e.status, e.target, e.reason if e.status in ("rename", "already migrated") else None)
            for e in p.entries}


def test_dry_run_plan_and_refusal_names_each_offender(server: GitHubTestServer) -> None:  # noqa: F811
    gh = server
    seed_server(gh)
    with make(gh) as store:
        gh.reset_counters()
        p = migrate.plan_for(store)
        assert mutations(gh) == 0
        assert statuses(p) == EXPECTED  # the draft is not listed
        assert p.leftover_tags == ("apex-master-py3.11",)  # v1.0 is no old form of any release's tag
        text = p.render()
        for tag, (status, target, reason) in EXPECTED.items():
            if status == "rename":
                assert f"rename            {tag} -> {target}  ({reason})" in text
        assert "4 to rename" not in text and "6 to rename, 2 already migrated, 2 unparseable, 2 in collisions" in text
        assert p.blocked
        lines = p.offender_lines()
        assert len(lines) == 4 and {line.split(": ")[1] for line in lines} == OFFENDERS
        assert all("\n" not in line for line in lines)
        assert any("apex-custom-build: title 'apex built by hand for the cluster' does not follow" in x for x in lines)
        assert any("apex-both: title names 2 (Python, torch) pairs" in x for x in lines)
        assert any("flashinfer-v0.6.13: target flashinfer-v0.6.13-cu130-py3.12-torch2.13.0 is also claimed by" in x
                   for x in lines)
        with pytest.raises(migrate.MigrationRefused) as refused:
            migrate.apply(p, store)
        message = str(refused.value)
        assert "\n" not in message and message.startswith("refusing to migrate: ")
        assert all(tag in message for tag in OFFENDERS) and "--skip-unparseable" in message
        assert isinstance(refused.value, WheelhouseError) and refused.value.offenders == tuple(lines)
        assert mutations(gh) == 0


def test_skip_unparseable_apply_then_apply_again_changes_nothing(server: GitHubTestServer) -> None:  # noqa: F811
    gh = server
    seed_server(gh)
    before = gh.snapshot()
    with make(gh) as store:
        p = migrate.plan_for(store, skip_unparseable=True)
        assert not p.blocked and len(p.renames) == 6
        assert "skipped (left as they are): apex-both, apex-custom-build, flashinfer-v0.6.13, " in p.render()
        result = migrate.apply(p, store)
        assert len(result.renamed) == 6 and set(result.skipped) == OFFENDERS and result.deleted_tags == ()
        after = gh.snapshot()
        for tag, (status, target, _) in EXPECTED.items():
            if status == "rename":
                assert tag not in after and after[target] == before[tag]  # assets moved with the release
            else:
                assert after[tag] == before[tag]  # offenders and migrated ones untouched
        # GitHub keeps the old git tags: reported, not deleted
        assert set(result.leftover_tags) == {t for t, v in EXPECTED.items() if v[0] == "rename"} | {"apex-master-py3.11"}
        assert set(result.leftover_tags) <= gh.tags()

        gh.reset_counters()
        again = migrate.plan_for(store, skip_unparseable=True)
        assert again.renames == () and set(again.leftover_tags) == set(result.leftover_tags)
        assert migrate.apply(again, store).renamed == ()
        assert mutations(gh) == 0

        cleaned = migrate.apply(migrate.plan_for(store, skip_unparseable=True, delete_old_tags=True), store)
        assert set(cleaned.deleted_tags) == set(result.leftover_tags)
        assert "v1.0" in gh.tags() and not (set(result.leftover_tags) & gh.tags())
        gh.reset_counters()
        migrate.apply(migrate.plan_for(store, skip_unparseable=True, delete_old_tags=True), store)
        assert mutations(gh) == 0
        assert gh.snapshot() == after


def _final_state(gh: GitHubTestServer) -> tuple[dict, set[str]]:
    return gh.snapshot(), gh.tags()


def test_killed_after_k_changes_resumes_to_the_same_state() -> None:
    with GitHubTestServer(token="t") as ref_gh:
        seed_server(ref_gh)
        with make(ref_gh) as store:
            ref_gh.reset_counters()
            migrate.apply(migrate.plan_for(store, skip_unparseable=True, delete_old_tags=True), store)
            n = mutations(ref_gh)
        expected = _final_state(ref_gh)
    assert n == 6 + 7  # six renames, seven tag deletions
    for k in range(n + 1):
        with GitHubTestServer(token="t") as gh:
            seed_server(gh)
            with make(gh) as store:
                killer = KillAfter(store, k)
                if k < n:
                    with pytest.raises(Killed):
                        migrate.apply(migrate.plan_for(killer, skip_unparseable=True, delete_old_tags=True), killer)
                else:
                    migrate.apply(migrate.plan_for(killer, skip_unparseable=True, delete_old_tags=True), killer)
                assert mutations(gh) == k
                resumed = migrate.plan_for(store, skip_unparseable=True, delete_old_tags=True)
                assert len(resumed.renames) == max(0, 6 - k)
                migrate.apply(resumed, store)
                assert mutations(gh) == n  # nothing done twice
            assert _final_state(gh) == expected, k


def test_local_store_migrate_and_resume(tmp_path: Path) -> None:
    mix_expected = {t: v for t, v in EXPECTED.items() if t != SLASH_REF[0]}
    reference = LocalStore(tmp_path / "ref")
    seed_local(reference, tmp_path)
    p = migrate.plan_for(reference)
    assert statuses(p) == mix_expected and p.blocked and not p.has_git_tags
    assert "git tags: none (this store has no git tags)" in p.render()
    with pytest.raises(migrate.MigrationRefused):
        migrate.apply(p, reference)
    result = migrate.apply(migrate.plan_for(reference, skip_unparseable=True, delete_old_tags=True), reference)
    assert len(result.renamed) == 5 and result.deleted_tags == () and result.leftover_tags == ()
    final = {r.tag: (r.title, r.assets) for r in reference.list_releases()}
    assert set(final) == {v[1] if v[0] == "rename" else t for t, v in mix_expected.items()}
    files = {p: p.stat().st_mtime_ns for p in (tmp_path / "ref").rglob("*") if p.is_file()}
    migrate.apply(migrate.plan_for(reference, skip_unparseable=True), reference)
    assert files == {p: p.stat().st_mtime_ns for p in (tmp_path / "ref").rglob("*") if p.is_file()}

    for k in range(6):
        store = LocalStore(tmp_path / f"k{k}")
        seed_local(store, tmp_path)
        killer = KillAfter(store, k)
        if k < 5:
            with pytest.raises(Killed):
                migrate.apply(migrate.plan_for(killer, skip_unparseable=True), killer)
        else:
            migrate.apply(migrate.plan_for(killer, skip_unparseable=True), killer)
        migrate.apply(migrate.plan_for(store, skip_unparseable=True), store)
        got = {r.tag: (r.title, tuple((a.name, a.digest) for a in r.assets)) for r in store.list_releases()}
        assert got == {t: (title, tuple((a.name, a.digest) for a in assets)) for t, (title, assets) in final.items()}


# The anchor's tag had no CUDA part: a CPU and a CUDA row of one Python and torch shared a release, and the wheel of
# one world replaced the other's. Stage C releases are renamed to their world's tag, by title.
STAGE_C = [
    ("flash-mla-v1.0-py3.12-torch2.13.0", "flash-mla v1.0 - cu13.0.2 py3.12 torch2.13.0; aarch64 cu13.0.2 py3.12 torch2.13.0"),
    ("wheelhouse-fixture-0.1.0-py3.11-torch2.13.0", "wheelhouse-fixture 0.1.0 - cpu py3.11 torch2.13.0"),
    ("fixture-old-0.1.0-py3.11-torch2.13.0", "fixture-old 0.1.0 - cucpu py3.11 torch2.13.0"),  # the older CPU label
    # the finding itself: both worlds in one release, under one wheel name each; which bytes are left is for a person
    ("mixed-1.0-py3.11-torch2.13.0", "mixed 1.0 - cpu py3.11 torch2.13.0; cu13.0.2 py3.11 torch2.13.0"),
    ("cuda-two-1.0-py3.11-torch2.13.0", "cuda-two 1.0 - cu12.8.1 py3.11 torch2.13.0; cu13.0.2 py3.11 torch2.13.0"),
]


def test_stage_c_tags_move_to_their_worlds_tag_and_a_release_of_two_worlds_is_left_alone(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    for tag, title in STAGE_C:
        store.ensure_release(tag, title, "")
        wheel = tmp_path / "pkg-1.0-cp311-cp311-linux_x86_64.whl"
        wheel.write_bytes(tag.encode())
        store.upload_asset(tag, wheel)
    plan = migrate.plan_for(store, skip_unparseable=True)
    assert statuses(plan) == {
        "flash-mla-v1.0-py3.12-torch2.13.0": ("rename", "flash-mla-v1.0-cu130-py3.12-torch2.13.0",
                                              "stage C tag, without its world's CUDA part"),
        "wheelhouse-fixture-0.1.0-py3.11-torch2.13.0": ("rename", "wheelhouse-fixture-0.1.0-cpu-py3.11-torch2.13.0",
                                                        "stage C tag, without its world's CUDA part"),
        "fixture-old-0.1.0-py3.11-torch2.13.0": ("rename", "fixture-old-0.1.0-cpu-py3.11-torch2.13.0",
                                                 "stage C tag, without its world's CUDA part"),
        "mixed-1.0-py3.11-torch2.13.0": ("unparseable", None, None),
        "cuda-two-1.0-py3.11-torch2.13.0": ("unparseable", None, None),
    }
    assert plan.offender_lines() == [
        "unparseable: cuda-two-1.0-py3.11-torch2.13.0: title names 2 worlds (cu128, cu130), whose wheels of one name "
        "replaced each other in this one release; a release holds exactly one world: delete it and release each "
        "world again",
        "unparseable: mixed-1.0-py3.11-torch2.13.0: title names 2 worlds (cpu, cu130), whose wheels of one name "
        "replaced each other in this one release; a release holds exactly one world: delete it and release each "
        "world again"]
    result = migrate.apply(plan, store)
    assert sorted(result.renamed) == sorted((tag, target) for tag, (status, target, _) in statuses(plan).items()
                                            if status == "rename")
    after = {r.tag: [a.name for a in r.assets] for r in store.list_releases()}
    assert sorted(after) == ["cuda-two-1.0-py3.11-torch2.13.0", "fixture-old-0.1.0-cpu-py3.11-torch2.13.0",
                             "flash-mla-v1.0-cu130-py3.12-torch2.13.0", "mixed-1.0-py3.11-torch2.13.0",
                             "wheelhouse-fixture-0.1.0-cpu-py3.11-torch2.13.0"]
    assert store.read_asset("wheelhouse-fixture-0.1.0-cpu-py3.11-torch2.13.0", "pkg-1.0-cp311-cp311-linux_x86_64.whl") \
        == b"wheelhouse-fixture-0.1.0-py3.11-torch2.13.0"  # the assets moved with the release
    assert migrate.plan_for(store, skip_unparseable=True).renames == ()  # run again: nothing to do


def test_the_git_tags_stage_c_releases_leave_behind_are_listed(server: GitHubTestServer) -> None:  # noqa: F811
    gh = server
    for tag, title in STAGE_C[:2]:
        gh.seed_release(tag, name=title, assets=[("pkg-1.0-cp311-cp311-linux_x86_64.whl", tag.encode())])
    with make(gh) as store:
        result = migrate.apply(migrate.plan_for(store), store)
        assert set(result.leftover_tags) == {tag for tag, _ in STAGE_C[:2]}
        cleaned = migrate.apply(migrate.plan_for(store, delete_old_tags=True), store)
        assert set(cleaned.deleted_tags) == {tag for tag, _ in STAGE_C[:2]}
