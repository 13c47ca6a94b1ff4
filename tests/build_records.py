"""What a build leaves in dist/ without running one: wheels already made, and their build record."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ci.base.digest import sha256_file
from ci.model import build_record
from ci.model.build_record import BuildRecord
from ci.model.manifest import WheelEntry
from ci.model.matrix import MatrixRow


def record_of(row: MatrixRow, wheels: Sequence[Path], *, build_config: dict | None = None,
              checks_ok: bool = True) -> BuildRecord:
    """A whole record of ``row`` listing ``wheels`` (their real digests), as a build whose checks passed
    (or failed) writes it."""
    return BuildRecord(
        row=row.to_json(), fingerprint="f" * 64, build_config=build_config or {},
        source={"kind": "path", "location": "tests/fixtures/fixture_ext", "ref": row.ref, "revision": "r" * 64},
        toolchain={"python": "/usr/bin/python3", "python_version": row.python, "torch": row.torch},
        compiler_cache=None, compiler_cache_stats=None, compiler_cache_misses=None,
        durations={"toolchain_s": 1.0, "source_s": 0.5, "build_s": 30.0, "checks_s": 2.0, "total_s": 33.5},
        checks={"ok": checks_ok, "problems": []},
        wheels=tuple(WheelEntry(w.name, sha256_file(w), w.stat().st_size) for w in wheels),
        sbom={}, ninja_steps={"steps": 0, "slowest": []},
    )


def write_record(dist_root: Path, row: MatrixRow, wheels: Sequence[Path], **kwargs) -> Path:
    """Write ``record_of(row, wheels)`` where the build of ``row`` into ``dist_root`` would; its path."""
    path = build_record.path_for(row, dist_root)
    path.parent.mkdir(parents=True, exist_ok=True)
    record_of(row, wheels, **kwargs).write(path)
    return path
