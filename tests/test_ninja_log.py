"""ci/formats/ninja_log.py: the slowest steps of a build, read from real ninja logs."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from ci.formats import ninja_log


def _ninja_build(directory: Path, steps: dict[str, str]) -> None:
    """Run real ninja in ``directory`` on one rule per output: ``steps`` maps an output to its shell command."""
    directory.mkdir(parents=True, exist_ok=True)
    lines = ["rule run", "  command = $cmd && touch $out", ""]
    for output, command in steps.items():
        lines += [f"build {output}: run", f"  cmd = {command}"]
    (directory / "build.ninja").write_text("\n".join(lines) + "\n")
    subprocess.run(["ninja", "-C", str(directory), "-j", "1"], check=True, capture_output=True)


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
def test_the_slowest_steps_of_every_log_under_the_build_longest_first(tmp_path):
    _ninja_build(tmp_path / "build/cmake", {"slow.o": "sleep 0.6", "quick.o": "true"})
    _ninja_build(tmp_path / "build/temp.linux", {"middle.o": "sleep 0.3"})
    found = ninja_log.slowest_steps(tmp_path, limit=2)
    assert found["steps"] == 3
    assert [(s["log"], s["output"]) for s in found["slowest"]] == [("build/cmake", "slow.o"), ("build/temp.linux", "middle.o")]
    assert found["slowest"][0]["seconds"] >= 0.6 and found["slowest"][1]["seconds"] >= 0.3


@pytest.mark.skipif(shutil.which("ninja") is None, reason="needs ninja")
def test_a_step_run_again_counts_once_with_its_last_time(tmp_path):
    build = tmp_path / "build"
    _ninja_build(build, {"a.o": "sleep 0.4", "b.o": "true"})
    (build / "a.o").unlink()  # a resumed build runs a.o again, faster this time
    _ninja_build(build, {"a.o": "true", "b.o": "true"})
    assert len((build / ".ninja_log").read_text().splitlines()) == 4  # header, a.o, b.o, a.o again
    seconds = ninja_log.step_seconds(build / ".ninja_log")
    assert set(seconds) == {"a.o", "b.o"} and seconds["a.o"] < 0.4


def test_lines_that_are_not_steps_are_skipped(tmp_path):
    log = tmp_path / ".ninja_log"
    log.write_text("# ninja log v5\n0\t2500\t0\tkernel.o\tabc\ntruncated line\nx\ty\t0\tbad.o\th\n")
    assert ninja_log.step_seconds(log) == {"kernel.o": 2.5}
    assert ninja_log.slowest_steps(tmp_path / "nothing-here") == {"steps": 0, "slowest": []}
