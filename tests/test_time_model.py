"""The build-time model: its predictions for the real rows, its inputs, and its error against timed builds."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ci.building import job
from ci.model import matrix
from ci.model.versions import REPO_ROOT, load
from ci.timing import time_model


def _row(component: str, arch: str = "x86_64", python: str = "3.12"):
    return next(r for r in matrix.expand(load()) if r.component == component and r.arch == arch and python in r.pythons)


def test_the_rows_read_their_runner_archs_and_threads():
    fa = time_model.predict(_row("flash-attention"))
    assert (fa.runner, fa.conditions.cores, fa.conditions.archs, fa.conditions.threads) == ("ubuntu-24.04", 4, 4, 2)
    assert fa.jobs == 1  # 16 GiB / (7 GiB x 2 archs at once)
    assert time_model.predict(_row("transformer-engine")).conditions.threads == 4  # NVTE_BUILD_THREADS_PER_JOB
    assert time_model.predict(_row("flash-mla")).conditions.archs == 2  # its setup.py's own sm_90a + sm_100f
    assert time_model.predict(_row("fast-hadamard-transform")).conditions.archs == 9
    assert time_model.predict(_row("apex")).runner == "self-hosted"


def test_more_archs_cost_more_and_threads_win_it_back_on_the_critical_path():
    base = time_model.Conditions(cores=16, memory_gib=128, max_jobs=16, threads=1, archs=1)
    one = time_model.predict_seconds("fast-hadamard-transform", base)
    nine = time_model.predict_seconds("fast-hadamard-transform", dataclasses.replace(base, archs=9))
    threaded = time_model.predict_seconds("fast-hadamard-transform", dataclasses.replace(base, archs=9, threads=9))
    # nine archs on nine threads: 2.5 effective threads (NVCC_THREAD_EFFICIENCY, measured on the GPU machine)
    assert one < threaded < nine / 2
    # a 4-core runner: fewer cores in use than the reference, never faster
    small = time_model.predict_seconds("apex", dataclasses.replace(base, cores=4, max_jobs=4))
    assert small > time_model.predict_seconds("apex", base)


def test_a_row_over_its_build_timeout_takes_the_resumable_path_in_runs():
    row = _row("flash-attention")
    prediction = time_model.predict(row)
    assert not prediction.fits and prediction.runs == -(-int(prediction.seconds) // prediction.budget_s)
    shorter = dataclasses.replace(row, settings=dataclasses.replace(row.settings, build_timeout="2h"))
    assert time_model.predict(shorter).runs > prediction.runs
    assert "resumable, " in prediction.short() and "the resumable path" in prediction.describe()
    assert time_model.predict(_row("flash-mla")).fits


def _versions_with_an_untimed_component(tmp_path: Path) -> Path:
    """versions.yaml with one more component that no build was ever timed of (fast-hadamard-transform's builder)."""
    entry = ("\n  untimed-hadamard:\n"
             "    source: {git: \"https://github.com/Dao-AILab/fast-hadamard-transform.git\"}\n"
             "    ref: v1.1.0\n    builder: fast_hadamard_transform\n    wheel_packages: [untimed-hadamard]\n"
             "    torch_cuda_arch_list: \"9.0\"\n    max_jobs: 2\n    runs_on: ubuntu-24.04\n")
    path = tmp_path / "versions.yaml"
    path.write_text((REPO_ROOT / "versions.yaml").read_text() + entry)
    return path


def test_a_component_without_any_timing_is_planned_as_not_timed_yet(tmp_path):
    """No timed build of a component is a state the plans print, not an error: its rows are listed and planned."""
    versions_file = _versions_with_an_untimed_component(tmp_path)
    assert "untimed-hadamard" not in time_model.calibrations()
    versions = load(versions_file)
    rows = [r for r in matrix.expand(versions) if r.component == "untimed-hadamard"]
    assert len(rows) == len(versions.build_matrix) and all(time_model.predict(r) is None for r in rows)
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(versions_file)}
    listed = subprocess.run([sys.executable, "-m", "invoke", "matrix"], cwd=REPO_ROOT, capture_output=True, text=True,
                            env=env)
    assert listed.returncode == 0, listed.stderr
    untimed = [line for line in listed.stdout.splitlines() if line.startswith("build-untimed-hadamard-")]
    assert len(untimed) == len(rows) and all(" not timed yet " in line for line in untimed)
    assert all(" not measured yet " in line for line in untimed)  # nor a wheel of it weighed (ci/timing/size_model.py)
    assert listed.stdout.splitlines()[-1].startswith(f"{len(matrix.expand(versions))} row(s)")
    with tempfile.TemporaryDirectory() as empty:
        options = job.BuildOptions(cache_dir=Path(empty) / "cache", dist_root=Path(empty) / "dist")
        plan = job.plan(versions, rows[0], options).render()
    assert "  predicted:      no timed build of this component yet" in plan
    # the model's own command works beside it, and names what it has for the component it lacks
    checked = subprocess.run([sys.executable, "-m", "invoke", "time-model"], cwd=REPO_ROOT, capture_output=True,
                             text=True, env=env)
    assert checked.returncode == 0 and "mean |error|" in checked.stdout, checked.stderr
    one = subprocess.run([sys.executable, "-m", "invoke", "time-model", "--component", "untimed-hadamard"],
                         cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    assert (one.returncode, one.stdout) == (2, "")
    assert one.stderr.startswith("error: --component untimed-hadamard: no timed build of it; known: apex, ")
    assert one.stderr.count("\n") == 1


def test_the_error_against_every_timed_build_is_printed():
    checks = time_model.check()
    assert len(checks) == len(time_model.observed())
    for c in checks:
        if c.observed.calibration:
            # the calibration build is predicted as it was measured (its archs, one)
            assert abs(c.error) < 0.01, c
    result = subprocess.run([sys.executable, "-m", "invoke", "time-model"], cwd=REPO_ROOT, capture_output=True,
                            text=True, env=dict(os.environ))
    assert result.returncode == 0, result.stderr
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith(f"{sum(not c.observed.calibration for c in checks)} timed builds besides the ")
    assert "mean |error|" in last


def test_invoke_matrix_shows_the_stage_and_the_prediction():
    result = subprocess.run([sys.executable, "-m", "invoke", "matrix", "--component", "flash-attention", "--arch",
                             "x86_64"], cwd=REPO_ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert " first " in lines[0] and "(resumable, 2 runs)" in lines[0]
    assert " then " in lines[1]
    assert lines[-1].startswith("2 row(s); 2 predicted over build_timeout")


def test_flash_attentions_own_unit_sets_its_thread_gain():
    """One kernel unit for four archs timed on the GPU machine with --threads 1 and 4 (639.2 s, 222.9 s): the
    model's critical path for that unit gives the measured ratio back; components without such a timing keep
    the cautious default."""
    cal = time_model.calibrations()["flash-attention"]

    def unit(threads: int) -> float:  # the slowest-unit term of predict_seconds, for one unit of 4 archs
        effective = 1 + (threads - 1) * cal.thread_efficiency
        return cal.host_share + (1 - cal.host_share) * 4 / effective

    assert abs(unit(1) / unit(4) - 639.2 / 222.9) < 0.02
    assert time_model.calibrations()["apex"].thread_efficiency == time_model.NVCC_THREAD_EFFICIENCY


def test_a_row_that_compiles_the_jit_cache_is_predicted_by_its_slowest_shard():
    """flashinfer's calibration build compiled nothing (the python wheel); a row that builds flashinfer-jit-cache
    is that plus its slowest shard from the recorded module times (ci/timing/shard_model.py), so more shards, less time."""
    from ci.timing import shard_model

    row = _row("flashinfer")
    prediction = time_model.predict(row)
    slowest = shard_model.slowest_shard_seconds(row, jobs=prediction.jobs)
    assert slowest is not None and prediction.seconds == time_model.calibrations()["flashinfer"].wall_s + slowest
    assert prediction.fits  # versions.yaml's shard count is the model's
    fewer = dataclasses.replace(row, settings=dataclasses.replace(row.settings, shards=1))
    assert time_model.predict(fewer).seconds > 3 * prediction.seconds
    rehosted = dataclasses.replace(row, settings=dataclasses.replace(row.settings, rehost=("flashinfer-cubin",
                                                                                           "flashinfer-jit-cache")))
    assert time_model.predict(rehosted).seconds == time_model.calibrations()["flashinfer"].wall_s
