"""ci/naming.py helpers that other modules sort and compare with."""

from __future__ import annotations

from ci.naming import version_key


def test_versions_sort_by_number_not_text():
    assert sorted(["3.10", "3.9", "3.13", "3.11"], key=version_key) == ["3.9", "3.10", "3.11", "3.13"]
    assert sorted(["2.13.0", "2.9.1", "2.10.0+cu130"], key=version_key) == ["2.9.1", "2.10.0+cu130", "2.13.0"]


def test_a_text_that_is_no_version_sorts_first_and_never_raises():
    # titles are written by hand now and then: sorting their versions must not fail
    assert sorted(["3.12", "3.x", "3.11"], key=version_key) == ["3.x", "3.11", "3.12"]
    assert version_key("3.10") == version_key("3.10.0")
