"""The row's torch wheel, downloaded and not installed, for checking a row's wheels against it elsewhere.

The publish job re-checks the build's wheels on a fresh runner without the row's torch installed:
``python -m ci torch-wheel --component C --python P --torch T --arch A --dest DIR`` downloads
``torch==T`` for that Python and arch from the row's torch index (``WHEELHOUSE_TORCH_INDEX`` first, as
the build takes it) with ``pip download --no-deps`` and prints the wheel's path, which
``invoke check-wheel --torch`` reads in place (its ``torch/lib`` libraries straight from the zip).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from ci.base import log
from ci.base.errors import UsageError, WheelhouseError
from ci.building import toolchain
from ci.model import matrix
from ci.model.matrix import MatrixRow
from ci.model.versions import load

# torch's Linux wheels are tagged manylinux_2_28 (2.6 and later) or manylinux2014 (earlier); pip does not
# widen a manylinux_2_X platform to older glibcs itself, so each is named.
_GLIBC_MINORS = range(39, 16, -1)


def download_command(row: MatrixRow, dest: Path, index: str | None) -> list[str]:
    """``pip download`` of exactly the row's torch wheel, for the row's Python and arch, whatever this machine is."""
    platforms = [f"manylinux_2_{minor}_{row.arch}" for minor in _GLIBC_MINORS] + [f"manylinux2014_{row.arch}"]
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--no-deps",
           "--only-binary=:all:", "--implementation", "cp", "--python-version", row.python,
           *(option for platform in platforms for option in ("--platform", platform)),
           "--dest", str(dest), f"torch=={row.torch}"]
    return cmd + (["--index-url", index] if index else [])


def download_torch_wheel(row: MatrixRow, dest: Path, index: str | None) -> Path:
    """Download the row's torch wheel into ``dest`` (which must hold no other torch wheel); its path."""
    dest.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(download_command(row, dest, index), capture_output=True, text=True)
    found = sorted(dest.glob("torch-*.whl"))
    if result.returncode != 0 or len(found) != 1:
        reason = next((line.strip() for line in reversed(result.stderr.splitlines()) if line.strip()),
                      f"{len(found)} torch wheels in {dest}")
        raise WheelhouseError(f"{row.label}: could not download torch=={row.torch} for Python {row.python} "
                              f"({row.arch}) from {index or 'the configured index'}: {reason}; check the row's "
                              "torch_index in versions.yaml")
    return found[0]


def add_command(commands: Any) -> None:
    """``python -m ci torch-wheel --component C --python P --torch T --arch A --dest DIR``: the publish job's."""
    parser = commands.add_parser("torch-wheel", help="download a row's torch wheel (not installed); prints its path",
                                 description=__doc__.splitlines()[0])
    for option in ("component", "python", "torch", "arch"):
        parser.add_argument(f"--{option}", required=True)
    parser.add_argument("--cuda", help="the row's CUDA version or cpu (when the matrix has several)")
    parser.add_argument("--dest", required=True, type=Path, help="an empty directory for the wheel")
    parser.set_defaults(run=_download_command)


def _download_command(args: Any) -> None:
    versions = load(os.environ.get("WHEELHOUSE_VERSIONS") or None)
    rows = matrix.select(matrix.expand(versions), versions=versions, component=args.component,
                         python=args.python, torch=args.torch, arch=args.arch, cuda=args.cuda)
    if len(rows) != 1:
        raise UsageError(f"{len(rows)} rows match component={args.component} python={args.python} "
                         f"torch={args.torch} arch={args.arch}; name a row of versions.yaml")
    index = toolchain.torch_index(rows[0], os.environ.get("WHEELHOUSE_TORCH_INDEX"))
    log.out(str(download_torch_wheel(rows[0], args.dest, index)))
