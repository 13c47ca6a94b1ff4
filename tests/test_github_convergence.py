"""Every entry of the GitHub store's convergence table (``ci.store.github.CONVERGE``) run against the
test server: each case sets up the observed state, uploads, and checks that the store saw that state and
ended where its action says. A state without a case fails here."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import pytest

from ci.base.errors import RemoteError
from ci.store.github import CLOBBER_SUFFIX, CONVERGE, GitHubStore, Seen
from ci.store.http import RetryPolicy
from tests.github_server import FaultConfig, GitHubTestServer
from tests.github_server.server import _ROUTES

TOKEN = "test-token"
TAG = "demo-1.0-py3.11-torch2.13.0"
NAME = "demo_pkg-1.0-cp311-cp311-linux_x86_64.whl"
OLD, NEW = b"old" * 3000, b"new" * 4000
UPLOAD = "POST /repos/{owner}/{repo}/releases/{release_id}/assets"
PATCH_ASSET = "PATCH /repos/{owner}/{repo}/releases/assets/{asset_id}"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class _Seen(logging.Handler):
    """The states the store reports observing (its debug line ``upload <name> to <tag>: <STATE>: ...``)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.states: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        prefix = f"upload {NAME} to {TAG}: "
        message = record.getMessage()
        if message.startswith(prefix):
            self.states.append(message.removeprefix(prefix).split(":", 1)[0])


class Case:
    """One store against a fresh test server holding release TAG, and the local file with NEW bytes."""

    def __init__(self, gh: GitHubTestServer, tmp: Path, seen: _Seen) -> None:
        self.gh = gh
        self.file = tmp / NAME
        self.file.write_bytes(NEW)
        logger = logging.getLogger(f"tests.convergence.{id(self)}")
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(seen)
        self.store = GitHubStore("o/r", token=TOKEN, api_url=gh.api_url, sleep=lambda s: None, logger=logger,
                                 retry=RetryPolicy(attempts=3))
        self.release = gh.seed_release(TAG)

    def holds(self, name: str, data: bytes, state: str = "uploaded") -> None:
        self.gh.state.add_asset(self.release, name, data, state=state)

    def assets(self) -> dict[str, tuple[str | None, str]]:
        return self.gh.snapshot()[TAG]


def _free(case: Case) -> None:
    case.store.upload_asset(TAG, case.file)
    assert case.assets() == {NAME: (_digest(NEW), "uploaded")}


def _temp_holds_bytes(case: Case) -> None:
    case.holds(f"{NAME}{CLOBBER_SUFFIX}0000abcd", NEW)
    uploads = case.gh.counters[UPLOAD]
    case.store.upload_asset(TAG, case.file, clobber=True)
    assert case.assets() == {NAME: (_digest(NEW), "uploaded")}
    assert case.gh.counters[UPLOAD] == uploads, "renamed into place, not uploaded again"


def _incomplete(case: Case) -> None:
    case.holds(NAME, b"", state="starter")
    case.store.upload_asset(TAG, case.file)
    assert case.assets() == {NAME: (_digest(NEW), "uploaded")}


def _same(case: Case) -> None:
    case.holds(NAME, NEW)
    case.holds(f"{NAME}{CLOBBER_SUFFIX}0000abcd", OLD)  # an earlier clobber's leftover goes too
    uploads = case.gh.counters[UPLOAD]
    case.store.upload_asset(TAG, case.file)
    assert case.assets() == {NAME: (_digest(NEW), "uploaded")}
    assert case.gh.counters[UPLOAD] == uploads


def _differs(case: Case) -> None:
    case.holds(NAME, OLD)
    with pytest.raises(RemoteError, match=f"asset {NAME} in release {TAG} differs"):
        case.store.upload_asset(TAG, case.file)
    assert case.assets() == {NAME: (_digest(OLD), "uploaded")}


def _clobber(rename_onto_existing: str) -> Callable[[Case], None]:
    def run(case: Case) -> None:
        case.gh.state.rename_onto_existing = rename_onto_existing
        case.holds(NAME, OLD)
        case.store.upload_asset(TAG, case.file, clobber=True)
        assert case.assets() == {NAME: (_digest(NEW), "uploaded")}

    return run


def _rename_fails(case: Case) -> None:
    case.holds(NAME, OLD)
    others = tuple(f"{m} {t}" for _, m, _, t in _ROUTES if f"{m} {t}" != PATCH_ASSET)
    case.gh.set_faults(FaultConfig(rate=1.0, weights={"500": 1}, after_apply=0.0, exclude=others))
    with pytest.raises(RemoteError, match=r"update asset \d+ failed after 3 attempts \(HTTP 500"):
        case.store.upload_asset(TAG, case.file, clobber=True)
    case.gh.set_faults(None)
    assert case.assets() == {NAME: (_digest(OLD), "uploaded")}, "the old asset intact, no temporary one left"


CASES: dict[Seen, Callable[[Case], None]] = {
    Seen.FREE: _free,
    Seen.TEMP_HOLDS_BYTES: _temp_holds_bytes,
    Seen.INCOMPLETE: _incomplete,
    Seen.SAME: _same,
    Seen.DIFFERS: _differs,
    Seen.DIFFERS_CLOBBER: _clobber("reject"),
    Seen.RENAME_ACCEPTED: _clobber("allow"),
    Seen.RENAME_REFUSED: _clobber("reject-bare"),
    Seen.RENAME_FAILED: _rename_fails,
}


def test_the_table_names_one_action_for_every_observable_state() -> None:
    assert set(CONVERGE) == set(Seen)


@pytest.mark.parametrize("state", list(Seen), ids=lambda s: s.name)
def test_each_state_is_observed_and_converges(state: Seen, tmp_path: Path) -> None:
    case_for = CASES.get(state)
    if case_for is None:
        pytest.fail(f"{state.name} ({state.value}) has an action in CONVERGE but no case here: add one")
    seen = _Seen()
    with GitHubTestServer(token=TOKEN) as gh:
        case = Case(gh, tmp_path, seen)
        with case.store:
            case_for(case)
    assert state.name in seen.states, f"the case for {state.name} made the store observe only {seen.states}"
