"""Figure 13: the compile time of every job, staged (the first Python, then the others from its cache) against
all-parallel (each job with a cache of its own, as separate runners have).

One run builds a component through ``ci.building.job.run`` for each Python of PYTHONS with an empty compiler cache
(the all-parallel jobs: separate runners, and what the first Python's job does in both plans), then each
other Python again from a copy of the first Python's compiler cache (the staged plan's second stage, as
``_build.yml`` restores it). The first Python's cold build counts once in both sums. Every build runs in one
cache directory, as every runner's job runs in one workspace path; only the compiler cache is emptied or
restored between them. Two and four Pythons come out of the same builds: the first two of PYTHONS, all four.

Components: the fixture extension (arch 9.0) and fast-hadamard-transform with the arch filter at 9.0 (as
tests/fixtures/versions-device.yaml builds it; sources from ``WHEELHOUSE_BENCH_FHT_GIT``, left out when unset).
``python -m benchmarks.staged_pythons --component fast-hadamard-transform --out FILE`` runs one component
alone and writes its measurements to FILE (JSON), for a long run started detached.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks import cuda_torch
from benchmarks.common import REPO, Context, Figure, Table

NAME = "staged-pythons"
TITLE = "13. Staged builds: compile time of every job, staged against all-parallel"
PYTHONS = ("3.10", "3.11", "3.12", "3.13")
TORCH = "2.13.0"
FHT_REF = "e7706faf8d1c3b9f241e36860640ad1dac644ede"
RESULTS = REPO / "benchmarks" / "staged_pythons.json"

VERSIONS = """\
build_matrix:
{rows}
components:
  wheelhouse-fixture:
    source: {{path: tests/fixtures/fixture_ext}}
    ref: "0.1.0"
    builder: fixture
    wheel_packages: [wheelhouse-fixture]
    torch_cuda_arch_list: "9.0"
    runs_on: ubuntu-24.04
    max_jobs: 2
  fast-hadamard-transform:
    source: {{git: "file:///nonexistent/fast-hadamard-transform"}}
    ref: {fht_ref}
    builder: fast_hadamard_transform
    wheel_packages: [fast-hadamard-transform]
    torch_cuda_arch_list: "9.0"
    arch_filter: true
    runs_on: ubuntu-24.04
    max_jobs: 2
"""


def _versions(work: Path):
    from ci.model.versions import load

    rows = "\n".join(f'  - {{arch: x86_64, cuda: "13.0.2", python: "{p}", torch: "{TORCH}", cxx11_abi: "TRUE", '
                     f"torch_index: default}}" for p in PYTHONS)
    path = work / "versions.yaml"
    path.write_text(VERSIONS.format(rows=rows, fht_ref=FHT_REF))
    return load(path)


def _fht_source(work: Path) -> Path | None:
    origin = os.environ.get("WHEELHOUSE_BENCH_FHT_GIT")
    if not origin:
        return None
    checkout = work / "fast-hadamard-transform-src"
    if not (checkout / "setup.py").is_file():
        shutil.rmtree(checkout, ignore_errors=True)
        checkout.mkdir(parents=True)
        archive = subprocess.run(["git", f"--git-dir={origin}", "archive", "--format=tar", FHT_REF],
                                 check=True, capture_output=True).stdout
        subprocess.run(["tar", "-x", "-C", str(checkout)], input=archive, check=True)
    return checkout


def _build(versions, row, cache: Path, source: Path | None, environ: dict, dist: Path, log) -> dict:
    from ci.building import job
    from ci.model.build_record import BuildRecord

    options = job.BuildOptions(cache_dir=cache, dist_root=dist, source=source, environ=environ)
    started = time.perf_counter()
    with open(cache.parent / "build.log", "ab") as out:
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            result = job.run(versions, row, options)
        finally:
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)
    record = BuildRecord.read(result.record)
    measured = {"wall_s": round(time.perf_counter() - started, 1), "build_s": record.durations["build_s"],
                "not_reused": record.compiler_cache_misses, "stats": record.compiler_cache_stats}
    log(f"    py{row.python}: build {measured['build_s']:.0f} s, not from the cache: {measured['not_reused']}")
    return measured


def measure(component: str, work: Path, log) -> dict:
    """Cold builds of every Python, then the others from the first's cache; the measurements as JSON."""
    from ci.model import matrix

    work.mkdir(parents=True, exist_ok=True)
    versions = _versions(work)
    rows = {r.python: r for r in matrix.expand(versions) if r.component == component}
    source = _fht_source(work) if component == "fast-hadamard-transform" else None
    cache = work / f"cache-{component}"  # one path for every job, as one workspace path on every runner
    shutil.rmtree(cache, ignore_errors=True)
    environ = cuda_torch.build_environ(rows.values(), cache, log)
    compiler_cache = cache / "compiler-cache"
    first_cache = work / f"{component}-first-compiler-cache"
    found: dict = {"component": component, "pythons": list(PYTHONS), "cold": {}, "staged": {}}
    for python in PYTHONS:
        shutil.rmtree(compiler_cache, ignore_errors=True)  # a runner of its own: an empty cache
        log(f"  {component}: cold build")
        found["cold"][python] = _build(versions, rows[python], cache, source, environ, work / "dist", log)
        if python == PYTHONS[0]:
            shutil.rmtree(first_cache, ignore_errors=True)
            shutil.copytree(compiler_cache, first_cache, symlinks=True)  # what its job saves
    for python in PYTHONS[1:]:
        shutil.rmtree(compiler_cache, ignore_errors=True)
        shutil.copytree(first_cache, compiler_cache, symlinks=True)  # what the second stage restores
        log(f"  {component}: from py{PYTHONS[0]}'s cache")
        found["staged"][python] = _build(versions, rows[python], cache, source, environ, work / "dist", log)
    shutil.rmtree(cache, ignore_errors=True)
    return found


def sums(found: dict, count: int) -> dict:
    pythons = found["pythons"][:count]
    cold = [found["cold"][p]["build_s"] for p in pythons]
    staged = [cold[0], *(found["staged"][p]["build_s"] for p in pythons[1:])]
    return {"pythons": pythons, "parallel_sum": sum(cold), "staged_sum": sum(staged),
            "parallel_wall": max(cold), "staged_wall": cold[0] + max(staged[1:])}


def table_rows(found: dict) -> list[list[str]]:
    rows = []
    for count in (2, 4):
        s = sums(found, count)
        rows.append([found["component"], f"{count} ({', '.join(s['pythons'])})", f"{s['parallel_sum']:.0f} s",
                     f"{s['staged_sum']:.0f} s", f"{s['staged_sum'] / s['parallel_sum']:.2f}",
                     f"{s['parallel_wall']:.0f} s", f"{s['staged_wall']:.0f} s",
                     f"{s['staged_wall'] / s['parallel_wall']:.2f}"])
    return rows


def run(ctx: Context) -> Figure:
    work = ctx.work / "staged-pythons"
    stored = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    if ctx.toy:
        measured = []
    elif os.environ.get("WHEELHOUSE_BENCH_STAGED_STORED") == "1" and "wheelhouse-fixture" in stored:
        measured = [stored["wheelhouse-fixture"]]  # render the stored run again, measure nothing
    else:
        measured = [measure("wheelhouse-fixture", work, ctx.log)]
        _store(measured[0])
    if os.environ.get("WHEELHOUSE_BENCH_FHT_GIT") and not ctx.quick and not ctx.toy:
        measured.append(measure("fast-hadamard-transform", work, ctx.log))
    elif "fast-hadamard-transform" in stored:
        measured.append(stored["fast-hadamard-transform"])  # the detached run's file (see the module's docstring)
    rows, per_build, conditions = [], [], []
    for found in measured:
        rows += table_rows(found)
        conditions += [f"{found['component']}: {note}" for note in found.get("notes", [])]
        for python in found["pythons"]:
            staged = found["staged"].get(python)
            per_build.append([found["component"], python, f"{found['cold'][python]['build_s']:.0f} s",
                              f"{staged['build_s']:.0f} s" if staged else "(first)",
                              ", ".join(staged["not_reused"] or []) if staged else ""])
    return Figure(
        NAME, TITLE,
        compared=("the build time (`build_s` of each build record) summed over the jobs of one compile group: "
                  "every Python with a compiler cache of its own (all-parallel), against the first Python cold and "
                  "the others from its saved cache (staged); and the wall time each plan takes with every job of a "
                  "stage at once"),
        where=(f"this machine, {os.cpu_count()} cores; torch {TORCH} (CUDA 13 wheel) from the package index, nvcc 13.0; "
               "the fixture and fast-hadamard-transform both for arch 9.0"),
        repetitions="1 build per Python and plan; the first Python's cold build counts in both plans",
        tables=[
            Table(["component", "Pythons", "all-parallel: sum", "staged: sum", "staged / parallel",
                   "all-parallel: wall", "staged: wall", "staged / parallel (wall)"], rows),
            Table(["component", "Python", "cold", f"from py{PYTHONS[0]}'s cache", "compiled, not from the cache"],
                  per_build),
        ],
        notes=[
            "Wall time assumes one runner per job: all-parallel is the slowest cold build, staged the first Python's "
            "cold build plus the slowest of the others.",
            *conditions,
            "Each component's measurements are kept in `benchmarks/staged_pythons.json`; fast-hadamard-transform's "
            "come from there when this run did not build it (a detached run writes it there), and "
            "WHEELHOUSE_BENCH_STAGED_STORED=1 renders the stored fixture run again without building.",
        ],
        summary=[f"{row[0]}, {row[1].split()[0]} Pythons: compile time summed over the jobs, staged / all-parallel "
                 f"{row[4]}" for row in rows],
    )


def _store(found: dict, out: Path = RESULTS) -> None:
    """Keep one component's measurements in ``out`` beside the others', written atomically."""
    stored = json.loads(out.read_text()) if out.is_file() else {}
    stored[found["component"]] = found
    partial = out.with_name(out.name + ".partial")
    partial.write_text(json.dumps(stored, indent=1, sort_keys=True) + "\n")
    partial.replace(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="one component's staged and all-parallel builds, to a JSON file")
    parser.add_argument("--component", required=True, choices=["wheelhouse-fixture", "fast-hadamard-transform"])
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    ctx = Context()
    found = measure(args.component, ctx.work / "staged-pythons", ctx.log)
    _store(found, args.out)
    for row in table_rows(found):
        print(" | ".join(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
