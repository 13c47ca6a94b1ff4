"""The record formats as JSON Schemas (draft 2020-12): every schema is one, every record the code writes satisfies
its schema, and a broken record is refused where it is read, in one line naming the file and the JSON path of the
bad value."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import jsonschema
import pytest
from build_records import record_of
from index_helpers import wheel_bytes
from test_index import BASE, DL, MemoryFetch, meta_bytes, sha

from ci.base import json_schema
from ci.base.errors import UsageError, WheelhouseError
from ci.model import build_record, matrix, shards
from ci.model.versions import REPO_ROOT, load
from ci.publish import catalog, site_marker, which_wheel
from ci.publish.pages import DirectoryTarget, publish_index
from ci.store.model import Asset, Release

SCHEMAS = sorted(REPO_ROOT.glob("ci/*/schemas/*.schema.json"))


def test_each_format_has_a_schema_and_each_schema_is_draft_2020_12() -> None:
    assert [p.relative_to(REPO_ROOT).as_posix() for p in SCHEMAS] == [
        "ci/model/schemas/build_record.schema.json", "ci/model/schemas/shard_manifest.schema.json",
        "ci/publish/schemas/index_record.schema.json", "ci/publish/schemas/site_marker.schema.json",
        "ci/publish/schemas/world_record.schema.json", "ci/timing/schemas/timed_builds.schema.json"]
    for path in SCHEMAS:
        schema = json.loads(path.read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema", path
        jsonschema.Draft202012Validator.check_schema(schema)


def test_a_build_record_the_code_writes_satisfies_its_schema() -> None:
    (row,) = matrix.expand(load(REPO_ROOT / "tests" / "fixtures" / "versions.yaml"))
    written = json.loads(record_of(row, []).to_json())
    assert json_schema.problem(written, build_record.SCHEMA_FILE) is None
    with_modules = json.loads(build_record.BuildRecord(**{**record_of(row, []).__dict__, "modules": {"modules": []}})
                              .to_json())
    assert json_schema.problem(with_modules, build_record.SCHEMA_FILE) is None


def _shard(root: Path, modules: dict[str, bytes], **manifest) -> Path:
    spec = shards.ShardSpec(1, 1)
    directory = root / spec.dir_name
    results = {}
    for name, data in modules.items():
        path = directory / name / f"{name}.so"
        path.parent.mkdir(parents=True)
        path.write_bytes(data)
        results[name] = shards.ModuleResult(f"{name}/{name}.so", hashlib.sha256(data).hexdigest(), len(data), 2.5)
    shards.ShardManifest(spec, "a" * 64, results, **manifest).write(directory)
    return directory


@pytest.mark.parametrize("manifest", [{}, {"fingerprint": "f" * 64, "durations": {"build_s": 3.0},
                                           "cache": {"requests": 2, "hits": 0, "misses": 2}}])
def test_a_shard_manifest_the_code_writes_satisfies_its_schema_and_reads_back(manifest, tmp_path: Path) -> None:
    directory = _shard(tmp_path, {"m": b"\x7fELF", "n": b""}, **manifest)
    written = json.loads((directory / shards.MANIFEST).read_text())
    assert json_schema.problem(written, shards.SCHEMA_FILE) is None
    assert shards.collect(tmp_path).shards[0][1].fingerprint == manifest.get("fingerprint")


def test_a_shard_manifest_without_a_fingerprint_reads_as_one_not_yet_written(tmp_path: Path) -> None:
    """``fingerprint`` is written when the shard leaves its build: a manifest without the key is read, not a
    KeyError."""
    directory = _shard(tmp_path, {"m": b"1"}, fingerprint="f" * 64)
    raw = json.loads((directory / shards.MANIFEST).read_text())
    del raw["fingerprint"]
    (directory / shards.MANIFEST).write_text(json.dumps(raw))
    assert shards.ShardManifest.read(directory).fingerprint is None


@pytest.mark.parametrize("change,problem", [
    (lambda raw: raw["modules"]["m"].update(sha256="abc"), "$.modules.m.sha256 is 'abc', not a sha256 hex digest"),
    (lambda raw: raw["modules"]["m"].pop("size"), "$.modules.m.size is missing"),
    (lambda raw: raw.update(shard="1"), "$.shard is a string, not an integer"),
    (lambda raw: raw.update(extra=1), "$.extra is an unknown field (a newer format?)"),
    (lambda raw: raw.update(cache={"hits": "0"}), "$.cache.hits is a string, not an integer"),
])
def test_a_broken_shard_manifest_is_one_line_naming_its_json_path(change, problem: str, tmp_path: Path) -> None:
    directory = _shard(tmp_path, {"m": b"1"})
    raw = json.loads((directory / shards.MANIFEST).read_text())
    change(raw)
    (directory / shards.MANIFEST).write_text(json.dumps(raw))
    with pytest.raises(UsageError) as refused:
        shards.collect(tmp_path)
    assert str(refused.value) == f"{directory / shards.MANIFEST}: shard manifest {problem}; build the shard again"


def _published(tmp_path: Path) -> Path:
    """A site published into a directory from one release: a wheel with its sidecar, so its facts are read."""
    meta = meta_bytes("pkg", "1.0", requires_python=">=3.10")
    data = wheel_bytes("pkg-1.0-py3-none-any.whl", meta)
    whl = Asset("pkg-1.0-py3-none-any.whl", len(data), f"{DL}/t/pkg-1.0-py3-none-any.whl", f"sha256:{sha(data)}", id=1)
    side = Asset(whl.name + ".metadata", len(meta), whl.url + ".metadata", f"sha256:{sha(meta)}", id=2)
    release = Release("t", "comp v1 - cu13.0.2 py3.11 torch2.13.0", assets=(whl, side))
    site = tmp_path / "site"
    publish_index([release], DirectoryTarget(site), base_url=BASE, default_world=None,
                  fetch=MemoryFetch({whl.url: data, side.url: meta}), store="github:o/r")
    return site


def test_the_records_a_publish_writes_satisfy_their_schemas(tmp_path: Path) -> None:
    site = _published(tmp_path)
    index = json.loads((site / catalog.INDEX_RECORD).read_text())
    assert json_schema.problem(index, catalog.INDEX_SCHEMA) is None
    worlds = sorted(site.glob(f"*/*/{catalog.WORLD_RECORD}"))
    assert [w.parent.relative_to(site).as_posix() for w in worlds] == [w["world"] for w in index["worlds"]]
    for path in worlds:
        record = json.loads(path.read_text())
        assert json_schema.problem(record, catalog.WORLD_SCHEMA) is None
        assert record["projects"][0]["wheels"][0]["facts"] is not None
        which_wheel.parse_world(path.read_bytes(), str(path))  # which-wheel reads it by the same rules
    marker = json.loads((site / site_marker.MARKER_FILE).read_text())
    assert json_schema.problem(marker, site_marker.SCHEMA_FILE) is None
    assert catalog.parse_previous((site / catalog.INDEX_RECORD).read_bytes(), source="x") is not None


@pytest.mark.parametrize("change,problem", [
    (lambda raw: raw["worlds"][0]["projects"][0].update(status="gone"),
     "$.worlds[0].projects[0].status is 'gone', not active, deprecated or archived (PEP 792)"),
    (lambda raw: raw["worlds"][0].update(world="cu130"), "$.worlds[0].world is 'cu130', not a world such as "
                                                         "cu130/torch2.13"),
    (lambda raw: raw["worlds"][0].pop("projects"), "$.worlds[0].projects is missing"),
])
def test_a_broken_index_record_of_an_earlier_publish_is_one_warning_naming_its_json_path(change, problem: str,
                                                                                          tmp_path: Path) -> None:
    site = _published(tmp_path)
    raw = json.loads((site / catalog.INDEX_RECORD).read_text())
    change(raw)
    (site / catalog.INDEX_RECORD).write_text(json.dumps(raw))
    with pytest.raises(WheelhouseError) as refused:
        catalog.parse_previous((site / catalog.INDEX_RECORD).read_bytes(), source="wheelhouse-index.json of the target")
    assert str(refused.value) == (f"wheelhouse-index.json of the target is not an index record this tool wrote "
                                  f"({problem}): retired worlds and components it named are not carried over")


@pytest.mark.parametrize("change,problem", [
    (lambda raw: raw.update(links="3"), "$.links is a string, not an integer"),
    (lambda raw: raw.update(links=-1), "$.links is -1, out of range (minimum 0)"),
    (lambda raw: raw.pop("store"), "$.store is missing"),
    (lambda raw: raw["files"].append("../outside"), "is '../outside', not a relative path inside the site"),
])
def test_a_broken_site_marker_is_refused_by_the_next_publish_in_one_line(change, problem: str, tmp_path: Path) -> None:
    site = _published(tmp_path)
    raw = json.loads((site / site_marker.MARKER_FILE).read_text())
    change(raw)
    (site / site_marker.MARKER_FILE).write_text(json.dumps(raw))
    before = sorted(p.relative_to(site) for p in site.rglob("*"))
    with pytest.raises(WheelhouseError) as refused:
        publish_index([], DirectoryTarget(site), base_url=BASE, default_world=None, store="github:o/r")
    message = str(refused.value)
    assert "\n" not in message and "is not a site marker this tool wrote (" in message and problem in message
    assert sorted(p.relative_to(site) for p in site.rglob("*")) == before  # nothing written
