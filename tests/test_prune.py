"""prune: delete releases versions.yaml no longer names, never one the matrix maps to; a seeded property
test over generated versions files against the local store, and an integration test against the
GitHub test server (with --older-than, --keep-worlds and the index re-published)."""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from ci.base.errors import WheelhouseError
from ci.maintenance import prune
from ci.model import matrix, naming
from ci.model.versions import Versions, load
from ci.publish import pages
from ci.publish.pages import DirectoryTarget, IndexWhere, publish_index
from ci.store.github import GitHubStore
from ci.store.local import LocalStore
from tests.crash_points import kill_at_every_step
from tests.github_server import GitHubTestServer
from tests.github_server.pytest_plugin import github_server as server  # noqa: F401 (fixture)

ARCHES = ("x86_64", "aarch64")
PYTHONS = ("3.10", "3.11", "3.12")
WORLDS = (("12.8.1", "2.12.0"), ("13.0.2", "2.13.0"), ("13.0.2", "2.13.1"), ("cpu", "2.13.0"))
COMPONENTS = ("alpha", "beta", "gamma", "delta", "epsilon")
REFS = ("v1.0", "v1.1", "main", "release/2.0", "3f601f7ac1c062c46502646ff04c535013bfca00")
NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)


def random_versions(rng: random.Random, path: Path) -> Versions:
    """A valid versions file: a random subset of rows and components, with random filters."""
    combos = [(a, p, w) for a in ARCHES for p in PYTHONS for w in WORLDS]
    rows = rng.sample(combos, rng.randint(1, 8))
    lines = ["build_matrix:"]
    for arch, python, (cuda, torch) in rows:
        lines.append(f'  - {{arch: {arch}, cuda: "{cuda}", python: "{python}", torch: "{torch}", cxx11_abi: "TRUE"}}')
    lines.append("components:")
    arches = sorted({r[0] for r in rows})
    pythons = sorted({r[1] for r in rows})
    for name in rng.sample(COMPONENTS, rng.randint(1, len(COMPONENTS))):
        lines += [f"  {name}:", "    source: {path: tests/fixtures/fixture_ext}", f'    ref: "{rng.choice(REFS)}"',
                  "    builder: fixture", "    runs_on: ubuntu-24.04"]
        want_py = rng.sample(pythons, rng.randint(1, len(pythons))) if rng.random() < 0.4 else None
        want_arch = rng.sample(arches, 1) if rng.random() < 0.3 else None
        if not any((want_py is None or p in want_py) and (want_arch is None or a in want_arch) for a, p, _ in rows):
            want_py = want_arch = None
        if want_py:
            lines.append(f"    python_versions: {json.dumps(want_py)}")
        if want_arch:
            lines.append(f"    arches: {json.dumps(want_arch)}")
        if rng.random() < 0.15:
            lines.append("    bundle_pythons: true")
    path.write_text("\n".join(lines) + "\n")
    return load(path)


def releases_of(versions: Versions) -> dict[str, str]:
    """tag -> title of every release the versions file's matrix makes."""
    return {row.release_tag: matrix.release_title(versions, row) for row in matrix.expand(versions)}


def seed(store: LocalStore, releases: dict[str, str]) -> None:
    for tag, title in releases.items():
        store.ensure_release(tag, title, "")


def worlds_of(title: str) -> set[str]:
    parsed = naming.parse_title(title)
    return {naming.world_path(s.cuda, s.torch) for s in parsed.segments} if parsed else set()


def test_prune_never_deletes_what_the_matrix_maps_to(tmp_path: Path) -> None:
    deleted_total = kept_by_world = 0
    reasons: set[str] = set()
    for case in range(100):
        rng = random.Random(case)
        current = random_versions(rng, tmp_path / f"now-{case}.yaml")
        mixed: dict[str, str] = {}
        for older in range(rng.randint(1, 3)):  # what earlier versions files published
            mixed.update(releases_of(random_versions(rng, tmp_path / f"old-{case}-{older}.yaml")))
        protected = releases_of(current)
        for tag in list(protected)[: rng.randint(0, len(protected))]:
            mixed[tag] = rng.choice([protected[tag], "hand-edited title", mixed.get(tag, protected[tag])])
        mixed[f"junk-{case}"] = "not a release title"
        store = LocalStore(tmp_path / f"store-{case}")
        seed(store, mixed)
        all_worlds = sorted({w for t in mixed.values() for w in worlds_of(t)})
        keep = tuple(rng.sample(all_worlds, rng.randint(0, min(2, len(all_worlds)))))
        p = prune.plan(current, store.list_releases(), keep_worlds=keep, store=store.description)
        assert "keep every release a build_matrix row" in p.render()
        result = prune.apply(p, store, force=True)  # random plans delete any share; the policy is what is tested
        left = {r.tag: r.title for r in store.list_releases()}
        for tag in mixed:
            if tag in protected:
                assert tag in left, (case, tag)  # whatever its title says
            if worlds_of(mixed[tag]) & set(keep):
                assert tag in left, (case, tag, keep)
                kept_by_world += tag not in protected
        assert f"junk-{case}" in left
        for d in p.to_delete:
            assert d.tag not in protected and d.tag not in left
            reasons.add(d.reason.split(":")[0])
        assert set(result.deleted) == {d.tag for d in p.to_delete}
        assert prune.plan(current, store.list_releases(), keep_worlds=keep).to_delete == ()  # converged
        deleted_total += len(result.deleted)
    print(f"deleted {deleted_total}, kept by world {kept_by_world}, reasons {sorted(reasons)}")
    assert deleted_total > 100 and kept_by_world > 0
    assert {"retired component", "superseded ref"} <= reasons and any(r.startswith("dropped") for r in reasons)


VERSIONS = """
build_matrix:
  - {arch: x86_64, cuda: "13.0.2", python: "3.11", torch: "2.13.0", cxx11_abi: "TRUE"}
  - {arch: x86_64, cuda: "13.0.2", python: "3.12", torch: "2.13.0", cxx11_abi: "TRUE"}
  - {arch: aarch64, cuda: "13.0.2", python: "3.12", torch: "2.13.0", cxx11_abi: "TRUE"}
components:
  flash-attention:
    source: {path: tests/fixtures/fixture_ext}
    ref: v2.8.3
    builder: fixture
    runs_on: ubuntu-24.04
  apex:
    source: {path: tests/fixtures/fixture_ext}
    ref: master
    builder: fixture
    runs_on: ubuntu-24.04
    python_versions: ["3.12"]
"""
MIX = {
    # current (the matrix maps to these)
    "flash-attention-v2.8.3-cu130-py3.11-torch2.13.0": "flash-attention v2.8.3 - cu13.0.2 py3.11 torch2.13.0",
    "flash-attention-v2.8.3-cu130-py3.12-torch2.13.0":
        "flash-attention v2.8.3 - cu13.0.2 py3.12 torch2.13.0; aarch64 cu13.0.2 py3.12 torch2.13.0",
    "apex-master-cu130-py3.12-torch2.13.0": "hand-edited title",
    # superseded ref, retired components, dropped torch, dropped Python
    "flash-attention-v2.8.2-py3.12-torch2.13.0": "flash-attention v2.8.2 - cu13.0.2 py3.12 torch2.13.0",
    "vllm-v0.10.0-py3.12-torch2.13.0": "vllm v0.10.0 - cu13.0.2 py3.12 torch2.13.0",
    "sglang-v0.5.0-py3.12-torch2.13.0": "sglang v0.5.0 - cu13.0.2 py3.12 torch2.13.0",
    "apex-master-py3.12-torch2.11.0": "apex master - cu12.8.1 py3.12 torch2.11.0",
    "apex-master-cu130-py3.11-torch2.13.0": "apex master - cu13.0.2 py3.11 torch2.13.0",
    # kept: inside a kept world; unparseable; an old tag scheme of a current release; too young
    "flash-attention-v2.7.0-py3.12-torch2.12.0": "flash-attention v2.7.0 - cu12.8.1 py3.12 torch2.12.0",
    "notes-2025": "release notes, not wheels",
    "flash-attention-v2.8.3-py3.11": "flash-attention v2.8.3 - cu13.0.2 py3.11 torch2.13.0",
    "flash-attention-v2.8.1-py3.12-torch2.13.0": "flash-attention v2.8.1 - cu13.0.2 py3.12 torch2.13.0",
}
YOUNG = "flash-attention-v2.8.1-py3.12-torch2.13.0"
DELETED = {
    "flash-attention-v2.8.2-py3.12-torch2.13.0": "superseded ref: flash-attention is now at v2.8.3 (this is v2.8.2)",
    "vllm-v0.10.0-py3.12-torch2.13.0": "retired component: vllm is not in versions.yaml",
    "sglang-v0.5.0-py3.12-torch2.13.0": "retired component: sglang is not in versions.yaml",
    "apex-master-py3.12-torch2.11.0": "dropped torch 2.11.0",
    "apex-master-cu130-py3.11-torch2.13.0": "dropped Python 3.11",
}
MIX["flash-attention-v2.8.3"] = "flash-attention v2.8.3 - cu13.0.2 py3.11 torch2.13.0; cu13.0.2 py3.12 torch2.13.0"
"""Stage A: one release for several Pythons; kept (its wheels may be the only ones until the new releases exist)."""


def wheel(tag: str) -> str:
    """A distinct wheel per release (one project, a version per release)."""
    return f"pkg-{list(MIX).index(tag) + 1}.0-py3-none-any.whl"


def test_prune_against_the_github_server(server: GitHubTestServer, tmp_path: Path) -> None:  # noqa: F811
    gh = server
    path = tmp_path / "versions.yaml"
    path.write_text(VERSIONS)
    versions = load(path)
    for tag, title in MIX.items():
        rel = gh.seed_release(tag, name=title, assets=[(wheel(tag), tag.encode())])
        rel.published_at = "2025-12-25T00:00:00Z" if tag == YOUNG else "2025-06-01T00:00:00Z"
    with GitHubStore("o/r", token=gh.token, api_url=gh.api_url, sleep=lambda s: None) as store:
        releases = store.list_releases()
        assert {r.tag: r.created_at for r in releases}[YOUNG] == "2025-12-25T00:00:00Z"
        keep = prune.parse_worlds("cu128/torch2.12")
        p = prune.plan(versions, releases, keep_worlds=keep, older_than=prune.parse_age("90d"), now=NOW,
                       store=store.description)
        text = p.render()
        assert "keep releases in the world(s) cu128/torch2.12" in text
        assert "but only those published before 2025-10-03 00:00 UTC (older than 90d)" in text
        got = {d.tag: d.reason for d in p.to_delete}
        assert set(got) == set(DELETED)
        for tag, reason in DELETED.items():
            assert got[tag].startswith(reason), got[tag]
        kept = {d.tag: d.reason for d in p.decisions if not d.delete}
        assert kept["apex-master-cu130-py3.12-torch2.13.0"] == "current: a build_matrix row maps to this tag"
        assert kept["flash-attention-v2.7.0-py3.12-torch2.12.0"] == "in kept world cu128/torch2.12"
        assert kept["notes-2025"].startswith("title does not follow the naming scheme")
        assert "run migrate-tags" in kept["flash-attention-v2.8.3-py3.11"]
        assert kept["flash-attention-v2.8.3"].startswith("holds Python 3.11+3.12 in one release (an older scheme)")
        assert "published 2025-12-25, within 90d" in kept[YOUNG]

        site = tmp_path / "site"
        index = IndexWhere(DirectoryTarget(site), base_url=site.as_uri(), default_world="cu130/torch2.13")
        with pytest.raises(WheelhouseError) as refused:  # vllm and sglang: components versions.yaml does not name
            prune.apply(p, store, index=index)
        assert str(refused.value) == (
            f"prune would delete releases of sglang, vllm, which {path} does not name: check that the versions file "
            f"({path}, WHEELHOUSE_VERSIONS) and the store (--store / WHEELHOUSE_STORE) are the right ones; pass "
            "--force if this is intended")
        assert set(gh.snapshot()) == set(MIX) and not site.exists()
        result = prune.apply(p, store, index=index, force=True)
        assert set(result.deleted) == set(DELETED)
        snapshot = gh.snapshot()
        assert not set(DELETED) & set(snapshot) and set(snapshot) == set(MIX) - set(DELETED)
        assert not set(DELETED) & gh.tags()  # the GitHub store deletes the git tag with the release
        pages = "".join(p.read_text() for p in site.rglob("*.html"))
        assert wheel("flash-attention-v2.8.3-cu130-py3.11-torch2.13.0") in pages
        assert not any(wheel(tag) in pages for tag in DELETED)
        assert result.index is not None and "index:" in result.render()

        gh.reset_counters()
        again = prune.plan(versions, store.list_releases(), keep_worlds=keep, older_than=timedelta(days=90), now=NOW)
        assert again.to_delete == ()
        prune.apply(again, store, index=index)
        assert sum(n for k, n in gh.counters.items() if k.split()[0] in ("POST", "PATCH", "DELETE")) == 0


def test_prune_local_store_age_and_arguments(tmp_path: Path) -> None:
    path = tmp_path / "versions.yaml"
    path.write_text(VERSIONS)
    versions = load(path)
    store = LocalStore(tmp_path / "store")
    seed(store, MIX)
    assert all(r.created_at for r in store.list_releases())  # recorded at creation
    record = store.releases_dir / "vllm-v0.10.0-py3.12-torch2.13.0" / "release.json"
    data = json.loads(record.read_text())
    data["created_at"] = "2025-01-01T00:00:00Z"
    record.write_text(json.dumps(data))
    legacy = store.releases_dir / "sglang-v0.5.0-py3.12-torch2.13.0" / "release.json"
    data = json.loads(legacy.read_text())
    del data["created_at"]  # a record from before created_at: its mtime stands in
    legacy.write_text(json.dumps(data))
    p = prune.plan(versions, store.list_releases(), older_than=prune.parse_age("30d"),
                   now=datetime.now(timezone.utc) + timedelta(days=1))
    assert [d.tag for d in p.to_delete] == ["vllm-v0.10.0-py3.12-torch2.13.0"]
    prune.apply(p, store, force=True)
    assert store.get_release("vllm-v0.10.0-py3.12-torch2.13.0") is None
    everything = prune.plan(versions, store.list_releases())
    assert {d.tag for d in everything.to_delete} == set(DELETED) - {"vllm-v0.10.0-py3.12-torch2.13.0"} | {
        "flash-attention-v2.7.0-py3.12-torch2.12.0", YOUNG}
    prune.apply(everything, store, index=IndexWhere(DirectoryTarget(tmp_path / "site"),
                                                    base_url=(tmp_path / "site").as_uri(), default_world=None),
                force=True)
    assert (tmp_path / "site" / "index.html").is_file()
    assert set(r.tag for r in store.list_releases()) == {
        "flash-attention-v2.8.3-cu130-py3.11-torch2.13.0", "flash-attention-v2.8.3-cu130-py3.12-torch2.13.0",
        "apex-master-cu130-py3.12-torch2.13.0", "notes-2025", "flash-attention-v2.8.3-py3.11", "flash-attention-v2.8.3"}

    assert prune.parse_age("2w") == timedelta(weeks=2) and prune.parse_age("12h") == timedelta(hours=12)
    for bad in ("90", "ninety days", "-3d"):
        with pytest.raises(WheelhouseError, match="--older-than"):
            prune.parse_age(bad)
    assert prune.parse_worlds("cu130/torch2.13, cpu/torch2.13,") == ("cu130/torch2.13", "cpu/torch2.13")
    with pytest.raises(WheelhouseError, match=r"--keep-worlds: 'torch2\.13'"):
        prune.parse_worlds("torch2.13")


# --- a wrong versions file or store cannot empty the store (N3); the index goes first (N18) --------------

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"


def _store_of(root: Path, releases: dict[str, str]) -> LocalStore:
    store = LocalStore(root)
    for i, (tag, title) in enumerate(releases.items()):
        store.ensure_release(tag, title, "")
        wheel = root.parent / f"pkg{i}-1.0-py3-none-any.whl"
        wheel.write_bytes(tag.encode())
        store.upload_asset(tag, wheel)
        wheel.unlink()
    return store


def _invoke(*args: str, versions: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("WHEELHOUSE_")}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          env={**env, "WHEELHOUSE_VERSIONS": str(versions)}, timeout=120)


def test_prune_with_the_wrong_versions_file_deletes_nothing(tmp_path: Path) -> None:
    """The store holds the production file's releases; WHEELHOUSE_VERSIONS names the fixture file (left over
    from the demo): every release is of a component that file does not name."""
    production = load(REPO / "versions.yaml")
    rows = matrix.expand(production)[:8]
    store = _store_of(tmp_path / "prod", {r.release_tag: matrix.release_title(production, r) for r in rows})
    before = sorted(r.tag for r in store.list_releases())
    components = ", ".join(sorted({r.component for r in rows}))

    dry = _invoke("prune", "--store", str(store.root), versions=FIXTURE_VERSIONS)
    assert dry.returncode == 0, dry.stderr
    assert f"release(s) in {store.root}, against {FIXTURE_VERSIONS}" in dry.stdout
    assert "warning: --apply will refuse this plan: prune would delete all" in dry.stderr

    result = _invoke("prune", "--store", str(store.root), "--apply", versions=FIXTURE_VERSIONS)
    assert result.returncode == 1
    assert result.stderr.strip() == (
        f"error: prune would delete all {len(before)} release(s) of {store.root}; and releases of {components}, which "
        f"{FIXTURE_VERSIONS} does not name: check that the versions file ({FIXTURE_VERSIONS}, WHEELHOUSE_VERSIONS) "
        "and the store (--store / WHEELHOUSE_STORE) are the right ones; pass --force if this is intended")
    assert sorted(r.tag for r in store.list_releases()) == before and not (store.root / "site").exists()

    result = _invoke("prune", "--store", str(store.root), "--apply", "--force", versions=FIXTURE_VERSIONS)
    assert result.returncode == 0, result.stderr
    assert store.list_releases() == []


def test_prune_of_more_than_half_the_releases_needs_force(tmp_path: Path) -> None:
    path = tmp_path / "versions.yaml"
    path.write_text(VERSIONS)
    versions = load(path)
    store = LocalStore(tmp_path / "store")
    seed(store, {tag: MIX[tag] for tag in ("flash-attention-v2.8.3-cu130-py3.11-torch2.13.0",
                                           "flash-attention-v2.8.2-py3.12-torch2.13.0",
                                           "apex-master-py3.12-torch2.11.0", "apex-master-cu130-py3.11-torch2.13.0")})
    p = prune.plan(versions, store.list_releases(), store=store.description)
    assert len(p.to_delete) == 3
    with pytest.raises(WheelhouseError, match=r"^prune would delete 3 of the 4 releases of .* \(more than 50%\): "):
        prune.apply(p, store)
    assert len(store.list_releases()) == 4
    assert len(prune.apply(p, store, force=True).deleted) == 3


def test_a_prune_killed_at_any_step_never_leaves_the_index_linking_to_a_deleted_wheel(tmp_path: Path) -> None:
    path = tmp_path / "versions.yaml"
    path.write_text(VERSIONS)
    versions = load(path)
    current = ("flash-attention-v2.8.3-cu130-py3.11-torch2.13.0", "flash-attention-v2.8.3-cu130-py3.12-torch2.13.0",
               "apex-master-cu130-py3.12-torch2.13.0")
    superseded = ("flash-attention-v2.8.2-py3.12-torch2.13.0", "apex-master-cu130-py3.11-torch2.13.0")
    base = _store_of(tmp_path / "base" / "store", {tag: MIX[tag] for tag in current + superseded})
    work, site = tmp_path / "work" / "store", tmp_path / "site"

    def prepare(k: int) -> None:
        shutil.rmtree(work.parent, ignore_errors=True)
        shutil.copytree(base.root.parent, work.parent)
        shutil.rmtree(site, ignore_errors=True)
        publish_index(LocalStore(work).list_releases(), DirectoryTarget(site), base_url=site.as_uri(),
                      default_world=None)

    def action() -> None:
        store = LocalStore(work)
        p = prune.plan(versions, store.list_releases(), store=store.description)
        prune.apply(p, store, index=IndexWhere(DirectoryTarget(site), base_url=site.as_uri(),
                                                      default_world=None))

    def check(k: int) -> None:
        links = [href.split("#")[0] for page in site.glob("*/*/simple/*/index.html")
                 for href in re.findall(r'href="([^"]+)"', page.read_text())]
        assert links, k
        missing = [link for link in links if not Path(unquote(urlsplit(link).path)).is_file()]
        assert missing == [], (k, missing)

    steps = kill_at_every_step(action, [(LocalStore, "delete_release"), (pages.os, "replace")], prepare=prepare,
                               check=check)
    assert steps > 4
    assert sorted(r.tag for r in LocalStore(work).list_releases()) == sorted(current)
