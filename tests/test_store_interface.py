"""The GitHub store's listing and download interface: one Link-pagination helper for every listing
(releases, assets, tags, workflow-run artifacts), and callers that use only its public methods."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ci.base.errors import RemoteError
from ci.store.github import GitHubStore
from tests.github_server.replay import Exchange, ReplayServer

REPO = Path(__file__).resolve().parent.parent
TOKEN = "test-token"


def private_uses(source: str) -> list[str]:
    """``x._name`` in ``source`` where ``x`` is not ``self``/``cls`` (dunders aside)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))):
            found.add(f"{ast.unparse(node.value)}.{node.attr}")
    return sorted(found)


def test_artifacts_use_only_the_stores_public_methods():
    assert private_uses("st = self._store\nresp = st._call(what, op)\nst._retrier.run(what, f)\n") == [
        "st._call", "st._retrier"]  # what the check finds
    assert private_uses((REPO / "ci" / "store" / "artifacts.py").read_text()) == []


def _page(path: str, query: tuple[str, ...], link: str) -> Exchange:
    return Exchange("GET", path, query, None, 200, [], {"content-type": "application/json", "link": link}, "api")


def test_a_link_header_that_points_back_is_one_line_not_a_loop():
    again = '<https://api.github.com/repos/o/r/releases?per_page=100&page=1>; rel="next"'
    with ReplayServer([_page("/repos/o/r/releases", ("page", "per_page"), again)] * 3) as rp:
        with GitHubStore("o/r", token=TOKEN, api_url=rp.api_url, sleep=lambda s: None) as store, \
                pytest.raises(RemoteError) as info:
            store.list_releases()
        assert len(rp.received) == 1
    assert str(info.value) == ("list releases of o/r: the Link header points back to a page already read, or past "
                               "10000 pages; check api_url")


def test_every_listing_follows_link_next_through_one_helper(github_server):
    gh = github_server
    for i in range(3):
        gh.seed_release(f"v{i}", name=f"v{i}", assets=[(f"a{j}.whl", b"x") for j in range(3)])
        gh.seed_artifact(7, f"art{i}", b"zip")
    with GitHubStore("o/r", token=TOKEN, api_url=gh.api_url, sleep=lambda s: None) as store:
        from ci.store.artifacts import GitHubArtifacts

        pages = [resp.status for resp in store.api.paged("list releases of o/r", "repos.list_releases", per_page=1)]
        assert pages == [200, 200, 200]
        assert len(GitHubArtifacts(store.api, per_page=2).list_artifacts("7")) == 3
    assert gh.counters["GET /repos/{owner}/{repo}/releases"] == 3
    assert gh.counters["GET /repos/{owner}/{repo}/actions/runs/{run_id}/artifacts"] == 2


# --- fetch and get_public: each store reads what it serves (no second HTTP client in the commands) ------


def test_both_stores_meet_the_protocol_with_fetch_and_get_public(tmp_path, github_server):
    from ci.store.local import LocalStore
    from ci.store.model import ReleaseStore

    with GitHubStore("o/r", token=TOKEN, api_url=github_server.api_url, sleep=lambda s: None) as remote:
        assert isinstance(remote, ReleaseStore) and remote.root is None
    local = LocalStore(tmp_path / "store")
    assert isinstance(local, ReleaseStore) and local.root == (tmp_path / "store").resolve()


def test_the_github_store_fetches_an_asset_from_its_download_url(tmp_path, github_server):
    gh = github_server
    gh.seed_release("v1", assets=[("a.whl", b"wheel bytes" * 1000)])
    with GitHubStore("o/r", token=TOKEN, api_url=gh.api_url, sleep=lambda s: None) as store:
        (asset,) = store.get_release("v1").assets
        assert b"".join(store.fetch(asset)) == b"wheel bytes" * 1000
        assert store.get_public(asset.url) == b"wheel bytes" * 1000
        assert store.get_public(asset.url + "-missing") is None


@pytest.mark.parametrize("base_url", [None, "http://127.0.0.1:9/store"])
def test_the_local_store_fetches_its_assets_and_reads_file_urls(tmp_path, base_url):
    from ci.store.local import LocalStore

    store = LocalStore(tmp_path / "store", base_url=base_url)
    store.ensure_release("v1", "v1", "")
    wheel = tmp_path / "a b+1.whl"
    wheel.write_bytes(b"local bytes" * 1000)
    asset = store.upload_asset("v1", wheel, name="a_b+1.whl")
    assert b"".join(store.fetch(asset)) == b"local bytes" * 1000  # over file:// or mapped back from base_url

    site = tmp_path / "site"
    site.mkdir()
    (site / "digests.json").write_bytes(b"{}")
    assert store.get_public((site / "digests.json").as_uri()) == b"{}"
    assert store.get_public((site / "wheelhouse-site.json").as_uri()) is None
    with pytest.raises(RemoteError) as info:
        store.get_public("https://o.github.io/r/digests.json")
    assert str(info.value) == ("https://o.github.io/r/digests.json: a local store reads file:// URLs only; give "
                               "--base-url as the file:// URL of the published site's directory")
    outside = type(asset)("x.whl", 1, (site / "digests.json").as_uri())
    with pytest.raises(RemoteError, match="is not an asset of"):
        b"".join(store.fetch(outside))


# --- ci.store opens the store and the artifact source the commands use ------------------------------------


def test_open_store_and_open_artifacts(tmp_path, github_server):
    from ci.base.errors import ConfigError, UsageError
    from ci.model.environment import Environment
    from ci.store import open_artifacts, open_store
    from ci.store.artifacts import GitHubArtifacts, LocalArtifacts
    from ci.store.local import LocalStore

    local = open_store(Environment(store_spec=str(tmp_path / "store")))
    assert isinstance(local, LocalStore)
    with pytest.raises(UsageError) as info:
        open_artifacts(local, None)
    assert info.value.exit_code == 2
    assert str(info.value) == ("restore-wheels: a local store takes its artifacts from --artifacts-dir DIR "
                               "(DIR/<run id>/<artifact name>.zip)")
    assert isinstance(open_artifacts(local, tmp_path / "artifacts"), LocalArtifacts)

    with pytest.raises(ConfigError, match="WHEELHOUSE_STORE=github:o/r needs a token"):
        open_store(Environment(store_spec="github:o/r"))
    remote = open_store(Environment(store_spec="github:o/r", token=TOKEN, api_url=github_server.api_url))
    with remote:
        source = open_artifacts(remote, None)
        assert isinstance(source, GitHubArtifacts) and source.description == "workflow artifacts of o/r"
