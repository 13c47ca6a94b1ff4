"""Local bare snapshots of upstream repositories, for the tests that read a real tree at versions.yaml's pin.

``WHEELHOUSE_SNAPSHOTS`` names a directory laid out as ``invoke device-bundle --snapshots`` reads it
(tests/gpu/make_source_bundles.py): ``<owner>/<name>.git`` or ``<owner>+<name>/repo``. CI has none, so
these tests skip there and their stand-ins cover the same code.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from make_source_bundles import find_snapshot


def find(repo: str) -> Path | None:
    """The bare snapshot of ``repo`` (``owner/name``), or None where none is given."""
    root = os.environ.get("WHEELHOUSE_SNAPSHOTS")
    if not root:
        return None
    return find_snapshot(Path(root), repo)


def skip_reason(repo: str) -> str:
    return (f"no {repo} snapshot: set WHEELHOUSE_SNAPSHOTS to a directory holding {repo}.git or "
            f"{repo.replace('/', '+')}/repo")
