"""Two uploaded assets of one name in one release (a clobber interrupted between its rename and its
delete, on a server that allows the rename): the index, the GitHub store and the test server's
download URL all take the newest upload (highest id), whatever order the listing has."""

from __future__ import annotations

import hashlib
import urllib.request

import pytest

from ci.publish.index import DigestCache, build_site
from ci.store.github import GitHubStore
from ci.store.model import Asset, Release, newest_by_name
from tests.github_server import GitHubTestServer

WHEEL = "demo_pkg-1.0-cp311-cp311-linux_x86_64.whl"
TITLE = "demo 1.0 - cucpu py3.11 torch2.13.0"
OLD, NEW = b"old bytes", b"new bytes, clobbered in"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _link_sha(releases: list[Release]) -> str:
    site = build_site(releases, default_world="cpu/torch2.13", cache=DigestCache())
    (page,) = site.worlds[0].packages
    (link,) = page.links
    return link.sha256


@pytest.mark.parametrize("order", ["old first", "new first"])
def test_index_links_the_newest_upload(order: str) -> None:
    old = Asset(WHEEL, len(OLD), "https://example.invalid/" + WHEEL, f"sha256:{_sha(OLD)}", id=100)
    new = Asset(WHEEL, len(NEW), "https://example.invalid/" + WHEEL, f"sha256:{_sha(NEW)}", id=200)
    sidecar_old = Asset(WHEEL + ".metadata", 1, "https://example.invalid/" + WHEEL + ".metadata", None, id=101)
    assets = (old, new) if order == "old first" else (new, old)
    release = Release("demo-1.0-py3.11-torch2.13.0", TITLE, assets=(*assets, sidecar_old))
    assert _link_sha([release]) == _sha(NEW)
    assert newest_by_name(assets)[WHEEL] is new


def test_store_server_and_index_agree_on_the_newest_upload() -> None:
    with GitHubTestServer(token="t") as gh:
        gh.state.rename_onto_existing = "allow"
        rel = gh.seed_release("demo-1.0-py3.11-torch2.13.0", name=TITLE)
        # listed order: the newer asset first (GitHub does not document the order of `assets`)
        gh.state.add_asset(rel, WHEEL, NEW, asset_id=7200)
        gh.state.add_asset(rel, WHEEL, OLD, asset_id=7100)
        with GitHubStore("o/r", token="t", api_url=gh.api_url, sleep=lambda s: None) as store:
            (release,) = store.list_releases()
            assert store.read_asset(release.tag, WHEEL) == NEW
            assert _link_sha([release]) == _sha(NEW)
        served = urllib.request.urlopen(f"{gh.api_url}/o/r/releases/download/{release.tag}/{WHEEL}").read()
        assert served == NEW
