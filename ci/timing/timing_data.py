"""``ci/timing/timings.json``: the build-time model's data, written by ``python -m ci timing-data`` from the timed
builds benchmarks/device_results.json records (``timed_builds``).

That section lists every timed build of a component with the conditions it ran in (cores, memory, max_jobs, nvcc
threads, archs) and its seconds, where and when; one build of each component carries its calibration
(``model``: translation units, the slowest unit's share, and the host share, the component's own arch count
and the nvcc thread efficiency where they were measured), checked against
``schemas/timed_builds.schema.json``. The file holds the calibrations (``wall_s`` the calibrating build's seconds)
and every build in the order recorded, which ci/timing/time_model.py reads; a component with no timed build is
"not timed yet" in the plans.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ci.base import json_schema, log
from ci.base.errors import ConfigError, WheelhouseError
from ci.timing import data_files

SECTION = "timed_builds"
TIMINGS_FILE = data_files.DATA_DIR / "timings.json"
SCHEMA = data_files.DATA_DIR / "schemas" / "timed_builds.schema.json"
COMMAND = "python -m ci timing-data"
_CALIBRATION_KEYS = ("units", "slowest_share", "host_share", "own_archs", "thread_efficiency", "source")
"""What a build's ``model`` gives its component's calibration (its ``note`` says why, for the reader only)."""


def document(results: Mapping[str, Any], *, where: str | None = None) -> dict[str, Any]:
    """The data file's contents from the measured record ``results`` (read from ``where``, by default the
    committed one); one ConfigError line naming the JSON path of a bad entry."""
    where = where or data_files.shown(data_files.DEVICE_RESULTS)
    section = results.get(SECTION)
    if section is None:
        raise ConfigError(f"{where}: has no '{SECTION}' section; record the timed builds there (see {shown_schema()})")
    problem = json_schema.problem(section, SCHEMA)
    if problem:
        raise ConfigError(f"{where}: {problem.replace('$', f'$.{SECTION}', 1)}; fix the entry (see {shown_schema()})")
    builds = section["builds"]
    calibrations: dict[str, dict[str, Any]] = {}
    for index, build in enumerate(builds):
        if "model" not in build:
            continue
        if build["component"] in calibrations:
            raise ConfigError(f"{where}: $.{SECTION}.builds[{index}].model: a second calibration of "
                              f"{build['component']}; keep the 'model' of one of its builds")
        model = build["model"]
        calibrations[build["component"]] = {"wall_s": build["seconds"],
                                            **{key: model[key] for key in _CALIBRATION_KEYS if key in model}}
    for index, build in enumerate(builds):
        if build["component"] not in calibrations:
            raise ConfigError(f"{where}: $.{SECTION}.builds[{index}]: {build['component']} has timed builds but no "
                              "calibration; give its one-arch build on the GPU machine a 'model'")
    observed = [{"component": b["component"], "conditions": b["conditions"], "measured_s": b["seconds"],
                 "where": b["where"], "lower_bound": b.get("lower_bound", False),
                 "calibration": b.get("calibration", False)} for b in builds]
    return {"generator": COMMAND, "source": f"{data_files.shown(data_files.DEVICE_RESULTS)} ({SECTION})",
            "model": "ci/timing/time_model.py", "calibrations": calibrations, "observed": observed}


def shown_schema() -> str:
    return data_files.shown(SCHEMA)


def read(path: Path = TIMINGS_FILE) -> dict[str, Any]:
    """The data file at ``path``: ``calibrations`` (component -> calibration) and ``observed`` (every timed build)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data.get("calibrations"), dict) or not isinstance(data.get("observed"), list):
            raise ValueError("no 'calibrations' object and 'observed' list")
    except (OSError, ValueError, AttributeError) as error:
        raise WheelhouseError(f"{data_files.shown(path)}: cannot be read ({error}); write it again: {COMMAND}") from None
    return data


def add_command(commands: Any) -> None:
    """``python -m ci timing-data [--check]``: the time model's data, written again from the device results."""
    parser = commands.add_parser("timing-data", help="the build-time model's data, written from the device results",
                                 description=__doc__.split("\n\n")[0])
    data_files.add_generator_options(parser, TIMINGS_FILE)
    parser.set_defaults(run=_command)


def _command(args: Any) -> None:
    written = document(data_files.read_results(args.results), where=data_files.shown(args.results))
    data_files.write_or_check(written, args.out, check=args.check, command=COMMAND)
    if not args.check:
        log.get("timing").info(f"{data_files.shown(args.out)}: {len(written['calibrations'])} calibrations and "
                               f"{len(written['observed'])} timed builds from {data_files.shown(args.results)}")
    for component, calibration in sorted(written["calibrations"].items()):
        builds = sum(o["component"] == component for o in written["observed"])
        log.out(f"{component}: {calibration['wall_s']} s for one arch on the GPU machine, {calibration['units']} "
                f"unit(s), {builds} timed build(s)")
