"""The parallel workers' rule (tests/worker_scheduling.py), run by a real pytest with two xdist workers: a module
whose tests share a module-scoped fixture makes it once on one worker; other tests still spread over both."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent

SHARED = """
import os
import pytest

@pytest.fixture(scope="module")
def made(tmp_path_factory):
    with open(os.environ["SCHEDULING_LOG"], "a") as log:
        log.write(f"made {os.environ['PYTEST_XDIST_WORKER']}\\n")

@pytest.mark.parametrize("n", range(6))
def test_shared(made, n):
    with open(os.environ["SCHEDULING_LOG"], "a") as log:
        log.write(f"shared {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""

ALONE = """
import os
import time
import pytest

@pytest.mark.parametrize("n", range(8))
def test_alone(n):
    time.sleep(0.3)
    with open(os.environ["SCHEDULING_LOG"], "a") as log:
        log.write(f"alone {os.environ['PYTEST_XDIST_WORKER']}\\n")
"""


def test_a_module_with_a_module_fixture_runs_on_one_worker_and_the_rest_spread(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "conftest.py").write_text("from worker_scheduling import pytest_xdist_make_scheduler  # noqa: F401\n")
    (project / "test_shared.py").write_text(SHARED)
    (project / "test_alone.py").write_text(ALONE)
    log = tmp_path / "log"
    env = {**os.environ, "PYTHONPATH": str(TESTS), "SCHEDULING_LOG": str(log)}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
                           "--rootdir", str(project), "-n", "2", "--dist", "loadscope", str(project)],
                          cwd=project, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [line.split() for line in log.read_text().splitlines()]
    made = [worker for what, worker in lines if what == "made"]
    shared = {worker for what, worker in lines if what == "shared"}
    alone = {worker for what, worker in lines if what == "alone"}
    assert len(made) == 1 and shared == set(made), lines  # one fixture, made once, its tests beside it
    assert alone == {"gw0", "gw1"}, lines  # the other tests still go one by one to either worker
