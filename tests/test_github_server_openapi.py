"""The test server is faithful to GitHub: its JSON validates against GitHub's OpenAPI description,
has the keys GitHub's recorded answers have, and follows the documented semantics."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from typing import Any

import pytest

from tests.github_server import FaultConfig, GitHubTestServer, normalize_asset_name
from tests.github_server.schemas import DATA, errors

TOKEN = "test-token"
NEWER_FIELDS = {"digest", "immutable", "updated_at", "user_view_type"}
"""Fields GitHub added after the octokit scenarios were recorded (2017-2022)."""


def call(url: str, method: str = "GET", data: bytes | None = None, headers: dict[str, str] | None = None,
         token: str | None = TOKEN) -> tuple[int, dict[str, str], Any]:
    h = dict(headers or {})
    if token:
        h["Authorization"] = f"token {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            body = r.read()
            return r.status, {k.lower(): v for k, v in r.headers.items()}, json.loads(body) if body else None
    except urllib.error.HTTPError as e:
        body = e.read()
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body
        return e.code, {k.lower(): v for k, v in e.headers.items()}, parsed


def upload(gh: GitHubTestServer, release_id: int, name: str, data: bytes) -> tuple[int, dict[str, str], Any]:
    return call(f"{gh.uploads_url}/repos/o/r/releases/{release_id}/assets?name={name}", "POST", data,
                {"Content-Type": "application/octet-stream"})


def keys_of(obj: Any, prefix: str = "") -> set[str]:
    out: set[str] = set()
    if isinstance(obj, dict):
        for k, v in obj.items():
            out.add(prefix + k)
            if isinstance(v, dict):
                out |= keys_of(v, prefix + k + ".")
            elif isinstance(v, list) and v and isinstance(v[0], dict):
                out |= keys_of(v[0], prefix + k + "[].")
    return out


def test_responses_validate_against_openapi(github_server: GitHubTestServer) -> None:
    gh = github_server
    rel = gh.seed_release("v1", body="notes", assets=[("a-1.0-py3-none-any.whl", b"abc")])
    gh.seed_release("v0-draft", draft=True)
    status, _, created = call(f"{gh.api_url}/repos/o/r/releases", "POST",
                              json.dumps({"tag_name": "v2", "name": "two", "make_latest": "false"}).encode())
    assert status == 201 and errors(created, "release") == []
    status, _, up = upload(gh, created["id"], "b.whl", b"x" * 1000)
    assert status == 201 and errors(up, "release-asset") == []
    assert up["digest"].startswith("sha256:") and up["state"] == "uploaded" and up["size"] == 1000
    status, _, listing = call(f"{gh.api_url}/repos/o/r/releases")
    assert status == 200 and errors(listing, "release", array=True) == []
    assert {r["tag_name"] for r in listing} == {"v1", "v0-draft", "v2"}  # drafts are listed
    status, _, one = call(f"{gh.api_url}/repos/o/r/releases/{rel.id}")
    assert errors(one, "release") == [] and one["assets"][0]["name"] == "a-1.0-py3-none-any.whl"
    status, _, assets = call(f"{gh.api_url}/repos/o/r/releases/{rel.id}/assets")
    assert status == 200 and errors(assets, "release-asset", array=True) == []
    status, _, asset = call(assets[0]["url"])
    assert errors(asset, "release-asset") == []
    status, _, rl = call(f"{gh.api_url}/rate_limit")
    assert status == 200 and errors(rl, "rate-limit-overview") == []
    status, _, err = call(f"{gh.api_url}/repos/o/r/releases", "POST", json.dumps({"tag_name": "v2"}).encode())
    assert status == 422 and errors(err, "validation-error") == []
    status, _, err = call(f"{gh.api_url}/repos/o/r/releases/99999")
    assert status == 404 and errors(err, "basic-error") == []


def test_validator_rejects_broken_objects() -> None:
    fixture = json.loads((DATA / "release-assets" / "normalized-fixture.json").read_text())
    release = fixture[0]["response"]
    asset = dict(fixture[1]["response"], digest=None)
    assert errors(release, "release") == []
    broken = dict(release, assets=[{k: v for k, v in asset.items() if k != "name"}])
    assert any("name" in e for e in errors(broken, "release"))  # nested $ref resolved and enforced
    assert errors(dict(asset, state="starter"), "release-asset")  # the description's enum lacks starter
    assert errors(dict(asset, state="starter"), "release-asset", extra_states=("starter",)) == []


@pytest.mark.parametrize("scenario", ["release-assets", "release-assets-conflict"])
def test_recorded_responses_validate_and_match_server_keys(github_server: GitHubTestServer, scenario: str) -> None:
    fixture = json.loads((DATA / scenario / "normalized-fixture.json").read_text())
    gh = github_server
    rel = gh.seed_release("v1.0.0", assets=[("test-upload.txt", b"Hello, world!\n")])
    _, _, ours_release = call(f"{gh.api_url}/repos/o/r/releases/tags/v1.0.0")
    ours_asset = ours_release["assets"][0]
    checked = 0
    for rec in fixture:
        resp = rec["response"]
        if isinstance(resp, dict) and "tag_name" in resp:
            assert errors(resp, "release", relax_required=("digest",)) == []
            theirs, ours = keys_of(resp) - {"assets"}, keys_of(ours_release)
            assert theirs - ours == set(), theirs - ours
            assert {k.rsplit(".", 1)[-1] for k in ours - theirs if not k.startswith("assets")} <= NEWER_FIELDS
            checked += 1
        elif isinstance(resp, dict) and "browser_download_url" in resp:
            assert errors(resp, "release-asset", relax_required=("digest",)) == []
            theirs, ours = keys_of(resp), keys_of(ours_asset)
            assert theirs - ours == set()
            assert {k.rsplit(".", 1)[-1] for k in ours - theirs} <= NEWER_FIELDS
            checked += 1
        elif isinstance(resp, list):
            assert errors(resp, "release-asset", array=True, relax_required=("digest",)) == []
            checked += 1
        elif rec["status"] == 422:
            assert errors(resp, "validation-error") == []
            status, _, ours_422 = upload(gh, rel.id, "test-upload.txt", b"again")
            assert status == 422 and ours_422["errors"] == resp["errors"]
            assert set(resp) - set(ours_422) == {"request_id"}  # GitHub's newer bodies carry status instead
            checked += 1
    assert checked >= 3


def test_pagination_link_header(github_server: GitHubTestServer) -> None:
    gh = github_server
    gh.seed_bulk(250, 1)
    status, h, page = call(f"{gh.api_url}/repos/o/r/releases")
    assert status == 200 and len(page) == 30 and 'rel="next"' in h["link"] and "page=9" in h["link"]
    status, h, page = call(f"{gh.api_url}/repos/o/r/releases?per_page=500&page=3")
    assert len(page) == 50 and 'rel="next"' not in h["link"] and 'rel="prev"' in h["link"]
    status, h, page = call(f"{gh.api_url}/repos/o/r/releases?per_page=100&page=4")
    assert status == 200 and page == []
    assert call(f"{gh.api_url}/repos/o/r/releases?per_page=100")[2][0]["tag_name"] == "bench-00249"  # newest first


def test_auth_drafts_tags_and_refs(github_server: GitHubTestServer) -> None:
    gh = github_server
    draft = gh.seed_release("v9", draft=True)
    assert call(f"{gh.api_url}/repos/o/r/releases", token=None)[0] == 401
    assert call(f"{gh.api_url}/repos/o/r/releases", token="wrong")[0] == 401
    assert call(f"{gh.api_url}/repos/o/r/releases", headers={"Authorization": f"Bearer {TOKEN}"}, token=None)[0] == 200
    assert call(f"{gh.api_url}/repos/o/r/releases/tags/v9")[0] == 404  # drafts are not found by tag
    assert call(f"{gh.api_url}/repos/o/r/releases/{draft.id}")[0] == 200
    # a draft does not own its tag: a published release of the same tag may be created
    assert call(f"{gh.api_url}/repos/o/r/releases", "POST", json.dumps({"tag_name": "v9"}).encode())[0] == 201
    assert call(f"{gh.api_url}/repos/o/r/git/refs/tags/v9", "DELETE")[0] == 204
    status, _, body = call(f"{gh.api_url}/repos/o/r/git/refs/tags/v9", "DELETE")
    assert status == 422 and body["message"] == "Reference does not exist"


def test_uploads_names_starters_and_downloads(github_server: GitHubTestServer) -> None:
    gh = github_server
    rel = gh.seed_release("v1")
    status, _, a = upload(gh, rel.id, "x%2By.whl", b"1")
    assert status == 201 and a["name"] == "x+y.whl"  # an encoded '+' is kept
    status, _, a = upload(gh, rel.id, "p+q(1).whl", b"1")
    assert a["name"] == "p.q.1.whl"  # an unencoded '+' decodes to a space; parentheses become dots
    assert normalize_asset_name("My App ~1.exe") == "My.App.1.exe"
    assert normalize_asset_name(".env") == "default.env"
    status, _, body = upload(gh, rel.id, "x%2By.whl", b"2")
    assert status == 422 and body["errors"][0] == {"resource": "ReleaseAsset", "code": "already_exists", "field": "name"}
    # a connection that dies mid-upload leaves a starter asset that blocks the name
    with socket.create_connection(("127.0.0.1", int(gh.uploads_url.rsplit(":", 1)[1]))) as s:
        s.sendall(f"POST /repos/o/r/releases/{rel.id}/assets?name=big.whl HTTP/1.1\r\nHost: x\r\n"
                  f"Authorization: token {TOKEN}\r\nContent-Type: application/zip\r\nContent-Length: 100000\r\n\r\n"
                  .encode() + b"z" * 1000)
    for _ in range(100):
        starter = [x for x in call(f"{gh.api_url}/repos/o/r/releases/{rel.id}")[2]["assets"] if x["name"] == "big.whl"]
        if starter and gh.log[-1][1] == "POST":
            break
    assert starter and starter[0]["state"] == "starter"
    assert upload(gh, rel.id, "big.whl", b"ok")[0] == 422
    assert call(starter[0]["url"], "DELETE")[0] == 204
    status, _, a = upload(gh, rel.id, "big.whl", b"ok")
    assert status == 201
    # download through the API (302 to object storage on another host) and the browser URL
    status, _, _ = call(a["url"], headers={"Accept": "application/octet-stream"})
    assert status == 400  # urllib forwards Authorization to the object store, which refuses two credentials
    with urllib.request.urlopen(a["browser_download_url"], timeout=10) as r:
        assert r.read() == b"ok"


def test_rate_limits_and_faults() -> None:
    clock = [1000.0]
    with GitHubTestServer(token=TOKEN, clock=lambda: clock[0]) as gh:
        status, h, _ = call(f"{gh.api_url}/repos/o/r/releases")
        assert status == 200 and h["x-ratelimit-remaining"] == "4999" and h["x-ratelimit-resource"] == "core"
        gh.exhaust_primary(reset_in=30)
        status, h, body = call(f"{gh.api_url}/repos/o/r/releases")
        assert status == 403 and h["x-ratelimit-remaining"] == "0" and int(h["x-ratelimit-reset"]) == 1030
        assert call(f"{gh.api_url}/rate_limit")[0] == 200  # not charged
        clock[0] = 1031
        assert call(f"{gh.api_url}/repos/o/r/releases")[0] == 200
        gh.inject_secondary(1, status=429, retry_after=7)
        status, h, body = call(f"{gh.api_url}/repos/o/r/releases")
        assert status == 429 and h["retry-after"] == "7" and "secondary rate limit" in body["message"]
        gh.set_faults(FaultConfig(rate=1.0, seed=1, weights={"503": 1}))
        assert call(f"{gh.api_url}/repos/o/r/releases")[0] == 503
        gh.set_faults(FaultConfig(rate=1.0, seed=1, weights={"drop": 1}, after_apply=0.0))
        with pytest.raises((urllib.error.URLError, ConnectionError)):
            call(f"{gh.api_url}/repos/o/r/releases")
        assert gh.fault_counts["503"] == 1 and gh.fault_counts["drop"] == 1
        assert gh.counters["GET /repos/{owner}/{repo}/releases"] == 6


def test_bulk_seed_is_fast() -> None:
    import time

    with GitHubTestServer(token=TOKEN, keep_log=False) as gh:
        t = time.perf_counter()
        gh.seed_bulk(5000, 12)
        assert time.perf_counter() - t < 5
        assert len(gh.snapshot()) == 5000
