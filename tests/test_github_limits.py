"""GitHub as it really is, enforced by the test server: the 10,000-result listing cap, the asset size
and count caps, and tags created by a retag at the commit GitHub picks."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ci.base.errors import RemoteError
from ci.maintenance import migrate
from ci.publish.index import DigestCache, build_site
from ci.store import github as github_store
from ci.store.github import GitHubStore
from tests.github_server import GitHubTestServer

TOKEN = "test-token"
LIST = "GET /repos/{owner}/{repo}/releases"
BY_TAG = "GET /repos/{owner}/{repo}/releases/tags/{tag}"
REFS = "GET /repos/{owner}/{repo}/git/matching-refs/{ref}"


def _store(gh: GitHubTestServer, **kw) -> GitHubStore:
    return GitHubStore("o/r", token=TOKEN, api_url=gh.api_url, sleep=lambda s: None, **kw)


def test_listing_12000_releases_past_the_10000_cap() -> None:
    n = 12_000
    with GitHubTestServer(token=TOKEN, keep_log=False) as gh:
        gh.seed_bulk(n, 1, tag_format="pkg0-{i}.0-py3.12-torch2.13.0")
        with gh.state.lock:  # titles the index can place in a world
            for rel in gh.state.repo("o", "r").releases.values():
                rel.name = f"pkg0 {rel.tag_name.split('-')[1]} - cu13.0.2 py3.12 torch2.13.0"
        gh.reset_counters()
        with _store(gh) as store:
            t0 = time.perf_counter()
            releases = store.list_releases()
            wall = time.perf_counter() - t0
        counts = dict(gh.counters)
    assert len(releases) == n and len({r.tag for r in releases}) == n
    assert counts[LIST] == 101  # 100 pages of 100, then the 422 of page 101
    assert counts[REFS] == 1 and counts[BY_TAG] == n - 10_000
    site = build_site(releases, default_world="cu130/torch2.13", cache=DigestCache())
    assert site.worlds[0].link_count == n  # the index is complete
    print(f"\nlisting {n} releases: {sum(counts.values())} requests ({counts[LIST]} list pages, 1 tag listing, "
          f"{counts[BY_TAG]} by tag) in {wall:.1f} s")


def test_the_server_refuses_listing_past_the_cap() -> None:
    with GitHubTestServer(token=TOKEN) as gh:
        gh.state.listing_cap = 5
        gh.seed_bulk(7, 1)
        import urllib.request

        req = urllib.request.Request(f"{gh.api_url}/repos/o/r/releases?per_page=5&page=2",
                                     headers={"Authorization": f"token {TOKEN}"})
        with pytest.raises(urllib.error.HTTPError) as caught:
            urllib.request.urlopen(req)
        assert caught.value.code == 422 and b"Only the first 5 results are available." in caught.value.read()
        with _store(gh) as store:  # the client completes the listing from the tags
            assert len(store.list_releases()) == 7


def test_retag_keeps_the_release_on_its_commit() -> None:
    """PATCH tag_name creates a missing tag at target_commitish (the default branch head unless given)."""
    with GitHubTestServer(token=TOKEN) as gh:
        gh.seed_release("apex-master", name="apex master - cu13.0.2 py3.12 torch2.11.0")
        old_commit = gh.tag_commits()["apex-master"]
        head = gh.state.advance_head("o", "r")  # main moved on since the release was made
        assert head != old_commit
        with _store(gh) as store:
            result = migrate.apply(migrate.plan_for(store), store)
        assert result.renamed == (("apex-master", "apex-master-cu130-py3.12-torch2.11.0"),)
        assert gh.tag_commits()["apex-master-cu130-py3.12-torch2.11.0"] == old_commit


def test_retag_refuses_when_the_old_tag_is_gone() -> None:
    with GitHubTestServer(token=TOKEN) as gh:
        gh.seed_release("apex-master", name="apex master - cu13.0.2 py3.12 torch2.11.0")
        with gh.state.lock:
            del gh.state.repo("o", "r").tags["apex-master"]
        with _store(gh) as store, pytest.raises(RemoteError, match="the git tag apex-master is missing"):
            store.retag_release("apex-master", "apex-master-py3.12-torch2.11.0")
        assert "apex-master" in gh.snapshot()


UPLOAD = "POST /repos/{owner}/{repo}/releases/{release_id}/assets"


def test_an_asset_of_2_gib_is_refused_before_uploading(tmp_path: Path) -> None:
    wheel = tmp_path / "big-1.0-cp312-cp312-linux_x86_64.whl"
    with wheel.open("wb") as f:
        f.truncate(2 * 1024**3)  # sparse: no disk used
    with GitHubTestServer(token=TOKEN) as gh:
        with _store(gh) as store:
            store.ensure_release("big-1.0", "big 1.0 - cu13.0.2 py3.12 torch2.13.0", "")
            with pytest.raises(RemoteError) as caught:
                store.upload_asset("big-1.0", wheel)
        assert gh.counters[UPLOAD] == 0
    assert str(caught.value) == (f"{wheel.name} is 2147483648 bytes; GitHub takes release assets under 2 GiB "
                                 "(2147483648 bytes): build fewer CUDA archs into one wheel, or split the package")


def test_a_full_release_is_refused_before_uploading_and_a_clobber_needs_a_free_slot(tmp_path: Path,
                                                                                      monkeypatch) -> None:
    monkeypatch.setattr(github_store, "MAX_ASSETS_PER_RELEASE", 3)
    files = []
    for i in range(4):
        f = tmp_path / f"a{i}.whl"
        f.write_bytes(b"x%d" % i)
        files.append(f)
    with GitHubTestServer(token=TOKEN) as gh:
        gh.state.max_assets = 3
        with _store(gh) as store:
            store.ensure_release("r", "r", "")
            for f in files[:3]:
                store.upload_asset("r", f)
            uploads = gh.counters[UPLOAD]
            with pytest.raises(RemoteError, match=r"release r holds 3 assets, GitHub's limit per release is 3: "
                                                  r"a3.whl cannot be added"):
                store.upload_asset("r", files[3])
            files[0].write_bytes(b"new bytes")
            with pytest.raises(RemoteError, match=r"replacing a0\.whl safely needs one free slot"):
                store.upload_asset("r", files[0], clobber=True)
            assert gh.counters[UPLOAD] == uploads  # refused before any upload


def test_the_server_enforces_the_limits_and_the_message_names_them(tmp_path: Path) -> None:
    """A release filled by someone else (or a limit lowered by GitHub): the 422 ``custom`` reaches the user."""
    f = tmp_path / "a.whl"
    f.write_bytes(b"x" * 100)
    with GitHubTestServer(token=TOKEN) as gh:
        gh.state.max_asset_size = 10
        with _store(gh) as store:
            store.ensure_release("r", "r", "")
            with pytest.raises(RemoteError, match=r"HTTP 422 size must be less than or equal to 10: GitHub refused it"):
                store.upload_asset("r", f)
        gh.state.max_asset_size = 1000
        gh.state.max_assets = 0
        with _store(gh) as store, pytest.raises(RemoteError, match=r"HTTP 422 file_count limited to 0 assets"):
            store.upload_asset("r", f)
        assert gh.snapshot()["r"] == {}
