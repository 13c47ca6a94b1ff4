"""The invoke tasks' command line: help for every task, no per-task short flags, usage errors exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from invoke import Task

import tasks

REPO = Path(__file__).resolve().parent.parent
TASKS = {name: obj for name, obj in vars(tasks).items() if isinstance(obj, Task)}


def test_no_task_has_an_automatic_short_flag():
    """invoke derived -r, -a, -s... from option names, so one letter meant different things per task."""
    shorts = {name: [n for arg in t.get_arguments() for n in arg.names if len(n) == 1] for name, t in TASKS.items()}
    assert {name: found for name, found in shorts.items() if found} == {}


def _listed_tasks() -> list[str]:
    """The task names `invoke --list` shows: what a user sees, not what this module imports."""
    listing = subprocess.run([sys.executable, "-m", "invoke", "--list", "--list-format=json"], cwd=REPO,
                             capture_output=True, text=True, timeout=60, check=True)
    return [entry["name"] for entry in json.loads(listing.stdout)["tasks"]]


LISTED = _listed_tasks()


def test_invoke_lists_every_task_of_tasks_py():
    """The -h test below covers what `invoke --list` shows; that is every task tasks.py defines."""
    assert sorted(LISTED) == sorted(name.replace("_", "-") for name in TASKS)


@pytest.mark.parametrize("task_name", LISTED)
def test_every_task_answers_dash_h(task_name):
    """`invoke <task> -h` shows the task's help (no task takes -h as an argument's value) and exits 0."""
    result = subprocess.run([sys.executable, "-m", "invoke", task_name, "-h"], cwd=REPO, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"Usage: inv[oke] [--core-opts] {task_name} [--options]"), result.stdout
    assert "Options:" in result.stdout and result.stderr == ""


def test_invokes_own_dry_flag_is_the_tasks_dry_run(tmp_path):
    """`invoke --dry publish-index` changes nothing, as `invoke publish-index --dry-run` does."""
    store = tmp_path / "store"
    (store / "releases").mkdir(parents=True)
    site = tmp_path / "site"
    result = subprocess.run([sys.executable, "-m", "invoke", "--dry", "publish-index", "--store", str(store),
                             "--out", str(site)], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "(dry run)" in result.stdout
    assert not site.exists()


USAGE_ERRORS = {
    "unknown-flag": (["prune", "--bogus"], "No idea what '--bogus' is!"),
    "unknown-task": (["nosuchtask"], "No idea what 'nosuchtask' is!"),
    "flag-without-value": (["publish-index", "--push-branch"],
                           "Flag <Argument: push_branch> needed value and was not given one!"),
    "help-for-unknown-task": (["--help", "nosuchtask"], "No idea what 'nosuchtask' is!"),
}


@pytest.mark.parametrize("entry", [[sys.executable, "-m", "invoke"], [str(Path(sys.executable).parent / "invoke")]],
                         ids=["python -m invoke", "invoke"])
@pytest.mark.parametrize("case", sorted(USAGE_ERRORS))
def test_invokes_own_parse_errors_are_invokes_one_line_and_change_nothing(case, entry):
    """What invoke's parser refuses (before any task runs) is invoke's: its one line, exit status 1; invoke
    gives its own binary no hook to map them, and the project does not patch invoke. The tasks' own usage
    errors are ours (exit 2, the tests of each task)."""
    args, expected = USAGE_ERRORS[case]
    result = subprocess.run([*entry, *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stderr, result.stdout) == (1, expected + "\n", "")


def test_tasks_py_leaves_invoke_unpatched():
    import invoke.program

    import tasks  # noqa: F401  (loading the tasks file is what used to patch invoke)

    for step in ("parse_tasks", "parse_cleanup"):
        assert not hasattr(getattr(invoke.program.Program, step), "__wrapped__")
