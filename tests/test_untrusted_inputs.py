"""Values from the command line or another commit that git would read as options stay arguments."""

from __future__ import annotations

import pytest

from ci.errors import WheelhouseError
from ci.maintenance import restore
from ci.pages import GitBranchTarget


def test_versions_ref_is_never_an_option_of_git_show(tmp_path):
    marker = tmp_path / "written"
    with pytest.raises(WheelhouseError, match="--versions-ref"):
        restore.versions_text_at(f"--output={marker}")
    assert not marker.exists()


def test_push_remote_is_never_an_option_of_git(tmp_path):
    marker = tmp_path / "PWNED"
    target = GitBranchTarget(f"--upload-pack=touch {marker};true", "gh-pages")
    with target, pytest.raises(WheelhouseError):
        target.worktree()
    assert not marker.exists()
