"""Figure 4: which CUDA archs a 1 GB wheel's device code covers: time and peak RSS.

- ours: ``ci.formats.fatbin.scan_wheel_archs(use_cuobjdump=False)``: each ELF member read in place
  from the wheel in 1 MiB chunks, fatbin container headers parsed, payloads skipped by offset;
- anchor: ``benchmarks/anchor/cuda_archs.py`` (``ci/cuda_archs.py`` §6): each ``.so`` member read
  whole into memory, ELF sections found, ``(sm|compute)_NN`` regex over every ``.nv_fatbin`` byte.

Both without cuobjdump (the anchor also runs it when present). The wheel is the one figure 3 uses
at 1 GB: one ``.so`` whose ``.nv_fatbin`` holds a cubin for each of 8.0, 9.0, 10.0, 12.0.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.common import GB, MB, Context, Figure, Samples, Table, human_bytes, measure_command, ratio, require_free
from benchmarks.strip import ARCHS, big_wheel

NAME = "fatbin-scan"
TITLE = "4. Fatbin arch scan of a 1 GB wheel"

_OURS = (
    "import json, sys; sys.path.insert(0, sys.argv[1]);"
    "from ci.formats.fatbin import scan_wheel_archs;"
    "scan = scan_wheel_archs(sys.argv[2], use_cuobjdump=False);"
    "print(json.dumps({'archs': [str(a) for a in scan.cubin_archs]}))"
)


def run(ctx: Context) -> Figure:
    size, reps = (2 * MB, 1) if ctx.toy else (GB, 3)
    require_free(ctx.cache, 3 * size + GB, "the fatbin scan benchmark")
    wheel = big_wheel(ctx, size)
    repo = str(Path(__file__).resolve().parent.parent)
    commands = {
        "ours": [sys.executable, "-c", _OURS, repo, str(wheel)],
        "anchor": [sys.executable, "-m", "benchmarks.anchor.cuda_archs", str(wheel)],
    }
    walls = {k: Samples() for k in commands}
    rss = {k: Samples() for k in commands}
    found: dict[str, list[str]] = {}
    ctx.log(f"  fatbin scan: {human_bytes(wheel.stat().st_size)} wheel ({reps} repetitions)")
    for rep in range(reps):
        for name in (list(commands) if rep % 2 == 0 else list(reversed(commands))):
            result = measure_command(commands[name], cwd=Path(repo))
            walls[name].add(result.wall_s)
            rss[name].add(result.maxrss_kb / 1024)
            archs = json.loads(result.stdout.strip().splitlines()[-1])["archs"]
            found[name] = sorted(archs, key=lambda a: float(a.rstrip("af")))
            ctx.log(f"    {name}: rep {rep + 1}/{reps} {result.wall_s:.2f} s, peak RSS {result.maxrss_kb / 1024:.0f} MiB")
    expected = sorted(ARCHS, key=float)
    for name, archs in found.items():
        if archs != expected:
            raise RuntimeError(f"{name} found {archs}, expected {expected}")
    table = Table(
        ["wheel", "", "ours (streaming)", "anchor (member read whole)", "anchor / ours"],
        [
            [human_bytes(wheel.stat().st_size), "wall time", walls["ours"].fmt(), walls["anchor"].fmt(),
             ratio(walls["anchor"], walls["ours"])],
            ["", "peak RSS", rss["ours"].fmt("MiB", 4), rss["anchor"].fmt("MiB", 4),
             f"{rss['anchor'].median / rss['ours'].median:,.1f}x"],
            ["", "archs found", ", ".join(found["ours"]), ", ".join(found["anchor"]), ""],
        ],
    )
    return Figure(
        NAME, TITLE,
        compared=("`ci.formats.fatbin.scan_wheel_archs` (ours, streaming, container headers only) vs the anchor's "
                  "`wheel_cuda_archs` (each member read whole, regex over `.nv_fatbin`; `benchmarks/anchor/cuda_archs.py`)"),
        where="this machine; each scan a separate process measured from a clean grandchild",
        repetitions=f"{reps} interleaved runs of each; min / median",
        tables=[table],
        notes=[
            "Peak RSS is the process's `ru_maxrss` (started from a small wrapper, so the runner's memory is not "
            "inherited). The anchor's peak grows with the largest member; ours stays flat at any wheel size.",
            "Ours writes each member to a temp file (1 MiB chunks) before parsing: its wall time includes that write.",
        ],
        summary=[f"fatbin scan of a {human_bytes(wheel.stat().st_size)} wheel: peak RSS {rss['ours'].median:.0f} MiB "
                 f"(ours) vs {rss['anchor'].median:,.0f} MiB (anchor); wall time anchor / ours "
                 f"{ratio(walls['anchor'], walls['ours'])}"],
    )


if __name__ == "__main__":
    start = time.perf_counter()
    print(run(Context(quick=True)).markdown())
    print(f"{time.perf_counter() - start:.1f} s")
