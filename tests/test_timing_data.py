"""The data files the plans read (ci/timing/): each committed one is what its command writes, the commands check as
well as write, a bad timed build is one line naming its JSON path, and nothing in ci/ but the generators' one
constant reads benchmarks/."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci.timing import data_files, shard_model, size_model, timing_data

REPO = Path(__file__).resolve().parent.parent


def ci(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ci", *args], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "GITHUB_ACTIONS": ""})


def test_each_committed_data_file_is_what_its_command_writes(tmp_path: Path) -> None:
    results = data_files.read_results(data_files.DEVICE_RESULTS)
    assert timing_data.TIMINGS_FILE.read_text() == data_files.render(timing_data.document(results))
    assert size_model.SIZES_FILE.read_text() == data_files.render(size_model.document(results))
    for command in (("timing-data", "--check"), ("size-model", "--check")):
        checked = ci(*command)
        assert checked.returncode == 0, checked.stderr
    # module times: the command's own format, and the GPU machine's module seconds are the measured record's
    gpu = {(m["name"], m["seconds"]) for m in results["jit_cache"]["modules"]}
    committed = sorted(shard_model.RECORDED_TIMES.glob("*.json"))
    assert [p.name for p in committed] == ["flashinfer-aarch64.json", "flashinfer-x86_64.json"]
    for path in committed:
        written = tmp_path / path.name
        assert ci("shard-model", "--record", str(path), "--write", str(written)).returncode == 0
        assert written.read_text() == path.read_text(), path
        measured = json.loads(path.read_text())["measured_elsewhere"]
        assert gpu <= {(m["name"], m["seconds"]) for m in measured}, path


def test_the_timing_data_holds_every_calibration_and_timed_build_in_order() -> None:
    data = json.loads(timing_data.TIMINGS_FILE.read_text())
    assert data["generator"] == "python -m ci timing-data"
    builds = data_files.read_results(data_files.DEVICE_RESULTS)["timed_builds"]["builds"]
    assert [(o["component"], o["measured_s"]) for o in data["observed"]] == [(b["component"], b["seconds"])
                                                                             for b in builds]
    calibrating = {b["component"]: b for b in builds if "model" in b}
    assert set(data["calibrations"]) == set(calibrating)
    for component, calibration in data["calibrations"].items():
        assert calibration["wall_s"] == calibrating[component]["seconds"]
        assert calibration["source"] == calibrating[component]["model"]["source"]


@pytest.mark.parametrize("command,data_file", [("timing-data", timing_data.TIMINGS_FILE),
                                               ("size-model", size_model.SIZES_FILE)])
def test_check_refuses_a_file_that_is_not_what_its_command_writes_in_one_line(command: str, data_file: Path,
                                                                              tmp_path: Path) -> None:
    stale = tmp_path / data_file.name
    stale.write_text(data_file.read_text().replace('"source"', '"Source"', 1))
    refused = ci(command, "--check", "--out", str(stale))
    assert (refused.returncode, refused.stdout) == (1, ""), refused.stderr
    writes = "python -m ci timing-data" if command == "timing-data" else "python -m ci size-model --write"
    assert refused.stderr == (f"error: {stale} differs from what `{writes}` writes from benchmarks/device_results.json; "
                              f"run it and commit {stale}\n")
    missing = ci(command, "--check", "--out", str(tmp_path / "none.json"))
    assert missing.returncode == 1 and f"none.json is missing: `{writes}` writes it from" in missing.stderr
    assert not (tmp_path / "none.json").exists()
    # and without --check it writes exactly the committed file
    assert ci(command, *(["--write"] if command == "size-model" else []), "--out", str(stale)).returncode == 0
    assert stale.read_text() == data_file.read_text()


def _broken(change) -> dict:
    results = json.loads(data_files.DEVICE_RESULTS.read_text())
    change(results["timed_builds"]["builds"])
    return results


@pytest.mark.parametrize("change,problem", [
    (lambda b: b[0]["conditions"].update(cores="16"),
     "$.timed_builds.builds[0].conditions.cores is a string, not an integer; fix the entry (see "
     "ci/timing/schemas/timed_builds.schema.json)"),
    (lambda b: b[3].update(secs=1), "$.timed_builds.builds[3].secs is an unknown field (a newer format?); fix the entry"),
    (lambda b: b[1].pop("seconds"), "$.timed_builds.builds[1].seconds is missing; fix the entry"),
    (lambda b: b[1].update(seconds=0), "$.timed_builds.builds[1].seconds is 0, out of range (exclusiveMinimum 0)"),
    (lambda b: b[0]["model"].pop("units"), "$.timed_builds.builds[0].model.units is missing"),
    (lambda b: b[2].update(model=b[0]["model"], calibration=True),
     "$.timed_builds.builds[2].model: a second calibration of fast-hadamard-transform; keep the 'model' of one of its "
     "builds"),
    (lambda b: b[0].pop("model"),
     "$.timed_builds.builds[0]: fast-hadamard-transform has timed builds but no calibration; give its one-arch build "
     "on the GPU machine a 'model'"),
    (lambda b: b[0].pop("calibration"), "$.timed_builds.builds[0].calibration is missing"),
])
def test_a_bad_timed_build_is_one_line_naming_its_json_path(change, problem: str, tmp_path: Path) -> None:
    results = tmp_path / "device_results.json"
    results.write_text(json.dumps(_broken(change)))
    out = tmp_path / "timings.json"
    refused = ci("timing-data", "--results", str(results), "--out", str(out))
    assert (refused.returncode, refused.stdout) == (2, ""), refused.stderr
    assert refused.stderr.startswith(f"error: {results}: {problem}") and refused.stderr.count("\n") == 1
    assert not out.exists()


def test_the_product_reads_no_file_of_benchmarks_but_through_the_generators() -> None:
    """A path into benchmarks/ is built in ci/ in one place: the measured record the generators read."""
    places = []
    for path in sorted((REPO / "ci").rglob("*.py")):
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and node.body and isinstance(node.body[0], ast.Expr)}
        places += [f"{path.relative_to(REPO)}:{node.lineno}" for node in ast.walk(tree)
                   if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings
                   and (node.value == "benchmarks" or node.value.startswith("benchmarks/"))]
    assert places == ["ci/timing/data_files.py:31"]
    assert data_files.DEVICE_RESULTS == REPO / "benchmarks" / "device_results.json"
