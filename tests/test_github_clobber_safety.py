"""A GitHub-store clobber killed at every step, renames refused with any 422, and uploads that leave an
incomplete asset behind: the next run always converges, reusing the new bytes it already uploaded,
and no temporary asset is left."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from ci.store.github import CLOBBER_SUFFIX, GitHubStore
from tests.crash_points import kill_at_every_step
from tests.github_server import FaultConfig, GitHubTestServer

TOKEN = "test-token"
TAG = "demo-1.0-py3.11-torch2.13.0"
NAME = "demo_pkg-1.0-cp311-cp311-linux_x86_64.whl"
UPLOAD = "POST /repos/{owner}/{repo}/releases/{release_id}/assets"
STEPS = [(GitHubStore, "upload_file"), (GitHubStore, "update_asset"), (GitHubStore, "delete_asset_id")]


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _store(gh: GitHubTestServer) -> GitHubStore:
    return GitHubStore("o/r", token=TOKEN, api_url=gh.api_url, sleep=lambda s: None)


@pytest.mark.parametrize("rename_onto_existing", ["reject", "allow"])
def test_clobber_killed_at_every_step_converges_without_uploading_again(tmp_path: Path,
                                                                       rename_onto_existing: str) -> None:
    old, new = tmp_path / "old" / NAME, tmp_path / "new" / NAME
    for f, data in ((old, b"old" * 5000), (new, b"new" * 7000)):
        f.parent.mkdir()
        f.write_bytes(data)
    old_d, new_d = _digest(old.read_bytes()), _digest(new.read_bytes())
    servers: list[GitHubTestServer] = []
    seen_states = set()

    def prepare(k: int) -> None:
        gh = GitHubTestServer(token=TOKEN).start()
        gh.state.rename_onto_existing = rename_onto_existing
        servers.append(gh)
        with _store(gh) as store:
            store.ensure_release(TAG, "demo 1.0 - cucpu py3.11 torch2.13.0", "")
            store.upload_asset(TAG, old)
        gh.reset_counters()

    def clobber() -> None:
        with _store(servers[-1]) as store:
            store.upload_asset(TAG, new, clobber=True)

    def check(k: int) -> None:
        gh = servers[-1]
        try:
            with gh.state.lock:  # every asset, duplicates of one name included
                (rel,) = gh.state.repo("o", "r").releases.values()
                assets = [(a.name, a.digest, a.state) for a in rel.assets.values()]
            named = {d for n, d, s in assets if n == NAME and s == "uploaded"}
            temps = {d for n, d, s in assets if n.startswith(NAME + CLOBBER_SUFFIX)}
            label = {old_d: "old", new_d: "new"}
            state = ("+".join(sorted(label[d] for d in named)) if named
                     else "only the temporary asset (new)")
            seen_states.add(state)
            # what a crash may leave: the old or the new bytes under the name, or (one round trip
            # after the delete) only the complete temporary asset with the new bytes
            assert named <= {old_d, new_d} and (named or temps == {new_d}), (k, assets)
            uploads_before = gh.counters[UPLOAD]
            clobber()  # the next run
            assert gh.snapshot()[TAG] == {NAME: (new_d, "uploaded")}, k
            if not named:
                assert gh.counters[UPLOAD] == uploads_before, f"{k}: uploaded again instead of renaming"
        finally:
            gh.stop()

    steps = kill_at_every_step(clobber, STEPS, prepare=prepare, check=check)
    print(f"github clobber ({rename_onto_existing}): killed at each of {steps} steps; states seen: "
          f"{sorted(seen_states)}; every re-run converged")
    assert steps >= 4
    if rename_onto_existing == "reject":
        assert "only the temporary asset (new)" in seen_states
    else:
        assert "new+old" in seen_states  # killed between the rename and the delete


@pytest.mark.parametrize("refusal", ["reject", "reject-custom", "reject-bare"])
def test_any_422_to_the_rename_takes_the_fallback_and_leaves_no_temporary_asset(tmp_path: Path, refusal: str) -> None:
    f = tmp_path / NAME
    with GitHubTestServer(token=TOKEN) as gh:
        gh.state.rename_onto_existing = refusal
        with _store(gh) as store:
            store.ensure_release(TAG, "demo 1.0 - cucpu py3.11 torch2.13.0", "")
            for version in range(3):
                f.write_bytes(b"v%d" % version * 1000)
                store.upload_asset(TAG, f, clobber=True)
                assert gh.snapshot()[TAG] == {NAME: (_digest(f.read_bytes()), "uploaded")}, version


@pytest.mark.parametrize("incomplete_state", ["starter", "open"])
def test_uploads_that_fail_after_the_body_leave_nothing_behind(tmp_path: Path, incomplete_state: str) -> None:
    """A 500 (like a 502) after the body leaves an incomplete asset that blocks the name; in GitHub's
    OpenAPI description that state is ``open``, in its prose ``starter``."""
    faults = FaultConfig(rate=0.5, seed=3, weights={"500": 1, "502": 1}, after_apply=1.0,
                         exclude=("GET /rate_limit", "GET /repos/{owner}/{repo}/releases/tags/{tag}",
                                  "GET /repos/{owner}/{repo}/releases/{release_id}/assets",
                                  "POST /repos/{owner}/{repo}/releases", "DELETE /repos/{owner}/{repo}/releases/assets/{asset_id}"))
    with GitHubTestServer(token=TOKEN) as gh:
        gh.state.incomplete_state = incomplete_state
        with _store(gh) as store:
            store.ensure_release(TAG, "demo 1.0 - cucpu py3.11 torch2.13.0", "")
            gh.set_faults(faults)
            for i in range(6):
                f = tmp_path / f"pkg{i}-1.0-py3-none-any.whl"
                f.write_bytes(b"x" * (1000 + i))
                store.upload_asset(TAG, f)
            gh.set_faults(None)
        left = gh.snapshot()[TAG]
    assert gh.fault_counts["500"] > 0 and gh.fault_counts["502"] > 0
    assert sorted(left) == [f"pkg{i}-1.0-py3-none-any.whl" for i in range(6)]
    assert all(state == "uploaded" for _, state in left.values())


def test_a_rename_that_fails_otherwise_leaves_the_old_asset_and_no_temporary_one(tmp_path: Path) -> None:
    """Not a 422 (here a 500 on every attempt): nothing is deleted but the temporary asset."""
    from ci.base.errors import RemoteError
    from ci.store.http import RetryPolicy

    f = tmp_path / NAME
    f.write_bytes(b"old" * 100)
    patch_asset = "PATCH /repos/{owner}/{repo}/releases/assets/{asset_id}"
    with GitHubTestServer(token=TOKEN) as gh:
        with _store(gh) as store:
            store.ensure_release(TAG, "demo 1.0 - cucpu py3.11 torch2.13.0", "")
            store.upload_asset(TAG, f)
        everything_but_patch = tuple(f"{m} {t}" for _, m, _, t in __import__("tests.github_server.server",
                                     fromlist=["_ROUTES"])._ROUTES if f"{m} {t}" != patch_asset)
        gh.set_faults(FaultConfig(rate=1.0, weights={"500": 1}, after_apply=0.0, exclude=everything_but_patch))
        f.write_bytes(b"new" * 100)
        with GitHubStore("o/r", token=TOKEN, api_url=gh.api_url, sleep=lambda s: None,
                         retry=RetryPolicy(attempts=3)) as store, \
                pytest.raises(RemoteError, match=r"update asset \d+ failed after 3 attempts \(HTTP 500"):
            store.upload_asset(TAG, f, clobber=True)
        assert gh.snapshot()[TAG] == {NAME: (_digest(b"old" * 100), "uploaded")}
