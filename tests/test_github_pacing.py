"""Write pacing against GitHub's content-creation limits (80 per minute, 500 per hour, one second
apart), on a fake clock shared by the client and the test server (what a command prints while it waits:
tests/test_github_logging.py)."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path

from ci.store.github import GitHubStore
from tests.github_server import FakeClock, GitHubTestServer

TOKEN = "test-token"
REPO = Path(__file__).resolve().parent.parent


def release_200_assets(tmp_path: Path, clock: FakeClock, gh: GitHubTestServer, **store_kw) -> GitHubStore:
    store = GitHubStore("o/r", token=TOKEN, api_url=gh.api_url, clock=clock.time, sleep=clock.sleep, **store_kw)
    store.ensure_release("many", "many 1.0 - cucpu py3.11 torch2.13.0", "")
    for i in range(200):
        f = tmp_path / f"pkg{i}-1.0-py3-none-any.whl"
        f.write_bytes(b"%d" % i)
        store.upload_asset("many", f)
        clock.sleep(0.05)  # the upload itself takes a moment
    return store


def peak_per_minute(times: list[float]) -> int:
    return max(sum(1 for t in times if start <= t < start + 60) for start in times)


def test_a_200_asset_release_meets_no_secondary_limit(tmp_path: Path) -> None:
    clock = FakeClock()
    with GitHubTestServer(token=TOKEN, clock=clock.time) as gh:
        gh.content_limits = (80, 500)
        with release_200_assets(tmp_path, clock, gh) as store:
            stats = dict(store.api.pacer.stats) if hasattr(store, "api") else {}
        times = list(gh.write_times)
        refused = gh.fault_counts["content-limit"]
    gaps = [b - a for a, b in pairwise(times)]
    print(f"\n200-asset release: {len(times)} writes in {times[-1] - times[0]:.0f} s (fake clock), peak "
          f"{peak_per_minute(times)} writes/min, {refused} secondary limits met, pacer {stats}")
    assert refused == 0
    assert len(times) == 201 and min(gaps) >= 1.0 and peak_per_minute(times) <= 60


def test_budget_waits_are_reported_and_kept() -> None:
    from ci.store.http import WritePacer

    clock, lines = FakeClock(), []
    pacer = WritePacer(min_interval=1.0, per_minute=3, per_hour=5, clock=clock.time, sleep=clock.sleep,
                       log=lines.append)
    done = []
    for i in range(6):
        pacer.wait(f"write {i}")
        done.append(clock.now)
    assert [round(t - done[0], 1) for t in done] == [0.0, 1.0, 2.0, 60.0, 61.0, 3600.0]
    assert lines == ["pacing writes: waiting 58.0s before write 3: 3 writes in the last minute (GitHub allows 3)",
                     "pacing writes: waiting 3539.0s before write 5: 5 writes in the last hour (GitHub allows 5)"]
