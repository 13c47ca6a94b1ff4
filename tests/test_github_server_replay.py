"""Replay GitHub's recorded traffic (octokit/fixtures) to OUR client: it must send the recorded
request sequence (method, path, query names; hosts and ids aside) and cope with the recorded answers.
The same operations against our server, seeded with the recorded starting state, give the same
sequence."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from ci.base.errors import RemoteError
from ci.store.github import GitHubStore
from tests.github_server import GitHubTestServer
from tests.github_server.replay import ReplayServer, load_fixture, shape
from tests.github_server.schemas import DATA

REPO_A = "octokit-fixture-org/release-assets"
REPO_C = "octokit-fixture-org/release-assets-conflict"
TOKEN = "0000000000000000000000000000000000000001"


@pytest.fixture
def upload_file(tmp_path: Path) -> Path:
    p = tmp_path / "test-upload.txt"
    shutil.copy(DATA / "release-assets" / "test-upload.txt", p)
    return p


def store(repo: str, api_url: str) -> GitHubStore:
    return GitHubStore(repo, token=TOKEN, api_url=api_url, sleep=lambda s: None, seed=0)


def run_release_assets(st: GitHubStore, path: Path, release_id: int) -> None:
    asset = st.upload_asset("v1.0.0", path, label="test")  # get by tag, upload 201
    assert asset.name == "test-upload.txt" and asset.size == 14
    listed = st.list_assets(release_id)
    assert [a["name"] for a in listed] == ["test-upload.txt"]
    got = st.get_asset(listed[0]["id"])
    assert got is not None and got["label"] == "test"
    resp = st.update_asset(listed[0]["id"], name="new-filename.txt", label="new label")
    assert resp is not None and resp.status == 200 and resp.json()["name"] == "new-filename.txt"
    st.delete_asset_id(listed[0]["id"])


def run_conflict(st: GitHubStore, path: Path, after_read: Callable[[], None] = lambda: None) -> None:
    raw = st.get_release_json("v1.0.0")
    assert raw is not None
    after_read()
    first = st.upload_file(raw, path, "test-upload.txt", label="test")
    assert first is not None and first.status == 422 and first.error_codes() == ["already_exists"]
    existing = [a for a in st.list_assets(raw["id"]) if a["name"] == "test-upload.txt"]
    assert len(existing) == 1
    st.delete_asset_id(existing[0]["id"])
    again = st.upload_file(raw, path, "test-upload.txt", label="test")
    assert again is not None and again.status == 201 and again.json()["name"] == "test-upload.txt"


def test_replay_release_assets(upload_file: Path) -> None:
    exchanges = load_fixture(DATA / "release-assets" / "normalized-fixture.json")
    with ReplayServer(exchanges) as rp:
        run_release_assets(store(REPO_A, rp.api_url), upload_file, 1000)
        assert rp.received_shapes() == rp.recorded_shapes()
        assert [r[3] for r in rp.received] == [e.host for e in exchanges]  # the upload went to the uploads host
        # bodies: the upload carries the file, the PATCH the recorded JSON
        assert rp.received[1][4] == exchanges[1].body.encode()
        assert json.loads(rp.received[4][4]) == exchanges[4].body


def test_replay_release_assets_conflict(upload_file: Path) -> None:
    exchanges = load_fixture(DATA / "release-assets-conflict" / "normalized-fixture.json")
    with ReplayServer(exchanges) as rp:
        run_conflict(store(REPO_C, rp.api_url), upload_file)
        assert rp.received_shapes() == rp.recorded_shapes()


def test_high_level_upload_reads_recorded_conflict(upload_file: Path) -> None:
    """upload_asset against the recorded answers: 422 already_exists -> list -> an uploaded asset
    without digest (recorded before digests existed) is not ours to overwrite without clobber."""
    exchanges = load_fixture(DATA / "release-assets-conflict" / "normalized-fixture.json")[:3]
    with ReplayServer(exchanges) as rp:
        with pytest.raises(RemoteError, match=r"test-upload\.txt in release v1\.0\.0 differs .*no digest.*--clobber"):
            store(REPO_C, rp.api_url).upload_asset("v1.0.0", upload_file, label="test")
        assert rp.received_shapes() == rp.recorded_shapes()


def test_same_sequences_against_our_server(upload_file: Path) -> None:
    with GitHubTestServer(token=TOKEN) as gh:
        rel_a = gh.seed_release("v1.0.0", repo=REPO_A, name="Version 1.0.0", body="Initial release")
        rel_c = gh.seed_release("v1.0.0", repo=REPO_C, name="Version 1.0.0", body="Initial release")
        # The recording's get-by-tag shows no assets although the name was taken (a stale read on
        # GitHub's side); the same sequence arises on our server when the conflicting asset is
        # added between the read and the upload.
        run_release_assets(store(REPO_A, gh.api_url), upload_file, rel_a.id)
        recorded = [shape(e.method, e.path, e.query_names)
                    for e in load_fixture(DATA / "release-assets" / "normalized-fixture.json")]
        assert [shape(*r) for r in gh.requests()] == recorded
        gh.reset_counters()
        repo_c = gh.state.repo(*REPO_C.split("/"))
        assert repo_c is not None
        run_conflict(store(REPO_C, gh.api_url), upload_file, lambda: gh.state.add_asset(
            repo_c.releases[rel_c.id], "test-upload.txt", b"Hello, world!\n", label="test"))
        recorded_c = [shape(e.method, e.path, e.query_names)
                      for e in load_fixture(DATA / "release-assets-conflict" / "normalized-fixture.json")]
        assert [shape(*r) for r in gh.requests()] == recorded_c
