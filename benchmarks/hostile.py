"""Figure 7: the checks on crafted wheels: time and peak RSS against an honest wheel's.

Each crafted wheel of ``tests/hostile_wheels.py`` (a ``.nv_fatbin`` flooded with the container magic,
back-to-back empty containers, a ``.dynsym`` bomb over and under the symbol cap, overlapping symbol
names) and one honest wheel (a real g++-built shared object) go through ``check_wheels`` with every
check, the torch ABI check included (a stand-in torch whose one library is that real object), each in
its own process. Before the fix the 2 KB flood wheel took 155 s and the 164 KB bomb 698 MB.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from benchmarks.common import Context, Figure, Samples, Table, human_bytes, measure_command, ratio

NAME = "crafted-wheels"
TITLE = "7. Wheel checks on crafted wheels"

_CHECK = (
    "import json, sys; sys.path.insert(0, sys.argv[1]);"
    "from ci.checks.check import check_wheels;"
    "report = check_wheels([sys.argv[2]], torch_target=sys.argv[3], use_cuobjdump=False);"
    "print(json.dumps({'ok': report.ok, 'problems': list(report.problems)}))"
)


def _wheels(work: Path) -> dict[str, Path]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests import hostile_wheels
    from tests.wheel_factory import build_wheel, host_shared_object

    so = host_shared_object().read_bytes()
    wheels = {"honest (real shared object)": build_wheel(work / "honest", {"demo_pkg/__init__.py": b"",
                                                                          hostile_wheels.SO: so})}
    for label, make in hostile_wheels.CRAFTED.items():
        wheels[label] = make(work / "crafted")
    torch = work / "torch" / "torch"
    (torch / "lib").mkdir(parents=True, exist_ok=True)
    (torch / "__init__.py").write_text("")
    (torch / "lib" / "libc10.so").write_bytes(so)
    wheels["<torch>"] = torch
    return wheels


def _outcome(stdout: str) -> str:
    result = json.loads(stdout.strip().splitlines()[-1])
    if result["ok"]:
        return "pass"
    first = result["problems"][0].split(": ", 2)[-1]
    return f"refused: {first[:90]}"


def run(ctx: Context) -> Figure:
    reps = 1 if ctx.toy else 3
    work = ctx.work / "crafted"
    wheels = _wheels(work)
    torch = wheels.pop("<torch>")
    repo = str(Path(__file__).resolve().parent.parent)
    walls = {label: Samples() for label in wheels}
    rss = {label: Samples() for label in wheels}
    outcomes: dict[str, str] = {}
    ctx.log(f"  crafted wheels: {len(wheels)} wheels ({reps} repetitions)")
    for rep in range(reps):
        for label in (list(wheels) if rep % 2 == 0 else list(reversed(wheels))):
            result = measure_command([sys.executable, "-c", _CHECK, repo, str(wheels[label]), str(torch)],
                                     cwd=Path(repo))
            walls[label].add(result.wall_s)
            rss[label].add(result.maxrss_kb / 1024)
            outcomes[label] = _outcome(result.stdout)
            ctx.log(f"    {label}: rep {rep + 1}/{reps} {result.wall_s:.2f} s, peak RSS "
                    f"{result.maxrss_kb / 1024:.0f} MiB, {outcomes[label]}")
    honest = "honest (real shared object)"
    rows = [[label, human_bytes(path.stat().st_size), walls[label].fmt(), rss[label].fmt("MiB", 4),
             "1.0x" if label == honest else ratio(walls[label], walls[honest]), outcomes[label]]
            for label, path in wheels.items()]
    crafted = [label for label in wheels if label != honest]
    slowest = max(crafted, key=lambda label: walls[label].median)
    hungriest = max(crafted, key=lambda label: rss[label].median)
    return Figure(
        NAME, TITLE,
        compared=("`ci.checks.check.check_wheels` (archive, METADATA, coverage, fatbin scan without cuobjdump, torch "
                  "ABI against a stand-in torch) on each crafted wheel of `tests/hostile_wheels.py` vs an honest wheel"),
        where="this machine; each check a separate process measured from a clean grandchild",
        repetitions=f"{reps} interleaved runs of each; min / median",
        tables=[Table(["wheel", "size", "wall time", "peak RSS", "crafted / honest (wall)", "outcome"], rows)],
        notes=[
            "Before the fix (commit 28c2075) the 1 MiB flood took 155 s and the 4 MiB one over 300 s (the scan "
            "re-read 1 MiB per 4-byte step); the 64 MiB `.dynsym` took 32-46 s and 698 MB (one object per symbol).",
            "The caps (1,048,576 dynamic symbols, 64 MiB string tables and names, 65,536 sections) are far above "
            "torch 2.13's libtorch_cpu.so (75,415 symbols, 5 MB of names).",
            "The honest wheel's outcome is the ABI check's verdict against the stand-in torch (whose one library "
            "does not define `c10::needs_string`): every check ran on it, as on the crafted ones.",
        ],
        summary=[f"worst crafted wheel: {walls[slowest].median:.2f} s ({slowest}), peak RSS "
                 f"{rss[hungriest].median:.0f} MiB ({hungriest}); honest wheel {walls[honest].median:.2f} s, "
                 f"{rss[honest].median:.0f} MiB"],
    )


if __name__ == "__main__":
    start = time.perf_counter()
    print(run(Context(quick=True)).markdown())
    print(f"{time.perf_counter() - start:.1f} s")
