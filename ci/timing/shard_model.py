"""How many shards a row needs to fit its job limit: a first time model, from per-module compile times.

Input: a build's ``modules`` (the build record's field, or the same read from shard manifests,
ci/model/jit_cache.py ``record_modules``): every module of the list with its CUDA translation units, the
archs it compiles them for, its family, and the compile seconds of the modules that were built
(the sum of each module's ninja steps: the time one core spends on it). A module without seconds
is extrapolated: its compiles (translation units x archs) times the measured seconds per compile
of its family, or of every measured module when none of its family was measured. So a measured
subset (a few families, one shard) gives an estimate of the whole list, and says how much of it is
measured; ``measured_elsewhere`` (same record layout) adds modules measured in a build of another
arch list, as rates only (a module compiled for one arch says what one compile of it costs).

A shard of the row (ci/model/shards.py's assignment) then takes ``work / jobs * slowdown`` on its runner,
``jobs`` being the parallel compiles: the row's ``max_jobs``, at most the runner's cores (its ninja
runs that many nvcc at once; memory is what max_jobs is chosen for). ``slowdown``: the runner's
seconds per second of the measuring machine's cores (1.0 unless known). It must fit the job: the
smaller of ``build_timeout`` and ``job_timeout_minutes`` less the job's setup outside the build
(toolkit, torch, sources, upload: ``overhead``), with a margin for the tail of the last module.
The answer is the smallest shard count whose slowest shard fits; none fits when one module alone
does not.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci.base import bounded_json, log
from ci.base.errors import UsageError, WheelhouseError
from ci.formats.archs import parse_arch_list
from ci.model import shards
from ci.model.matrix import MatrixRow
from ci.model.versions import REPO_ROOT
from ci.timing import data_files

# GitHub-hosted standard runners (public repositories): 4 vCPUs, 16 GB, 6 h per job.
HOSTED_CORES = {"ubuntu-24.04": 4, "ubuntu-22.04": 4, "ubuntu-latest": 4, "ubuntu-24.04-arm": 4,
                "ubuntu-22.04-arm": 4}
DEFAULT_OVERHEAD_S = 30 * 60
"""A hosted job's time outside the build step: the CUDA toolkit, torch, the sources, the artifact upload."""
MARGIN = 0.85
"""The share of the budget a shard's estimate may fill: estimates are averages, and a shard ends on its slowest module."""
MAX_SHARDS = 256
RECORDED_TIMES = data_files.DATA_DIR / "module_times"
"""Committed per-module times, ``<component>-<arch>.json`` (``python -m ci shard-model --write``): what the plan
reads when no build of the row left times in dist/."""


@dataclass(frozen=True)
class Runner:
    label: str
    cores: int | None
    """None: not a runner of known size (self-hosted); the row's max_jobs is taken as it is."""


@dataclass(frozen=True)
class Estimate:
    modules: int
    measured: int
    measured_sources: int
    sources: int
    seconds: dict[str, float]
    """Each module's core-seconds, measured or extrapolated."""
    measured_families: int = 0
    families: int = 0

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


@dataclass(frozen=True)
class Fit:
    shards: int | None
    """The smallest count whose slowest shard fits; None when none does."""
    slowest_s: float
    """The slowest shard's estimated build seconds at that count (at MAX_SHARDS when none fits)."""
    budget_s: float
    jobs: int
    largest: tuple[str, float]
    """The module with the most core-seconds."""


def estimate(modules: Mapping[str, Any]) -> Estimate:
    """Every module's core-seconds from a build's ``modules`` (see the module doc)."""
    entries = modules.get("modules") or []
    elsewhere = [m for m in modules.get("measured_elsewhere") or []
                 if isinstance(m.get("seconds"), (int, float)) and not m.get("cached")]
    timed = [m for m in entries if isinstance(m.get("seconds"), (int, float))]
    measured = [m for m in timed if not m.get("cached")]
    if not measured and not elsewhere:
        why = (" (every timed one was built with compiler-cache hits, whose seconds are no compile times: build with "
               "an empty compiler cache)") if timed else ""
        raise WheelhouseError(f"no module of the list has measured compile seconds{why}; build the row (or one shard) "
                              "once")
    def rate(group: list[dict]) -> float:
        return sum(m["seconds"] for m in group) / sum(units(m) for m in group)

    cost = {m["name"]: units(m) for m in entries}
    overall = rate(measured + elsewhere)
    by_family: dict[str, list[dict]] = {}
    for m in measured + elsewhere:
        by_family.setdefault(str(m.get("family", "")), []).append(m)
    family_rate = {family: rate(group) for family, group in by_family.items()}
    seconds = {}
    for m in entries:
        if isinstance(m.get("seconds"), (int, float)) and not m.get("cached"):
            seconds[m["name"]] = float(m["seconds"])
        else:
            seconds[m["name"]] = cost[m["name"]] * family_rate.get(str(m.get("family", "")), overall)
    families = {str(m.get("family", "")) for m in entries}
    return Estimate(len(entries), len(measured), sum(cost[m["name"]] for m in measured), sum(cost.values()), seconds,
                    len({str(m.get("family", "")) for m in measured + elsewhere} & families), len(families))


def units(module: Mapping[str, Any]) -> int:
    """A module's compiles (ci/model/jit_cache.py ``compile_units``); a record without archs counts one arch."""
    from ci.model.jit_cache import compile_units

    return compile_units(int(module.get("cuda_sources") or 0), module.get("archs") or ())


def costs_of(modules: Mapping[str, Any]) -> dict[str, int]:
    """The shard assignment's costs for a record's module list."""
    return {m["name"]: units(m) for m in modules["modules"]}


def runner(row: MatrixRow) -> Runner:
    labels = row.settings.runs_on_labels
    known = [label for label in labels if label in HOSTED_CORES]
    return Runner(known[0], HOSTED_CORES[known[0]]) if known else Runner(" ".join(labels), None)


def slowest_shard_work(est: Estimate, costs: Mapping[str, int], count: int) -> float:
    """The core-seconds of the most loaded of ``count`` shards of ci/model/shards.py's assignment (by ``costs``)."""
    return max(sum(est.seconds[name] for name in names) for names in shards.assign(costs, count))


def fit(est: Estimate, costs: Mapping[str, int], *, jobs: int, budget_s: float, slowdown: float = 1.0) -> Fit:
    """The smallest shard count of ci/model/shards.py's assignment (by ``costs``) whose slowest shard fits ``budget_s``."""
    largest = max(est.seconds.items(), key=lambda item: (item[1], item[0]))
    slowest = 0.0
    for count in range(1, MAX_SHARDS + 1):
        slowest = slowest_shard_work(est, costs, count) / jobs * slowdown
        if slowest <= budget_s * MARGIN:
            return Fit(count, slowest, budget_s, jobs, largest)
        if largest[1] / jobs * slowdown > budget_s * MARGIN:
            break  # the largest module alone does not fit: no count will
    return Fit(None, slowest, budget_s, jobs, largest)


def row_budget(row: MatrixRow, overhead_s: float = DEFAULT_OVERHEAD_S) -> float:
    """Seconds a shard's build step may take in its job: build_timeout, or the job limit less its setup."""

    return min(row.settings.build_timeout_s, row.settings.job_timeout_minutes * 60 - overhead_s)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.0f} min"


def describe(est: Estimate, result: Fit, runner_label: str) -> str:
    share = (f"{est.measured} of {est.modules} modules measured ({est.measured_sources} of {est.sources} compiles, "
             f"{est.measured_families} of {est.families} families with a measured rate)")
    work = f"{_hours(est.total)} of compile on one core"
    if result.shards is None:
        return (f"no shard count fits: module {result.largest[0]} alone is ~{_hours(result.largest[1] / result.jobs)} "
                f"with {result.jobs} jobs on {runner_label}, over the {_hours(result.budget_s * MARGIN)} a job has; "
                f"{share}; {work}")
    return (f"{result.shards} shard(s) fit {runner_label} ({result.jobs} parallel jobs, {_hours(result.budget_s)} "
            f"per build step; the slowest ~{_hours(result.slowest_s)}); {share}; {work}")


def plan_line(row: MatrixRow, dist_root: Path) -> str:
    """The plan's time-model sentence for ``row``, from the times its last build recorded under ``dist_root``
    (the build record, else the shards' manifests), else from :data:`RECORDED_TIMES` for the row's arch list."""
    found = recorded_modules(row, dist_root)
    if found is None:
        return (f"time model: no module times recorded for this row (in {dist_root / row.world} or "
                f"{RECORDED_TIMES.relative_to(REPO_ROOT)}/{row.component}-{row.arch}.json); build it, or one shard of "
                "it, once")
    source, modules = found
    try:
        est = estimate(modules)
    except WheelhouseError as error:
        return f"time model: {error}"
    hosted = runner(row)
    jobs = min(row.settings.max_jobs, hosted.cores) if hosted.cores else row.settings.max_jobs
    result = fit(est, costs_of(modules), jobs=jobs, budget_s=row_budget(row))
    return f"time model ({source}): {describe(est, result, hosted.label)}"


def slowest_shard_seconds(row: MatrixRow, *, jobs: int, dist_root: Path | None = None) -> float | None:
    """The build step of the row's slowest shard (versions.yaml's ``shards``) on ``jobs`` parallel compiles, from
    its recorded module times (:func:`recorded_modules`); None where none are recorded."""
    found = recorded_modules(row, dist_root or REPO_ROOT / "dist")
    if found is None:
        return None
    try:
        est = estimate(found[1])
    except WheelhouseError:
        return None
    return slowest_shard_work(est, costs_of(found[1]), max(1, row.settings.shards)) / max(1, jobs)


def recorded_modules(row: MatrixRow, dist_root: Path) -> tuple[str, dict[str, Any]] | None:
    """(where, modules) of the newest times recorded for ``row``: its build record in ``dist_root``, its shards
    there, or the committed file for its component, arch and arch list."""
    from ci.model import build_record, jit_cache
    from ci.model.build_record import BuildRecord

    record_path = build_record.path_for(row, dist_root)
    with contextlib.suppress(WheelhouseError):
        if record_path.is_file() and (modules := BuildRecord.read(record_path).modules) is not None:
            return str(record_path), modules
    shards_dir = dist_root / row.world / "shards" / f"{row.release_tag}-{row.arch}"
    with contextlib.suppress(WheelhouseError):
        if (modules := jit_cache.record_modules(shards_dir)) is not None:
            return str(shards_dir), modules
    committed = RECORDED_TIMES / f"{row.component}-{row.arch}.json"
    if committed.is_file():
        modules = json.loads(committed.read_text(encoding="utf-8"))
        wanted = row.settings.archs.archs if row.settings.archs else ()
        if parse_arch_list(str(modules.get("cuda_arch_list", ""))).archs == wanted:
            return str(committed.relative_to(REPO_ROOT)), modules
    return None


def add_command(commands: Any) -> None:
    """``python -m ci shard-model --record RECORD ...``: the shards a row needs on another runner."""
    parser = commands.add_parser("shard-model", help="model a row's shards on a runner from measured module times",
                                 description=__doc__.split("\n\n")[0])
    parser.add_argument("--record", type=Path, required=True,
                        help="a build record with per-module times, or a directory of shards")
    parser.add_argument("--cores", type=int, default=4, help="the runner's cores (default 4: a hosted runner)")
    parser.add_argument("--jobs", type=int, help="parallel compiles (default: the cores)")
    parser.add_argument("--job-minutes", type=int, default=360, help="the job limit (default 360)")
    parser.add_argument("--overhead-minutes", type=float, default=DEFAULT_OVERHEAD_S / 60)
    parser.add_argument("--slowdown", type=float, default=1.0, help="runner seconds per measured second")
    parser.add_argument("--label", default="a 4-core hosted runner")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--also", type=Path, action="append", default=[],
                        help="a build record (or shards) of another build: its measured modules add rates only")
    parser.add_argument("--module-list", type=Path,
                        help="model this module list (build/aot/modules.json: the builder's lists merged by "
                             "python -m ci jit-cache merge), with the record's measurements as rates")
    parser.add_argument("--write", type=Path, help="write the modules the model read (for ci/timing/module_times/)")
    parser.add_argument("--note", default="", help="with --write: where and how the times were measured")
    parser.set_defaults(run=_model_command)


def _model_command(args: Any) -> None:
    modules = _combined(args.record, args.also, args.module_list)
    if args.write:
        args.write.write_text(_compact({**modules, **({"note": args.note} if args.note else {})}), encoding="utf-8")
    est = estimate(modules)
    costs = costs_of(modules)
    jobs = args.jobs or args.cores
    budget = args.job_minutes * 60 - args.overhead_minutes * 60
    result = fit(est, costs, jobs=jobs, budget_s=budget, slowdown=args.slowdown)
    if args.json:
        log.out(json.dumps({"modules": est.modules, "measured": est.measured, "core_seconds": round(est.total),
                            "wall_seconds_on_cores": round(est.total / jobs * args.slowdown),
                            "shards": result.shards, "slowest_shard_seconds": round(result.slowest_s),
                            "jobs": jobs, "budget_seconds": budget}, indent=2))
        return
    log.out(f"full list: {est.modules} modules, {est.sources} compiles, ~{_hours(est.total)} on one core, "
            f"~{_hours(est.total / jobs * args.slowdown)} on {jobs} parallel jobs")
    log.out(describe(est, result, args.label))


def _combined(record: Path, also: list[Path], module_list: Path | None) -> dict[str, Any]:
    """The record's modules; with ``module_list``, that list with every measurement as ``measured_elsewhere``."""
    from ci.model.jit_cache import ModuleList

    modules = _read_modules(record)
    extra = [m for path in also for m in _read_modules(path)["modules"] if m.get("seconds") is not None]
    if module_list is None:
        return {**modules, "measured_elsewhere": [*modules.get("measured_elsewhere", []), *extra]}
    listing = ModuleList.read(module_list)
    measured = [m for m in modules["modules"] if m.get("seconds") is not None]
    return {"cuda_arch_list": listing.cuda_arch_list, "flashinfer_version": listing.document["flashinfer_version"],
            "modules": [{"name": m.key, "provider": m.provider, "cuda_sources": m.cuda_sources, "archs": list(m.archs),
                         "family": m.family, "seconds": None} for m in listing.modules],
            "measured_elsewhere": [*modules.get("measured_elsewhere", []), *measured, *extra]}


def _compact(modules: dict[str, Any]) -> str:
    """One module a line: a file a reviewer can read and diff."""
    head = {k: v for k, v in modules.items() if k not in ("modules", "measured_elsewhere")}
    lines = ["{"] + [f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}," for k, v in sorted(head.items())]
    for key in ("measured_elsewhere", "modules"):
        entries = [f"  {json.dumps(m, sort_keys=True)}" for m in modules.get(key, [])]
        lines += [f" {json.dumps(key)}: [", ",\n".join(entries), " ]" + ("," if key != "modules" else "")]
    return "\n".join(lines) + "\n}\n"


def _plain_times(path: Path) -> dict[str, Any] | None:
    try:
        raw = bounded_json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return raw if isinstance(raw, dict) and "modules" in raw and "row" not in raw else None


def _read_modules(path: Path) -> dict[str, Any]:
    from ci.model import jit_cache
    from ci.model.build_record import BuildRecord

    if path.is_dir():
        modules = jit_cache.record_modules(path)
    elif path.is_file() and isinstance(plain := _plain_times(path), dict):
        modules = plain  # a file of ci/timing/module_times/ (--write)
    else:
        modules = BuildRecord.read(path).modules
    if modules is None:
        raise UsageError(f"{path}: records no per-module times; give a build record of a build by shards, or the "
                         "directory of its shards")
    return modules
