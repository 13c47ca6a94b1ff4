"""The provenance statement each release carries: in-toto Statement v1 with an SLSA Provenance v1 predicate,
uploaded after the wheels it names and before the manifest, in deterministic bytes."""

from __future__ import annotations

import json
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit
from urllib.request import url2pathname

import pytest
from provenance_helpers import RUN_ENV, built_row, release_fixture

from ci.base.digest import sha256_file
from ci.base.errors import ConfigError, RemoteError
from ci.building import sbom
from ci.model import build_record, manifest
from ci.model.versions import REPO_ROOT
from ci.publish import provenance, release
from ci.publish.index import site_files
from ci.store.local import LocalStore
from ci.store.model import Asset, Release


class RecordingStore:
    """A local store that records each upload and can fail the one named ``fail_at``."""

    def __init__(self, inner: LocalStore, fail_at: str | None = None) -> None:
        self.inner = inner
        self.description = inner.description
        self.fail_at = fail_at
        self.calls: list[str] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def ensure_release(self, tag, title, body):
        self.calls.append("ensure")
        return self.inner.ensure_release(tag, title, body)

    def upload_asset(self, tag, path, *, name=None, clobber=False):
        self.calls.append(name)
        if name == self.fail_at:
            raise RemoteError(f"upload of {name} failed")
        return self.inner.upload_asset(tag, path, name=name, clobber=clobber)


def test_the_statement_binds_every_wheel_to_its_commits_fingerprint_row_and_run(fixture_wheel, tmp_path):
    released = release_fixture(fixture_wheel, tmp_path)
    row, wheel = released.row, released.wheel
    statement = json.loads(released.provenance.read_bytes())
    built = manifest.parse(released.manifest.read_bytes(), where="test")
    summary = sbom.read_sbom(wheel)

    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    assert statement["predicateType"] == "https://slsa.dev/provenance/v1"
    assert statement["subject"] == [{"name": wheel.name, "digest": {"sha256": sha256_file(wheel)}}]
    assert released.store.get_release(row.release_tag).asset(wheel.name).sha256 == sha256_file(wheel)
    definition = statement["predicate"]["buildDefinition"]
    external = definition["externalParameters"]
    assert definition["buildType"] == provenance.BUILD_TYPE
    assert external["row"] == row.to_json() and external["release_tag"] == row.release_tag
    assert external["fingerprint"] == built.fingerprint
    assert external["source"]["revision"] == summary.source_revision == built.source["revision"]
    record = json.loads(build_record.path_for(row, tmp_path / "dist").read_text())
    versions_commit = record["sbom"]["versions"]["commit"] + ("-dirty" if record["sbom"]["versions"]["dirty"] else "")
    assert external["versions"] == {"file": "tests/fixtures/versions.yaml", "commit": versions_commit}
    assert definition["internalParameters"] == {"build_config": built.build_config}
    # the fixture's source is a directory: its digest is the source dependency
    assert {"name": "source", "digest": {"sha256": summary.source_revision}} in definition["resolvedDependencies"]
    if not versions_commit.endswith("-dirty"):  # a clean checkout names its commit as a dependency too
        (versions_dep,) = [d for d in definition["resolvedDependencies"] if d["name"] == "versions.yaml"]
        assert versions_dep == {"name": "versions.yaml", "digest": {"gitCommit": versions_commit},
                                "uri": f"git+https://github.com/octo/wheelhouse@{versions_commit}"}
    assert statement["predicate"]["runDetails"] == {
        "builder": {"id": "https://github.com/octo/wheelhouse/.github/workflows/_publish.yml"},
        "metadata": {"invocationId": "https://github.com/octo/wheelhouse/actions/runs/4242/attempts/2"},
    }
    parsed = provenance.parse(released.provenance.read_bytes(), where="test")
    assert (parsed.arch, parsed.world, parsed.run) == (row.arch, row.world, statement["predicate"]["runDetails"]
                                                       ["metadata"]["invocationId"])


def test_the_statement_bytes_are_deterministic_and_sorted(fixture_wheel, tmp_path):
    versions, row = built_row(fixture_wheel, tmp_path / "dist")

    def statement_bytes() -> bytes:
        steps = release.plan(versions, row, tmp_path / "dist", env=RUN_ENV).steps
        (step,) = [s for s in steps if s.name == provenance.asset_name(row.arch)]
        assert step.data is not None
        return step.data

    first = statement_bytes()
    assert statement_bytes() == first
    # no path of this machine (the SBOM facts' source, not the record's absolute directory): a rebuild
    # elsewhere gives the same statement
    assert str(REPO_ROOT) not in first.decode() and str(tmp_path) not in first.decode()
    assert json.loads(first)["predicate"]["buildDefinition"]["externalParameters"]["source"]["location"] == \
        "tests/fixtures/fixture_ext"
    assert first == (json.dumps(json.loads(first), sort_keys=True, indent=2) + "\n").encode()


def test_the_provenance_follows_the_wheels_and_precedes_the_manifest(fixture_wheel, tmp_path):
    versions, row = built_row(fixture_wheel, tmp_path / "dist")
    store = RecordingStore(LocalStore(tmp_path / "store"))
    release.apply(release.plan(versions, row, tmp_path / "dist", env=RUN_ENV), store)
    wheel = fixture_wheel.name
    assert store.calls == ["ensure", wheel, f"{wheel}.metadata", provenance.asset_name(row.arch),
                           manifest.asset_name(row.arch)]


@pytest.mark.parametrize("failing", ["wheel", "provenance"])
def test_a_release_that_stops_part_way_never_names_a_missing_wheel_and_the_rerun_completes(fixture_wheel, tmp_path,
                                                                                            failing):
    versions, row = built_row(fixture_wheel, tmp_path / "dist")
    names = {"wheel": fixture_wheel.name, "provenance": provenance.asset_name(row.arch)}
    inner = LocalStore(tmp_path / "store")
    with pytest.raises(RemoteError):
        release.apply(release.plan(versions, row, tmp_path / "dist", env=RUN_ENV),
                      RecordingStore(inner, fail_at=names[failing]))
    present = {asset.name for asset in inner.get_release(row.release_tag).assets}
    assert manifest.asset_name(row.arch) not in present  # so the skip plan builds and releases the row again
    if failing == "wheel":
        assert provenance.asset_name(row.arch) not in present
    release.apply(release.plan(versions, row, tmp_path / "dist", env=RUN_ENV), inner)
    present = {asset.name for asset in inner.get_release(row.release_tag).assets}
    assert {fixture_wheel.name, provenance.asset_name(row.arch), manifest.asset_name(row.arch)} <= present


def test_a_run_without_its_variables_is_one_line_before_anything_is_uploaded(fixture_wheel, tmp_path):
    versions, row = built_row(fixture_wheel, tmp_path / "dist")
    env = {k: v for k, v in RUN_ENV.items() if k != "GITHUB_RUN_ID"}
    with pytest.raises(ConfigError) as info:
        release.plan(versions, row, tmp_path / "dist", env=env)
    assert str(info.value).startswith("GitHub Actions run without GITHUB_RUN_ID:") and "\n" not in str(info.value)


def test_a_release_outside_actions_names_the_local_builder_and_no_run(fixture_wheel, tmp_path):
    released = release_fixture(fixture_wheel, tmp_path, env={"GITHUB_RUN_ID": "ignored outside Actions"})
    statement = json.loads(released.provenance.read_bytes())
    assert statement["predicate"]["runDetails"] == {"builder": {"id": provenance.LOCAL_BUILDER}}
    assert provenance.parse(released.provenance.read_bytes(), where="test").run is None


def test_asset_names_round_trip():
    assert provenance.asset_name("aarch64") == "wheelhouse-provenance-aarch64.intoto.json"
    assert provenance.arch_of("wheelhouse-provenance-aarch64.intoto.json") == "aarch64"
    assert provenance.arch_of("wheelhouse-build-manifest-aarch64.json") is None


def test_the_publish_job_signs_our_predicate_over_the_checked_wheels_and_releases_the_bundle():
    """One provenance: the predicate `invoke release --predicate-out` writes is what actions/attest signs (over the
    wheels checked again on this runner), and its bundle is what `invoke release --provenance-bundle` uploads."""
    from ci.flows import workflows

    job = workflows.publish_workflow()["jobs"]["publish"]
    names = [step.get("name") for step in job["steps"]]
    order = ["Check the wheels again", "Write the provenance predicate", "Sign the provenance", "Publish to the release"]
    assert [names.index(name) for name in order] == sorted(names.index(name) for name in order)
    sign = job["steps"][names.index("Sign the provenance")]
    assert sign["uses"] == "actions/attest@1e69f48acb82d1966a394da916b4c1698aa569d6"
    assert sign["with"] == {"subject-path": "dist/${{ inputs.world }}/*.whl",
                            "predicate-type": "https://slsa.dev/provenance/v1",
                            "predicate-path": "${{ steps.predicate.outputs.path }}"}
    publish = job["steps"][names.index("Publish to the release")]
    assert publish["env"]["PROVENANCE_BUNDLE"] == "${{ steps.sign.outputs.bundle-path }}"
    scripts = {step["name"]: (REPO_ROOT / step["run"].split()[1]).read_text() for step in job["steps"]
               if step.get("run", "").startswith("bash ")}
    assert "--predicate-out" in scripts["Write the provenance predicate"]
    assert '--provenance-bundle "$PROVENANCE_BUNDLE"' in scripts["Publish to the release"]
    assert job["permissions"] == {"contents": "write", "id-token": "write", "attestations": "write"}
    rendered = workflows.render(workflows.publish_workflow())
    assert "uses: actions/attest@1e69f48acb82d1966a394da916b4c1698aa569d6  # v4.2.2" in rendered


# --- the index links each wheel's statement -------------------------------------------------------


class _Links(HTMLParser):
    """The attributes of every <a> of a page."""

    def __init__(self, text: str) -> None:
        super().__init__(convert_charrefs=True)
        self.anchors: list[dict[str, str | None]] = []
        self.feed(text)

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.anchors.append(dict(attrs))


def _file_fetch(asset: Asset):
    yield Path(url2pathname(urlsplit(asset.url).path)).read_bytes()


def test_the_index_links_the_released_wheels_statement(fixture_wheel, tmp_path):
    released = release_fixture(fixture_wheel, tmp_path)
    site, files = site_files(released.store.list_releases(), base_url="https://owner.github.io/repo/",
                             default_world="cpu/torch2.13", fetch=_file_fetch)
    assert site.warnings == ()
    (link,) = _Links(files["cpu/torch2.13/simple/wheelhouse-fixture/index.html"].decode()).anchors
    statement_url = link["data-wheelhouse-provenance"]
    assert statement_url is not None and statement_url.endswith("/" + released.provenance.name)
    # the URL serves the statement, and the statement names this wheel's bytes
    statement = provenance.parse(Path(url2pathname(urlsplit(statement_url).path)).read_bytes(), where="test")
    assert statement.subjects == {released.wheel.name: sha256_file(released.wheel)}
    assert "data-provenance" not in link  # PEP 740's attribute promises a signed provenance object: not ours


def _asset(name: str, aid: int) -> Asset:
    return Asset(name, 1, f"https://example.invalid/download/t/{name}", "sha256:" + "0" * 64, id=aid)


def test_each_wheel_links_the_statement_of_its_own_arch_and_never_a_guess():
    x86 = _asset("comp-1.0-cp311-cp311-manylinux_2_28_x86_64.whl", 1)
    arm = _asset("comp-1.0-cp311-cp311-manylinux_2_28_aarch64.whl", 2)
    pure = _asset("pure-1.0-py3-none-any.whl", 3)
    x86_statement = _asset(provenance.asset_name("x86_64"), 4)
    arm_statement = _asset(provenance.asset_name("aarch64"), 5)
    title = "comp v1 - cu13.0.2 py3.11 torch2.13.0; aarch64 cu13.0.2 py3.11 torch2.13.0"

    def links(*assets: Asset) -> dict[str, str | None]:
        _, files = site_files([Release("t", title, assets=assets)], base_url="https://owner.github.io/repo/",
                              default_world="cu130/torch2.13")
        found = {}
        for project in ("comp", "pure"):
            page = files.get(f"cu130/torch2.13/simple/{project}/index.html")
            for anchor in _Links(page.decode()).anchors if page else ():
                found[str(anchor["href"]).split("#")[0].rsplit("/", 1)[1]] = anchor.get("data-wheelhouse-provenance")
        return found

    both = links(x86, arm, pure, x86_statement, arm_statement)
    assert both == {x86.name: x86_statement.url, arm.name: arm_statement.url, pure.name: None}  # pure: which arch?
    only_x86 = links(x86, arm, pure, x86_statement)
    assert only_x86 == {x86.name: x86_statement.url, arm.name: None, pure.name: x86_statement.url}
    assert links(x86, pure) == {x86.name: None, pure.name: None}
