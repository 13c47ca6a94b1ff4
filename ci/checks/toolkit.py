"""The CUDA toolkit a check or a build uses: its nvcc, where the toolkit lies, its release."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path


def find_nvcc(env: dict[str, str] | None = None) -> Path | None:
    """nvcc of CUDA_HOME (or CUDA_PATH) when set, else from PATH, else /usr/local/cuda."""
    env = env if env is not None else dict(os.environ)
    home = env.get("CUDA_HOME") or env.get("CUDA_PATH")
    if home:
        nvcc = Path(home) / "bin" / "nvcc"
        return nvcc if nvcc.is_file() else None
    found = shutil.which("nvcc", path=env.get("PATH"))
    if found:
        return Path(found)
    default = Path("/usr/local/cuda/bin/nvcc")
    return default if default.is_file() else None



def cuda_home(nvcc: Path) -> Path:
    """The toolkit ``nvcc`` belongs to.

    Usually nvcc's grandparent; but an nvcc on PATH may be a wrapper script
    (``/usr/local/bin/nvcc`` exec'ing the real one), whose grandparent has no
    CUDA headers. nvcc itself names its toolkit (``TOP``) in a dry run.
    """
    guess = nvcc.parent.parent
    if (guess / "include" / "cuda_runtime.h").is_file() or (guess / "targets").is_dir():
        return guess
    result = subprocess.run([str(nvcc), "--dryrun", "-x", "cu", "-c", os.devnull, "-o", os.devnull],
                            capture_output=True, text=True)
    match = re.search(r"^#\$ TOP=(.+?)\s*$", result.stdout + result.stderr, re.MULTILINE)
    return Path(os.path.normpath(match.group(1))) if match else guess


def nvcc_version(nvcc: Path) -> str | None:
    """The CUDA release ``nvcc`` is (``13.0``), from its ``--version``."""
    result = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True)
    match = re.search(r"release (\d+\.\d+)", result.stdout)
    return match.group(1) if match else None
