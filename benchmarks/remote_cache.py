"""Figure 15: the compiler cache between machines, a remote store against the archive handoff.

A torch extension of several translation units (each includes ``torch/extension.h``; toy mode: plain C++
units) is built through ``ci.building.job.run`` with this interpreter's torch (``--reuse-env``), each build on a
fresh machine: a fresh cache directory and build directory at the one workspace path every hosted runner
has. Side by side in one run:

- **remote** (ours now): the first machine builds and writes to a WebDAV server (WsgiDAV on 127.0.0.1,
  tests/webdav_server.py); the second machine reads it (``WHEELHOUSE_COMPILER_CACHE``);
- **archive** (today's handoff in the generated workflows): the first machine's ``.cache/compiler-cache/``
  packed as a tar archive and unpacked on the second machine before it builds; the pack and unpack are
  counted in its time (actions/cache moves the same archive through GitHub's cache service);
- **ref bump**: the sources with one unit changed. The remote serves every other unit. The archive's key
  hashes versions.yaml, which holds the ref: a bump restores nothing, and the build compiles cold.

Per build: wall time of ``job.run``, and the record's compiler-cache counts per translation unit (hits of
requests) with sccache's per-step counts and the remote level's share of them.
"""

from __future__ import annotations

import os
import shutil
import tarfile
import time
from pathlib import Path

from benchmarks.builds import _device_section, _output_to
from benchmarks.common import REPO, Context, Figure, Samples, Table
from ci.formats.cache_log import hit_share

NAME = "remote-cache"
TITLE = "15. Compiler cache between machines: a remote store against the archive handoff"
COMPONENT = "bench-remote-cache"

VERSIONS = """\
build_matrix:
  - {{arch: x86_64, cuda: cpu, python: "{python}", torch: "{torch}", cxx11_abi: "TRUE", torch_index: default}}
components:
  {component}:
    source: {{path: tests/fixtures/fixture_ext}}
    ref: "{ref}"
    builder: fixture
    wheel_packages: [wheelhouse-fixture]
    runs_on: ubuntu-24.04
    max_jobs: 2
"""

SETUP = """\
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

setup(name="wheelhouse-fixture", version="0.1.0", packages=["wheelhouse_fixture"],
      ext_modules=[CppExtension("wheelhouse_fixture._C", {sources!r}, extra_compile_args=["-g0"])],
      cmdclass={{"build_ext": BuildExtension}})
"""
TORCH_UNIT = """\
#include <torch/extension.h>
torch::Tensor unit{index}(torch::Tensor x) {{ return x * {index} + {salt}; }}
"""
PLAIN_UNIT = "int unit{index}(int x) {{ return x * {index} + {salt}; }}\n"
BINDING = """\
#include <Python.h>
static PyModuleDef module_def = {{PyModuleDef_HEAD_INIT}};
PyMODINIT_FUNC PyInit__C(void) {{
    module_def.m_name = "_C";
    module_def.m_size = -1;
    return PyModule_Create(&module_def);
}}
"""


def _sizes(ctx: Context) -> tuple[int, int, str]:
    """(units, repetitions, unit template)."""
    if ctx.toy:
        return 3, 1, PLAIN_UNIT
    return (4, 1, TORCH_UNIT) if ctx.quick else (8, 2, TORCH_UNIT)


def _project(path: Path, units: int, template: str, *, bumped: bool = False) -> Path:
    """The extension's sources; ``bumped``: unit 0 changed, as a ref bump that touches one file."""
    shutil.rmtree(path, ignore_errors=True)
    shutil.copytree(REPO / "tests" / "fixtures" / "fixture_ext", path, ignore=shutil.ignore_patterns("csrc", "setup.py"))
    (path / "csrc").mkdir()
    sources = [f"csrc/unit{i}.cpp" for i in range(units)] + ["csrc/binding.cpp"]
    for i in range(units):
        (path / "csrc" / f"unit{i}.cpp").write_text(template.format(index=i, salt=7 if bumped and i == 0 else 1))
    (path / "csrc" / "binding.cpp").write_text(BINDING.format())
    (path / "setup.py").write_text(SETUP.format(sources=sources))
    return path


class _Machines:
    """Fresh machines at one workspace path: each build gets an empty cache and build directory there."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.workspace = work / "runner"
        self.count = 0

    def fresh(self) -> Path:
        if self.workspace.exists():
            self.count += 1
            self.workspace.rename(self.work / f"machine-{self.count}")
        cache = self.workspace / ".cache"
        cache.mkdir(parents=True)
        return cache


def _build(versions_file: Path, source: Path, cache: Path, environ: dict[str, str]) -> tuple[float, dict]:
    from ci.building import job
    from ci.model import matrix
    from ci.model.build_record import BuildRecord
    from ci.model.versions import load

    versions = load(versions_file)
    (row,) = matrix.expand(versions)
    options = job.BuildOptions(cache_dir=cache, dist_root=cache.parent / "dist", reuse_env=True, source=source,
                                 environ=environ)
    started = time.perf_counter()
    record = BuildRecord.read(job.run(versions, row, options).record)
    return time.perf_counter() - started, dict(record.compiler_cache_stats or {})


def _archive(cache: Path, archive: Path) -> float:
    """Pack the machine's compiler cache as the workflow's cache step does; seconds taken."""
    started = time.perf_counter()
    with tarfile.open(archive, "w") as tar:
        tar.add(cache / "compiler-cache", arcname="compiler-cache")
    return time.perf_counter() - started


def _unpack(archive: Path, cache: Path) -> float:
    started = time.perf_counter()
    with tarfile.open(archive) as tar:
        tar.extractall(cache, filter="data")
    return time.perf_counter() - started


def _counts(stats: dict) -> str:
    if not stats:
        return "n/a"
    text = f"{stats.get('hits', 0)} / {stats.get('requests', 0)} units"
    if "step_hits" in stats:
        steps = stats["step_hits"] + stats.get("step_misses", 0)
        text += f" ({stats['step_hits']} / {steps} steps"
        text += f", {stats['remote_step_hits']} remote)" if "remote_step_hits" in stats else ")"
    return text


def _one_repetition(machines: _Machines, dav, versions: dict[str, Path], sources: dict[str, Path],
                    base: dict[str, str], times: dict[str, Samples], counts: dict[str, dict], transfer: Samples) -> None:
    """Each build kind once, every build on a fresh machine; the archive handoff from the cold build's machine."""
    def remote(name: str) -> dict[str, str]:
        secret = dav.secret_file(machines.work / f"{name}.secret")
        return {**base, "WHEELHOUSE_COMPILER_CACHE": dav.url(), "WHEELHOUSE_COMPILER_CACHE_MODE": "read-write",
                "WHEELHOUSE_COMPILER_CACHE_SECRET_FILE": str(secret)}

    def measure(kind: str, ref: str, environ: dict[str, str], cache: Path | None = None, extra_s: float = 0.0) -> Path:
        cache = cache or machines.fresh()
        seconds, counts[kind] = _build(versions[ref], sources[ref], cache, environ)
        times[kind].add(seconds + extra_s)
        return cache

    first = measure("cold", "1.0", remote("first"))
    archive = machines.work / "compiler-cache.tar"
    packed = _archive(first, archive)
    second = machines.fresh()
    moved = packed + _unpack(archive, second)
    transfer.add(moved)
    measure("archive", "1.0", dict(base), second, moved)
    measure("remote", "1.0", remote("second"))
    measure("bump-remote", "1.1", remote("bump"))
    measure("bump-archive", "1.1", dict(base))  # the archive's key hashes versions.yaml: nothing restored


def _compiled(entry: dict) -> str:
    stats = entry.get("compiler_cache") or {}
    # deep-gemm's one unit is a host .cpp, which torch 2.11 compiles outside the cache: "no request" is all we know
    return _counts(stats) if stats.get("requests") else "no compile request reached the cache"


def device_sweep_table() -> tuple[Table, list[str], str] | None:
    """15(b): the GPU machine's sweeps through a served cache, each then again as a second machine
    (device_results.json ``cached_sweeps``, each run), per component: build time and compiles from the cache."""
    cached_sweeps = _device_section("cached_sweeps")
    if cached_sweeps is None:
        return None
    rows: list[list[str]] = []
    notes = ["15(b) read from benchmarks/device_results.json `cached_sweeps`: `WHEELHOUSE_SWEEP_REMOTE_CACHE=1 "
             "tests/gpu/run_on_device.sh sweep`, every build through sccache with WsgiDAV on the machine's loopback as "
             "the remote (read-write), then the sweep again in fresh work, cache and build directories at the same "
             "path. Build times include each row's venv and checks, and the builds of one run share the 16 cores. The "
             "same sha256 in both runs shows the cache serves what the first run compiled, not that a compile is "
             "reproducible (the second run's objects are the first's); rebuild-check compiles twice."]
    hits = requests = 0
    components: set[str] = set()
    for cached in cached_sweeps:
        first, again = cached["first"], cached["again"]
        commit = first["commit"][:7]
        for name, entry in first["components"].items():
            second = again["components"].get(name, {})
            same = [w["sha256"] for w in entry.get("wheels", [])] == [w["sha256"] for w in second.get("wheels", [])]
            rows.append([f"{name} ({commit})", f"{entry.get('build_s')} s, {_compiled(entry)}",
                         f"{second.get('build_s')} s, {_compiled(second)}", "yes" if same else "NO",
                         "yes" if entry.get("green") and second.get("green") else "no"])
        rate = cached["hit_rate"]
        rows.append([f"all builds at {commit}, side by side", f"{first.get('builds_wall_s')} s",
                     f"{again.get('builds_wall_s')} s, {rate['hits']} / {rate['requests']} units "
                     f"({hit_share(rate['hits'], rate['requests'])})", "",
                     f"{again.get('green')} of {len(again['components'])}"])
        notes += [f"15(b) {commit}: {first['machine']}, {first['date']}, {len(first['components'])} components",
                  *(f"15(b) {commit}: {note}" for note in cached.get("notes", []))]
        hits, requests = hits + rate["hits"], requests + rate["requests"]
        components |= set(again["components"])
    table = Table(["15(b) component (commit)", "first machine: build, from the cache",
                   "second machine: build, from the cache", "same wheel sha256", "green both times"], rows)
    summary = (f"the GPU machine's sweeps again as a second machine ({len(components)} components in "
               f"{len(cached_sweeps)} runs): {hits} of {requests} compiles from the served cache "
               f"({hit_share(hits, requests)})")
    return table, notes, summary


def run(ctx: Context) -> Figure:
    import sys

    import torch

    from tests.webdav_server import webdav_server

    units, reps, template = _sizes(ctx)
    work = ctx.work / NAME
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    versions = {}
    for ref in ("1.0", "1.1"):
        versions[ref] = work / f"versions-{ref}.yaml"
        versions[ref].write_text(VERSIONS.format(python=python, torch=torch.__version__.split("+")[0], ref=ref,
                                                        component=COMPONENT))
    sources = {"1.0": _project(work / "src-1.0", units, template),
               "1.1": _project(work / "src-1.1", units, template, bumped=True)}
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SCCACHE_", "WHEELHOUSE_COMPILER_CACHE"))}
    times = {key: Samples() for key in ("cold", "remote", "archive", "bump-remote", "bump-archive")}
    counts: dict[str, dict] = {}
    transfer = Samples()
    log = work / "build.log"
    ctx.log(f"  {units} units, {reps} repetition(s); build output in {log}")

    for rep in range(reps):
        with webdav_server(work / f"dav-{rep}") as dav, _output_to(log):
            _one_repetition(_Machines(work / f"rep-{rep}"), dav, versions, sources, base, times, counts, transfer)
        ctx.log(f"    rep {rep + 1}/{reps}: " + ", ".join(f"{k} {v.values[-1]:.1f} s" for k, v in times.items()))

    rows = [
        ["first machine (cold)", times["cold"].fmt(), _counts(counts["cold"]), "compiles everything, writes the server"],
        ["second machine, remote", times["remote"].fmt(), _counts(counts["remote"]),
         f"{times['cold'].median / times['remote'].median:.1f}x faster than cold"],
        ["second machine, archive handoff", times["archive"].fmt(), _counts(counts["archive"]),
         f"{times['cold'].median / times['archive'].median:.1f}x faster than cold; pack + unpack {transfer.fmt()}"
         " (the upload and download through GitHub's cache service come on top)"],
        ["ref bump (one unit changed), remote", times["bump-remote"].fmt(), _counts(counts["bump-remote"]),
         f"{times['cold'].median / times['bump-remote'].median:.1f}x faster than cold"],
        ["ref bump, archive handoff", times["bump-archive"].fmt(), _counts(counts["bump-archive"]),
         "the archive's key hashes versions.yaml: nothing restored, a cold build"],
    ]
    remote, bump = counts["remote"], counts["bump-remote"]
    summary = [
        f"compiler cache between machines ({units} units and a binding): the second machine takes {remote.get('hits')}/"
        f"{remote.get('requests')} units from the remote store, {times['cold'].median / times['remote'].median:.1f}x "
        f"faster than cold; after a ref bump changing one unit {bump.get('hits')}/{bump.get('requests')}, "
        f"{times['cold'].median / times['bump-remote'].median:.1f}x, where the archive handoff compiles cold",
    ]
    shutil.rmtree(work, ignore_errors=True)
    tables = [Table(["build", "wall time", "from the cache (units; sccache steps, of them from the remote)", "note"],
                    rows)]
    notes = [
        "Counts are the build record's: per translation unit (a unit is a hit when every cached step of it hit), "
        "then sccache's per-step counts. The binding unit includes Python.h and is its own unit.",
        "On GitHub the remote is GitHub's cache service (`gha`), one object per entry; here a WebDAV server on "
        "loopback, so the figure leaves out network time on both sides.",
    ]
    if device := device_sweep_table():
        tables.append(device[0])
        notes += device[1]
        summary.append(device[2])
    return Figure(
        NAME, TITLE,
        compared=("a second machine's build of the same sources and of a ref bump that changes one unit: the remote "
                  "compiler cache (WebDAV behind each machine's cache directory, `WHEELHOUSE_COMPILER_CACHE`) "
                  "against the exact-key archive handoff of `.cache/compiler-cache/` the workflows used alone before"),
        where=(f"this machine; `ci.building.job.run` with this interpreter's torch (--reuse-env) on a torch extension of "
               f"{units} units plus a binding, every build on a fresh cache and build directory at one workspace "
               "path; WsgiDAV on 127.0.0.1"),
        repetitions=f"{reps} per build kind (each with a new server); times are min / median",
        tables=tables,
        notes=notes,
        summary=summary,
    )
