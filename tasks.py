"""invoke tasks: thin wrappers that parse options, call ci/, and print.

    invoke --list                      every task
    invoke matrix --component apex --arch aarch64 --python 3.12 --json

Every task honours WHEELHOUSE_VERSIONS and WHEELHOUSE_STORE (see
ci/environment.py). A WheelhouseError ends the task with its one-line message
and its exit status (2 for a malformed versions file); no traceback.
"""

from __future__ import annotations

import functools
import json
import os
import sys
from pathlib import Path

from invoke import Exit, task

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ci import matrix as matrix_module  # noqa: E402
from ci.environment import Environment  # noqa: E402
from ci.errors import WheelhouseError  # noqa: E402
from ci.versions import load  # noqa: E402


def _env() -> Environment:
    return Environment.from_mapping(os.environ)


def reports_errors(fn):
    """Turn a WheelhouseError into one line on stderr and its exit status."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except WheelhouseError as error:
            raise Exit(f"error: {error}", code=error.exit_code) from None

    return wrapper


@task(
    help={
        "component": "one component (default: all)",
        "arch": "x86_64 or aarch64 (default: all)",
        "python": "X.Y (default: all)",
        "torch": "torch version (default: all)",
        "json": "print the rows as a JSON list (the GitHub Actions matrix)",
        "github_output": "append matrix=<json> and has_builds=<bool> to $GITHUB_OUTPUT",
    }
)
@reports_errors
def matrix(c, component=None, arch=None, python=None, torch=None, json_=False, github_output=False):
    """Print the build rows of versions.yaml."""
    versions = load(_env().versions_path)
    rows = matrix_module.select(
        matrix_module.expand(versions), versions=versions, component=component, arch=arch, python=python, torch=torch
    )
    entries = [row.to_json() for row in rows]
    if github_output:
        target = os.environ.get("GITHUB_OUTPUT")
        if not target:
            raise Exit("error: --github-output needs $GITHUB_OUTPUT (it is set inside GitHub Actions)", code=2)
        with open(target, "a", encoding="utf-8") as handle:
            handle.write(f"matrix={json.dumps(entries, separators=(',', ':'))}\n")
            handle.write(f"has_builds={'true' if entries else 'false'}\n")
    if json_:
        print(json.dumps(entries, indent=2))
    elif not github_output:
        for row in rows:
            print(f"{row.session:40} {row.arch:8} cu{row.cuda:8} py{'+'.join(row.pythons):10} torch{row.torch:8} {row.release_tag}")
        print(f"{len(rows)} row(s)")
