"""The build record is read once and validated: a whole record round-trips, a broken one is one line naming
the field, and a record of another row is never released."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from build_records import record_of, write_record
from wheel_factory import build_wheel

from ci.base.errors import ConfigError, WheelhouseError
from ci.model import build_record, matrix
from ci.model.build_record import BuildRecord
from ci.model.versions import load
from ci.publish import release
from ci.store.local import LocalStore

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"
FIX = "rebuild the row (nox -s build-wheelhouse-fixture-3.11)"


@pytest.fixture
def fixture(tmp_path):
    """The fixture row and a wheel of it in tmp_path/dist/<world>/ (no record yet)."""
    versions = load(FIXTURE_VERSIONS)
    (row,) = matrix.expand(versions)
    wheel = build_wheel(tmp_path / "dist" / row.world, {"wheelhouse_fixture/__init__.py": b""},
                        name="wheelhouse_fixture", version=row.ref, tags="py3-none-linux_x86_64")
    return versions, row, wheel


def _broken(row: matrix.MatrixRow, change) -> str:
    raw = json.loads(record_of(row, []).to_json())
    change(raw)
    return json.dumps(raw)


def test_a_record_round_trips(fixture, tmp_path):
    _, row, wheel = fixture
    record = record_of(row, [wheel], build_config={"arch": row.arch})
    path = tmp_path / build_record.file_name(row)
    record.write(path)
    read = BuildRecord.read(path)
    assert read == record
    assert read.to_json() == path.read_text()
    assert not list(tmp_path.glob("*.partial"))
    manifest = read.to_manifest()
    assert (manifest.component, manifest.release_tag, manifest.arch, manifest.pythons, manifest.torch) == (
        row.component, row.release_tag, row.arch, row.pythons, row.torch)
    assert manifest.wheels == record.wheels and manifest.checks_passed


@pytest.mark.parametrize("field", ["schema", "row", "fingerprint", "build_config", "source", "toolchain",
                                   "compiler_cache", "compiler_cache_stats", "compiler_cache_misses", "durations", "checks", "wheels", "sbom",
                                   "ninja_steps"])
def test_a_record_missing_a_field_is_one_line_naming_it(fixture, field):
    _, row, _ = fixture
    text = _broken(row, lambda raw: raw.pop(field))
    with pytest.raises(ConfigError) as refused:
        BuildRecord.from_json(text, where="r.build.json", fix=FIX)
    assert str(refused.value) == f"r.build.json: build record $.{field} is missing; {FIX}"


@pytest.mark.parametrize("change,problem", [
    (lambda raw: raw.update(fingerprint=7), "$.fingerprint is an integer, not a string"),
    (lambda raw: raw.update(schema="1"), "$.schema is '1', not 2, the schema this checkout reads"),
    (lambda raw: raw.update(compiler_cache=["sccache"]), "$.compiler_cache is an array, not a string or null"),
    (lambda raw: raw.update(wheels={}), "$.wheels is an object, not an array"),
    (lambda raw: raw["row"].update(torch=2.13), "$.row.torch is a number, not a string"),
    (lambda raw: raw["row"].pop("arch"), "$.row.arch is missing"),
    (lambda raw: raw["row"].update(bundle_pythons=[3.11]), "$.row.bundle_pythons[0] is a number, not a string"),
    (lambda raw: raw["durations"].update(build_s="30s"), "$.durations.build_s is a string, not a number"),
    # bool is an int to Python but not to JSON: true is never a duration
    (lambda raw: raw["durations"].update(build_s=True), "$.durations.build_s is true or false, not a number"),
    (lambda raw: raw["checks"].update(ok="yes"), "$.checks.ok is a string, not true or false"),
    (lambda raw: raw.update(checks={}), "$.checks is {}, not an object with 'ok' (true or false), or 'ran': false"),
    (lambda raw: raw.update(checks={"ran": True}), "$.checks.ran is true, not false"),
    (lambda raw: raw["ninja_steps"].pop("slowest"), "$.ninja_steps.slowest is missing"),
    (lambda raw: raw.update(wheels=[{"name": "a.whl", "sha256": "0" * 64, "size": "1"}]),
     "$.wheels[0].size is a string, not an integer"),
    (lambda raw: raw.update(wheels=[{"name": "a.whl", "sha256": "abc", "size": 1}]),
     "$.wheels[0].sha256 is 'abc', not a sha256 hex digest"),
    (lambda raw: raw.update(wheels=[{"name": "a.whl", "sha256": "0" * 64 + "\n", "size": 1}]),
     "$.wheels[0].sha256 is '" + "0" * 64 + "\\n', not a sha256 hex digest"),
    (lambda raw: raw.update(wheels=["a.whl"]), "$.wheels[0] is a string, not an object"),
    (lambda raw: raw.update(wheels=[{"name": "a.tar.gz", "sha256": "0" * 64, "size": 1}]),
     "$.wheels[0].name is 'a.tar.gz', not a wheel file name"),
    (lambda raw: raw.update(wheels=[{"name": "../a.whl", "sha256": "0" * 64, "size": 1}]),
     "$.wheels[0].name is '../a.whl', not a wheel file name"),
    (lambda raw: raw.update(wheel_count=1), "$.wheel_count is an unknown field (a newer format?)"),
    (lambda raw: raw.update(schema=1), "schema 1, but this checkout reads schema 2"),
])
def test_a_record_with_a_mistyped_field_is_one_line_naming_it(fixture, change, problem):
    _, row, _ = fixture
    with pytest.raises(ConfigError) as refused:
        BuildRecord.from_json(_broken(row, change), where="r.build.json", fix=FIX)
    assert str(refused.value) == f"r.build.json: build record {problem}; {FIX}"


def test_a_build_without_checks_is_read_but_never_released(fixture, tmp_path):
    versions, row, wheel = fixture
    path = write_record(tmp_path / "dist", row, [wheel])
    path.write_text(_broken(row, lambda raw: raw.update(checks={"ran": False})))
    assert not BuildRecord.read(path).checks_passed
    with pytest.raises(WheelhouseError, match="the wheel checks did not pass for this build; it cannot be released"):
        release.plan(versions, row, tmp_path / "dist")


@pytest.mark.parametrize("field,value", [("component", "other"), ("ref", "0.2.0"), ("python", "3.12"),
                                         ("bundle_pythons", ("3.11", "3.12")), ("arch", "aarch64"), ("cuda", "13.0.2"),
                                         ("torch", "2.12.0")])
def test_release_refuses_a_record_of_another_row(fixture, tmp_path, field, value):
    versions, row, wheel = fixture
    other = dataclasses.replace(row, **{field: value})
    record = record_of(other, [wheel])
    path = build_record.path_for(row, tmp_path / "dist")  # where the asked row's record lies
    record.write(path)
    store = LocalStore(tmp_path / "store")
    with pytest.raises(ConfigError) as refused:
        release.apply(release.plan(versions, row, tmp_path / "dist"), store)
    got, wanted = record.row[field], row.to_json()[field]
    assert str(refused.value) == (
        f"{path}: records a build with {field} {got!r}, but the row to release ({row.label}) has {field} {wanted!r}; "
        f"release the row it was built for, or rebuild this one (nox -s {row.session})")
    assert store.list_releases() == []


def test_invoke_release_of_another_rows_record_is_one_line_and_releases_nothing(fixture, tmp_path):
    _, row, wheel = fixture
    path = build_record.path_for(row, tmp_path / "dist")
    record_of(dataclasses.replace(row, torch="2.12.0"), [wheel]).write(path)
    done = subprocess.run(
        [sys.executable, "-m", "invoke", "release", "--component", row.component, "--arch", row.arch, "--dist",
         str(tmp_path / "dist"), "--store", str(tmp_path / "store")],
        cwd=REPO, capture_output=True, text=True, timeout=120,
        env={**os.environ, "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS)})
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: {path}: records a build with torch '2.12.0', but the row to release ({row.label}) has torch "
        f"'2.13.0'; release the row it was built for, or rebuild this one (nox -s {row.session})"]
    assert not (tmp_path / "store").exists()
