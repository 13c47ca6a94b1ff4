"""GitHubStore against the GitHub-compatible test server: behaviour, dry run, secrets, rate limits,
listing cost."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from ci.base.errors import RemoteError
from ci.store.github import GitHubStore
from ci.store.http import RetryPolicy
from ci.store.model import ReleaseStore
from tests.github_server import GitHubTestServer
from tests.github_server.replay import Exchange, ReplayServer

TOKEN = "test-token"
SECRET = "ghp_S3cretTokenValue0123456789abcdefABCD"
LIST = "GET /repos/{owner}/{repo}/releases"


def make(gh: GitHubTestServer, **kw: object) -> GitHubStore:
    kw.setdefault("sleep", lambda s: None)
    return GitHubStore("o/r", token=kw.pop("token", gh.token), api_url=gh.api_url, seed=0, **kw)  # type: ignore[arg-type]


def wheel(tmp_path: Path, name: str, data: bytes) -> Path:
    p = tmp_path / name
    p.write_bytes(data)
    return p


def mutations(gh: GitHubTestServer) -> int:
    return sum(n for k, n in gh.counters.items() if k.split()[0] in ("POST", "PATCH", "DELETE"))


def test_protocol_and_round_trip(github_server: GitHubTestServer, tmp_path: Path) -> None:
    gh = github_server
    progress: list[tuple[str, int, int]] = []
    st = make(gh, progress=lambda *a: progress.append(a))
    assert isinstance(st, ReleaseStore) and st.description == "github:o/r"
    rel = st.ensure_release("fa-v1", "flash-attn 1", "notes")
    assert (rel.tag, rel.title, rel.body, rel.assets) == ("fa-v1", "flash-attn 1", "notes", ())
    w = wheel(tmp_path, "fa-1.0+cu128-cp312-cp312-linux_x86_64.whl", b"W" * 3_000_000)
    a = st.upload_asset("fa-v1", w)
    assert a.name == w.name and a.size == 3_000_000 and a.sha256 and a.state == "uploaded"
    assert progress[-1] == (f"upload {w.name}", 3_000_000, 3_000_000)
    before = mutations(gh)
    assert st.upload_asset("fa-v1", w) == a  # same digest: nothing to do
    assert st.ensure_release("fa-v1", "flash-attn 1", "notes").id == rel.id  # same title/body: no PATCH
    assert mutations(gh) == before
    assert st.ensure_release("fa-v1", "flash-attn 1", "new notes").body == "new notes"
    assert st.read_asset("fa-v1", w.name) == b"W" * 3_000_000
    [listed] = st.list_releases()
    assert listed.asset(w.name) == a and st.get_release("fa-v1") == listed
    moved = st.retag_release("fa-v1", "fa-v1-cu128")
    assert moved.tag == "fa-v1-cu128" and st.get_release("fa-v1") is None
    assert st.retag_release("fa-v1", "fa-v1-cu128").id == moved.id  # idempotent
    st.delete_asset("fa-v1-cu128", w.name)
    st.delete_asset("fa-v1-cu128", w.name)  # missing: fine
    st.delete_release("fa-v1-cu128")
    st.delete_release("fa-v1-cu128")
    assert st.list_releases() == [] and "fa-v1-cu128" not in gh.state.repo("o", "r").tags  # type: ignore[union-attr]


def test_digest_mismatch_clobber_and_starters(github_server: GitHubTestServer, tmp_path: Path) -> None:
    gh = github_server
    st = make(gh)
    st.ensure_release("t", "t", "")
    w = wheel(tmp_path, "x-1.0-py3-none-any.whl", b"old")
    st.upload_asset("t", w)
    w.write_bytes(b"new")
    with pytest.raises(RemoteError, match=r"asset x-1.0-py3-none-any.whl in release t differs .*--clobber"):
        st.upload_asset("t", w)
    a = st.upload_asset("t", w, clobber=True)
    assert gh.snapshot()["t"] == {w.name: (a.digest, "uploaded")}
    # a leftover starter of that name is removed before uploading
    rel = gh.state.repo("o", "r").releases[st.get_release("t").id]  # type: ignore[union-attr]
    gh.state.add_asset(rel, "y.whl", b"", state="starter", digest=None)
    y = st.upload_asset("t", wheel(tmp_path, "y.whl", b"y"))
    assert gh.snapshot()["t"]["y.whl"] == (y.digest, "uploaded")
    # a leftover temporary asset of an interrupted clobber is cleaned up on the next run
    gh.state.add_asset(rel, f"{w.name}.clobber-deadbeef", b"partial")
    st.upload_asset("t", w)
    assert set(gh.snapshot()["t"]) == {w.name, "y.whl"}
    with pytest.raises(RemoteError, match="characters GitHub would rename"):
        st.upload_asset("t", wheel(tmp_path, "a b.whl", b"z"))
    with pytest.raises(RemoteError, match="release nope not found"):
        st.upload_asset("nope", w)


def test_ensure_release_publishes_a_draft_and_sets_make_latest(github_server: GitHubTestServer) -> None:
    gh = github_server
    draft = gh.seed_release("d1", draft=True, name="old")
    st = make(gh)
    rel = st.ensure_release("d1", "title", "body")
    assert rel.id == draft.id and not rel.draft and rel.title == "title"
    assert len(gh.state.repo("o", "r").releases) == 1  # type: ignore[union-attr]


def test_dry_run_records_and_changes_nothing(github_server: GitHubTestServer, tmp_path: Path) -> None:
    gh = github_server
    real = make(gh)
    real.ensure_release("r1", "one", "")
    w = wheel(tmp_path, "a-1-py3-none-any.whl", b"1")
    real.upload_asset("r1", w)
    before = gh.snapshot()
    gh.reset_counters()
    dry = make(gh, dry_run=True)
    dry.ensure_release("r1", "one!", "")
    dry.ensure_release("r2", "two", "")
    dry.upload_asset("r2", w)
    w.write_bytes(b"2")
    dry.upload_asset("r1", w, clobber=True)
    dry.delete_release("r1")
    assert gh.snapshot() == before and mutations(gh) == 0
    rid = real.get_release("r1").id  # type: ignore[union-attr]
    assert dry.plan[0] == f'PATCH /repos/o/r/releases/{rid} {{"name": "one!", "body": ""}}'
    assert dry.plan[1] == ('POST /repos/o/r/releases {"tag_name": "r2", "name": "two", "body": "", "draft": false, '
                           '"prerelease": false, "make_latest": "false"}')
    assert dry.plan[2].startswith("POST ") and "name=a-1-py3-none-any.whl" in dry.plan[2] and "(1 bytes, sha256:" in dry.plan[2]
    assert "name=a-1-py3-none-any.whl.clobber-" in dry.plan[3]
    assert dry.plan[4].startswith("PATCH /repos/o/r/releases/assets/<new>") and dry.plan[5].startswith("DELETE /repos/o/r/releases/assets/")
    assert dry.plan[6:] == [f"DELETE /repos/o/r/releases/{rid}", "DELETE /repos/o/r/git/refs/tags/r1"]


def test_list_releases_1000x12_costs_10_requests(tmp_path: Path) -> None:
    with GitHubTestServer(token=TOKEN, keep_log=False) as gh:
        gh.seed_bulk(1000, 12)
        gh.seed_release("a-draft", draft=True)
        st = make(gh)
        t = time.perf_counter()
        rels = st.list_releases()
        elapsed = time.perf_counter() - t
        assert len(rels) == 1000 and all(len(r.assets) == 12 for r in rels)
        assert gh.counters[LIST] == 11  # 1001 releases with the draft, 100 per page; the draft is dropped
        assert sum(gh.counters.values()) == 11
        print(f"\nlist_releases 1000x12 (+1 draft): {gh.counters[LIST]} requests, {elapsed:.2f}s")
        gh.reset_counters()
        gh.state.repo("o", "r").releases.pop(max(gh.state.repo("o", "r").releases))  # type: ignore[union-attr]
        assert len(st.list_releases()) == 1000 and gh.counters[LIST] == 10


def test_rate_limits_are_waited_out(tmp_path: Path) -> None:
    now = [10_000.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    with GitHubTestServer(token=TOKEN, clock=lambda: now[0]) as gh:
        st = make(gh, sleep=sleep, clock=lambda: now[0])
        gh.exhaust_primary(reset_in=120)
        assert st.list_releases() == []
        assert slept and 120 <= slept[0] <= 122 and st.stats["primary"] == 1
        slept.clear()
        gh.inject_secondary(2, status=429, retry_after=7)
        assert st.get_release("x") is None
        assert slept == [7.0, 7.0] and st.stats["secondary"] == 2
        gh.exhaust_primary(reset_in=10_000)
        with pytest.raises(RemoteError, match=r"rate limit used up until .*re-run after"):
            make(gh, sleep=sleep, clock=lambda: now[0], retry=RetryPolicy(max_rate_limit_wait=600)).list_releases()


def test_gives_up_with_one_line(tmp_path: Path) -> None:
    from tests.github_server import FaultConfig

    with GitHubTestServer(token=TOKEN, faults=FaultConfig(rate=1.0, weights={"502": 1})) as gh:
        st = make(gh, retry=RetryPolicy(attempts=3))
        with pytest.raises(RemoteError) as e:
            st.list_releases()
        assert "\n" not in str(e.value) and "failed after 3 attempts (HTTP 502)" in str(e.value)
        assert gh.counters[LIST] == 3


def test_token_never_leaks(tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level(logging.DEBUG)
    messages: list[str] = []
    progress: list[str] = []
    log = logging.getLogger("wheelhouse.test")
    from tests.github_server import FaultConfig

    def attempt(fn: object) -> None:
        try:
            fn()  # type: ignore[operator]
        except RemoteError as e:
            messages.append(str(e) + repr(e))

    with GitHubTestServer(token=TOKEN) as gh:  # the server does not know SECRET: 401
        st = GitHubStore("o/r", token=SECRET, api_url=gh.api_url, logger=log, sleep=lambda s: None)
        messages.append(repr(st))
        attempt(st.list_releases)
        attempt(lambda: st.ensure_release("t", "t", ""))
    with GitHubTestServer(token=SECRET, faults=FaultConfig(rate=0.5, seed=3)) as gh:
        st = GitHubStore("o/r", token=SECRET, api_url=gh.api_url, logger=log, sleep=lambda s: None,
                         progress=lambda *a: progress.append(repr(a)), retry=RetryPolicy(attempts=2))
        for i in range(10):
            attempt(lambda i=i: st.ensure_release(f"t{i}", "t", ""))
            attempt(lambda i=i: st.upload_asset(f"t{i}", wheel(tmp_path, "w.whl", b"w" * 10)))
            attempt(lambda i=i: st.read_asset(f"t{i}", "missing.whl"))
    # connection refused
    st = GitHubStore("o/r", token=SECRET, api_url="http://127.0.0.1:9", logger=log, sleep=lambda s: None,
                     retry=RetryPolicy(attempts=2))
    attempt(st.list_releases)
    # an answer that echoes the token (some proxies and error pages do) is scrubbed
    echo = Exchange("GET", "/repos/o/r/releases/tags/t", (), "", 500,
                    {"message": f"upstream said: Authorization: token {SECRET}"}, {"content-type": "application/json"}, "api")
    with ReplayServer([echo] * 2) as rp:
        st = GitHubStore("o/r", token=SECRET, api_url=rp.api_url, logger=log, sleep=lambda s: None,
                         retry=RetryPolicy(attempts=2))
        attempt(lambda: st.get_release("t"))
    assert len(messages) >= 5 and any("***" in m for m in messages)
    captured = capsys.readouterr()
    everything = "\n".join([*messages, *progress, caplog.text, captured.out, captured.err,
                            *(r.getMessage() for r in caplog.records)])
    assert SECRET not in everything
    assert SECRET[4:20] not in everything
