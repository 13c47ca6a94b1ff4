"""Row venvs with the package index's CUDA torch, for builds that compile CUDA on a machine without a GPU.

``ci.building.toolchain.prepare_venv`` would take pip's configured torch (a CPU wheel on our development machines),
so these venvs are made once with uv from the index (torch with its nvidia-* libraries, about 3 GB, linked
from uv's cache) under ``.cache/bench/cuda-torch/<venv key>`` and linked where a build expects the row's
pinned venv. Figures 10 and 12 and the slow compiler-cache test build through them.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Callable, Iterable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
VENVS = REPO / ".cache" / "bench" / "cuda-torch"


def _uv() -> str:
    from ci.building import toolchain

    uv = toolchain.find_uv()
    if uv is None:
        raise RuntimeError("uv not found (requirements-tools.txt installs it)")
    return uv


def prepared_venv(row, log: Callable[[str], None] = print) -> Path:
    """The venv of ``row`` (its Python, its torch from the package index), made once."""
    from ci.building import toolchain

    venv = VENVS / toolchain.venv_key(row, None)
    if not (venv / ".wheelhouse-ready").is_file():
        env = {**os.environ, "UV_CACHE_DIR": os.environ.get("UV_CACHE_DIR", str(REPO / ".cache" / "uv"))}
        subprocess.run(["rm", "-rf", str(venv)], check=True)
        log(f"  making the Python {row.python} venv with the index's torch {row.torch} (several GB, once)")
        subprocess.run([_uv(), "venv", "-q", "--python", str(toolchain.find_python(row.python)), str(venv)],
                       check=True, env=env)
        subprocess.run([_uv(), "pip", "install", "-q", "--python", str(venv / "bin" / "python"), f"torch=={row.torch}",
                        "pip", *toolchain.BUILD_TOOLS], check=True, env=env)
        toolchain.normalise_header_mtimes(venv)  # as ci.building.toolchain.prepare_venv does
        (venv / ".wheelhouse-ready").write_text(json.dumps({"python": row.python, "torch": row.torch}) + "\n")
    return venv


def link_venv(row, cache: Path, log: Callable[[str], None] = print) -> None:
    """Put the prepared venv of ``row`` where a build into ``cache`` looks for its pinned venv."""
    from ci.building import toolchain

    link = cache / "venvs" / toolchain.venv_key(row, None)
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.exists():
        link.symlink_to(prepared_venv(row, log), target_is_directory=True)


def toolkit_extra_include() -> str:
    """The math libraries' headers (cusparse.h...) a full CUDA toolkit has and this one lacks, from torch's
    nvidia-* wheels, at one path for every build (as a toolkit's would be): a per-venv CPATH would differ
    between the Pythons, and sccache hashes CPATH as it is."""
    linked = VENVS / "toolkit-extra-include"
    linked.mkdir(parents=True, exist_ok=True)
    site = next(VENVS.glob("py*/lib/python*/site-packages"))
    for include in sorted(site.glob("nvidia/*/include")):
        link = linked / include.parent.name
        if not link.exists():
            link.symlink_to(include, target_is_directory=True)
    return ":".join(str(p) for p in sorted(linked.iterdir()))


def build_environ(rows: Iterable, cache: Path, log: Callable[[str], None] = print) -> dict[str, str]:
    """The environment for ``ci.building.job.run`` of ``rows`` into ``cache``: their venvs linked in, the toolkit,
    and no sccache settings of the caller's."""
    for row in rows:
        link_venv(row, cache, log)
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_")}
    environ["CUDA_HOME"] = environ.get("CUDA_HOME", "/usr/local/cuda")
    environ["CPATH"] = toolkit_extra_include()
    return environ
