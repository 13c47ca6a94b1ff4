"""The compiler cache across Pythons: a real sccache, real g++, the environment builds get.

Two builds of one component for Python 3.12 and then 3.11, each in its own build directory with its
own venv (torch's headers live in the venv's site-packages, whose path names the Python): an object
that includes only torch-like headers is compiled once; an object that includes Python.h is
compiled again for each Python, whatever the paths.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci.building import build_place, compile_path, job, reproducible, toolchain
from ci.formats import cache_log

PYTHONS = ("3.12", "3.11")
_RESULT = re.compile(r"\[(?P<out>[^\]]+)\]: compile result: (?P<result>.+)$")


def _sccache() -> str | None:
    return shutil.which("sccache", path=str(Path(sys.executable).parent)) or shutil.which("sccache")


def _python_include(version: str) -> str | None:
    try:
        python = toolchain.find_python(version)
    except Exception:  # no such Python here: the test is skipped
        return None
    out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
                         capture_output=True, text=True).stdout.strip()
    return out if out and Path(out, "Python.h").is_file() else None


def _compile_results(log: Path) -> dict[str, str]:
    return {m["out"]: m["result"].strip() for m in map(_RESULT.search, log.read_text().splitlines()) if m}


@pytest.mark.skipif(_sccache() is None or shutil.which("g++") is None, reason="needs sccache and g++")
def test_object_with_python_headers_is_never_reused_across_pythons(tmp_path):
    includes = {version: _python_include(version) for version in PYTHONS}
    if not all(includes.values()):
        pytest.skip(f"needs Pythons {', '.join(PYTHONS)} with headers")
    tool = _sccache()
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", environ={})
    results, not_reused = {}, {}
    sites = {version: tmp_path / "cache" / "venvs" / f"py{version}-torch2.13.0-abc" / "lib" / f"python{version}"
             / "site-packages" for version in PYTHONS}
    for version in PYTHONS:
        build_dir = tmp_path / "cache" / "builds" / f"comp-x86_64-py{version}-torch2.13.0-0123"
        site = sites[version]
        headers = site / "torch" / "include"
        headers.mkdir(parents=True)
        (headers / "kernel_dep.h").write_text("inline int scale(int x) { return 3 * x; }\n")
        src = build_dir / "src"
        src.mkdir(parents=True)
        (src / "kernel.cpp").write_text('#include <kernel_dep.h>\nint kernel(int x) { return scale(x); }\n')
        (src / "binding.cpp").write_text(
            "#include <Python.h>\n#include <kernel_dep.h>\nint binding(int x) { return scale(x) + PY_MINOR_VERSION; }\n"
        )
        _, cache_env = job._compiler_cache(options, build_dir, job._free_port(), [site])
        # the server's log the build reads back for its record (ci/formats/cache_log.py), where the build keeps it
        log = Path(cache_env["SCCACHE_ERROR_LOG"])
        assert log == build_dir / cache_log.LOG_NAME and cache_env["SCCACHE_LOG"] == cache_log.SERVER_LOG_FILTER
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **cache_env}
        try:
            for name in ("kernel", "binding"):
                # with the prefix maps a reproducible build adds (the sources at their fixed path): every
                # Python's site-packages of the group
                maps = reproducible.prefix_maps(build_place.fixed_path("comp", "x86_64"), sites.values())
                subprocess.run([tool, "g++", *maps, f"-I{headers}", f"-I{includes[version]}", "-c", f"{name}.cpp",
                                "-o", f"{name}.o"], cwd=src, env=env, check=True, capture_output=True)
        finally:
            subprocess.run([tool, "--stop-server"], env=env, capture_output=True)
        results[version] = _compile_results(log)
        not_reused[version] = cache_log.not_reused(cache_log.read_results(log))
    assert results["3.12"] == {"kernel.o": "cache miss", "binding.o": "cache miss"}, results
    # the second Python: the kernel comes from the cache although every path differs; the binding,
    # which includes Python.h, is compiled again
    assert results["3.11"] == {"kernel.o": "cache hit", "binding.o": "cache miss"}, results
    # and the build record names exactly that unit
    assert not_reused == {"3.12": ["binding", "kernel"], "3.11": ["binding"]}


def test_pythons_of_a_row_build_at_one_path_one_at_a_time(tmp_path):
    """nvcc writes the source's absolute path into its device steps, so the compiler cache can share a
    kernel between Pythons only when they build at one path: the build directory leaves the Python out
    (a ref or script change still gives another directory), and a second Python's build that finds it
    busy builds in a directory of its own instead of waiting or trampling it."""
    import dataclasses

    from ci.model import fingerprint, matrix
    from ci.model.versions import load

    (row311,) = matrix.expand(load(Path(__file__).parent / "fixtures" / "versions.yaml"))
    row312 = dataclasses.replace(row311, python="3.12")
    options = job.BuildOptions(cache_dir=tmp_path, dist_root=tmp_path / "dist", environ={})
    dirs = {row.python: job._build_dir(options, row, fingerprint.build_config(row, "abc123")) for row in (row311, row312)}
    assert dirs["3.11"] == dirs["3.12"] and "py3" not in dirs["3.11"].name
    assert job._build_dir(options, row311, fingerprint.build_config(row311, "def456")) != dirs["3.11"]

    shared, first = job._claim(dirs["3.11"], row311)
    own, second = job._claim(dirs["3.12"], row312)
    assert shared == dirs["3.11"] and own == dirs["3.12"].with_name(dirs["3.12"].name + "-py3.12")
    second.close()
    first.close()
    again, lock = job._claim(dirs["3.12"], row312)
    assert again == dirs["3.12"]
    lock.close()


@pytest.mark.skipif(_sccache() is None, reason="needs sccache")
def test_nvcc_goes_through_the_compiler_cache_with_or_without_the_arch_filter(tmp_path):
    """torch 2.11's extension builder never prefixed nvcc with the cache found on PATH, so a build without
    the arch filter compiled every kernel afresh; PYTORCH_NVCC names the cache for every CUDA row."""
    from ci.model import matrix
    from ci.model.versions import load

    nvcc = tmp_path / "cuda" / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 13.0, V13.0.88'\n")
    nvcc.chmod(0o755)
    environ = {"PATH": f"{nvcc.parent}:{Path(_sccache()).parent}:/usr/bin:/bin"}
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", environ=environ)
    for versions_file, component, wrapped in (("versions.yaml", "flash-attention", str(nvcc)),
                                              ("tests/fixtures/versions-device.yaml", "causal-conv1d", "nvcc-filter-bin/nvcc")):
        versions = load(job.REPO_ROOT / versions_file)
        row = next(r for r in matrix.expand(versions) if r.component == component and r.arch == "x86_64")
        assert row.settings.arch_filter == (component == "causal-conv1d")
        command = job.plan(versions, row, options).env["PYTORCH_NVCC"]
        assert command.startswith(f"{_sccache()} ") and command.endswith(wrapped), command


@pytest.mark.skipif(_sccache() is None or shutil.which("nvcc", path="/usr/local/cuda/bin") is None,
                    reason="needs sccache and nvcc")
def test_a_kernel_built_from_two_venv_paths_hits_every_step_the_second_time(tmp_path):
    """On the GPU machine, causal-conv1d built from a second venv path (--reuse-env, its own copy of torch)
    hit the PTX and host steps but missed every ptxas step: with -lineinfo the PTX names the headers'
    absolute paths, and the PTX served from the cache named the first venv's, which the second build did
    not strip. The cache now remembers the site-packages of every build that filled it."""
    nvcc = str(Path("/usr/local/cuda/bin/nvcc"))
    tool = _sccache()
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", environ={})
    build_dir = tmp_path / "cache" / "builds" / "comp-x86_64-torch2.11.0-0123"
    src = build_dir / "src"
    src.mkdir(parents=True)
    (src / "kernel.cu").write_text('#include <kernel_dep.cuh>\n__global__ void k(float* x) { x[threadIdx.x] = scale(x[threadIdx.x]); }\n')
    results = {}
    for name in ("venv-a", "venv-b"):
        site = tmp_path / name / "lib" / "python3.12" / "site-packages"
        headers = site / "torch" / "include"
        headers.mkdir(parents=True)
        (headers / "kernel_dep.cuh").write_text("__device__ inline float scale(float x) { return 3 * x; }\n")
        _, cache_env = job._compiler_cache(options, build_dir, job._free_port(), [site])
        log = tmp_path / f"sccache-{name}.log"
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **cache_env,
               "SCCACHE_LOG": "debug", "SCCACHE_ERROR_LOG": str(log)}
        try:
            subprocess.run([tool, nvcc, "-lineinfo", "-gencode", "arch=compute_90,code=sm_90", f"-I{headers}",
                            "-c", "kernel.cu", "-o", "kernel.o"], cwd=src, env=env, check=True, capture_output=True)
        finally:
            subprocess.run([tool, "--stop-server"], env=env, capture_output=True)
        results[name] = _compile_results(log)
    steps = {out for out in results["venv-a"] if not out.endswith(".o")}
    assert any(out.endswith(".cubin") for out in steps), results
    assert all(results["venv-a"][out] == "cache miss" for out in steps), results
    assert {out: results["venv-b"][out] for out in steps} == dict.fromkeys(steps, "cache hit"), results


def test_the_cache_remembers_the_site_packages_of_the_builds_that_filled_it(tmp_path):
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", environ={})
    build_dir = tmp_path / "build"
    tool, _ = job._compiler_cache(options, build_dir, "1", remember=False)
    if tool is None or Path(tool).name != "sccache":
        pytest.skip("needs sccache")
    record = tmp_path / "cache" / "compiler-cache" / "sccache" / job.SITE_PACKAGES_SEEN

    def basedirs(sites: list[str], remember: bool = True) -> list[str]:
        return job._compiler_cache(options, build_dir, "1", sites, remember=remember)[1]["SCCACHE_BASEDIRS"].split(":")

    assert basedirs(["/a/site"], remember=False) == [str(build_dir), "/a/site",
                                                     "<site-packages of earlier builds into this cache>"]
    assert not record.exists()  # a plan writes nothing
    basedirs(["/a/site"])
    assert basedirs(["/b/site"]) == [str(build_dir), "/b/site", "/a/site"]
    assert basedirs(["/a/site"]) == [str(build_dir), "/a/site", "/b/site"]  # newest first, no repeats
    for i in range(job.SITE_PACKAGES_REMEMBERED + 5):
        basedirs([f"/many/{i}"])
    assert len(record.read_text().splitlines()) == job.SITE_PACKAGES_REMEMBERED
    assert not list(record.parent.glob("*.partial"))


def _listening(port: str) -> bool:
    import socket

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", int(port))) == 0


@pytest.mark.skipif(_sccache() is None, reason="needs sccache")
def test_the_builds_sccache_server_does_not_stop_while_a_long_compile_runs(tmp_path):
    """sccache's server stops after SCCACHE_IDLE_TIMEOUT (600 s) without a request, and the objects still
    compiling are lost (a 607 s nvcc step on the GPU machine); the build's own server has none. A server a
    client starts by itself, which only a compiler left running by a killed build does, has a short one."""
    import time

    tool = _sccache()
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", environ={})
    (tmp_path / "build" / "src").mkdir(parents=True)  # where the server writes its log, as in a build's directory
    place = build_place.choose(tmp_path / "build" / "src", "demo", "x86_64", {build_place.SETTING: "in-place"})
    envs = {}
    for name in ("build", "control"):
        _, cache_env = job._compiler_cache(options, tmp_path / "build", job._free_port())
        envs[name] = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **cache_env}
    assert envs["build"]["SCCACHE_IDLE_TIMEOUT"] == str(job.ORPHAN_SERVER_IDLE_S)
    server = job._start_sccache(tool, envs["build"], place, job.ServerSettings())
    envs["control"]["SCCACHE_IDLE_TIMEOUT"] = "1"  # what a client-started server does, shortened
    subprocess.run([tool, "--start-server"], env=envs["control"], check=True, capture_output=True)
    try:
        time.sleep(4)
        assert _listening(envs["build"]["SCCACHE_SERVER_PORT"]) and server.poll() is None
        assert not _listening(envs["control"]["SCCACHE_SERVER_PORT"])
    finally:
        job._stop_sccache(tool, envs["build"], server)
        subprocess.run([tool, "--stop-server"], env=envs["control"], capture_output=True)
    assert server.returncode is not None


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_venvs_preprocess_torch_headers_alike_once_their_mtimes_are_one(tmp_path):
    """GCC's #pragma once reads only the first of two headers with equal contents and equal mtimes. Whether
    torch's identical ATen/ops/*_native.h share an mtime depended on how fast a venv was unpacked, so the
    fixture's kernel preprocessed differently in two venvs and missed the cache between Pythons."""
    import os

    from ci.building import toolchain

    body = "#pragma once\nnamespace at { namespace native { } }\n"
    outputs = {}
    for name, mtimes in (("fast", (1000, 1000)), ("slow", (1000, 1001))):
        venv = tmp_path / name
        ops = venv / "lib" / "python3.12" / "site-packages" / "torch" / "include" / "ops"
        ops.mkdir(parents=True)
        for header, mtime in zip(("a_native.h", "b_native.h"), mtimes, strict=True):
            (ops / header).write_text(body)
            os.utime(ops / header, (mtime, mtime))
        (tmp_path / "kernel.cpp").write_text('#include "a_native.h"\n#include "b_native.h"\n')

        def preprocess(include: Path = ops) -> str:
            text = subprocess.run(["g++", "-E", "-P", f"-I{include}", str(tmp_path / "kernel.cpp")],
                                  capture_output=True, text=True, check=True).stdout
            return text.replace(str(include), "<include>")

        before = preprocess()
        assert toolchain.normalise_header_mtimes(venv) == 2
        outputs[name] = (before, preprocess())
    # unpacked within one second, the second header is skipped; a second apart, both are read
    assert outputs["fast"][0].count("namespace native") == 1 and outputs["slow"][0].count("namespace native") == 2
    assert outputs["fast"][1] == outputs["slow"][1]


def test_a_unit_counts_as_reused_only_when_every_cached_step_of_it_hit():
    """One nvcc compile is several cached steps and an outer object sccache cannot cache."""
    nvcc_steps = [("k.module_id", "cache hit"), ("k.compute_90.ptx", "cache hit"), ("k.compute_90.cubin", "cache hit"),
                  ("k.o", "cache hit"), ("k.o", "not cacheable")]
    assert cache_log.not_reused(nvcc_steps) == []
    assert cache_log.not_reused([*nvcc_steps[:2], ("k.compute_90.cubin", "cache miss"), *nvcc_steps[3:]]) == ["k"]
    assert cache_log.not_reused([("link.so", "not cacheable")]) == ["link"]  # nothing of it came from a cache
    assert cache_log.not_reused([("a.o", "cache miss (timed out)"), ("b.o", "cache hit")]) == ["a"]


def test_a_hit_rate_with_a_miss_never_reads_as_every_compile_served():
    """The GPU machine's all-nine cached sweep had 213 hits of 214: rounded to a whole percent that read "100%"."""
    assert cache_log.hit_share(213, 214) == "99.5%"
    assert cache_log.hit_share(999, 1000) == "99.9%" and cache_log.hit_share(9999, 10000) == "99.9%"
    assert cache_log.hit_share(38, 38) == "100.0%" and cache_log.hit_share(0, 6) == "0.0%"
    assert cache_log.hit_share(0, 0) == "-"


FIXTURE_TWO_PYTHONS = """\
build_matrix:
  - {arch: x86_64, cuda: "13.0.2", python: "3.12", torch: "2.13.0", cxx11_abi: "TRUE", torch_index: default}
  - {arch: x86_64, cuda: "13.0.2", python: "3.11", torch: "2.13.0", cxx11_abi: "TRUE", torch_index: default}
components:
  wheelhouse-fixture:
    source: {path: tests/fixtures/fixture_ext}
    ref: "0.1.0"
    builder: fixture
    wheel_packages: [wheelhouse-fixture]
    torch_cuda_arch_list: "9.0"
    runs_on: ubuntu-24.04
    max_jobs: 2
"""


@pytest.mark.slow
@pytest.mark.network
@pytest.mark.skipif(_sccache() is None or shutil.which("nvcc", path="/usr/local/cuda/bin") is None,
                    reason="needs sccache and nvcc")
def test_the_build_record_names_the_units_the_second_python_compiled_again(tmp_path):
    """The fixture built for Python 3.12, then 3.11, into one compiler cache, through ``ci.building.job.run``: its
    fixture.cpp includes Python's headers (torch/csrc/utils/pybind.h) and its fixture_cuda.cu does not. The
    second build's record names fixture alone: never a false hit for the unit with Python.h."""
    from benchmarks import cuda_torch
    from ci.model import matrix
    from ci.model.build_record import BuildRecord
    from ci.model.versions import load

    path = tmp_path / "versions.yaml"
    path.write_text(FIXTURE_TWO_PYTHONS)
    versions = load(path)
    rows = {row.python: row for row in matrix.expand(versions)}
    cache = tmp_path / "cache"
    environ = cuda_torch.build_environ(rows.values(), cache)
    misses = {}
    for python in ("3.12", "3.11"):
        options = job.BuildOptions(cache_dir=cache, dist_root=tmp_path / f"dist-{python}", environ=environ)
        record = BuildRecord.read(job.run(versions, rows[python], options).record)
        misses[python] = record.compiler_cache_misses
    assert misses == {"3.12": ["fixture", "fixture_cuda"], "3.11": ["fixture"]}


@pytest.mark.skipif(_sccache() is None or shutil.which("nvcc", path="/usr/local/cuda/bin") is None,
                    reason="needs sccache and nvcc")
def test_the_counts_are_per_translation_unit_and_the_steps_are_counted_apart(tmp_path):
    """Three nvcc units, compiled one at a time as a setuptools build without ninja does: sccache counts
    3 compile requests but 12 misses (four cached steps each), which the build reported as it was. The
    build's counts are per unit now; sccache's per step stay beside them."""
    nvcc = "/usr/local/cuda/bin/nvcc"
    tool = _sccache()
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", environ={})
    build_dir = tmp_path / "cache" / "builds" / "comp-x86_64-torch2.13.0-0123"
    src = build_dir / "src"
    src.mkdir(parents=True)
    counts = []
    for _ in range(2):
        _, cache_env = job._compiler_cache(options, build_dir, job._free_port())
        Path(cache_env["SCCACHE_ERROR_LOG"]).unlink(missing_ok=True)  # as the build does before its builder
        env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **cache_env}
        try:
            for unit in ("fwd", "bwd", "update"):
                (src / f"{unit}.cu").write_text(f"__global__ void {unit}(float* x) {{ x[threadIdx.x] *= 2; }}\n")
                subprocess.run([tool, nvcc, "-gencode", "arch=compute_90,code=sm_90", "-c", f"{unit}.cu", "-o",
                                f"{unit}.o"], cwd=src, env=env, check=True, capture_output=True)
            counts.append(job.sccache_stats(tool, env))
        finally:
            subprocess.run([tool, "--stop-server"], env=env, capture_output=True)
    cold, warm = counts
    assert {key: cold[key] for key in ("requests", "hits", "misses", "step_hits", "step_misses")} == \
        {"requests": 3, "hits": 0, "misses": 3, "step_hits": 0, "step_misses": 12}, cold
    assert {key: warm[key] for key in ("requests", "hits", "misses", "step_hits", "step_misses")} == \
        {"requests": 3, "hits": 3, "misses": 0, "step_hits": 12, "step_misses": 0}, warm


@pytest.mark.skipif(_sccache() is None or shutil.which("cmake") is None, reason="needs sccache and cmake")
def test_a_cmake_projects_compiles_go_through_the_cache_by_ninja(tmp_path):
    """TransformerEngine's common library is a CMake build inside its setup.py: it compiled with neither the
    cache nor (unless it chose it) ninja. CMake takes both from the builder's environment."""
    tool = _sccache()
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist",
                                 environ={"PATH": os.environ.get("PATH", "")})
    build_dir = tmp_path / "cache" / "builds" / "comp-x86_64-torch2.13.0-0123"
    project = build_dir / "src"
    project.mkdir(parents=True)
    (project / "CMakeLists.txt").write_text("cmake_minimum_required(VERSION 3.18)\nproject(common CXX)\n"
                                            "add_library(common SHARED a.cpp b.cpp)\n")
    for unit in ("a", "b"):
        (project / f"{unit}.cpp").write_text(f"int {unit}() {{ return 1; }}\n")
    _, cache_env = job._compiler_cache(options, build_dir, job._free_port())
    assert cache_env["CMAKE_CXX_COMPILER_LAUNCHER"] == tool and cache_env["CMAKE_CUDA_COMPILER_LAUNCHER"] == tool
    ninja_dir = str(Path(tool).parent)  # the tools' venv holds ninja beside sccache (requirements-tools.txt)
    env = {"PATH": os.pathsep.join([ninja_dir, "/usr/bin", "/bin"]), "HOME": str(tmp_path), **cache_env}
    try:
        subprocess.run(["cmake", "-S", ".", "-B", "out"], cwd=project, env=env, check=True, capture_output=True)
        subprocess.run(["cmake", "--build", "out"], cwd=project, env=env, check=True, capture_output=True)
        stats = job.sccache_stats(tool, env)
    finally:
        subprocess.run([tool, "--stop-server"], env=env, capture_output=True)
    assert (project / "out" / "build.ninja").is_file()
    units = {cache_log.translation_unit(out) for out, _ in cache_log.read_results(Path(cache_env["SCCACHE_ERROR_LOG"]))}
    assert stats is not None and stats["requests"] >= 2 and {"a", "b"} <= units, (stats, units)  # and CMake's probe
    # a generator the caller chose stays
    assert "CMAKE_GENERATOR" not in job._compiler_cache(
        job.BuildOptions(cache_dir=tmp_path / "c2", environ={"CMAKE_GENERATOR": "Unix Makefiles"}), build_dir, "1")[1]


NO_NINJA_SETUP = """\
import sys
from setuptools import setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

sys.exit(1)  # the test stops here: the build's warning came before the builder
setup(name="wheelhouse-fixture", ext_modules=[CppExtension("wheelhouse_fixture._C", ["csrc/fixture.cpp"])],
      cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)})
"""


def test_a_project_that_compiles_without_ninja_is_named_by_the_plan_and_the_build(tmp_path, caplog):
    import logging

    from ci.base.errors import WheelhouseError
    from ci.model import matrix
    from ci.model.versions import load

    src = tmp_path / "src"
    shutil.copytree(job.REPO_ROOT / "tests" / "fixtures" / "fixture_ext", src)
    (src / "setup.py").write_text(NO_NINJA_SETUP)
    # a component name of its own: its sources' fixed build path is not the fixture's, which other builds use
    versions_file = tmp_path / "versions.yaml"
    versions_file.write_text((job.REPO_ROOT / "tests" / "fixtures" / "versions.yaml").read_text()
                             .replace("  wheelhouse-fixture:", "  no-ninja-fixture:"))
    versions = load(versions_file)
    (row,) = matrix.expand(versions)
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", reuse_env=True,
                                 source=src, environ=dict(os.environ))
    said = "setup.py builds its torch extensions without ninja (use_ninja=False): they compile one unit at a time"
    assert f"  warning:        {said}" in job.plan(versions, row, options).render()
    caplog.set_level(logging.WARNING, logger="wheelhouse")
    with pytest.raises(WheelhouseError, match="exited with status"):
        job.run(versions, row, options)
    assert any(said in record.getMessage() for record in caplog.records)
    # the fixture as it is builds with ninja: no warning
    plain = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", environ={})
    assert "warning:" not in job.plan(versions, row, plain).render()


def test_the_build_says_when_torch_leaves_the_host_cpp_units_outside_the_cache(tmp_path):
    """torch 2.13 puts a compiler cache on PATH in front of c++ (``_wrap_compiler``); the GPU machine's torch 2.11
    runs c++ as it is, so TransformerEngine's 32 PyTorch-extension .cpp units never reached the served cache
    while its 79 CMake units did. Each way the .cpp units miss the build's sccache gets one line."""
    import torch

    torch_dir = Path(torch.__file__).parent
    sccache = "/opt/tools/sccache"
    no_ccache = {"PATH": str(tmp_path / "bin")}  # whatever this machine has installed
    assert compile_path.host_compile_warnings(torch_dir, sccache, no_ccache) == []
    # a torch without the wrapper: torch 2.13's own builder less the function that puts the cache in front
    older = tmp_path / "torch-older"
    (older / "utils").mkdir(parents=True)
    (older / "utils" / "cpp_extension.py").write_text(
        (torch_dir / "utils" / "cpp_extension.py").read_text().replace("_wrap_compiler", "_compiler"))
    (said,) = compile_path.host_compile_warnings(older, sccache, no_ccache)
    assert said.startswith("this torch's extension builder runs c++ with no compiler cache in front: the host C++ "
                           "units of torch extensions (.cpp) compile outside the build's sccache and its counts")
    (said,) = compile_path.host_compile_warnings(torch_dir, sccache, {**no_ccache, "TORCH_NO_COMPILER_WRAPPER": "1"})
    assert said.startswith("TORCH_NO_COMPILER_WRAPPER is set") and said.endswith("unset it")
    # torch takes ccache before sccache: one on the build's PATH takes the .cpp units
    tools = tmp_path / "tools"
    tools.mkdir()
    (tools / "ccache").write_text("#!/bin/sh\nexec \"$@\"\n")
    (tools / "ccache").chmod(0o755)
    (said,) = compile_path.host_compile_warnings(torch_dir, sccache, {"PATH": f"{tmp_path / 'bin'}:{tools}"})
    assert f"finds one on the build's PATH ({tools / 'ccache'})" in said and said.endswith("take ccache's directory off PATH")
    # ccache as the build's own cache, or none: nothing to say
    assert compile_path.host_compile_warnings(older, str(tools / "ccache"), {"PATH": str(tools)}) == []
    assert compile_path.host_compile_warnings(older, None, {}) == []


@pytest.mark.skipif(_sccache() is None, reason="needs sccache")
def test_with_torchs_wrapper_off_the_fixture_binding_compiles_outside_the_cache_and_the_build_says_so(tmp_path, caplog):
    """The real fixture build with TORCH_NO_COMPILER_WRAPPER=1, as torch 2.11 builds: its one .cpp unit makes no
    compile request (tests/test_build.py's plain build of it counts at least one), and the log says why."""
    import logging

    from ci.model import matrix
    from ci.model.build_record import BuildRecord
    from ci.model.versions import load

    versions = load(job.REPO_ROOT / "tests" / "fixtures" / "versions.yaml")
    (row,) = matrix.expand(versions)
    options = job.BuildOptions(cache_dir=tmp_path / "cache", dist_root=tmp_path / "dist", run_checks=False,
                               environ={**os.environ, "TORCH_NO_COMPILER_WRAPPER": "1", "FIXTURE_FORCE_CPU": "1"})
    caplog.set_level(logging.WARNING, logger="wheelhouse")
    record = BuildRecord.read(job.run(versions, row, options).record)
    assert record.compiler_cache_stats is not None and record.compiler_cache_stats["requests"] == 0, record
    assert any("TORCH_NO_COMPILER_WRAPPER is set, so torch puts no compiler cache in front of c++" in r.getMessage()
               for r in caplog.records)
