"""Local bare snapshots of upstream repositories, for the tests that read a real tree at versions.yaml's pin.

``WHEELHOUSE_SNAPSHOTS`` names a directory laid out as ``invoke device-bundle --snapshots`` reads it
(tests/gpu/make_source_bundles.py): ``<owner>/<name>.git`` or ``<owner>+<name>/repo``. CI has none, so
these tests skip there and their stand-ins cover the same code.
"""

from __future__ import annotations

import os
from pathlib import Path


def find(repo: str) -> Path | None:
    """The bare snapshot of ``repo`` (``owner/name``), or None where none is given."""
    root = os.environ.get("WHEELHOUSE_SNAPSHOTS")
    if not root:
        return None
    laid_out = (Path(root) / f"{repo}.git", Path(root) / repo.replace("/", "+") / "repo")
    return next((path for path in laid_out if path.is_dir()), None)


def skip_reason(repo: str) -> str:
    return (f"no {repo} snapshot: set WHEELHOUSE_SNAPSHOTS to a directory holding {repo}.git or "
            f"{repo.replace('/', '+')}/repo")
