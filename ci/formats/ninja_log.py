"""What a build spent its time on, from the logs ninja keeps in its build directories.

ninja appends a line per finished step to ``.ninja_log`` in the directory it
builds in: ``start_ms end_ms mtime output hash``, tab-separated, under a
``# ninja log vN`` header. A step that ran again (a resumed build) appears
again, and its last line is the one that counts. CMake projects
(TransformerEngine's library) and torch's extension builder (``build/temp.*``)
each leave one, so the build record can say which objects dominated the build
long after its directory is gone.
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict

LOG_NAME = ".ninja_log"


class Step(TypedDict):
    log: str  # the log's directory, relative to the build's root
    output: str
    seconds: float


class Steps(TypedDict):
    steps: int  # every step of every log
    slowest: list[Step]


def step_seconds(log: Path) -> dict[str, float]:
    """Seconds per output of one ninja log, the last run of each; lines that are not steps are skipped."""
    steps: dict[str, float] = {}
    for line in log.read_text(errors="replace").splitlines():
        fields = line.split("\t")
        if line.startswith("#") or len(fields) < 4:
            continue
        try:
            start, end = int(fields[0]), int(fields[1])
        except ValueError:
            continue
        steps[fields[3]] = (end - start) / 1000
    return steps


def seconds_by_directory(log: Path) -> dict[str, float]:
    """Seconds per directory of outputs in one ninja log: each step's (its last run) under the name of the
    directory its output is in. flashinfer's ahead-of-time build writes each module's objects and shared
    object into a directory named after the module (``cached_ops/<module>/``), so this is each module's
    compile time: the sum of its steps, as one core spends it."""
    totals: dict[str, float] = {}
    for output, seconds in step_seconds(log).items():
        directory = Path(output).parent.name
        if directory:
            totals[directory] = round(totals.get(directory, 0.0) + seconds, 3)
    return totals


def slowest_steps(root: Path, limit: int = 10) -> Steps:
    """The ``limit`` longest steps of every ninja log under ``root``, longest first, with the total count.

    Each entry names the step's output and the log's directory relative to ``root``.
    """
    steps: list[Step] = []
    for log in sorted(root.rglob(LOG_NAME)):
        where = str(log.parent.relative_to(root))
        steps += [Step(log=where, output=output, seconds=seconds) for output, seconds in step_seconds(log).items()]
    steps.sort(key=lambda step: (-step["seconds"], step["log"], step["output"]))
    return Steps(steps=len(steps), slowest=steps[:limit])
