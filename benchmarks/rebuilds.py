"""Figure 11: rebuilds, byte for byte.

Each row is one ``ci.building.rebuild.rebuild_check``, what ``nox -s rebuild-check-<component>-<python>`` runs: the
row built twice, one build after the other, each in a fresh cache directory (venv, sources, compiler cache,
build directory) and its own dist directory, and the two wheels compared member by member (a shared
object's differing ELF sections named).

On this machine, against the current interpreter's torch (``--reuse-env``, as the rebuild sessions take it):
  - the fixture extension, tests/fixtures/versions.yaml's wheelhouse-fixture row for this Python;
  - a small pure-Python project made here, built by the Megatron-Bridge builder (pip wheel, setuptools).
With WHEELHOUSE_BENCH_CUDA_PYTHON naming an interpreter whose torch is the CUDA build of
tests/fixtures/versions-device.yaml's row (torch 2.11.0+cu130, Python 3.12), that file's upstream rows
are rebuilt here too, in that interpreter (nvcc compiles device code without a GPU): causal-conv1d from
its sdist, and Megatron-Bridge from its git source when WHEELHOUSE_BENCH_GIT_MIRROR names a directory of
bare repositories laid out as <owner>/<name>.git (tests/gpu/make_source_bundles.py makes one), which
git's insteadOf puts in GitHub's place.
Toy mode (the smoke test) builds only the pure-Python project (a few seconds, a real build).

The GPU machine's runs (tests/gpu/run_on_device.sh rebuild) are read from the ``rebuilds`` section of
benchmarks/device_results.json: a list of runs, each with its own date, rendered as further rows.
"""

from __future__ import annotations

import json
import os
import platform
import re
import sys
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from benchmarks.common import DEVICE_RESULTS, REPO, Context, Figure, Table

NAME = "rebuilds"
TITLE = "11. Rebuilds, byte for byte"
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"
FIXTURE_SOURCE = REPO / "tests" / "fixtures" / "fixture_ext"
PURE_PROJECT = "tinypkg"
PURE_FILES = {
    f"{PURE_PROJECT}/__init__.py": 'VERSION = "0.3.0"\n',
    f"{PURE_PROJECT}/data.txt": "payload\n",
    "pyproject.toml": ('[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
                       f'[project]\nname = "{PURE_PROJECT}"\nversion = "0.3.0"\n'
                       f'[tool.setuptools.package-data]\n{PURE_PROJECT} = ["*.txt"]\n'),
}
DEVICE_VERSIONS = REPO / "tests" / "fixtures" / "versions-device.yaml"
UPSTREAM_ROWS = ("causal-conv1d", "megatron-bridge")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# One rebuild check in another interpreter; the last line of its stdout is the report as JSON.
_CHILD = """
import json, sys
from pathlib import Path
from ci.building import job, rebuild
from ci.model import matrix
from ci.model.versions import load
versions_file, component, work = sys.argv[1], sys.argv[2], Path(sys.argv[3])
versions = load(versions_file)
row = next(r for r in matrix.expand(versions) if r.component == component)
report = rebuild.rebuild_check(versions, row, job.BuildOptions(cache_dir=work / "cache", reuse_env=True),
                               work / "rebuild")
print(json.dumps({"wheels": [{"sha256": list(w.sha256), "differences": [d.describe() for d in w.differences],
                              "identical": w.identical} for w in report.wheels], "only_once": list(report.only_once)}))
"""
_DEVICE_KEYS = ("date", "machine", "command", "rows")
_DEVICE_ROW_KEYS = ("component", "commit", "first_sha256", "second_sha256", "differences", "wall_s")


@dataclass(frozen=True)
class Rebuilt:
    """One wheel of one rebuild check, as a table row shows it."""

    component: str
    where: str
    first_sha256: str
    second_sha256: str
    differences: tuple[str, ...]
    wall_s: float

    @property
    def identical(self) -> bool:
        return self.first_sha256 == self.second_sha256 and not self.differences

    def cells(self) -> list[str]:
        return [self.component, self.where, f"`{self.first_sha256[:12]}`", f"`{self.second_sha256[:12]}`",
                "yes" if self.identical else "**no**", "; ".join(self.differences) or "none",
                f"{self.wall_s:.0f} s"]


def _this_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def _row_for_this_machine(versions, component: str, versions_file: Path):
    from ci.building import job
    from ci.model import matrix

    rows = [r for r in matrix.expand(versions) if r.component == component and r.python == _this_python()
            and r.arch == job.host_arch()]
    if not rows:
        raise RuntimeError(f"{versions_file}: {component} has no {job.host_arch()} row for Python "
                           f"{_this_python()}; run the benchmarks with an interpreter of a row's Python")
    return rows[0]


def _rebuild_here(ctx: Context, component: str, versions_file: Path, source: Path | None, work: Path) -> list[Rebuilt]:
    """``ci.building.rebuild.rebuild_check`` of ``component``'s row for this Python, in this interpreter (--reuse-env)."""
    from ci.building import job, rebuild
    from ci.model.versions import load

    versions = load(versions_file)
    row = _row_for_this_machine(versions, component, versions_file)
    options = job.BuildOptions(cache_dir=work / "cache", reuse_env=True, source=source, environ=dict(os.environ))
    where = f"this machine (Python {platform.python_version()}, torch {metadata.version('torch')}, --reuse-env)"
    ctx.log(f"  {component}: two builds of {row.label}")
    started = time.perf_counter()
    report = rebuild.rebuild_check(versions, row, options, work / "rebuild")
    elapsed = time.perf_counter() - started
    ctx.log(f"  {component}: {'the same bytes' if report.identical else 'the builds differ'} ({elapsed:.0f} s)")
    rows = [Rebuilt(component, where, wheel.sha256[0], wheel.sha256[1],
                    tuple(d.describe() for d in wheel.differences)
                    or (() if wheel.identical else ("the same members, dates and modes: the zip structure differs",)),
                    elapsed)
            for wheel in report.wheels]
    rows += [Rebuilt(component, where, "-", "-", (f"{name}: built only once",), elapsed) for name in report.only_once]
    return rows


def _rebuild_in(ctx: Context, python: str, component: str, work: Path, mirror: str | None) -> list[Rebuilt]:
    """The device versions file's ``component`` row rebuilt by ``python`` (its CUDA torch, --reuse-env)."""
    import subprocess

    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if mirror:
        gitconfig = work / "gitconfig"
        gitconfig.write_text(f'[url "file://{Path(mirror).resolve()}/"]\n\tinsteadOf = https://github.com/\n'
                             "[protocol \"file\"]\n\tallow = always\n")
        env["GIT_CONFIG_GLOBAL"] = str(gitconfig)
    version = subprocess.run([python, "-c", "import platform, torch; print(platform.python_version(), torch.__version__)"],
                             capture_output=True, text=True, check=True, env=env).stdout.split()
    where = f"this machine (Python {version[0]}, torch {version[1]}, --reuse-env; nvcc without a GPU)"
    ctx.log(f"  {component}: two builds in {python} (log: {work / 'build.log'})")
    started = time.perf_counter()
    with (work / "build.log").open("w") as log:
        proc = subprocess.run([python, "-c", _CHILD, str(DEVICE_VERSIONS), component, str(work)], cwd=REPO, env=env,
                              stdout=subprocess.PIPE, stderr=log, text=True, check=False)
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"{component}: the rebuild check in {python} failed (exit {proc.returncode}); see "
                           f"{work / 'build.log'}")
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    ctx.log(f"  {component}: {'the same bytes' if all(w['identical'] for w in report['wheels']) else 'the builds differ'}"
            f" ({elapsed:.0f} s)")
    rows = [Rebuilt(component, where, w["sha256"][0], w["sha256"][1], tuple(w["differences"]), elapsed)
            for w in report["wheels"]]
    rows += [Rebuilt(component, where, "-", "-", (f"{name}: built only once",), elapsed) for name in report["only_once"]]
    return rows


def _upstream_here(ctx: Context, work: Path) -> tuple[list[Rebuilt], list[str]]:
    """The upstream rows rebuilt in WHEELHOUSE_BENCH_CUDA_PYTHON, and a note for each one left out."""
    python = os.environ.get("WHEELHOUSE_BENCH_CUDA_PYTHON")
    if not python:
        return [], [f"Not rebuilt here this run: {', '.join(UPSTREAM_ROWS)} (WHEELHOUSE_BENCH_CUDA_PYTHON unset: "
                    "they need a CUDA build of torch)."]
    mirror = os.environ.get("WHEELHOUSE_BENCH_GIT_MIRROR")
    rows: list[Rebuilt] = []
    notes: list[str] = []
    for component in UPSTREAM_ROWS:
        if component == "megatron-bridge" and not mirror:
            notes.append("Not rebuilt here this run: megatron-bridge (WHEELHOUSE_BENCH_GIT_MIRROR unset: its git "
                         "source needs a mirror).")
            continue
        rows += _rebuild_in(ctx, python, component, work / component, mirror)
    return rows, notes


def _pure_python_versions(work: Path) -> tuple[Path, Path]:
    """The pure-Python project's sources and a versions file naming it: the fixture world's matrix, the
    component replaced by the project built with the Megatron-Bridge builder."""
    project = work / "project"
    for relative, text in PURE_FILES.items():
        (project / relative).parent.mkdir(parents=True, exist_ok=True)
        (project / relative).write_text(text)
    versions_text = FIXTURE_VERSIONS.read_text()
    replacements = {"wheelhouse-fixture:": f"{PURE_PROJECT}:", "builder: fixture": "builder: megatron_bridge",
                    "wheel_packages: [wheelhouse-fixture]": f"wheel_packages: [{PURE_PROJECT}]"}
    for old, new in replacements.items():
        if old not in versions_text:
            raise RuntimeError(f"{FIXTURE_VERSIONS}: no '{old}' to replace; update benchmarks/rebuilds.py's "
                               f"pure-Python versions file to its new shape")
        versions_text = versions_text.replace(old, new)
    # the fixture's smoke test imports the fixture's package: the project's own import instead
    smoke = re.compile(r"^    # the extension imported[^\n]*\n    smoke_test:\n(?:      [^\n]*\n)+", re.M)
    if not smoke.search(versions_text):
        raise RuntimeError(f"{FIXTURE_VERSIONS}: no smoke_test of the fixture to replace; update benchmarks/rebuilds.py")
    versions_text = smoke.sub(f'    smoke_test:\n      - python -c "import {PURE_PROJECT}"\n', versions_text)
    versions_file = work / "versions.yaml"
    versions_file.write_text(versions_text)
    return project, versions_file


def device_runs(path: Path = DEVICE_RESULTS) -> list[dict]:
    """The GPU machine's rebuild-check runs recorded in device_results.json, oldest first (none when absent).

    Written by hand from device output, so every key a row needs is checked here: a run missing one is an
    error naming the file, the run and the key.
    """
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
    except json.JSONDecodeError as error:
        raise RuntimeError(f"{path}: not JSON ({error}); fix the file") from None
    runs = data.get("rebuilds") or []
    for index, run in enumerate(runs):
        for key in _DEVICE_KEYS:
            if key not in run:
                raise RuntimeError(f"{path}: rebuilds[{index}] has no '{key}'; add it (each run needs "
                                   f"{', '.join(_DEVICE_KEYS)})")
        for number, row in enumerate(run["rows"]):
            where = f"{path}: rebuilds[{index}].rows[{number}]"
            for key in _DEVICE_ROW_KEYS:
                if key not in row:
                    raise RuntimeError(f"{where} has no '{key}'; add it (each row needs {', '.join(_DEVICE_ROW_KEYS)})")
            for key in ("first_sha256", "second_sha256"):
                if not _SHA256.fullmatch(str(row[key])):
                    raise RuntimeError(f"{where}.{key} is {row[key]!r}; write the wheel's full sha256 (64 hex digits)")
    return runs


def _run_name(run: dict) -> str:
    """The GPU machine's run as rows and notes name it: its date, and its label when a day has several runs."""
    return f"GPU machine, {run['date']}" + (f" ({run['label']})" if run.get("label") else "")


def device_rows(runs: list[dict]) -> list[Rebuilt]:
    return [Rebuilt(f"{row['component']} {row['commit']}", _run_name(run), row["first_sha256"],
                    row["second_sha256"], tuple(row["differences"]), float(row["wall_s"]))
            for run in runs for row in run["rows"]]


def device_notes(runs: list[dict]) -> list[str]:
    notes = []
    for run in runs:
        notes.append(f"{_run_name(run)}: {run['machine']}; {run['command']}.")
        notes += [f"{_run_name(run)}, {row['component']}: {row['cause']}" for row in run["rows"]
                  if row.get("cause")]
    return notes


def _summary(local: list[Rebuilt], device: list[Rebuilt], runs: list[dict]) -> list[str]:
    def sentence(rows: list[Rebuilt]) -> str:
        same = [r.component for r in rows if r.identical]
        differ = [r.component for r in rows if not r.identical]
        parts = []
        if same:
            parts.append(f"the same bytes: {', '.join(same)}")
        if differ:
            parts.append(f"different: {', '.join(differ)}")
        return "; ".join(parts)

    lines = [f"this machine, {len(local)} rebuilt: {sentence(local)}"]
    if device:
        latest = [r for r in device if r.where == _run_name(runs[-1])]
        lines.append(f"{_run_name(runs[-1])}, {len(latest)} rebuilt: {sentence(latest)}")
    return lines


def run(ctx: Context) -> Figure:
    work = ctx.work / "rebuilds"
    local: list[Rebuilt] = []
    if not ctx.toy:
        local += _rebuild_here(ctx, "wheelhouse-fixture", FIXTURE_VERSIONS, None, work / "fixture")
    project, versions_file = _pure_python_versions(work / "pure-python")
    local += _rebuild_here(ctx, PURE_PROJECT, versions_file, project, work / "pure-python")
    upstream_notes: list[str] = []
    if not ctx.toy:
        upstream, upstream_notes = _upstream_here(ctx, work / "upstream")
        local += upstream
    runs = device_runs()
    device = device_rows(runs)
    return Figure(
        NAME, TITLE,
        compared=("`ci.building.rebuild.rebuild_check` (`nox -s rebuild-check-<component>-<python>`): one matrix row built "
                  "twice, each build in fresh cache and dist directories, the second right after the first; the "
                  "two wheels' sha256 and, when they differ, every differing member"),
        where=(f"this machine, {os.cpu_count()} cores: the fixture extension (tests/fixtures/versions.yaml's row for "
               f"Python {_this_python()}{'; left out in toy mode' if ctx.toy else ''}), a small pure-Python project "
               "(Megatron-Bridge builder), and, in an interpreter with a CUDA torch, tests/fixtures/versions-device.yaml's "
               "causal-conv1d (sdist) and megatron-bridge (git) rows; the GPU machine's runs from "
               "benchmarks/device_results.json"),
        repetitions="1 rebuild check (two builds) per row; wall time is both builds and the comparison",
        tables=[Table(["component", "where", "first sha256", "second sha256", "identical", "differing members",
                       "two builds"], [r.cells() for r in local + device])],
        notes=[
            "The comparison covers every member's bytes, name, order, date and mode; for a shared object whose "
            "bytes differ it names the ELF sections that differ. Two wheels are the same only when their sha256 "
            "is: no difference is ignored, whatever member or section it is in.",
            "A differing .so moves the SBOM (it holds the .so's sha256) and RECORD with it; those follow from "
            "the .so, they are not separate causes.",
            "nvcc's cause: cudafe++ gives every compile a module id of its own and writes it into the names of "
            "internal-linkage entities (`_ZN<n>_INTERNAL_<hash>_<n>_<file>_cu_<module id>...`), which end up in the "
            "cubins' .debug_str, the fatbin and the host symbol tables; two compiles of the same source give "
            "two ids, so two builds give two .so files.",
            *upstream_notes,
            *device_notes(runs),
        ],
        summary=_summary(local, device, runs),
    )


if __name__ == "__main__":
    start = time.perf_counter()
    print(run(Context(quick=True)).markdown())
    print(f"{time.perf_counter() - start:.1f} s")
