"""What the GitHub store and the commands print, against the GitHub-compatible test server: every
retry and every rate-limit wait (what, why, how long) through the wheelhouse logger, upload progress
in tenths, and on GitHub Actions one folded group per release step and an ::error:: annotation."""

from __future__ import annotations

import io
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ci.base import log
from ci.base.errors import RemoteError
from ci.store.github import GitHubStore
from ci.store.http import RetryPolicy
from tests.github_server import FakeClock, FaultConfig, GitHubTestServer

TOKEN = "test-token"
REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"


@pytest.fixture
def output():
    """The wheelhouse logger configured as the commands configure it, into a buffer."""
    root = logging.getLogger(log.ROOT)
    before = (list(root.handlers), root.level, root.propagate)
    out = io.StringIO()
    log.configure(stream=out)
    yield out
    root.handlers[:], root.level, root.propagate = before


def test_every_retry_and_wait_is_printed_by_a_store_given_no_logger(output: io.StringIO, tmp_path: Path) -> None:
    clock = FakeClock()
    with GitHubTestServer(token=TOKEN, clock=clock.time) as gh:
        store = GitHubStore("o/r", token=TOKEN, api_url=gh.api_url, clock=clock.time, sleep=clock.sleep,
                            progress=log.TransferProgress(), seed=1, retry=RetryPolicy(attempts=3))
        gh.inject_secondary(1, status=403, retry_after=7)
        store.ensure_release("v1", "v1", "")
        gh.exhaust_primary(reset_in=30)
        assert store.get_release("v1") is not None
        big = tmp_path / "big-1.0-py3-none-any.whl"
        big.write_bytes(b"w" * (3 * log.MIB))
        store.upload_asset("v1", big)
        gh.set_faults(FaultConfig(rate=1.0, weights={"502": 1}))
        with pytest.raises(RemoteError, match="failed after 3 attempts"):
            store.list_releases()
    assert output.getvalue().splitlines() == [
        "get release v1: HTTP 403 You have exceeded a secondary rate limit. Please wait a few minutes before you try "
        "again. If you reach out to GitHub Support for help, please include the request ID.; retry 1/2 in 7.0s",
        "get release v1: HTTP 403 API rate limit exceeded for user ID 1.; retry 1/2 in 31.0s",
        *(f"upload {big.name}: {p}% ({mib}.0 of 3.0 MiB)" for p, mib in ((30, 1), (60, 2), (100, 3))),  # 1 MiB pieces
        "list releases of o/r (page 1): HTTP 502; retry 1/2 in 0.6s",  # jitter from seed=1
        "list releases of o/r (page 1): HTTP 502; retry 2/2 in 1.8s",
    ]
    assert TOKEN not in output.getvalue()


def _built_row(tmp_path: Path):
    from build_records import write_record
    from wheel_factory import build_wheel

    from ci.model import matrix
    from ci.model.versions import load

    row = matrix.expand(load(FIXTURE_VERSIONS))[0]
    world = tmp_path / "dist" / row.world
    wheel = build_wheel(world, {"wheelhouse_fixture/__init__.py": b""}, name="wheelhouse_fixture", version=row.ref,
                        tags="py3-none-linux_x86_64")
    write_record(tmp_path / "dist", row, [wheel])
    return row, wheel


def _invoke(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=120, env={**os.environ, "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS), **env})


def test_release_on_github_actions_folds_each_step_and_annotates_the_error(tmp_path: Path) -> None:
    row, wheel = _built_row(tmp_path)
    release = ("release", "--component", row.component, "--arch", row.arch, "--dist", str(tmp_path / "dist"),
               "--store", str(tmp_path / "store"))
    done = _invoke(*release, GITHUB_ACTIONS="true", GITHUB_SERVER_URL="https://github.com", GITHUB_REPOSITORY="o/r",
                   GITHUB_RUN_ID="1", GITHUB_RUN_ATTEMPT="1")  # what the runner sets; the provenance names the run
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    groups = [line for line in lines if line.startswith("::group::")]
    assert [g.split(" to ")[0].split(" (")[0] for g in groups] == [
        f"::group::release: ensure release {row.release_tag}",
        f"::group::release: upload {wheel.name}",
        f"::group::release: upload {wheel.name}.metadata",  # made from the wheel: the build wrote none here
        f"::group::release: upload wheelhouse-provenance-{row.arch}.intoto.json",
        f"::group::release: upload wheelhouse-build-manifest-{row.arch}.json"]
    assert lines.count("::endgroup::") == len(groups)
    for start in groups:  # each group ends with its duration, then ::endgroup::
        title = start.removeprefix("::group::")
        end = lines.index(start) + 1
        while not lines[end].startswith(f"{title}: done in "):
            end += 1
        assert lines[end + 1] == "::endgroup::" and lines[end].endswith("s")

    refused = _invoke("release", "--component", "no-such-component", GITHUB_ACTIONS="true")
    assert refused.returncode == 2
    assert refused.stderr.startswith("::error::") and "no-such-component" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    plain = _invoke("release", "--component", "no-such-component", GITHUB_ACTIONS="")
    assert plain.stderr.startswith("error: ") and "::" not in plain.stderr


def test_the_release_command_prints_each_secondary_limit_wait(tmp_path: Path) -> None:
    row, _ = _built_row(tmp_path)
    with GitHubTestServer(token=TOKEN) as gh:
        gh.inject_secondary(2, status=429, retry_after=1)
        result = _invoke("release", "--component", row.component, "--arch", row.arch, "--dist",
                         str(tmp_path / "dist"), WHEELHOUSE_STORE="github:o/r", WHEELHOUSE_API_URL=gh.api_url,
                         GITHUB_TOKEN=TOKEN)
    assert result.returncode == 0, result.stderr
    waits = [line for line in result.stderr.splitlines() if "; retry " in line]
    assert waits == [f"get release {row.release_tag}: HTTP 429 You have exceeded a secondary rate limit. Please "
                     "wait a few minutes before you try again. If you reach out to GitHub Support for help, please "
                     f"include the request ID.; retry {n}/7 in 1.0s" for n in (1, 2)], result.stderr


def test_the_release_command_prints_primary_and_5xx_waits(tmp_path: Path) -> None:
    row, wheel = _built_row(tmp_path)
    with GitHubTestServer(token=TOKEN) as gh:
        gh.exhaust_primary(reset_in=6)  # the command needs a second or two to start
        gh.set_faults(FaultConfig(rate=0.25, seed=5, weights={"502": 1, "503": 1}, retry_after=(0,)))
        result = _invoke("release", "--component", row.component, "--arch", row.arch, "--dist",
                         str(tmp_path / "dist"), WHEELHOUSE_STORE="github:o/r", WHEELHOUSE_API_URL=gh.api_url,
                         GITHUB_TOKEN=TOKEN)
        faults = sum(gh.fault_counts.values())
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    retries = [line for line in lines if "; retry " in line]
    # the used-up primary limit: until its reset (at most six seconds on), plus one
    assert re.fullmatch(rf"get release {row.release_tag}: HTTP 403 API rate limit exceeded for user ID 1\.; "
                        r"retry 1/7 in [1-7]\.\ds", retries[0]), retries[0]
    # then one line per 5xx, each with what was retried and how long it waits
    assert len(retries) == 1 + faults and faults > 0, result.stderr
    assert all(re.fullmatch(r"[a-z].*: HTTP 50[23]; retry [1-7]/7 in \d+\.\ds", line) for line in retries[1:]), retries
    assert f"upload {wheel.name}: 100% ({wheel.stat().st_size / 1024:.1f} of {wheel.stat().st_size / 1024:.1f} KiB)" \
        in lines
    assert TOKEN not in result.stderr
