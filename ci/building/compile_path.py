"""What a project's own build does to its compiles that the compiler cache and MAX_JOBS cannot undo.

torch's ``BuildExtension.with_options(use_ninja=False)`` compiles through setuptools one unit at a time, in
whatever order, whatever MAX_JOBS says (causal-conv1d's three kernels ran one after the other on the GPU
machine); the units still go through the compiler cache (``PYTORCH_NVCC`` names it). CMake projects get the
cache as their compiler launcher and ninja as their generator from the build's environment
(ci/building/job.py ``_compiler_cache``), unless they choose others themselves.

The plan says so for sources it can read without fetching (a repository directory), the build for every
source once it has it.

A torch extension's host C++ units (its ``.cpp`` files) reach the cache only through torch itself: torch
2.13's extension builder puts a compiler cache it finds on PATH in front of ``c++``, ccache before sccache;
torch 2.11's runs ``c++`` as it is. The build says so once it has the row's torch
(:func:`host_compile_warnings`).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Mapping
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


_TORCH_WRAPS_COMPILER = "_wrap_compiler"  # torch.utils.cpp_extension's name for it (torch 2.13)
NO_WRAPPER_SETTING = "TORCH_NO_COMPILER_WRAPPER"


def host_compile_warnings(torch_dir: Path, cache_tool: str | None, environ: Mapping[str, str]) -> list[str]:
    """One line when the host C++ units of the row's torch extensions compile outside the build's compiler cache
    (``cache_tool``), and so outside its counts, with why; none when they go through it."""
    if cache_tool is None or Path(cache_tool).name != "sccache":
        return []
    outside = ("the host C++ units of torch extensions (.cpp) compile outside the build's sccache and its counts; "
               "nvcc's units go through it (PYTORCH_NVCC)")
    try:
        builder = (torch_dir / "utils" / "cpp_extension.py").read_text(errors="replace")
    except OSError:
        return []
    if _TORCH_WRAPS_COMPILER not in builder:
        return [f"this torch's extension builder runs c++ with no compiler cache in front: {outside}; torch 2.13 "
                "puts the cache found on PATH there"]
    if environ.get(NO_WRAPPER_SETTING):
        return [f"{NO_WRAPPER_SETTING} is set, so torch puts no compiler cache in front of c++: {outside}; unset it"]
    ccache = shutil.which("ccache", path=environ.get("PATH", ""))
    if ccache:
        return [f"torch puts ccache before sccache in front of c++ and finds one on the build's PATH ({ccache}): "
                f"{outside}; take ccache's directory off PATH"]
    return []
