"""ci/model/naming.py helpers that other modules sort and compare with, and the rules names must follow."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from ci.model.naming import MAX_TAG_LENGTH, ref_format_problem, tag_problem, version_key

REPO = Path(__file__).resolve().parent.parent


def test_versions_sort_by_number_not_text():
    assert sorted(["3.10", "3.9", "3.13", "3.11"], key=version_key) == ["3.9", "3.10", "3.11", "3.13"]
    assert sorted(["2.13.0", "2.9.1", "2.10.0+cu130"], key=version_key) == ["2.9.1", "2.10.0+cu130", "2.13.0"]


def test_a_text_that_is_no_version_sorts_first_and_never_raises():
    # titles are written by hand now and then: sorting their versions must not fail
    assert sorted(["3.12", "3.x", "3.11"], key=version_key) == ["3.x", "3.11", "3.12"]
    assert version_key("3.10") == version_key("3.10.0")


# --- git's ref-name rules ---------------------------------------------------------------------------

# Each rule of `git help check-ref-format` broken once (and near misses that keep it), then names
# that must pass. A leading '-' is left out: check-ref-format reads it as an option of its own.
REF_NAMES = [
    "v1", "main", "release/v1.2", "a/b/c", "v1.2.3+cu130", "x_y", "@a", "a@b", "a{b}", "a}b", "é", "v1.lockx",
    "lock", "a.lock.b", "a.b", "0.1.0", "feature/x.y", "a/b.", "a!b", "a#b", "a$b%c&d'e(f)g,h;i<j=k>l\"m|n`o",
    # rule 1: a part begins with '.' or ends with '.lock'
    ".a", "a/.b", "a/.", "v1.lock", "a.lock/b", "a/b.lock", ".lock",
    # rule 3: '..'
    "a..b", "..", "a/../b", "a/..",
    # rule 4: control characters, DEL, space, '~', '^', ':'
    "a\x01b", "a\tb", "a\x1fb", "a\x7fb", "a b", "HEAD~1", "a^b", "v1^{}", "a:b",
    # rule 5: '?', '*', '['
    "a?b", "a*b", "a[b", "refs/*",
    # rule 6: '/' at either end, '//'
    "/a", "a/", "a//b", "/",
    # rule 7: '.' at the end
    "a.", "a/b.c.",
    # rule 8: '@{'
    "a@{b", "v@{1", "@{",
    # rule 9: '@' alone
    "@",
    # rule 10: '\'
    "a\\b",
    # empty
    "",
]


@pytest.mark.parametrize("name", REF_NAMES, ids=[repr(name) for name in REF_NAMES])
def test_ref_rule_agrees_with_git_check_ref_format(name):
    git = subprocess.run(["git", "check-ref-format", "--allow-onelevel", name], capture_output=True)
    assert git.returncode in (0, 1), git.stderr
    assert (ref_format_problem(name) is None) == (git.returncode == 0), ref_format_problem(name)


def test_the_table_breaks_every_rule_and_keeps_names_that_pass():
    accepted = [name for name in REF_NAMES if ref_format_problem(name) is None]
    refused = {ref_format_problem(name) for name in REF_NAMES} - {None}
    assert len(accepted) >= 20
    assert {problem.split(" (")[0].split("'")[0] for problem in refused} >= {
        "has a part that begins with ", "has a part that ends in ", "contains ", "begins or ends with ",
        "ends with ", "is ", "is empty"}


def _schema_ref() -> re.Pattern:
    schema = json.loads((REPO / "versions.schema.json").read_text())
    return re.compile(schema["$defs"]["component"]["properties"]["ref"]["pattern"])


# The characters a ref may use (the schema's pattern before the git rules were added).
_REF_CHARACTERS = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._/+-]*[A-Za-z0-9_+])?$")


@pytest.mark.parametrize("name", [*REF_NAMES, "v1.2.lock.x", "a/b/c.lock", "a.b/c..d", "x/.y/z", "a/b//c", "a+b/c_"])
def test_schema_ref_pattern_is_git_rule_within_the_ref_characters(name):
    """Editors check refs with the schema: within the characters a ref may use, it accepts exactly what git does."""
    expected = bool(_REF_CHARACTERS.match(name)) and ref_format_problem(name) is None
    assert bool(_schema_ref().match(name)) == expected


def test_a_tag_longer_than_the_file_names_made_from_it_is_refused():
    assert tag_problem("t" * MAX_TAG_LENGTH) is None
    assert tag_problem("t" * (MAX_TAG_LENGTH + 1)) == f"is {MAX_TAG_LENGTH + 1} characters long, more than 200"
    assert tag_problem("demo-a..b-py3.11-torch2.13.0") == "contains '..'"
    # the longest tag still leaves room for the build record's name and git's lock file
    assert len(f"{'t' * MAX_TAG_LENGTH}-aarch64.build.json") <= 255
    assert len(f"{'t' * MAX_TAG_LENGTH}.lock") <= 255
