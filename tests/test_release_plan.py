"""Release a built row into the local store, then let the skip plan judge it."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from ci.base.digest import sha256_file
from ci.base.errors import RemoteError, WheelhouseError
from ci.building import job
from ci.flows import plan
from ci.model import manifest, matrix, naming
from ci.model.versions import load
from ci.publish import provenance, release
from ci.store.local import LocalStore

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"


class RecordingStore:
    """Wraps a store and records the order of mutating calls."""

    def __init__(self, inner):
        self.inner = inner
        self.description = inner.description
        self.calls: list[str] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def ensure_release(self, tag, title, body):
        self.calls.append(f"ensure {tag}")
        return self.inner.ensure_release(tag, title, body)

    def upload_asset(self, tag, path, *, name=None, clobber=False):
        self.calls.append(f"upload {name}")
        return self.inner.upload_asset(tag, path, name=name, clobber=clobber)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The fixture row built once through the real build path (warm compiler cache after the first run)."""
    versions = load(FIXTURE_VERSIONS)
    (row,) = matrix.expand(versions)
    dist = tmp_path_factory.mktemp("dist")
    result = job.run(versions, row, job.BuildOptions(cache_dir=REPO / ".cache", dist_root=dist))
    return versions, row, dist, result


def test_release_uploads_manifest_last(built, tmp_path):
    versions, row, dist, result = built
    store = RecordingStore(LocalStore(tmp_path / "store"))
    release.apply(release.plan(versions, row, dist), store)
    wheel = result.wheels[0].name
    assert store.calls == [
        f"ensure {row.release_tag}",
        f"upload {wheel}",
        f"upload {wheel}.metadata",
        f"upload {provenance.asset_name(row.arch)}",
        f"upload {manifest.asset_name(row.arch)}",
    ]
    published = store.get_release(row.release_tag)
    assert published.title == "wheelhouse-fixture 0.1.0 - cpu py3.11 torch2.13.0"
    stored = manifest.parse(store.read_asset(row.release_tag, manifest.asset_name(row.arch)), where="test")
    assert stored.checks_passed and stored.wheels[0].name == wheel
    assert published.asset(wheel).sha256 == stored.wheels[0].sha256


def test_release_twice_changes_nothing(built, tmp_path):
    versions, row, dist, _ = built
    store = LocalStore(tmp_path / "store")
    release.apply(release.plan(versions, row, dist), store)
    before = {p: p.stat().st_mtime_ns for p in (tmp_path / "store").rglob("*") if p.is_file()}
    release.apply(release.plan(versions, row, dist), store)
    after = {p: p.stat().st_mtime_ns for p in (tmp_path / "store").rglob("*") if p.is_file()}
    assert before == after


def test_the_store_refuses_other_bytes_without_clobber(built, tmp_path):
    versions, row, dist, result = built
    store = LocalStore(tmp_path / "store")
    release.apply(release.plan(versions, row, dist), store)
    other = tmp_path / result.wheels[0].name
    other.write_bytes(b"other bytes")
    with pytest.raises(RemoteError, match="exists with other bytes") as info:
        store.upload_asset(row.release_tag, other, clobber=False)
    # the store serves commands with different flags: it names each one's way, never a flag release lacks
    assert str(info.value).endswith("replace it on purpose (invoke release: --replace; restore-wheels: --clobber)")


def test_release_refuses_a_tampered_wheel(built, tmp_path):
    versions, row, dist, result = built
    copy = tmp_path / "dist"
    shutil.copytree(dist, copy)
    (copy / row.world / result.wheels[0].name).write_bytes(b"tampered")
    with pytest.raises(WheelhouseError, match="bytes differ from the build record"):
        release.plan(versions, row, copy)


def _revision(versions, row):
    return plan.resolve_revision(versions, row)


def test_plan_skips_a_complete_release_and_builds_what_changed(built, tmp_path):
    versions, row, dist, _result = built
    store = LocalStore(tmp_path / "store")
    assert plan.decide(versions, [row], store).decisions[0].reason == f"release {row.release_tag} does not exist"
    release.apply(release.plan(versions, row, dist), store)

    decision = plan.decide(versions, [row], store).decisions[0]
    assert not decision.build, decision.reason
    assert decision.reason.startswith("complete: fingerprint")

    # a changed build input (extra_env) changes the fingerprint
    changed = tmp_path / "versions.yaml"
    changed.write_text(FIXTURE_VERSIONS.read_text().replace("max_jobs: 2", "max_jobs: 2\n    extra_env: {FOO: bar}"))
    changed_versions = load(changed)
    (changed_row,) = matrix.expand(changed_versions)
    decision = plan.decide(changed_versions, [changed_row], store).decisions[0]
    assert decision.build and decision.reason.startswith("build inputs changed")

    # max_jobs does not change what is built: still a skip
    tuned = tmp_path / "tuned.yaml"
    tuned.write_text(FIXTURE_VERSIONS.read_text().replace("max_jobs: 2", "max_jobs: 7"))
    tuned_versions = load(tuned)
    assert not plan.decide(tuned_versions, matrix.expand(tuned_versions), store).decisions[0].build


def test_plan_fails_closed(built, tmp_path):
    versions, row, dist, result = built
    store = LocalStore(tmp_path / "store")
    release.apply(release.plan(versions, row, dist), store)
    wheel = result.wheels[0].name

    # a wheel whose bytes changed after the checks
    record = json.loads((tmp_path / "store" / "releases" / row.release_tag / "release.json").read_text())
    record["assets"][wheel]["sha256"] = "0" * 64
    (tmp_path / "store" / "releases" / row.release_tag / "release.json").write_text(json.dumps(record))
    assert "differs from the checked build" in plan.decide(versions, [row], store).decisions[0].reason

    # a missing wheel
    store.delete_asset(row.release_tag, wheel)
    assert "is missing from the release" in plan.decide(versions, [row], store).decisions[0].reason

    # an unreadable manifest
    broken = tmp_path / manifest.asset_name(row.arch)
    broken.write_text("{not json")
    store.upload_asset(row.release_tag, broken, clobber=True)
    assert plan.decide(versions, [row], store).decisions[0].reason.startswith("manifest unreadable")

    # a title edited by hand
    store.ensure_release(row.release_tag, "hand edited", "")
    assert plan.decide(versions, [row], store).decisions[0].reason.startswith("title mismatch")

    # an unresolvable ref
    assert plan.decide(versions, [row], store, resolve=lambda r: None).decisions[0].reason.startswith("cannot resolve")


def test_plan_markdown(built, tmp_path):
    versions, row, _dist, _ = built
    text = plan.decide(versions, [row], LocalStore(tmp_path / "s")).render_markdown()
    assert "**1 row(s) would build, 0 row(s) would be skipped.**" in text
    assert "| wheelhouse-fixture | `0.1.0` | x86_64 | cpu | 3.11 | 2.13.0 | :hammer: build |" in text


def test_wheel_arch_coverage_rule():
    assert naming.wheel_covers_arch("x-1.0-py3-none-any.whl", "aarch64")
    assert naming.wheel_covers_arch("x-1.0-cp312-cp312-manylinux_2_28_aarch64.whl", "aarch64")
    assert not naming.wheel_covers_arch("x-1.0-cp312-cp312-linux_x86_64.whl", "aarch64")
    assert not naming.wheel_covers_arch("not-a-wheel.whl", "x86_64")


def test_release_notes_say_which_wheels_are_upstreams():
    """versions.yaml's rehost names them; a component that rehosts nothing gets no such line."""
    from ci.model import wheel_packages

    versions = load()
    rows = {row.component: row for row in matrix.expand(versions) if row.arch == "x86_64"}
    assert "flashinfer-cubin: upstream's wheel(s), rehosted unchanged (versions.yaml `rehost`)" in release.notes(
        rows["flashinfer"])
    assert "rehosted" not in release.notes(rows["flash-attention"])
    assert wheel_packages.rehosted_by_component(versions)["flashinfer"] == frozenset({"flashinfer-cubin"})


TWO_WORLDS = """
build_matrix:
  - {arch: x86_64, cuda: cpu, python: "3.11", torch: "2.13.0", cxx11_abi: "TRUE", torch_index: default}
  - {arch: x86_64, cuda: "13.0.2", python: "3.11", torch: "2.13.0", cxx11_abi: "TRUE"}
components:
  demo:
    source: {path: tests/fixtures/fixture_ext}
    ref: "1.0"
    builder: fixture
    runs_on: ubuntu-24.04
"""


def test_a_cpu_and_a_cuda_row_of_one_python_and_torch_release_into_two_releases(tmp_path):
    """The tag names the world: the CPU row's wheel and the CUDA row's wheel of one file name, each released in turn,
    keep their own bytes (the anchor's tag had no CUDA part: the second release replaced the first one's wheel)."""
    from build_records import write_record
    from wheel_factory import build_wheel

    path = tmp_path / "versions.yaml"
    path.write_text(TWO_WORLDS)
    versions = load(path)
    cpu, cuda = matrix.expand(versions)
    store = LocalStore(tmp_path / "store")
    wheels = {}
    for row, world_bytes in ((cpu, b"cpu build"), (cuda, b"cuda build")):
        dist = tmp_path / f"dist-{row.cuda}"
        wheel = build_wheel(dist / row.world, {"demo/__init__.py": world_bytes}, name="demo", version="1.0",
                            tags="py3-none-any")
        write_record(dist, row, [wheel])
        wheels[row.release_tag] = wheel.read_bytes()
        release.apply(release.plan(versions, row, dist), store)
    assert len(wheels) == 2  # two tags
    for tag, data in wheels.items():
        assert store.read_asset(tag, "demo-1.0-py3-none-any.whl") == data
    assert sorted(r.tag for r in store.list_releases()) == ["demo-1.0-cpu-py3.11-torch2.13.0",
                                                            "demo-1.0-cu130-py3.11-torch2.13.0"]
    assert matrix.release_rows(versions, cpu) == [cpu] and matrix.release_rows(versions, cuda) == [cuda]
    assert matrix.release_title(versions, cpu) == "demo 1.0 - cpu py3.11 torch2.13.0"  # one world per title
    assert matrix.release_title(versions, cuda) == "demo 1.0 - cu13.0.2 py3.11 torch2.13.0"
    assert matrix.select(matrix.expand(versions), versions=versions, component="demo", cuda="cpu") == [cpu]


def test_on_github_an_asset_without_a_digest_is_hashed_to_tell_identical_from_replaced(tmp_path):
    """Assets uploaded before GitHub kept digests have none: their bytes are hashed (downloaded) to know whether a
    re-release is identical (written over, nothing served changes) or would replace them (refused without replace)."""
    from build_records import write_record
    from wheel_factory import build_wheel

    from ci.store.github import GitHubStore
    from tests.github_server import GitHubTestServer

    path = tmp_path / "versions.yaml"
    path.write_text(TWO_WORLDS)
    versions = load(path)
    cpu, _ = matrix.expand(versions)
    dist = tmp_path / "dist"
    wheel = build_wheel(dist / cpu.world, {"demo/__init__.py": b"ours"}, name="demo", version="1.0", tags="py3-none-any")
    write_record(dist, cpu, [wheel])
    plan_ = release.plan(versions, cpu, dist)
    ours = sha256_file(wheel)
    with GitHubTestServer(token="t") as gh:
        rel = gh.seed_release(cpu.release_tag, name=matrix.release_title(versions, cpu))
        gh.state.add_asset(rel, wheel.name, wheel.read_bytes(), digest=None)
        with GitHubStore("o/r", token="t", api_url=gh.api_url, sleep=lambda s: None) as store:
            assert release.outcomes(plan_, store)[wheel.name] == release.Outcome(release.IDENTICAL, ours, ours)
            release.apply(plan_, store)
            assert store.get_release(cpu.release_tag).asset(wheel.name).sha256 == ours  # written over: now digested

        other = b"published before, other bytes"
        for existing in [a for a in rel.assets.values() if a.name == wheel.name]:
            del rel.assets[existing.id]
        gh.state.add_asset(rel, wheel.name, other, digest=None)
        with GitHubStore("o/r", token="t", api_url=gh.api_url, sleep=lambda s: None) as store:
            with pytest.raises(WheelhouseError) as refused:
                release.apply(plan_, store)
            published = hashlib.sha256(other).hexdigest()
            assert str(refused.value) == (
                f"release {cpu.release_tag}: {wheel.name} is published with sha256 {published}, this build's is "
                f"{ours}: its URL would serve other bytes; pass --replace to replace it, or bump the version")
            release.apply(plan_, store, replace=True)
            assert store.read_asset(cpu.release_tag, wheel.name) == wheel.read_bytes()
