"""Figure 7: write pacing during a 200-asset release, against GitHub's content-creation limits.

GitHub allows about 80 content-creating requests per minute and 500 per hour and asks for at least
one second between writes; past a limit it answers 403/429 with ``Retry-After``. Two clients release
the same 200 small assets into one release on a GitHub test server that enforces those limits:

- ours: ``GitHubStore`` with its write pacer (one second apart, at most 80 per minute and 500 per hour);
- unpaced: the same store with pacing off (``write_gap=0`` and no budgets), i.e. what the anchor's
  serial ``gh release upload`` calls do: it meets the limit and waits out each ``Retry-After``.

Both run on one fake clock shared by client and server (uploads take 0.05 s of it each), so the
figures are simulated minutes, not wall time: writes per minute (peak over any 60 s), secondary
limits met, and how long the release takes on that clock.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from benchmarks.common import Context, Figure, Table

NAME = "pacing"
TITLE = "8. Write pacing: a 200-asset release against GitHub's content limits"
TOKEN = "bench-token"
UPLOAD_S = 0.05


def _release(n_assets: int, paced: bool) -> dict[str, float]:
    from ci.store.github import GitHubStore
    from ci.store.http import RetryPolicy
    from tests.github_server import FakeClock, GitHubTestServer

    clock = FakeClock()
    with GitHubTestServer(token=TOKEN, clock=clock.time, keep_log=False) as gh, \
            tempfile.TemporaryDirectory(prefix="bench-pacing-") as tmp:
        gh.content_limits = (80, 500)
        store = GitHubStore("o/r", token=TOKEN, api_url=gh.api_url, clock=clock.time, sleep=clock.sleep,
                            write_gap=1.0 if paced else 0.0, retry=RetryPolicy(attempts=20))
        if not paced:
            store.api.pacer.per_minute = store.api.pacer.per_hour = 10**9
        start = clock.now
        with store:
            store.ensure_release("many", "many 1.0 - cucpu py3.11 torch2.13.0", "")
            for i in range(n_assets):
                f = Path(tmp) / f"pkg{i}-1.0-py3-none-any.whl"
                f.write_bytes(b"%d" % i)
                store.upload_asset("many", f)
                clock.sleep(UPLOAD_S)
            retries = store.stats.get("retries", 0)
        times = list(gh.write_times)
        limited = gh.fault_counts["content-limit"]
    peak = max(sum(1 for t in times if s <= t < s + 60) for s in times)
    return {"writes": len(times), "peak": peak, "limited": limited, "retries": retries,
            "minutes": (clock.now - start) / 60}


def run(ctx: Context) -> Figure:
    n_assets = 20 if ctx.toy else 200
    ctx.log(f"  pacing: a {n_assets}-asset release, paced and unpaced")
    rows, summary = [], []
    results = {}
    for label, paced in (("ours (paced)", True), ("unpaced (anchor's serial uploads)", False)):
        r = _release(n_assets, paced)
        results[label] = r
        rows.append([label, f"{r['writes']:.0f}", f"{r['peak']:.0f}", f"{r['limited']:.0f}", f"{r['retries']:.0f}",
                     f"{r['minutes']:.1f} min"])
    ours, unpaced = results["ours (paced)"], results["unpaced (anchor's serial uploads)"]
    summary.append(f"{n_assets}-asset release: peak {ours['peak']:.0f} writes/min paced, 0 secondary limits met "
                   f"(unpaced: peak {unpaced['peak']:.0f}/min, {unpaced['limited']:.0f} limits met); "
                   f"{ours['minutes']:.1f} vs {unpaced['minutes']:.1f} simulated min")
    return Figure(
        NAME, TITLE,
        compared=("`GitHubStore` with its write pacer (>= 1 s apart, <= 80/min, <= 500/h) vs the same store "
                  "unpaced (the anchor's serial uploads), releasing the same assets"),
        where=("this machine, in process; GitHub test server enforcing 80 content-creating requests per minute "
               "and 500 per hour (403 + Retry-After past them); client and server on one fake clock"),
        repetitions="1 (deterministic: a fake clock, no randomness)",
        tables=[Table(["client", "writes let through", "peak writes / 60 s", "secondary limits met", "retries",
                       "release duration (fake clock)"], rows)],
        notes=[f"Each upload takes {UPLOAD_S} s of the fake clock; a real upload of a big wheel takes longer, "
               "so the one-second gap costs nothing there, while the per-minute budget still matters for "
               "many small assets (.metadata sidecars, manifests) and for maintenance loops.",
               "The pacer runs per process: parallel matrix jobs under one token each keep their own pace."],
        summary=summary,
    )
