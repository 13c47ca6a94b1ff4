"""The data files the plans read, and the one measured record they are written from.

The plans read files under ci/timing/ only, never benchmarks/: each is written by a command, and a test proves
each committed one is what its command writes.

- ``timings.json``: the build-time model's calibrations and every timed build (``python -m ci timing-data``,
  ci/timing/timing_data.py), from :data:`DEVICE_RESULTS`' ``timed_builds``;
- ``wheel_sizes.json``: the wheel-size model's fits (``python -m ci size-model --write``, ci/timing/size_model.py),
  from every wheel :data:`DEVICE_RESULTS` records;
- ``module_times/<component>-<arch>.json``: per-module compile seconds for a row's module list (``python -m ci
  shard-model --write``, ci/timing/shard_model.py), from a build record and a module list;
- ``build_times.json``: builds timed outside the GPU machine (``invoke time-model --record``,
  ci/timing/timed_builds.py), from their build records.

Both generators from :data:`DEVICE_RESULTS` write the same way (:func:`write_or_check`): ``--check`` writes nothing
and exits 1, in one line naming the command, when the committed file is not what it would write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ci.base import bounded_json
from ci.base.errors import UsageError, WheelhouseError
from ci.model.versions import REPO_ROOT

DATA_DIR = Path(__file__).resolve().parent
DEVICE_RESULTS = REPO_ROOT / "benchmarks" / "device_results.json"
"""The measured record: what the GPU machine (and this machine's benchmarks) measured, written from their output."""


def shown(path: Path) -> str:
    """``path`` relative to the checkout where it lies in it (messages and generated files name it so)."""
    try:
        return str(path.resolve().relative_to(REPO_ROOT))
    except ValueError:
        return str(path)


def read_results(path: Path) -> dict[str, Any]:
    """The measured record at ``path``; one UsageError line for a file that cannot be read as a JSON object."""
    try:
        results = bounded_json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise UsageError(f"{path}: {error}; name the device results file (--results)") from None
    if not isinstance(results, dict):
        raise UsageError(f"{path}: holds no JSON object; name the device results file (--results)")
    return results


def render(document: Mapping[str, Any]) -> str:
    """A data file's text: one key a line, keys sorted, so a regenerated file diffs only where the data moved."""
    return json.dumps(document, indent=1, sort_keys=True) + "\n"


def add_generator_options(parser: Any, out: Path, *, check_into: Any = None) -> None:
    """A generator command's ``--check`` (into ``check_into``: a group that excludes ``--write``), ``--results`` and
    ``--out`` (default ``out``)."""
    (check_into or parser).add_argument("--check", action="store_true",
                                        help=f"write nothing; exit 1 when {shown(out)} is not what would be written")
    parser.add_argument("--results", type=Path, default=DEVICE_RESULTS, help="the measured record to read")
    parser.add_argument("--out", type=Path, default=out, help="the data file to write or check")


def write_or_check(document: Mapping[str, Any], out: Path, *, check: bool, command: str) -> None:
    """Write ``document`` to ``out`` (whole or not at all); with ``check``, write nothing and raise (exit status 1)
    when ``out`` does not hold exactly that."""
    text = render(document)
    if check:
        current = out.read_text(encoding="utf-8") if out.is_file() else None
        if current != text:
            state = "is missing: `{}` writes it" if current is None else "differs from what `{}` writes"
            raise WheelhouseError(f"{shown(out)} {state.format(command)} from {shown(DEVICE_RESULTS)}; run it and "
                                  f"commit {shown(out)}")
        return
    partial = out.with_name(out.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(out)
