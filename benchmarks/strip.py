"""Figure 3: removing the local version (``+cu130``) from big wheels.

Three ways, each run as its own process tree (wall time and peak RSS of the whole tree):

- ours: ``ci.formats.rewrite.strip_local_version`` (copies every member's compressed bytes as they
  are; rewrites METADATA, RECORD and the central directory);
- anchor: ``benchmarks/anchor/wheel_pack.sh`` (lib/wheel_pack.sh: ``wheel unpack``, sed, renames,
  ``wheel pack``, which inflates every member to disk and deflates it again);
- ``cp``: copying the file, the physical limit of any rewrite that writes a new file.

The wheels are made once under ``.cache/bench/wheels`` (content: incompressible, as compressed
cubins are; real wheels compress 2-4x, so the anchor's inflate/deflate would have more to do).
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

from benchmarks.common import (
    GB,
    MB,
    Context,
    Figure,
    Samples,
    Table,
    cuda_wheel,
    free_bytes,
    human_bytes,
    measure_command,
    ratio,
    require_free,
)

NAME = "strip"
TITLE = "3. Local-version strip of big wheels"
ANCHOR_SCRIPT = Path(__file__).resolve().parent / "anchor" / "wheel_pack.sh"
ARCHS = ("8.0", "9.0", "10.0", "12.0")

_OURS = (
    "import sys; sys.path.insert(0, sys.argv[1]);"
    "from ci.formats.rewrite import strip_local_version;"
    "print(strip_local_version(sys.argv[2], sys.argv[3]))"
)


def big_wheel(ctx: Context, size: int) -> Path:
    """A ``flash_attn-2.8.3+cu130`` wheel of about ``size`` bytes (made once, cached)."""
    return cuda_wheel(ctx.cache / "wheels", name="flash-attn", version="2.8.3+cu130",
                      tags="cp312-cp312-linux_x86_64", size=size, archs=ARCHS)


def _sizes(ctx: Context) -> list[tuple[int, int]]:
    """(bytes, repetitions)."""
    if ctx.toy:
        return [(2 * MB, 1)]
    if ctx.quick:
        return [(GB // 2, 3)]
    return [(GB // 2, 3), (GB, 3), (2 * GB, 3)]


def run(ctx: Context) -> Figure:
    rows = []
    summary = []
    reps_text = []
    work = ctx.work / "strip"
    for size, reps in _sizes(ctx):
        require_free(ctx.cache, 5 * size + 2 * GB, f"the {human_bytes(size)} strip benchmark")
        ctx.log(f"  strip: {human_bytes(size)} wheel ({reps} repetitions)")
        wheel = big_wheel(ctx, size)
        reps_text.append(f"{human_bytes(size)}: {reps}")
        walls = {k: Samples() for k in ("cp", "ours", "anchor")}
        rss = {k: Samples() for k in walls}
        outputs: dict[str, int] = {}
        for rep in range(reps):
            order = ["cp", "ours", "anchor"]
            order = order[rep % 3:] + order[: rep % 3]
            for method in order:
                shutil.rmtree(work, ignore_errors=True)
                out = work / "out"
                out.mkdir(parents=True)
                if method == "cp":
                    cmd = ["cp", str(wheel), str(out / wheel.name)]
                elif method == "ours":
                    cmd = [sys.executable, "-c", _OURS, str(Path(__file__).resolve().parent.parent), str(wheel), str(out)]
                else:
                    shutil.copyfile(wheel, out / wheel.name)  # the anchor rewrites dist/ in place
                    cmd = ["env", f"PYTHON={sys.executable}", "bash", str(ANCHOR_SCRIPT), str(out)]
                os.sync()  # no run pays for the previous one's writeback (outputs are GBs of dirty pages)
                result = measure_command(cmd)
                produced = sorted(out.glob("*.whl"))
                if len(produced) != 1:
                    raise RuntimeError(f"{method} left {produced} in {out}")
                if method != "cp" and "+" in produced[0].name:
                    raise RuntimeError(f"{method} did not strip the local version: {produced[0].name}")
                outputs[method] = produced[0].stat().st_size
                walls[method].add(result.wall_s)
                rss[method].add(result.maxrss_kb / 1024)
                ctx.log(f"    {method}: rep {rep + 1}/{reps} {result.wall_s:.2f} s, peak RSS {result.maxrss_kb / 1024:.0f} MiB")
        shutil.rmtree(work, ignore_errors=True)
        rows.append([
            human_bytes(wheel.stat().st_size),
            walls["cp"].fmt(), walls["ours"].fmt(), walls["anchor"].fmt(),
            ratio(walls["anchor"], walls["ours"]),
            f"{walls['ours'].median / walls['cp'].median:.2f}x",
            f"{rss['cp'].median:.0f} / {rss['ours'].median:.0f} / {rss['anchor'].median:.0f}",
            f"{human_bytes(outputs['ours'])} / {human_bytes(outputs['anchor'])}",
        ])
        summary.append(f"local-version strip of a {human_bytes(wheel.stat().st_size)} wheel: wall time anchor / ours "
                       f"{ratio(walls['anchor'], walls['ours'])}; ours takes {walls['ours'].median / walls['cp'].median:.1f}x "
                       f"the time of `cp`; peak RSS {rss['ours'].median:.0f} vs {rss['anchor'].median:,.0f} MiB")
    return Figure(
        NAME, TITLE,
        compared=("`strip_local_version` (ours) vs the anchor's `lib/wheel_pack.sh` (`python -m wheel unpack` + sed + "
                  "renames + `python -m wheel pack`, reproduced in `benchmarks/anchor/wheel_pack.sh`) vs plain `cp`"),
        where=(f"this machine, local disk, inputs in the page cache; each method a separate process tree "
               f"measured from a clean grandchild (`benchmarks/_rusage.py`); "
               f"{human_bytes(free_bytes(ctx.cache))} free on the cache disk after the run"),
        repetitions=f"interleaved (rotating order), per size {', '.join(reps_text)}; times are min / median",
        tables=[Table(["wheel", "cp", "ours", "anchor", "anchor / ours", "ours / cp",
                       "peak RSS MiB (cp / ours / anchor)", "output size (ours / anchor)"], rows)],
        notes=[
            "Every run starts after `sync` (untimed), so none pays for an earlier run's writeback; outputs land "
            "in the page cache and are not synced inside the timing (as a build writing dist/ does).",
            "Wall times include each process's start (Python interpreter and imports for ours and the anchor's two "
            "`python -m wheel` runs).",
            "Peak RSS is `ru_maxrss` of the process tree (RUSAGE_CHILDREN of a small wrapper started through "
            "/bin/sh), so it is the largest single process; its floor (about 11 MiB) is the wrapper's own size, "
            "which a forked child starts with. For the anchor the peak is `wheel pack`, which reads each file "
            "whole before compressing it (about 3x the largest member).",
            "Wheel content is incompressible (random bytes in a fatbin), the kindest case for the anchor: it "
            "inflates and deflates every byte, and deflate is slower on real, compressible .so files.",
            "The anchor's repack is not byte-reproducible (reference §9.1: zip timestamps); ours copies every "
            "member's compressed bytes as they are.",
        ],
        summary=summary,
    )


if __name__ == "__main__":
    start = time.perf_counter()
    print(run(Context(quick=True)).markdown())
    print(f"{time.perf_counter() - start:.1f} s")
