"""What a project's own build does to its compiles that the compiler cache and MAX_JOBS cannot undo.

torch's ``BuildExtension.with_options(use_ninja=False)`` compiles through setuptools one unit at a time, in
whatever order, whatever MAX_JOBS says (causal-conv1d's three kernels ran one after the other on the GPU
machine); the units still go through the compiler cache (``PYTORCH_NVCC`` names it). CMake projects get the
cache as their compiler launcher and ninja as their generator from the build's environment
(ci/building/job.py ``_compiler_cache``), unless they choose others themselves.

The plan says so for sources it can read without fetching (a repository directory), the build for every
source once it has it.
"""

from __future__ import annotations

import re
from pathlib import Path

_NO_NINJA = re.compile(r"\buse_ninja\s*=\s*False\b")
_MAX_SETUP_BYTES = 1 << 20


def warnings(sources: Path) -> list[str]:
    """One line per thing in ``sources`` that makes its compiles serial, with what would change it."""
    setup = sources / "setup.py"
    try:
        with setup.open("rb") as handle:
            text = handle.read(_MAX_SETUP_BYTES).decode(errors="replace")
    except OSError:
        return []
    if not _NO_NINJA.search(text):
        return []
    return [f"{setup.name} builds its torch extensions without ninja (use_ninja=False): they compile one unit "
            "at a time, whatever MAX_JOBS says; a patch that drops use_ninja=False (versions.yaml patches) lets "
            "ninja compile them in parallel"]
