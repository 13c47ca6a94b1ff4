"""The GitHub store's listing and download interface: one Link-pagination helper for every listing
(releases, assets, tags, workflow-run artifacts), and callers that use only its public methods."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from ci.errors import RemoteError
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
