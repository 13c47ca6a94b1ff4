"""Timed builds into the time model, by a command: ``invoke time-model --record <build record>``.

A build record (ci/model/build_record.py) holds what the time model (ci/timing/time_model.py) is calibrated from: the
build's seconds, its translation units and its slowest unit (the ninja log's steps). This turns one record
into a calibration on the model's reference machine and keeps it in ``ci/timing/build_times.json``, which
the model reads beside ci/timing/timings.json (the builds timed on the GPU machine), so a component added anywhere gets a predicted build time without a
hand edit. A build whose compiles came from the compiler cache says nothing about compile times and is
refused, as is a component the model already has a calibration of from the GPU machine.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from ci.base.errors import UsageError
from ci.model.build_record import BuildRecord
from ci.timing import time_model


def calibration_of(record: BuildRecord, *, cores: int, source: str) -> dict[str, object]:
    """The model's calibration of ``record``'s build, made on ``cores`` cores: its core-seconds spread over the
    reference machine's cores (as many as there are units), its units and its slowest unit's share."""
    build_s = float(record.durations.get("build_s", 0.0))
    units = int(record.ninja_steps.get("steps", 0))
    slowest = max((float(step.get("seconds", 0.0)) for step in record.ninja_steps.get("slowest", [])), default=0.0)
    jobs = int(record.row.get("max_jobs", 1))
    in_use = max(1, min(cores, jobs, units or 1))
    wall_s = build_s * in_use / max(1, min(time_model.REFERENCE_CORES, units or 1))
    return {"wall_s": round(wall_s, 1), "units": units, "slowest_share": round(min(1.0, slowest / build_s), 3)
            if build_s else 1.0, "source": source}


def record(path: Path, *, times: Path | None = None, cores: int | None = None) -> str:
    """Add the build of the record at ``path`` to ``times`` (default: the model's file); the line to print."""
    times = times or time_model.BUILD_TIMES
    built = BuildRecord.read(path, fix="pass the build record a build wrote (dist/<world>/<tag>-<arch>.build.json)")
    component = str(built.row["component"])
    hits = int(built.compiler_cache_stats.get("hits", 0)) if built.compiler_cache_stats else 0
    if hits:
        raise UsageError(f"{path}: {hits} of the build's compiles came from the compiler cache, so it did not time "
                         "them; time a build with an empty cache (WHEELHOUSE_CACHE=<a new directory>)")
    calibrated = time_model.device_calibrations().get(component)
    if calibrated is not None:
        raise UsageError(f"{component} is calibrated by a build timed on the GPU machine ({calibrated.source}; "
                         "ci/timing/timings.json, from benchmarks/device_results.json); that one stays")
    cores = cores or os.cpu_count() or 1
    entry = calibration_of(built, cores=cores, source=f"{path.name}: {built.durations.get('build_s')} s on {cores} cores")
    table = json.loads(times.read_text()) if times.is_file() else {}
    table[component] = entry
    times.parent.mkdir(parents=True, exist_ok=True)
    times.write_text(json.dumps(dict(sorted(table.items())), indent=1) + "\n")
    return (f"{component} ({built.row['arch']} {built.row['cuda']} py{built.row['python']} torch{built.row['torch']}): "
            f"{built.durations.get('build_s')} s measured on {cores} cores, {entry['units']} unit(s), added to {times}")
