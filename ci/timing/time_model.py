"""How long a matrix row's build takes on its runner, predicted before it runs, from builds that were timed.

Each component is calibrated by one timed build (:func:`calibrations`: the GPU machine's 16 cores, one arch;
ci/timing/timings.json, written by ``python -m ci timing-data`` from benchmarks/device_results.json), with the
number of translation units and the share of the build its slowest unit took, both read from that build's ninja
log (the build record's ``ninja_steps``). A unit
costs ``host + (1 - host) * archs`` times its one-arch cost: the host compile once, the device code once
per arch (``host`` fitted where two arch counts were timed, else ``DEFAULT_HOST_SHARE``). nvcc's
``--threads`` runs a unit's archs side by side, so that unit takes ``host + (1 - host) * archs / threads``
of its time on ``threads`` cores. A row's build then takes the longer of

    its slowest unit, alone                        (the critical path)
    all its units' core-seconds / cores in use     (the throughput bound)

where the cores in use are ``min(cores, jobs * threads, units * threads)`` and jobs are the row's
``max_jobs`` capped by the runner's cores and, for flash-attention, by its memory rule
(build_scripts/lib/flash_attention.sh: 7 GiB per arch a job compiles at once). Cores are taken as equally
fast everywhere; :func:`check` compares the model with every timed build (:func:`observed`) and says how far
off it is (``invoke time-model``). A component with no timed build has no prediction: the plans say "not timed
yet".
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path

from ci.base.errors import WheelhouseError
from ci.model.matrix import MatrixRow
from ci.timing import data_files, timing_data

REFERENCE_CORES = 16
"""The GPU machine (1x H200, 16 cores, 128 GiB) every calibration build ran on, with max_jobs 16."""
DEFAULT_HOST_SHARE = 0.3
# What one more nvcc --thread buys on a unit's gencodes, as a share of a whole core, where a component has
# no measurement of its own (Calibration.thread_efficiency): fitted to fast-hadamard-transform's nine
# gencodes under --threads 9 on the GPU machine (245 s where perfect threads would give 87 s: 2.47 effective
# threads); benchmarks figure 14 gives 0.15 (two threads on this 2-core machine, 1.15x). flash-attention's
# one kernel unit for four archs gets far more from its threads (0.86, below): the lower figure is the
# cautious default.
NVCC_THREAD_EFFICIENCY = 0.184
FLASH_ATTENTION_GIB_PER_ARCH = 7  # build_scripts/lib/flash_attention.sh


@dataclass(frozen=True)
class Runner:
    cores: int
    memory_gib: int
    note: str = ""


# GitHub's standard hosted runners for public repositories; the self-hosted machine is assumed
# (its max_jobs in versions.yaml: up to 32).
RUNNERS = {
    "ubuntu-24.04": Runner(4, 16),
    "ubuntu-24.04-arm": Runner(4, 16),
    "self-hosted": Runner(32, 128, "assumed"),
}


@dataclass(frozen=True)
class Calibration:
    wall_s: float
    """One build for one arch on the reference machine (16 cores, 16 jobs)."""
    units: int
    """Translation units, from the build's ninja log (0: nothing compiled)."""
    slowest_share: float
    """The slowest unit's time over the build's wall time, from the same log's slowest steps."""
    host_share: float = DEFAULT_HOST_SHARE
    own_archs: int = 1
    """The archs the component's setup.py compiles when versions.yaml gives none (torch_cuda_arch_list null)."""
    source: str = ""
    thread_efficiency: float = NVCC_THREAD_EFFICIENCY
    """What one more nvcc --thread buys on one unit's gencodes, where the component's own unit was timed."""


BUILD_TIMES = Path(__file__).resolve().with_name("build_times.json")
"""Builds timed outside the GPU machine, added by ``invoke time-model --record`` (ci/timing/timed_builds.py); a
component's calibration from ci/timing/timings.json wins."""


def measured(path: Path = BUILD_TIMES) -> dict[str, Calibration]:
    raw = json.loads(path.read_text()) if path.is_file() else {}
    return {component: Calibration(**entry) for component, entry in raw.items()}


def calibrations() -> dict[str, Calibration]:
    """Each timed component's calibration: ci/timing/timings.json's, else one recorded in :data:`BUILD_TIMES`."""
    timed = device_calibrations()
    return {**{c: cal for c, cal in _recorded(BUILD_TIMES).items() if c not in timed}, **timed}


def device_calibrations() -> dict[str, Calibration]:
    """The calibrations of ci/timing/timings.json: builds timed on the GPU machine."""
    return _timings()[0]


def observed() -> tuple[Observed, ...]:
    """Every timed build of a component (ci/timing/timings.json), in the order benchmarks/device_results.json
    records them."""
    return _timings()[1]


@functools.cache
def _recorded(path: Path) -> dict[str, Calibration]:
    return measured(path)


@functools.cache
def _timings() -> tuple[dict[str, Calibration], tuple[Observed, ...]]:
    data = timing_data.read()
    try:
        table = {component: Calibration(**entry) for component, entry in data["calibrations"].items()}
        builds = tuple(Observed(o["component"], Conditions(**o["conditions"]), o["measured_s"], o["where"],
                                o["lower_bound"], o["calibration"]) for o in data["observed"])
    except (KeyError, TypeError) as error:
        raise WheelhouseError(f"{data_files.shown(timing_data.TIMINGS_FILE)}: an entry is not the model's ({error}); "
                              f"write it again: {timing_data.COMMAND}") from None
    return table, builds


@dataclass(frozen=True)
class Conditions:
    """What the time of one build depends on."""

    cores: int
    memory_gib: int
    max_jobs: int
    threads: int
    archs: int


@dataclass(frozen=True)
class Prediction:
    seconds: float
    runner: str
    conditions: Conditions
    jobs: int
    budget_s: int
    """The row's build_timeout: the most one run builds before it stops and saves its state."""

    @property
    def runs(self) -> int:
        """Runs of build_timeout the build needs: 1 when it fits, more through the resumable path."""
        return max(1, math.ceil(self.seconds / self.budget_s))

    @property
    def fits(self) -> bool:
        return self.runs == 1

    def short(self) -> str:
        verdict = "fits" if self.fits else f"resumable, {self.runs} runs"
        return f"{_duration(self.seconds)} ({verdict})"

    def describe(self) -> str:
        c = self.conditions
        where = (f"{self.runner} ({c.cores} cores, {c.memory_gib} GiB: {self.jobs} job(s) x {c.threads} nvcc "
                 f"thread(s), {c.archs} arch(s))")
        if self.fits:
            return f"{_duration(self.seconds)} on {where}; fits build_timeout ({_duration(self.budget_s)})"
        return (f"{_duration(self.seconds)} on {where}; over build_timeout ({_duration(self.budget_s)}): the "
                f"resumable path, {self.runs} runs")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def jobs_for(component: str, conditions: Conditions) -> int:
    jobs = max(1, min(conditions.max_jobs, conditions.cores))
    if component == "flash-attention":
        at_once = max(1, min(conditions.threads, conditions.archs))
        jobs = max(1, min(jobs, conditions.memory_gib // (FLASH_ATTENTION_GIB_PER_ARCH * at_once)))
    return jobs


def predict_seconds(component: str, conditions: Conditions) -> float:
    cal = calibrations().get(component)
    if cal is None:
        raise KeyError(component)
    if cal.units == 0:
        return cal.wall_s  # nothing compiled: the build is what it was
    archs = max(1, conditions.archs)
    threads = max(1, min(conditions.threads, archs))
    effective = 1 + (threads - 1) * cal.thread_efficiency
    cost = cal.host_share + (1 - cal.host_share) * archs  # one unit's core-seconds, relative to one arch
    reference_cores = min(REFERENCE_CORES, cal.units)
    core_seconds = cal.wall_s * reference_cores * cost
    slowest = cal.slowest_share * cal.wall_s * (cal.host_share + (1 - cal.host_share) * archs / effective)
    jobs = jobs_for(component, conditions)
    in_use = min(conditions.cores, jobs * threads, cal.units * threads)
    return max(slowest, core_seconds / in_use)


def arch_count(row: MatrixRow) -> int:
    if row.settings.archs is not None:
        return max(1, len(row.settings.archs.archs))
    cal = calibrations().get(row.component)
    return cal.own_archs if cal else 1


def nvcc_threads(row: MatrixRow) -> int:
    """The nvcc threads the row's builder gives each unit: TransformerEngine's own setting, an NVCC_THREADS
    in extra_env (FlashMLA's setup.py reads it), else the nvcc_threads setting."""
    env = row.settings.extra_env
    for key in ("NVTE_BUILD_THREADS_PER_JOB", "NVCC_THREADS"):
        if env.get(key, "").isdigit():
            return int(env[key])
    return row.settings.nvcc_threads


def runner_of(row: MatrixRow) -> tuple[str, Runner]:
    labels = [label.lower() for label in row.settings.runs_on_labels]
    if "self-hosted" in labels:
        return "self-hosted", RUNNERS["self-hosted"]
    for label in labels:
        if label in RUNNERS:
            return label, RUNNERS[label]
    return labels[0], Runner(4, 16, "unknown runner: taken as 4 cores, 16 GiB")


def predict(row: MatrixRow) -> Prediction | None:
    """The row's build time on its runner, or None for a component the model has no timed build of."""

    if row.component not in calibrations():
        return None
    name, runner = runner_of(row)
    conditions = Conditions(runner.cores, runner.memory_gib, row.settings.max_jobs, nvcc_threads(row), arch_count(row))
    seconds = predict_seconds(row.component, conditions)
    if _builds_jit_cache(row):
        # the calibration build compiled nothing; the jit-cache's modules are the build, one shard a job
        from ci.timing import shard_model

        slowest = shard_model.slowest_shard_seconds(row, jobs=jobs_for(row.component, conditions))
        if slowest is None:
            return None
        seconds += slowest
    return Prediction(seconds, name, conditions, jobs_for(row.component, conditions),
                      row.settings.build_timeout_s)


def _builds_jit_cache(row: MatrixRow) -> bool:
    wanted = {p.lower() for p in row.settings.wheel_packages}
    rehosted = {p.lower() for p in row.settings.rehost}
    return "flashinfer-jit-cache" in wanted - rehosted


# --- the model against every timed build ----------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    component: str
    conditions: Conditions
    measured_s: float
    where: str
    lower_bound: bool = False
    """The build was stopped before it finished: it takes at least ``measured_s``."""
    calibration: bool = False
    """A model figure was fitted to it (its component's calibration, or the default nvcc thread efficiency)."""


@dataclass(frozen=True)
class Check:
    observed: Observed
    predicted_s: float

    @property
    def error(self) -> float:
        """(predicted - measured) / measured; for a lower bound, 0 when the prediction is above it."""
        if self.observed.lower_bound and self.predicted_s >= self.observed.measured_s:
            return 0.0
        return (self.predicted_s - self.observed.measured_s) / self.observed.measured_s


def check() -> list[Check]:
    return [Check(o, predict_seconds(o.component, o.conditions)) for o in observed()]


def render_check(checks: list[Check]) -> str:
    lines = [f"{'component':26} {'where':70} {'cores jobs thr archs':>21} {'measured':>9} {'predicted':>9} {'error':>7}"]
    for c in checks:
        o = c.observed
        conditions = f"{o.conditions.cores:5} {o.conditions.max_jobs:4} {o.conditions.threads:3} {o.conditions.archs:5}"
        measured = (">" if o.lower_bound else "") + f"{o.measured_s:.0f} s"
        tag = "  (calibration)" if o.calibration else ""
        lines.append(f"{o.component:26} {o.where:70} {conditions:>21} {measured:>9} {c.predicted_s:8.0f} s "
                     f"{c.error:+7.0%}{tag}")
    checked = [c for c in checks if not c.observed.calibration]
    if not checked:
        lines.append(f"only the {len(checks)} calibration build(s): nothing else timed to check the model against")
        return "\n".join(lines)
    mean = sum(abs(c.error) for c in checked) / len(checked)
    worst = max(checked, key=lambda c: abs(c.error))
    lines.append(f"{len(checked)} timed builds besides the {len(checks) - len(checked)} calibration builds: mean "
                 f"|error| {mean:.0%}, worst {worst.error:+.0%} ({worst.observed.component}, {worst.observed.where})")
    return "\n".join(lines)
