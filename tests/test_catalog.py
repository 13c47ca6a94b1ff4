"""The catalog behind the pages and records: statuses from versions.yaml and the earlier publish, torch
indexes, wheel facts kept in digests.json, and which GPUs a wheel's device code runs on."""

from __future__ import annotations

import json
import random

import pytest
from index_helpers import wheel_bytes
from packaging.version import Version
from test_index import BASE, DL, MemoryFetch, meta_bytes, sha, wheel_asset

from ci.base import json_text
from ci.base.errors import WheelhouseError
from ci.formats.archs import CudaArch, parse_arch_list
from ci.model.versions import REPO_ROOT, load
from ci.publish.catalog import (
    DEPRECATED,
    INDEX_RECORD,
    WORLD_RECORD,
    Context,
    Previous,
    ProjectEntry,
    Status,
    WheelEntry,
    WorldEntry,
    parse_previous,
    wheel_entry,
    wheel_records,
)
from ci.publish.index import CACHE_FILE, DigestCache, build_site, site_catalog, site_files
from ci.publish.pages import DirectoryTarget, context_of, publish_index
from ci.publish.wheel_facts import WheelFacts
from ci.publish.which_wheel import runs_on
from ci.store.model import Asset, Release

TITLE = "comp v1 - cu13.0.2 py3.11 torch2.13.0"


def _release(tag: str = "t", title: str = TITLE, name: str = "comp-1.0-py3-none-any.whl") -> Release:
    return Release(tag, title, assets=(wheel_asset(name, tag),))


def test_a_world_and_a_project_versions_yaml_no_longer_builds_are_deprecated():
    context = Context(current_worlds=frozenset({"cu129/torch2.13"}), current_projects=frozenset({"other"}))
    _, files = site_files([_release()], base_url=BASE, default_world=None, context=context)
    record = json.loads(files[f"cu130/torch2.13/{WORLD_RECORD}"])
    assert record["status"] == DEPRECATED and "no build_matrix row" in record["status_reason"]
    assert record["projects"][0]["status"] == DEPRECATED
    page = files["cu130/torch2.13/simple/comp/index.html"].decode()
    assert '<meta name="pypi:project-status" content="deprecated">' in page and "<a href=" in page  # still served
    assert "The world cu130/torch2.13 is deprecated" in files["cu130/torch2.13/index.html"].decode()


def test_an_archived_project_comes_back_active_when_a_release_holds_it_again():
    previous = Previous({"cu130/torch2.13": Status()}, {"cu130/torch2.13": {"comp": Status("archived", "gone")}})
    _, files = site_files([_release()], base_url=BASE, default_world=None, context=Context(previous=previous))
    assert json.loads(files[INDEX_RECORD])["worlds"][0]["projects"] == [
        {"name": "comp", "status": "active", "status_reason": ""}]


def test_a_cpu_world_whose_rows_take_torch_from_the_installers_index_names_pytorchs_cpu_index():
    """torch_index: default (the demo's world, for the build) must not reach the pages as "the installer's own
    index": there the package index's torch is a CUDA build, which a CPU world's commands would then install."""
    context = context_of(load(REPO_ROOT / "tests" / "fixtures" / "versions.yaml"))
    assert context.torch_indexes == {"cpu/torch2.13": None} and context.current_projects == {"wheelhouse-fixture"}
    rel = _release("f", "wheelhouse-fixture 0.1.0 - cpu py3.11 torch2.13.0", "wheelhouse_fixture-0.1.0-py3-none-any.whl")
    _, files = site_files([rel], base_url=BASE, default_world=None, context=context)
    page = files["cpu/torch2.13/index.html"].decode()
    cpu = "https://download.pytorch.org/whl/cpu"
    assert f"<pre>pip install --index-url {cpu} &#x27;torch==2.13.*&#x27;\npip install --no-deps --index-url " in page
    assert (f"<pre>uv pip install --index {BASE}/cpu/torch2.13/simple/ --index {cpu} "
            "wheelhouse-fixture==0.1.0</pre>") in page
    assert "configured index" not in page
    assert json.loads(files[INDEX_RECORD])["worlds"][0]["torch_index"] == cpu


def test_a_cache_from_before_the_wheel_facts_downloads_each_wheel_once_more_then_never():
    meta = meta_bytes("pkg", "1.0")
    data = wheel_bytes("pkg-1.0-py3-none-any.whl", meta)
    whl = Asset("pkg-1.0-py3-none-any.whl", len(data), f"{DL}/t/pkg-1.0-py3-none-any.whl", f"sha256:{sha(data)}", id=1)
    side = Asset(whl.name + ".metadata", len(meta), whl.url + ".metadata", f"sha256:{sha(meta)}", id=2)
    release = Release("t", TITLE, assets=(whl, side))
    old = {"version": 1, "assets": {}, "metadata": {sha(meta): {"name": "pkg", "version": "1.0", "requires_python": None}},
           "sidecars": {sha(data): sha(meta)}}  # what a publish wrote before the facts existed
    fetch = MemoryFetch({whl.url: data, side.url: meta})
    _, files = site_files([release], base_url=BASE, default_world=None, fetch=fetch,
                          cache=DigestCache.from_json(json.dumps(old)))
    assert fetch.calls == [whl.name]
    facts = json.loads(files[CACHE_FILE])["wheels"][sha(data)]
    assert facts["archs_known"] is False and facts["torch_pin"] is None  # no SBOM: not recorded, and said so
    again = MemoryFetch({whl.url: data, side.url: meta})
    site_files([release], base_url=BASE, default_world=None, fetch=again, cache=DigestCache.from_json(files[CACHE_FILE]))
    assert again.calls == []


def test_an_earlier_record_that_is_not_ours_is_a_warning_and_the_site_is_published(tmp_path):
    site = tmp_path / "site"
    publish_index([_release()], DirectoryTarget(site), base_url=BASE, default_world=None)
    (site / INDEX_RECORD).write_text('{"format": "something else"}')
    outcome = publish_index([_release()], DirectoryTarget(site), base_url=BASE, default_world=None)
    assert any(f"{INDEX_RECORD} of directory" in w and "is not an index record this tool wrote" in w
               for w in outcome.warnings), outcome.warnings
    assert json.loads((site / INDEX_RECORD).read_text())["format"] == "wheelhouse-index"
    with pytest.raises(WheelhouseError, match="not carried over"):
        parse_previous(b"[]", source="x")


def _facts(cubins: str = "", ptx: str = "") -> WheelFacts:
    return WheelFacts(True, parse_arch_list(cubins).archs, parse_arch_list(ptx).archs)


@pytest.mark.parametrize(("facts", "gpu", "runs"), [
    (_facts("8.0;9.0"), CudaArch(8, 6), True),  # same major, a higher minor runs the older cubin
    (_facts("8.0;9.0"), CudaArch(12, 0), False),
    (_facts("9.0a"), CudaArch(9, 0), True),
    (_facts("10.0a"), CudaArch(10, 3), False),  # arch-specific: only its own arch
    (_facts("10.0f"), CudaArch(10, 3), True),  # family: the higher minors of its major
    (_facts("8.0", ptx="9.0"), CudaArch(12, 0), True),  # PTX the driver compiles for a newer GPU
    (_facts("8.0", ptx="9.0a"), CudaArch(12, 0), False),
    (_facts("9.0", ptx="10.0"), CudaArch(8, 9), False),  # PTX does not run on an older GPU
])
def test_which_gpus_a_wheels_device_code_runs_on(facts, gpu, runs):
    assert runs_on(facts, gpu) is runs


@pytest.mark.parametrize("reader", ["previous-index", "site-marker", "digest-cache", "digest-cache-probe"])
def test_a_deeply_nested_record_of_an_earlier_publish_is_one_line(reader):
    """R9: json.loads ends 200,000 nested brackets in RecursionError; each reader of what an earlier publish left
    says so in its one line (or, probing whether a file is ours, answers no)."""
    from ci.publish.site_marker import SiteMarker, is_digest_cache

    deep = b"[" * 200_000 + b"]" * 200_000
    if reader == "digest-cache-probe":
        assert is_digest_cache(deep) is False
        return
    read = {"previous-index": lambda: parse_previous(deep, source="wheelhouse-index.json of the target"),
            "site-marker": lambda: SiteMarker.parse(deep, source="wheelhouse-site.json of the target"),
            "digest-cache": lambda: DigestCache.from_json(deep, source="digests.json of the target")}[reader]
    with pytest.raises(WheelhouseError) as error:
        read()
    assert "of the target" in str(error.value) and "\n" not in str(error.value)


_ODD_TEXTS = ("", "plain", "%s %d %%", 'quote " and \\ backslash', "caf\u00e9 \U0001f600", "line\nbreak\t\x00", "},\n  {")


def _random_wheel(rnd: random.Random, i: int) -> WheelEntry:
    def text() -> str:
        return rnd.choice(_ODD_TEXTS) + str(i)

    def maybe() -> str | None:
        return None if rnd.random() < 0.4 else text()

    facts = None if rnd.random() < 0.3 else WheelFacts(
        rnd.random() < 0.5, parse_arch_list(rnd.sample(["8.0", "9.0a", "10.0", "12.0"], rnd.randint(0, 3))).archs,
        parse_arch_list(rnd.sample(["9.0", "12.0"], rnd.randint(0, 2))).archs, maybe(),
        None if rnd.random() < 0.3 else {text(): text() for _ in range(rnd.randint(0, 3))})
    return wheel_entry(filename=text(), url=text(), sha256=maybe(), size=rnd.choice((0, 1, 2**40, i)), release=text(),
                       release_url=text(), version=Version(f"1.{i}"), requires_python=maybe(), yanked=maybe(),
                       facts=facts)


def test_each_wheels_record_is_written_as_json_writes_it_in_its_worlds_record():
    """A wheel's record text, made with its entry, is json.dumps(indent=1, sort_keys=True)'s at the depth where a
    world's record holds it; the records of a project are joined as json writes the list."""
    rnd = random.Random(45)
    for i in range(400):
        wheels = [_random_wheel(rnd, i) for _ in range(rnd.randint(0, 4))]
        world = WorldEntry("cu130/torch2.13", "i", None, projects=(ProjectEntry("p", wheels=tuple(wheels)),))
        assert world.record() == (json.dumps(world.to_json(), indent=1, sort_keys=True) + "\n").encode()
        for wheel in wheels:
            without = wheel.without_sha256()
            assert without.sha256 is None and without._replace(record="") == wheel._replace(sha256=None, record="")
            assert without.record == json_text.dumps(without.to_json(), 4)


def test_wheel_records_are_made_for_the_depth_of_a_worlds_record():
    wheels = [_random_wheel(random.Random(1), 1)]
    assert "".join(wheel_records(wheels, 3)).startswith("[\n    {\n     ")
    with pytest.raises(ValueError, match="depth 3"):
        wheel_records(wheels, 2)


def test_a_world_record_is_written_without_a_document_per_wheel(monkeypatch):
    """The record's bytes are those of its document, which the catalog no longer builds for each wheel."""
    releases = [Release(f"t{i}", TITLE, assets=(wheel_asset(f"comp-1.{i}-py3-none-any.whl", f"t{i}", aid=i),))
                for i in range(30)]
    site = build_site(releases, default_world=None)
    catalog = site_catalog(site, base_url=BASE)
    [world] = catalog.worlds
    expected = (json.dumps(world.to_json(), indent=1, sort_keys=True) + "\n").encode()

    def no_document(self):
        raise AssertionError("a wheel's document was built")

    monkeypatch.setattr(WheelEntry, "to_json", no_document)
    assert world.record() == expected
    _, files = site_files(releases, base_url=BASE, default_world=None)
    assert files[f"cu130/torch2.13/{WORLD_RECORD}"] == expected


def test_the_catalog_keeps_the_sites_links_as_its_wheels():
    """One object per wheel: the catalog's entries of a project are the links of its page, not copies."""
    releases = [Release(f"t{i}", TITLE, assets=(wheel_asset(f"comp-1.{i}-py3-none-any.whl", f"t{i}", aid=i),
                                                 wheel_asset(f"other-1.{i}-py3-none-any.whl", f"t{i}", aid=100 + i)))
                for i in range(3)]
    site = build_site(releases, default_world=None)
    [world] = site_catalog(site, base_url=BASE).worlds
    pages = site.world(world.path).packages
    assert [p.name for p in world.projects] == [p.name for p in pages] == ["comp", "other"]
    for project, page in zip(world.projects, pages, strict=True):
        assert len(project.wheels) == len(page.links) == 3
        assert all(wheel is link for wheel, link in zip(project.wheels, page.links, strict=True))
