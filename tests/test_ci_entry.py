"""CI's entry point (.ci/run) runs the README's test command, and that command lints as well as tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETUP = "python3 -m venv .venv && .venv/bin/pip install -r requirements.txt && "


def _readme_test_command() -> str:
    """The command under the README's "# 2." comment of "Two commands on a fresh machine"."""
    lines = (REPO / "README.md").read_text(encoding="utf-8").splitlines()
    comment = next(i for i, line in enumerate(lines) if line.startswith("# 2. "))
    return lines[comment + 1]


def test_ci_runs_exactly_the_readme_test_command():
    run = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    commands = [line for line in run if line.startswith(SETUP)]
    assert commands == [_readme_test_command()]


def test_the_test_command_runs_lint_and_tests_and_both_are_sessions():
    command = _readme_test_command()
    assert command.startswith(SETUP)
    nox, flag, *sessions = command.removeprefix(SETUP).split()
    assert (nox, flag, sessions) == (".venv/bin/nox", "-s", ["lint", "tests"])
    # nox refuses (exit 3) a session it does not define; --json lists the ones the command selects
    listed = subprocess.run([sys.executable, "-m", "nox", "-s", *sessions, "--list", "--json"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert sorted(entry["session"] for entry in json.loads(listed.stdout)) == ["lint", "tests"]
