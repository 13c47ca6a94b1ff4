"""``invoke time-model --record``: a timed build feeds the time model by a command, not a hand edit, and the
plan then predicts the component's rows; a build served by the compiler cache, or of a component the model
has a calibration of from the GPU machine (ci/timing/timings.json), is refused in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from build_records import record_of
from index_helpers import REPO
from stamp_helpers import fixture_row

from ci.model import build_record
from ci.timing import time_model


def run_task(*args: str, times: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(REPO / "tests" / "fixtures" / "versions.yaml")}
    code = ("import sys, tasks; from ci.timing import time_model; from pathlib import Path; "
            f"time_model.BUILD_TIMES = Path({str(times)!r}); "
            "from invoke.program import Program; from invoke.collection import Collection; "
            "Program(namespace=Collection.from_module(tasks)).run(['invoke', *sys.argv[1:]])")
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


def timed_record(tmp: Path, *, hits: int = 0) -> Path:
    _, row = fixture_row()
    record = replace(record_of(row, []), compiler_cache_stats={"requests": 3, "hits": hits, "misses": 3 - hits},
                     durations={"toolchain_s": 2.0, "source_s": 0.1, "build_s": 96.0, "checks_s": 1.0, "total_s": 99.1},
                     ninja_steps={"steps": 3, "slowest": [{"log": "b", "output": "a.o", "seconds": 76.0}]})
    path = build_record.path_for(row, tmp / "dist")
    path.parent.mkdir(parents=True)
    record.write(path)
    return path


def test_a_timed_build_becomes_a_calibration_the_plan_predicts_from(tmp_path):
    times = tmp_path / "build_times.json"
    result = run_task("time-model", "--record", str(timed_record(tmp_path)), times=times)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("wheelhouse-fixture (x86_64 cpu py3.11 torch2.13.0): 96.0 s measured on ")
    (entry,) = json.loads(times.read_text()).values()
    cores = os.cpu_count() or 1
    # max_jobs 2 on this machine's cores, spread over the reference machine's cores for its 3 units
    assert entry["units"] == 3 and entry["slowest_share"] == round(76 / 96, 3)
    assert entry["wall_s"] == round(96.0 * min(cores, 2, 3) / 3, 1)
    measured = time_model.measured(times)
    assert set(measured) == {"wheelhouse-fixture"} and measured["wheelhouse-fixture"].units == 3


def test_the_model_reads_the_recorded_builds_beside_its_own_table(tmp_path, monkeypatch):
    times = tmp_path / "build_times.json"
    times.write_text(json.dumps({"tiny": {"wall_s": 48.0, "units": 1, "slowest_share": 0.8, "source": "x"}}))
    assert time_model.measured(times)["tiny"] == time_model.Calibration(48.0, 1, 0.8, source="x")
    assert time_model.measured(tmp_path / "none.json") == {}


@pytest.mark.parametrize("case", ["cache-hits", "calibrated"])
def test_a_build_that_cannot_calibrate_is_one_line(case, tmp_path):
    times = tmp_path / "build_times.json"
    path = timed_record(tmp_path, hits=2 if case == "cache-hits" else 0)
    if case == "calibrated":  # a component of the measured table: flash-mla's row record
        data = json.loads(path.read_text())
        data["row"]["component"] = "flash-mla"
        path.write_text(json.dumps(data))
    result = run_task("time-model", "--record", str(path), times=times)
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr
    assert result.stderr.count("\n") == 1
    expected = ("2 of the build's compiles came from the compiler cache" if case == "cache-hits"
                else "flash-mla is calibrated by a build timed on the GPU machine (")
    assert expected in result.stderr and not times.exists()
