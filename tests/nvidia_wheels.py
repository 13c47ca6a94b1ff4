"""Real nvidia-* wheels (and others) from the package index pip is configured with, cached under .cache/.

Only the network tests call it: the first run downloads, later runs read the cache.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from made_once import one_maker
from packaging.utils import canonicalize_name, parse_wheel_filename

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "nvidia-wheels"


def cached_wheel(project: str, version: str) -> Path:
    """The wheel of ``project==version`` for this machine, downloaded once (without its dependencies)."""
    CACHE.mkdir(parents=True, exist_ok=True)
    with one_maker(CACHE):
        return _download(project, version)


def _download(project: str, version: str) -> Path:
    found = _find(project, version)
    if found is None:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary", ":all:",
                        "--dest", str(CACHE), f"{project}=={version}"], check=True)
        found = _find(project, version)
    assert found is not None, f"pip downloaded no wheel of {project}=={version}"
    return found


def _find(project: str, version: str) -> Path | None:
    for wheel in sorted(CACHE.glob("*.whl")):
        name, found_version, _, _ = parse_wheel_filename(wheel.name)
        if name == canonicalize_name(project) and str(found_version) == version:
            return wheel
    return None
