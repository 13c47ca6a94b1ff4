"""Build one row twice, in two fresh directories, and say whether the wheels are the same bytes.

``nox -s rebuild-check-<component>-<python>`` runs this. Each build gets its own cache directory
(venvs, sources, compiler cache, build directory) and its own dist directory under ``work``, so
nothing of the first build can reach the second; the second starts right after the first, at
another time. A remote compiler cache the environment names is not used (its credential file is
read and removed all the same): the second build would take the first one's objects from it, and
two copies of one compile prove nothing about the compiler. The report names each differing member
and, for a shared object, its ELF sections (ci/building/reproducible.py).
"""

from __future__ import annotations

import dataclasses
import shutil
from dataclasses import dataclass
from pathlib import Path

from ci.base import log
from ci.base.digest import sha256_file
from ci.base.errors import WheelhouseError
from ci.building import job, remote_cache, sources
from ci.building.reproducible import MemberDifference, compare_wheels
from ci.model.build_record import BuildRecord
from ci.model.matrix import MatrixRow
from ci.model.versions import Versions

_LOG = log.get("rebuild")


@dataclass(frozen=True)
class WheelComparison:
    name: str
    sha256: tuple[str, str]
    differences: tuple[MemberDifference, ...]

    @property
    def identical(self) -> bool:
        return self.sha256[0] == self.sha256[1]


@dataclass(frozen=True)
class RebuildReport:
    row: MatrixRow
    wheels: tuple[WheelComparison, ...]
    only_once: tuple[str, ...]
    """Wheel names that only one of the two builds made."""
    places: tuple[str, ...] = ()
    """Where each build ran (the build record's ``toolchain.build_place``)."""

    @property
    def identical(self) -> bool:
        return not self.only_once and all(w.identical for w in self.wheels)

    def render(self) -> str:
        lines = [f"rebuild check of {self.row.label}"]
        lines += [f"  {name} build place: {place}" for name, place in zip(("first", "second"), self.places, strict=False)]
        for wheel in self.wheels:
            lines.append(f"  {wheel.name}")
            lines.append(f"    first:  sha256 {wheel.sha256[0]}")
            lines.append(f"    second: sha256 {wheel.sha256[1]}")
            lines.append("    identical" if wheel.identical else "    DIFFERENT:")
            lines += [f"      {d.describe()}" for d in wheel.differences]
            if not wheel.identical and not wheel.differences:
                lines.append("      the same members, dates and modes: the zip structure differs")
        lines += [f"  {name}: built only once" for name in self.only_once]
        lines.append("the same bytes" if self.identical else "the builds differ")
        return "\n".join(lines)


def rebuild_check(versions: Versions, row: MatrixRow, options: job.BuildOptions, work: Path) -> RebuildReport:
    """Build ``row`` in ``work``/first and then in ``work``/second, each with fresh caches; compare."""
    if work.exists() and any(work.iterdir()):
        raise WheelhouseError(f"--work {work}: not empty; pass a new directory (the two builds must start fresh)")
    options = without_remote_cache(options)
    placed, places = [], []
    try:
        for name in ("first", "second"):
            root = work / name
            _seed_sdists(options.cache_dir, root / "cache")
            _LOG.info(f"{name} build of {row.label} in {root}")
            result = job.run(versions, row,
                               dataclasses.replace(options, cache_dir=root / "cache", dist_root=root / "dist"))
            placed.append({wheel.name: wheel for wheel in result.wheels})
            places.append(str(BuildRecord.read(result.record).toolchain.get("build_place", "unknown")))
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)  # half a comparison is no result: nothing is left behind
        raise
    first, second = placed
    comparisons = tuple(
        WheelComparison(name, (sha256_file(first[name]), sha256_file(second[name])),
                        tuple(compare_wheels(first[name], second[name])))
        for name in sorted(first.keys() & second.keys())
    )
    return RebuildReport(row, comparisons, tuple(sorted(first.keys() ^ second.keys())), tuple(places))


def without_remote_cache(options: job.BuildOptions) -> job.BuildOptions:
    """``options`` with the compiler cache local: no remote, no mode, the credential file consumed."""
    remote = remote_cache.from_environment(options.environ)
    secret_file = options.environ.get(remote_cache.SECRET_FILE, "").strip()
    if remote is None and not secret_file:
        return options
    remote_cache.take_secret(options.environ, remote)  # one line for a bad file; never left for a builder to read
    if remote is not None:
        _LOG.warning(f"rebuild check: the remote compiler cache ({remote.location}) is not used: the second build "
                     "would take the first one's objects from it")
    environ = {key: value for key, value in options.environ.items()
               if key not in (remote_cache.MODE, remote_cache.SECRET_FILE)}
    return dataclasses.replace(options, environ={**environ, remote_cache.SETTING: "local"})


def _seed_sdists(cache_dir: Path, fresh: Path) -> None:
    """Downloaded sdists are inputs, not build state (their sha256 is checked): each fresh cache gets a copy,
    so a machine without the package index can rebuild an sdist component."""
    downloads = sources.sdist_downloads(cache_dir)
    if downloads.is_dir():
        shutil.copytree(downloads, sources.sdist_downloads(fresh))


def remove_caches(work: Path) -> None:
    """Keep the two builds' wheels and records; drop their caches (venvs, sources, compiler caches)."""
    for name in ("first", "second"):
        shutil.rmtree(work / name / "cache", ignore_errors=True)
