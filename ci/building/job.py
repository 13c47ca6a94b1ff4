"""Build one matrix row exactly as CI does: plan, then run.

``plan`` is pure apart from reading files: it says which interpreter, which
torch, which sources, which environment and which command. ``run`` carries
it out; both take the builder's environment from :func:`builder_environment`,
the plan with placeholders where only the build knows the value (a free port,
the bundle's interpreters, the caller's PATH). The build runs in phases
(interpreter, sources and build directory, environment, builder, checks,
placing the wheels) in a directory keyed by the row and its build-input
fingerprint:

    .cache/builds/<component>-<arch>-py<X.Y>-torch<T>-<fingerprint>/src    the sources, patched and built in
    .cache/builds/<...>/dist                                              wheels the script writes (DIST_DIR)

A build that times out or fails keeps that directory, and running the same
command again resumes in it; a different ref, script or setting has another
fingerprint and therefore another directory, so two refs never mix. Only a
build whose wheels pass the checks moves them to ``dist/<world>/`` with a JSON
build record beside them; on any failure dist/ is left untouched.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import platform
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from ci.base import log
from ci.base.digest import sha256_file
from ci.base.errors import UsageError, WheelhouseError
from ci.building import (
    build_place,
    compile_path,
    interpreter_state,
    orphans,
    remote_cache,
    reproducible,
    sbom,
    smoke,
    sources,
    stamp,
    toolchain,
)
from ci.checks import toolkit
from ci.formats import cache_log, ninja_log, rewrite
from ci.formats.archs import ArchList
from ci.model import build_record, credentials, fingerprint, jit_cache, matrix, shards
from ci.model.build_record import BuildRecord
from ci.model.manifest import WheelEntry
from ci.model.matrix import MatrixRow
from ci.model.versions import REPO_ROOT, Component, Versions
from ci.timing import shard_model, size_model


class BuildTimedOut(WheelhouseError):
    """The build reached its build_timeout: its directory and compiler cache hold what it compiled, and the
    same command resumes it (in CI, a re-run of the job restores both, see docs/ci.md)."""
_LOG = log.get("build")


@dataclass(frozen=True)
class BuildOptions:
    cache_dir: Path
    dist_root: Path = REPO_ROOT / "dist"
    reuse_env: bool = False
    source: Path | None = None
    torch_index: str | None = None
    run_checks: bool = True
    max_jobs: int | None = None
    """This machine's build jobs (WHEELHOUSE_MAX_JOBS), in place of the component's max_jobs."""
    shard: shards.ShardSpec | None = None
    """Build only this shard of the row (ci/model/shards.py): its modules go to dist/<world>/shards/, no wheel."""
    assemble: Path | None = None
    """Build the row's wheels from the shards in this directory (every one of them), compiling none."""
    environ: dict = field(default_factory=lambda: dict(os.environ), repr=False)


@dataclass(frozen=True)
class BuildPlan:
    row: MatrixRow
    interpreter: str
    torch_install: str
    source: str
    env: dict
    command: list[str]
    build_dir: Path
    dist_dir: Path
    timeout_s: int
    compiler_cache: str | None
    bundle_interpreters: tuple[str, ...] = ()
    shard: shards.ShardSpec | None = None
    """The one shard this build compiles (--shard); it leaves no wheel."""
    shards: str = ""
    """How the row is split (versions.yaml's shards, this build's --shard or --assemble) and what the time model
    says it needs; empty for a row that is not split."""
    warnings: tuple[str, ...] = ()
    """What in the sources keeps compiles serial or away from the cache (ci/building/compile_path.py)."""
    wheel_sizes: str = ""
    """The row's release assets and their predicted sizes (ci/timing/size_model.py)."""

    def render(self) -> str:
        lines = [
            f"build plan for {self.row.label}",
            f"  interpreter:    {self.interpreter}",
            f"  torch:          {self.torch_install}",
            f"  source:         {self.source}",
            f"  build dir:      {self.build_dir}  (kept on failure; rerun resumes)",
            f"  wheels to:      {self.dist_dir}",
            f"  timeout:        {self.row.settings.build_timeout} ({self.timeout_s} s)",
            f"  predicted:      {_predicted(self.row)}",
            f"  wheel sizes:    {self.wheel_sizes}",
            f"  compiler cache: {self.compiler_cache or 'none found (install sccache or ccache)'}",
        ]
        if self.row.bundle_pythons:
            lines.append(f"  bundle:         one wheel for Pythons {', '.join(self.row.bundle_pythons)}")
        if self.row.settings.arch_filter:
            lines.append(f"  arch filter:    nvcc compiles only {self.row.settings.torch_cuda_arch_list}")
        if self.shards:
            lines.append(f"  shards:         {self.shards}")
        lines += [f"  warning:        {warning}" for warning in self.warnings]
        lines.append("  environment:")
        lines += [f"    {key}={value}" for key, value in sorted(self.env.items())]
        lines.append(f"  command:        {shlex.join(self.command)}  (cwd: build dir/src, seen at "
                     f"{build_place.fixed_path(self.row.component, self.row.arch)} in a mount namespace of the "
                     f"build's own; in place where the kernel refuses one, see {build_place.SETTING})")
        lines.append(f"  reproducible:   {reproducible.describe_plan()}")
        checks = ["torch ABI", "Python coverage"]
        if self.row.settings.verify_wheel_archs and self.row.settings.torch_cuda_arch_list and self.row.cuda != "cpu":
            checks.append(f"CUDA archs {self.row.settings.torch_cuda_arch_list}")
        if self.shard is not None:
            lines.append(f"  then:           the shard's modules, each checked for a cubin of every arch it compiles for, "
                         f"and its manifest (sha256 and compile seconds of each) to dist/{self.row.world}/shards/")
            return log.redact("\n".join(lines))
        lines.append(f"  then:           {stamp.describe_plan(self.row)}")
        lines.append(f"                  wheel checks ({', '.join(checks)}), .metadata files, build record")
        if smoke.describe_plan(self.row):
            lines.append(f"                  {smoke.describe_plan(self.row)}")
        return log.redact("\n".join(lines))  # an index URL may carry its password


def _predicted(row: MatrixRow) -> str:
    from ci.timing import time_model

    prediction = time_model.predict(row)
    return prediction.describe() + " (ci/timing/time_model.py)" if prediction else "no timed build of this component yet"


@dataclass(frozen=True)
class BuildResult:
    wheels: tuple[Path, ...]
    record: Path
    """The build record; for a shard build (no wheel), the shard's manifest."""


def host_arch() -> str:
    machine = platform.machine()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine.lower(), machine)


def sccache_stats(tool: str, env: dict, *, settle_s: float = 60.0) -> dict[str, int] | None:
    """Compile requests, hits and misses of the sccache server ``env`` names, or None if it cannot say: per
    translation unit where the server's log says which (ci/formats/cache_log.py), and sccache's own per cached step
    (``step_hits``, ``step_misses``; ``remote_step_hits`` of a remote cache).

    sccache stores a compiled object after it answered the compile, and a server stopped before that
    loses it (one of six in a test against a remote): the counts are read once every miss has been
    stored or has failed to, waiting at most ``settle_s``, so the caller's stop loses nothing."""
    deadline = time.monotonic() + settle_s
    while True:
        stats = _read_stats(tool, env)
        if stats is None:
            return None
        misses = _total(stats, "cache_misses")
        stored = remote_cache.stored(stats, env)
        if stored >= misses or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    steps = {"step_hits": _total(stats, "cache_hits"), "step_misses": misses}
    counts = {"requests": int(stats.get("compile_requests", 0)), "hits": steps["step_hits"], "misses": misses, **steps}
    log = env.get("SCCACHE_ERROR_LOG")
    units = cache_log.unit_counts(cache_log.read_results(Path(log))) if log else None
    if units is not None:  # requests, hits and misses per translation unit; sccache's own per cached step
        counts |= units
    remote = remote_cache.remote_hits(stats)
    if remote is not None:  # of the steps' hits, those the remote level served (the local directory had not)
        counts["remote_step_hits"] = remote
    return counts


def _read_stats(tool: str, env: dict) -> dict | None:
    proc = subprocess.run([tool, "--show-stats", "--stats-format", "json"], env=env, capture_output=True, text=True)
    try:
        stats = json.loads(proc.stdout).get("stats", {})
    except (ValueError, AttributeError):
        return None
    return stats if isinstance(stats, dict) else None


def _total(stats: dict, key: str) -> int:
    return sum(int(v) for v in (stats.get(key) or {}).get("counts", {}).values())


def builder_path(filter_bin: Path | None, python: Path, cache_tool: str | None, inherited: str) -> str:
    """PATH for the builder: the nvcc arch filter (if any) first, then the row venv, the compiler cache (if any),
    then the caller's PATH."""
    entries = [str(filter_bin)] if filter_bin else []
    entries.append(str(python.parent))
    if cache_tool:
        entries.append(str(Path(cache_tool).parent))
    if inherited:
        entries.append(inherited)
    return os.pathsep.join(entries)


def _compiler_cache(options: BuildOptions, build_dir: Path, port: str,
                    site_packages: Sequence[Path | str] = (), *, remember: bool = True) -> tuple[str | None, dict]:
    """sccache (from requirements.txt) or ccache, and its environment; the build puts it on PATH.

    The build directory is the cache's base dir: compiles are keyed by paths relative to it, so
    a build in another fingerprint's directory (a new ref, a CI runner) still hits the cache.
    sccache also strips ``site_packages``: the row interpreter's, where torch's headers live (in a
    venv whose path names the Python), and those of the row's other Pythons' venvs, since an object
    fetched from the cache (a PTX with line info) names the headers of the Python that compiled it. A
    kernel that includes only torch's headers is then the same compile for every Python and hits; one
    that includes Python.h still misses, because the headers' text differs. The site-packages of earlier
    builds into the same cache are stripped too (``_site_packages_seen``; a plan, ``remember=False``, names
    them and writes nothing). sccache reads these settings when its server starts, so each build runs
    its own server on ``port`` and stops it afterwards.
    """
    path = options.environ.get("PATH", "")
    for tool in ("sccache", "ccache"):
        found = shutil.which(tool, path=path) or shutil.which(tool, path=str(Path(sys.executable).parent))
        if found:
            cache_root = str(options.cache_dir / "compiler-cache" / tool)
            if tool == "sccache":
                current = [str(p) for p in site_packages]
                seen = (_site_packages_seen(Path(cache_root), current) if remember
                        else [*current, "<site-packages of earlier builds into this cache>"])
                basedirs = os.pathsep.join(dict.fromkeys([str(build_dir), *seen]))
                # the build runs its own server with no idle shutdown (_start_sccache: one nvcc step can
                # outlast sccache's default 600 s without a request); this short one is for a server a
                # client starts itself, which only a compiler left running by a killed build does
                env = {"SCCACHE_DIR": cache_root, "SCCACHE_BASEDIRS": basedirs, "SCCACHE_SERVER_PORT": port,
                       "SCCACHE_IDLE_TIMEOUT": str(ORPHAN_SERVER_IDLE_S)}
                env |= _cmake_through(found, options.environ)
                remote = remote_cache.from_environment(options.environ)
                if remote is not None:  # its settings, never its credential (ci/building/remote_cache.py)
                    env |= remote.server_env
                if "SCCACHE_ERROR_LOG" not in options.environ:  # the server's per-compile results (ci/formats/cache_log.py)
                    env |= {"SCCACHE_LOG": cache_log.SERVER_LOG_FILTER,
                            "SCCACHE_ERROR_LOG": str(build_dir / cache_log.LOG_NAME)}
            else:
                if remote_cache.from_environment(options.environ) is not None:
                    raise UsageError(f"{remote_cache.SETTING} names a remote compiler cache, which needs sccache "
                                     f"(found only ccache at {found}); install requirements.txt, or set it to local")
                env = {"CCACHE_DIR": cache_root, "CCACHE_BASEDIR": str(build_dir)}
            return found, env
    return None, {}


ORPHAN_SERVER_IDLE_S = 60


def _cmake_through(tool: str, environ: dict) -> dict[str, str]:
    """A CMake project's compiles (TransformerEngine's common library) through the cache, by ninja: CMake takes
    its compiler launchers and generator from these variables unless the project sets its own (a project
    that chose a generator keeps it; a caller's CMAKE_GENERATOR is kept)."""
    env = {f"CMAKE_{language}_COMPILER_LAUNCHER": tool for language in ("C", "CXX", "CUDA")}
    ninja = shutil.which("ninja", path=str(Path(tool).parent)) or shutil.which("ninja", path=environ.get("PATH", ""))
    if ninja and "CMAKE_GENERATOR" not in environ:
        env["CMAKE_GENERATOR"] = "Ninja"
    return env


SITE_PACKAGES_SEEN = "site-packages-seen.txt"
SITE_PACKAGES_REMEMBERED = 64


def _site_packages_seen(cache_root: Path, current: list[str]) -> list[str]:
    """``current`` and then the site-packages of earlier builds that filled this compiler cache, newest first.

    A PTX compiled with line info names its headers' absolute paths, so the PTX an earlier build left in
    the cache names that build's venv; stripping only this build's venv from the ptxas step's input would
    miss every ptxas step (seen on the GPU machine with --reuse-env interpreters at two paths). The list is
    kept beside the cache, the newest SITE_PACKAGES_REMEMBERED, rewritten atomically: a lost race costs a
    miss, never a wrong hit (a header of other contents still changes the preprocessed text).
    """
    record = cache_root / SITE_PACKAGES_SEEN
    earlier = record.read_text().splitlines() if record.is_file() else []
    merged = list(dict.fromkeys([*current, *earlier]))[:SITE_PACKAGES_REMEMBERED]
    if merged != earlier:
        cache_root.mkdir(parents=True, exist_ok=True)
        partial = record.with_name(f"{record.name}.{os.getpid()}.partial")
        partial.write_text("".join(f"{path}\n" for path in merged))
        partial.replace(record)
    return merged


def _sibling_site_packages(options: BuildOptions, versions: Versions, row: MatrixRow, index: str | None) -> list[Path]:
    """site-packages of the pinned venvs of every Python of the row (same component, arch, CUDA, torch)."""
    rows = matrix.component_rows(versions, versions.component(row.component))
    return [options.cache_dir / "venvs" / toolchain.venv_key(other, index) / "lib" / f"python{other.python}" / "site-packages"
            for other in rows if (other.arch, other.cuda, other.torch) == (row.arch, row.cuda, row.torch)]


def _site_packages(python: str) -> str:
    """Where ``python`` installs packages (torch's headers live below it)."""
    return subprocess.run([python, "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True,
                          env=toolchain.interpreter_environment()).stdout.strip()


def _free_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return str(sock.getsockname()[1])


def _build_dir(options: BuildOptions, row: MatrixRow, config: dict) -> Path:
    """Where a row builds: keyed by its build inputs except the Python, so two refs or scripts never
    share one, and the Pythons of a component build at one path. nvcc writes the source's absolute
    path into its device steps (``--orig_src_file_name``), so the compiler cache reuses a kernel for
    another Python only at the same path. The directory's marker holds the full build config: a
    build resumes only its own Python's interrupted build."""
    shared = {key: value for key, value in config.items() if key not in ("python", "pythons")}
    digest = fingerprint.fingerprint(shared)
    split = f"-{options.shard.dir_name}" if options.shard is not None else ("-assembly" if options.assemble else "")
    return options.cache_dir / "builds" / f"{row.component}-{row.arch}-torch{row.torch}-{digest[:16]}{split}"


def _claim(build_dir: Path, row: MatrixRow) -> tuple[Path, IO[str]]:
    """(``build_dir``, its lock) or, while another Python's build holds it, a directory of this Python's
    own (which the compiler cache cannot share with the other Pythons). The lock ends with the process
    or when the returned file is closed."""
    locks = build_dir.parent.parent / "build-locks"  # beside builds/, which CI prunes and caches
    locks.mkdir(parents=True, exist_ok=True)
    holders = []
    for candidate in (build_dir, build_dir.with_name(f"{build_dir.name}-py{'-'.join(row.pythons)}")):
        lock = (locks / f"{candidate.name}.lock").open("a+")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            holders.append(_holder(lock.read()))
            lock.close()
            continue
        lock.seek(0)
        lock.truncate()
        lock.write(json.dumps({"pid": os.getpid(), "started": time.time()}))
        lock.flush()
        return candidate, lock
    raise WheelhouseError(f"{row.label}: another build of this row is running in {build_dir} ({'; '.join(holders)}); "
                          "wait for it to finish or stop it")


def _holder(text: str) -> str:
    """Who holds a build lock, from what the holder wrote into it."""
    try:
        holder = json.loads(text)
        started = float(holder["started"])
        pid = int(holder["pid"])
    except (ValueError, KeyError, TypeError):
        return "holder unknown"
    minutes = max(0, int((time.time() - started) // 60))
    return (f"pid {pid}, started {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(started))}, "
            f"running for {minutes} min")


@dataclass(frozen=True)
class BuilderEnvironment:
    """What the builder script runs with on top of the caller's environment (credentials withheld)."""

    variables: dict[str, str]
    """The environment contract (README), the compiler cache's settings, and PATH."""
    compiler_cache: str | None
    filter_bin: Path | None
    """Where the nvcc arch filter is linked as ``nvcc`` (first on PATH), when ``arch_filter`` is on."""


def builder_environment(versions: Versions, row: MatrixRow, options: BuildOptions, *, index: str | None, python: str,
                        build_dir: Path, site_packages: Path | str, port: str, bundle: tuple[str, ...],
                        inherited_path: str, revision: str, planning: bool = False) -> BuilderEnvironment:
    """The builder's environment, resolved once for the plan and for the build (``planning``: nothing is written).

    The plan passes what only the build can know as placeholders (``port="<a free port>"``, ``<python3.11>``
    for a bundle's interpreters, ``inherited_path="$PATH"``, the sources' ``revision``); the build passes the
    real values, so the two can differ in nothing else.
    """
    cache_tool, cache_env = _compiler_cache(options, build_dir, port,
                                            [site_packages, *_sibling_site_packages(options, versions, row, index)],
                                            remember=not planning)
    filter_bin = build_dir / "nvcc-filter-bin" if row.settings.arch_filter else None
    variables = _contract(row, python, build_dir / "dist", options, bundle)
    variables["SOURCE_REVISION"] = revision
    nvcc = toolkit.find_nvcc(options.environ)
    if nvcc is not None and row.cuda != "cpu":
        variables["CUDA_HOME"] = str(toolkit.cuda_home(nvcc))
    if filter_bin is not None and nvcc is not None:
        variables["WHEELHOUSE_REAL_NVCC"] = str(nvcc)
        variables["WHEELHOUSE_NVCC_ARCHS"] = str(row.settings.archs or "")
        variables["PYTORCH_NVCC"] = str(filter_bin / "nvcc")
    if cache_tool:
        variables.update(cache_env)
        if nvcc is not None and row.cuda != "cpu":
            # torch 2.13's extension builder puts a compiler cache found on PATH before c++ and nvcc, but
            # takes PYTORCH_NVCC as given; torch 2.11's puts it before neither (a flash-attention build on
            # the GPU machine made 0 compile requests). Naming it here caches nvcc under both.
            variables["PYTORCH_NVCC"] = f"{cache_tool} {variables.get('PYTORCH_NVCC', str(nvcc))}"
    variables["PATH"] = builder_path(filter_bin, Path(python), cache_tool, inherited_path)
    # the C/C++ compilers the builder finds, wrapped to put the prefix maps first (ci/building/reproducible.py)
    variables.update(reproducible.compiler_wrappers(build_dir / "compilers", {**options.environ, **variables},
                                                    write=not planning))
    return BuilderEnvironment(variables, cache_tool, filter_bin)


def arch_forms(archs: ArchList | None) -> dict[str, str]:
    """The arch list as builders use it, parsed once here so no builder parses it again: dotted
    (``WHEELHOUSE_ARCHS``: ``8.0;9.0a;10.0;12.0f``, as TORCH_CUDA_ARCH_LIST and flashinfer take it), as nvcc's
    numbers (``WHEELHOUSE_ARCHS_SM``: ``80;90a;100;120f``, flash-attention's and TransformerEngine's form), how
    many, whether +PTX was asked for, and whether any is older than Hopper (DeepEP's sm_80 patch). Empty for a
    component that sets its own gencodes."""
    if archs is None:
        return {}
    return {"WHEELHOUSE_ARCHS": ";".join(str(a) for a in archs.archs),
            "WHEELHOUSE_ARCHS_SM": ";".join(a.sm.removeprefix("sm_") for a in archs.archs),
            "WHEELHOUSE_ARCHS_COUNT": str(len(archs.archs)),
            "WHEELHOUSE_ARCHS_PTX": "1" if archs.ptx else "0",
            "WHEELHOUSE_ARCHS_PRE_HOPPER": "1" if any(a.major < 9 for a in archs.archs) else "0"}


def _contract(row: MatrixRow, python: str, dist: Path, options: BuildOptions, bundle: tuple[str, ...]) -> dict:
    """The variables every builder gets (README, "The build environment contract")."""
    s = row.settings
    env = {
        "COMPONENT": row.component,
        "REF": row.ref,
        "TARGET_ARCH": row.arch,
        "CUDA_VERSION": row.cuda,
        "PYTHON_VERSION": row.python,
        "TORCH_VERSION": row.torch,
        "TORCH_VISION_VERSION": row.torch_vision,
        "TORCH_AUDIO_VERSION": row.torch_audio,
        "TORCH_CUDA_ARCH_LIST": s.torch_cuda_arch_list or "",
        **arch_forms(s.archs),
        "WHEEL_PACKAGES": " ".join(s.wheel_packages),
        "MAX_JOBS": str(options.max_jobs or s.max_jobs),
        "NVCC_THREADS": str(s.nvcc_threads),
        "CXX11_ABI": row.cxx11_abi,
        "EXTRA_ENV": json.dumps(dict(s.extra_env), sort_keys=True),
        "DIST_DIR": str(dist),
        "WHEELHOUSE_ROOT": str(REPO_ROOT),
        "WHEELHOUSE_PYTHON": python,
        # `python -m ci` in a builder runs here: the row's venv holds torch and the build tools only, not the
        # wheelhouse's own requirements (jsonschema validates the shard manifests the jit-cache packs)
        "WHEELHOUSE_TOOLS_PYTHON": sys.executable,
        "PYTHONNOUSERSITE": "1",
        "PYTHONDONTWRITEBYTECODE": "1",  # a build leaves its interpreter's site-packages as they are
    }
    if s.rehost:
        env["REHOST_PACKAGES"] = " ".join(s.rehost)
    if options.shard is not None:
        env["WHEELHOUSE_SHARD"] = str(options.shard)
    if options.assemble is not None:
        env["WHEELHOUSE_ASSEMBLE"] = "1"
    env.update(s.extra_env)  # each key exported as itself: builders need no jq
    if bundle:
        env["WHEELHOUSE_BUNDLE_PYTHONS"] = " ".join(row.pythons)
        env["WHEELHOUSE_BUNDLE_INTERPRETERS"] = " ".join(bundle)
    return env


def _torch_index(row: MatrixRow, options: BuildOptions) -> str | None:
    return toolchain.torch_index(row, options.torch_index or options.environ.get("WHEELHOUSE_TORCH_INDEX"))


def _command(row: MatrixRow) -> list[str]:
    return ["bash", str(REPO_ROOT / "build_scripts" / f"{row.settings.builder}.sh")]


def plan(versions: Versions, row: MatrixRow, options: BuildOptions) -> BuildPlan:
    size_model.refuse_over_budget(row, versions_name=versions.path.name, dist_root=options.dist_root)
    component = versions.component(row.component)
    index = _torch_index(row, options)
    if options.reuse_env:
        interpreter = f"current interpreter {sys.executable} (--reuse-env; verified, nothing installed)"
        torch_install = f"none: verify torch {row.torch} / CUDA {row.cuda} / cxx11_abi {row.cxx11_abi}"
        python = sys.executable
        site_packages: Path | str = _site_packages(python)
    else:
        venv = options.cache_dir / "venvs" / toolchain.venv_key(row, index)
        interpreter = f"venv {venv} (Python {row.python}; reused when its pins match)"
        torch_install = shlex.join(toolchain.plan_install_command(row, venv, index))
        python = str(venv / "bin" / "python")
        site_packages = venv / "lib" / f"python{row.python}" / "site-packages"
    # The plan fetches nothing, so its build directory is keyed by the ref as written; the build
    # itself keys it by the revision the ref resolves to.
    build_dir = _build_dir(options, row, fingerprint.declared_config(versions, row, row.ref))
    bundle = tuple(f"<python{p}>" for p in row.bundle_pythons)
    environment = builder_environment(versions, row, options, index=index, python=python, build_dir=build_dir,
                                      site_packages=site_packages, port="<a free port>", bundle=bundle,
                                      inherited_path="$PATH",
                                      revision="<the commit, sdist sha256 or directory digest of the fetched sources>",
                                      planning=True)
    return BuildPlan(
        row=row,
        interpreter=interpreter,
        torch_install=torch_install,
        source=sources.describe_plan(component, options.source),
        env=environment.variables,
        command=_command(row),
        build_dir=build_dir,
        dist_dir=options.dist_root / row.world,
        timeout_s=row.settings.build_timeout_s,
        compiler_cache=_describe_cache(environment.compiler_cache, options.environ),
        bundle_interpreters=bundle,
        shard=options.shard,
        shards=_describe_shards(row, options),
        warnings=tuple(_compile_warnings(component, options)),
        wheel_sizes=size_model.predict(row, dist_root=options.dist_root).describe(),
    )


def _compile_warnings(component: Component, options: BuildOptions) -> list[str]:
    """The plan's warnings about the sources' own build, where it can read them without fetching."""
    if options.source is not None:
        return compile_path.warnings(options.source)
    return compile_path.warnings(REPO_ROOT / component.source.location) if component.source.kind == "path" else []


def _describe_cache(tool: str | None, environ: dict) -> str | None:
    """The plan's compiler cache line: the tool, and the remote store behind its directory if any."""
    remote = remote_cache.from_environment(environ)
    return f"{tool}; {remote.describe()}" if tool and remote is not None else tool


def _describe_shards(row: MatrixRow, options: BuildOptions) -> str:
    """The plan's shards line: the split, and the time model's count from the row's recorded module times."""
    if options.shard is None and options.assemble is None and row.settings.shards == 1:
        return ""
    if options.shard is not None:
        what = f"this build compiles shard {options.shard} only; it leaves no wheel but {shard_directory(row, options.dist_root)}/"
    elif options.assemble is not None:
        what = f"this build assembles the wheels from every shard in {options.assemble}, compiling none"
    else:
        what = f"versions.yaml splits the row into {row.settings.shards} (a build without --shard compiles all of them)"
    return f"{what}; {shard_model.plan_line(row, options.dist_root)}"


def shard_directory(row: MatrixRow, dist_root: Path) -> Path:
    """Where the shards of ``row`` built into ``dist_root`` go: ``dist/<world>/shards/<release tag>-<arch>``."""
    return dist_root / row.world / "shards" / f"{row.release_tag}-{row.arch}"


def run(versions: Versions, row: MatrixRow, options: BuildOptions) -> BuildResult:
    """Build ``row``; returns the checked wheels in dist/<world>/ and their build record.

    The phases: interpreter (pinned venv, verified), sources and the build directory, the builder's
    environment, the builder, the checks, and placing the wheels with their record. Each is a named step
    of the log with its duration (a folded group on GitHub Actions).
    """
    credentials.refuse_if_exposed_above(options.environ)
    size_model.refuse_over_budget(row, versions_name=versions.path.name, dist_root=options.dist_root)  # before hours
    with log.Steps(_LOG) as steps:
        return _run(versions, row, options, steps)


def _run(versions: Versions, row: MatrixRow, options: BuildOptions, steps: log.Steps) -> BuildResult:
    index = _torch_index(row, options)
    # the remote compiler cache's credential, read (and its file removed) before any third-party code runs
    remote = remote_cache.from_environment(options.environ)
    cache_secret = remote_cache.take_secret(options.environ, remote)
    # an incomplete set of shards is refused before anything is installed or fetched
    shard_set = shards.collect(options.assemble, how_to_build=_how_to_build_shard(row)) if options.assemble else None

    _git_source_reachable(versions, row, options)
    reused = " (this interpreter)" if options.reuse_env else ""
    steps.start(f"toolchain: Python {row.python}, torch {row.torch}{reused}", key="toolchain")
    # Everything in the block below runs third-party code (an sdist's setup.py, the builder, the project's
    # build): it gets the allow-listed environment, and must leave the interpreter as it found it.
    filtered = credentials.build_environment(options.environ, pass_env=row.settings.pass_env)
    if filtered.describe():
        _LOG.info(filtered.describe())
    with _interpreter(row, options, index) as (python, interpreter), \
            _interpreter_left_unchanged(row, options, interpreter):
        steps.start(f"sources: {sources.describe_plan(versions.component(row.component), options.source)}",
                    key="source")
        checkout = _fetch_sources(versions, row, options, python, interpreter, filtered.environ)
        for warning in compile_path.warnings(checkout.path):
            _LOG.warning(f"{row.label}: {warning}")
        config = fingerprint.build_config(row, checkout.revision, submodules=checkout.submodules)
        epoch = reproducible.source_date_epoch(checkout, options.cache_dir)  # the sources' own time
        build_dir, lock = _prepare_build_dir(options, row, checkout, config, epoch)
        if shard_set is not None:
            _take_shards(row, shard_set, fingerprint.fingerprint(config), build_dir / "shards")

        environment = builder_environment(
            versions, row, options, index=index, python=python, build_dir=build_dir,
            site_packages=interpreter.torch_dir.parent, port=_free_port(),
            bundle=tuple(str(toolchain.find_python(p)) for p in row.bundle_pythons),
            inherited_path=options.environ.get("PATH", ""), revision=checkout.revision,
        )

        steps.start(f"build: build_scripts/{row.settings.builder}.sh for {row.label}", key="build")
        builder_environ = {**filtered.environ, **environment.variables}
        for warning in compile_path.host_compile_warnings(interpreter.torch_dir, environment.compiler_cache,
                                                          builder_environ):
            _LOG.warning(f"{row.label}: {warning}")
        place = build_place.choose(build_dir / "src", row.component, row.arch, options.environ, builder_environ)
        _LOG.info(f"build place: {place.describe()}")
        # every Python's site-packages of the compile group, so the host compiles' flags are the same for each
        sites = [interpreter.torch_dir.parent, *_sibling_site_packages(options, versions, row, index)]
        builder_environ.update(reproducible.build_variables(
            builder_environ, epoch=epoch, source_dir=place.path, site_packages=sites,
            seed_path=build_place.fixed_path(row.component, row.arch)))
        server = ServerSettings(remote, cache_secret, options.environ)  # a remote's credential: its server's alone
        wheels, cache_stats, cache_misses = _run_builder(row, environment, builder_environ, build_dir, place, server,
                                                         want_wheels=options.shard is None)
        if options.shard is not None:
            result = _place_shard(row, options.shard, build_dir / "shards", fingerprint.fingerprint(config),
                                  steps.durations(), cache_stats, options.dist_root)
            shutil.rmtree(build_dir, ignore_errors=True)
            lock.close()
            return result
        _check_projects(row, wheels)
        # what is published and checked: the torch pin and the SBOM written into each wheel
        facts = sbom.build_facts(versions, row, checkout, interpreter, builder_environ)
        stamp.stamp_wheels(row, wheels, facts)
        for wheel in wheels:  # the last rewrite: sorted members, the sources' time, fixed modes
            rewrite.normalize_wheel(wheel, epoch)

    steps.start(f"checks: {len(wheels)} wheel(s), then dist/{row.world}/", key="checks")
    # against the torch found before the build: the build's interpreter is not started again
    # the build's own paths must not be where the wheel's import looks (ci/checks/paths.py)
    build_paths = (build_place.FIXED_BUILD_ROOT, str(build_dir), str(interpreter.torch_dir.parent))
    checks = _check_wheels(row, wheels, interpreter.torch_dir, build_paths) if options.run_checks else {"ran": False}
    if options.run_checks and row.settings.smoke_test:  # ci/building/smoke.py: the wheels installed and used, before dist/
        steps.start(f"smoke test: {len(row.settings.smoke_test)} command(s) in a fresh venv", key="smoke")
        smoked = smoke.run(row, wheels, cache_dir=options.cache_dir, index=index, environ=options.environ,
                           reuse=interpreter if options.reuse_env else None)
        checks["smoke_test"] = smoked.to_json() if smoked else None

    ninja_steps = ninja_log.slowest_steps(build_dir / "src")  # read before the build directory goes
    if ninja_steps["slowest"]:
        slowest = ninja_steps["slowest"][0]
        _LOG.info(f"slowest of {ninja_steps['steps']} ninja steps: {slowest['output']} ({slowest['seconds']:.0f} s)")
    record = BuildRecord(
        row=row.to_json(),
        fingerprint=fingerprint.fingerprint(config),
        build_config=config,
        source=checkout.describe(),
        toolchain={**interpreter.describe(), "build_place": place.summary()},
        compiler_cache=environment.compiler_cache,
        compiler_cache_stats=cache_stats,
        compiler_cache_misses=cache_misses,
        # the checks step is still running: its time so far, which is all of the checks
        durations={f"{phase}_s": round(seconds, 1) for phase, seconds in steps.durations().items()},
        checks=checks,
        wheels=tuple(WheelEntry(w.name, sha256_file(w), w.stat().st_size) for w in wheels),
        sbom=facts,
        ninja_steps=dict(ninja_steps),
        # a whole build's own shard records no cache counts: this build's stand for it
        modules=jit_cache.record_modules(build_dir / "shards", cache=cache_stats),
    )
    result = _place(row, wheels, record, options.dist_root)
    shutil.rmtree(build_dir, ignore_errors=True)
    lock.close()
    return result


@contextlib.contextmanager
def _interpreter(row: MatrixRow, options: BuildOptions,
                 index: str | None) -> Iterator[tuple[str, toolchain.Interpreter]]:
    """The pinned venv, held while the build runs in it, or the current interpreter with --reuse-env; verified
    either way."""
    with contextlib.ExitStack() as held:
        python = sys.executable if options.reuse_env else str(
            held.enter_context(toolchain.pinned_venv(row, options.cache_dir, index=index)))
        interpreter = toolchain.verify(python, row, env=options.environ)
        toolchain.check_cxx(options.environ)
        yield python, interpreter


def _git_source_reachable(versions: Versions, row: MatrixRow, options: BuildOptions) -> None:
    """A git source that cannot be reached ends the build before the toolchain is installed: a CUDA torch venv
    is gigabytes that an offline machine would download for nothing."""
    source = versions.component(row.component).source
    if source.kind != "git" or options.source is not None or options.assemble:
        return
    if sources.resolve_ref(source.location, "HEAD") is None:
        raise WheelhouseError(log.redact(
            f"{source.location} cannot be reached (git ls-remote), so its sources cannot be fetched; nothing was "
            "installed: offline or behind a firewall, serve it from a mirror (the README's 'Building offline or from a "
            "mirror'; WHEELHOUSE_TORCH_INDEX names a torch index), or build a checkout with --source DIR"))


def _fetch_sources(versions: Versions, row: MatrixRow, options: BuildOptions, python: str,
                   interpreter: toolchain.Interpreter, builder_environ: dict) -> sources.Checkout:
    """Clean sources of the row's ref (an sdist's build may need the toolkit to be found)."""
    fetch_env = dict(builder_environ)
    if interpreter.nvcc is not None and row.cuda != "cpu":
        fetch_env["CUDA_HOME"] = str(toolkit.cuda_home(interpreter.nvcc))
        fetch_env["PATH"] = os.pathsep.join([str(interpreter.nvcc.parent), fetch_env.get("PATH", "")])
    return sources.fetch(versions.component(row.component), options.cache_dir, python=python,
                         override=options.source, env=fetch_env)


def _prepare_build_dir(options: BuildOptions, row: MatrixRow, checkout: sources.Checkout,
                       config: dict, epoch: int) -> tuple[Path, IO[str]]:
    """(build directory, its lock): the interrupted build of this config resumed, else a fresh copy of the
    sources with their mtimes at ``epoch``; an empty ``dist/`` either way (wheels of an interrupted
    attempt are never trusted)."""
    build_dir, lock = _claim(_build_dir(options, row, config), row)
    stopped = build_place.stop_leftovers(build_dir)  # a SIGKILLed run's builder may still be compiling there
    if stopped:
        _LOG.info(f"stopped {len(stopped)} process(es) a killed build of {row.label} left running")
    src = build_dir / "src"
    marker = build_dir / ".incomplete"
    if marker.exists() and src.is_dir() and _marked_config(marker) == json.loads(json.dumps(config)):
        _LOG.info(f"resuming the interrupted build in {build_dir}")
    else:
        shutil.rmtree(build_dir, ignore_errors=True)
        build_dir.mkdir(parents=True)
        marker.write_text(json.dumps(config, sort_keys=True))
        ignore = shutil.ignore_patterns(*sources.LOCAL_IGNORE) if checkout.kind == "path" else shutil.ignore_patterns(".git")
        shutil.copytree(checkout.path, src, symlinks=True, ignore=ignore)
        reproducible.pin_source_times(src, epoch)  # not on a resume: its build outputs keep their times
    dist = build_dir / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    dist.mkdir()
    return build_dir, lock


def _run_builder(row: MatrixRow, environment: BuilderEnvironment, full_env: dict, build_dir: Path,
                 place: build_place.BuildPlace, settings: ServerSettings | None = None, *,
                 want_wheels: bool = True) -> tuple[list[Path], dict[str, int] | None, list[str] | None]:
    """Run build_scripts/<builder>.sh in its build place (the sources of ``build_dir``) under the contract; (its
    wheels, compiler cache counts, the translation units it could not reuse). A shard build (``want_wheels``
    false) leaves its shard in ``build_dir/shards/`` instead."""
    if environment.filter_bin is not None:
        _install_arch_filter(environment.filter_bin)
    cache_tool = environment.compiler_cache
    server_log = Path(full_env["SCCACHE_ERROR_LOG"]) if "SCCACHE_ERROR_LOG" in full_env else None
    if server_log is not None and server_log.is_relative_to(build_dir):
        server_log.unlink(missing_ok=True)  # a resumed build's log holds this run's compiles only
        server_log.parent.mkdir(parents=True, exist_ok=True)
    _LOG.info(f"building {row.label} in {place.path}")
    own_server = cache_tool is not None and "SCCACHE_SERVER_PORT" in environment.variables
    server = (_start_sccache(cache_tool, full_env, place, settings or ServerSettings())
              if own_server and cache_tool else None)
    try:
        code = build_place.run(place, _command(row), full_env, build_dir, row.settings.build_timeout_s,
                               join=server.pid if server is not None and place.private_namespace else None)
    finally:
        cache_stats, cache_misses = None, None
        if server is not None and cache_tool:  # this build's own server: its counts are this build's
            cache_stats = sccache_stats(cache_tool, full_env)
            _stop_sccache(cache_tool, full_env, server)
            if server_log is not None:
                results = cache_log.read_results(server_log)
                cache_misses = cache_log.not_reused(results) if results else None
    if cache_stats:
        _LOG.info(f"compiler cache: {cache_stats['requests']} compile requests, {cache_stats['hits']} hits, "
                  f"{cache_stats['misses']} misses")
    if cache_misses is not None:
        _LOG.info(f"compiled, not from the cache: {len(cache_misses)} translation unit(s)"
                  + (f": {', '.join(cache_misses[:10])}" + (" ..." if len(cache_misses) > 10 else "") if cache_misses else ""))
    if code == "timeout":
        raise BuildTimedOut(
            f"{row.label}: build did not finish within build_timeout {row.settings.build_timeout}; "
            f"run the same command again to resume from {build_dir}"
        )
    if code != 0:
        raise WheelhouseError(
            f"{row.label}: build_scripts/{row.settings.builder}.sh exited with status {code}; "
            f"see the log above (build dir kept for a resumed run: {build_dir})"
        )
    dist = build_dir / "dist"
    wheels = sorted(dist.glob("*.whl"))
    if not want_wheels:
        return wheels, cache_stats, cache_misses
    if not wheels:
        raise WheelhouseError(f"{row.label}: build_scripts/{row.settings.builder}.sh wrote no wheel to DIST_DIR")
    if row.settings.repair:
        wheels = _repair(wheels, f"{row.settings.repair}_{row.arch}", dist)
    return wheels, cache_stats, cache_misses


def _place(row: MatrixRow, wheels: list[Path], record: BuildRecord, dist_root: Path) -> BuildResult:
    """Move the checked wheels to dist/<world>/ with their .metadata, then write the build record (atomically)."""
    record_path = build_record.path_for(row, dist_root)
    out_dir = record_path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    placed = []
    for wheel in wheels:
        target = out_dir / wheel.name
        shutil.move(str(wheel), target)
        placed.append(target)
        _write_metadata(target)
    record.write(record_path)
    return BuildResult(tuple(placed), record_path)


def _how_to_build_shard(row: MatrixRow) -> str:
    return f"nox -s {row.session} -- --arch {row.arch} --torch {row.torch} --shard {{shard}}"


def _take_shards(row: MatrixRow, shard_set: shards.ShardSet, own: str, target: Path) -> None:
    """Copy (hard-link where possible) every shard into the build's ``shards/``, once they are shards of this
    very build: the same build inputs (fingerprint) as the assembly's own."""
    if shard_set.fingerprint != own:
        raise UsageError(f"{row.label}: the shards in {shard_set.directory} were built from other build inputs "
                         f"(fingerprint {str(shard_set.fingerprint)[:12]}, this build {own[:12]}): other sources, "
                         f"settings or builder; build them again ({_how_to_build_shard(row).format(shard='I/N')})")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    for path, _manifest in shard_set.shards:
        shutil.copytree(path, target / path.name, copy_function=_link_or_copy)


def _link_or_copy(source: str, destination: str) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _place_shard(row: MatrixRow, spec: shards.ShardSpec, built: Path, own: str, durations: dict[str, float],
                 cache: dict[str, int] | None, dist_root: Path) -> BuildResult:
    """Move the shard the builder left in ``built`` to dist/<world>/shards/<tag>-<arch>/, its manifest
    completed with the build's fingerprint and durations: whole, or not at all (a partial directory is
    renamed into place)."""
    source = built / spec.dir_name
    if not (source / shards.MANIFEST).is_file():
        raise WheelhouseError(f"{row.label}: build_scripts/{row.settings.builder}.sh left no shard {spec} in {built}; "
                              "does its builder build by shards? (versions.yaml shards: 1 builds it whole)")
    manifest = shards.ShardManifest.read(source)
    if manifest.spec != spec:
        raise WheelhouseError(f"{row.label}: the builder left shard {manifest.spec}, not {spec}")
    complete = shards.ShardManifest(spec, manifest.modules_sha256, manifest.modules, own,
                                    {f"{phase}_s": round(seconds, 1) for phase, seconds in durations.items()},
                                    cache)
    complete.write(source)
    parent = shard_directory(row, dist_root)
    parent.mkdir(parents=True, exist_ok=True)
    target, partial = parent / spec.dir_name, parent / f"{spec.dir_name}.partial"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.move(str(source), partial)
    shutil.rmtree(target, ignore_errors=True)
    partial.rename(target)
    _LOG.info(f"shard {spec}: {len(manifest.modules)} modules in {target}")
    return BuildResult((), target / shards.MANIFEST)


def _marked_config(marker: Path) -> dict | None:
    try:
        return json.loads(marker.read_text())
    except ValueError:
        return None


def _repair(wheels: list[Path], tag: str, dist: Path) -> list[Path]:
    """auditwheel repair to ``tag``; torch, CUDA, NCCL and NVSHMEM libraries stay outside the wheel."""
    from ci.base.errors import CheckFailed
    from ci.checks import audit

    repaired = []
    for wheel in wheels:
        try:
            fixed = audit.audit_repair(wheel, dist / "repaired", plat=tag)
        except CheckFailed as error:
            raise WheelhouseError(f"{error}; check versions.yaml's repair setting") from None
        wheel.unlink()
        repaired.append(fixed.replace(dist / fixed.name))
        _LOG.info(f"repaired {wheel.name} -> {fixed.name}")
    shutil.rmtree(dist / "repaired", ignore_errors=True)
    return repaired


def _install_arch_filter(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    link = bin_dir / "nvcc"
    link.unlink(missing_ok=True)
    link.symlink_to(REPO_ROOT / "build_scripts" / "nvcc-arch-filter")


SCCACHE_START_S = 30


@dataclass(frozen=True)
class ServerSettings:
    """What the build's sccache server gets beyond the cache's settings: a remote store and its credential."""

    remote: remote_cache.RemoteCache | None = None
    secret: dict[str, str] = field(default_factory=dict)
    environ: dict[str, str] = field(default_factory=dict)
    """The caller's environment: the few variables a server needs to start come from it."""


def _start_sccache(tool: str, env: dict, place: build_place.BuildPlace, settings: ServerSettings) -> subprocess.Popen:
    """The build's sccache server, in the foreground as a child of this process and in the build place (it
    reads the sources by the paths the compiler names): it ends when this process ends, SIGKILL included
    (the kernel sends it SIGTERM then), so no killed build leaves one running. A client that finds no
    server (a builder's compiler still running after a kill) starts its own, which ends after the idle time
    the builder's environment sets. It starts with the cache's settings only, and a remote's credential
    (ci/building/remote_cache.py), which nothing the builder runs can read."""
    with tempfile.TemporaryDirectory(prefix="wheelhouse-cache-server-") as private:  # 0700, gone once it started
        server_env = remote_cache.server_environment(env, settings.remote, settings.secret, settings.environ,
                                                     Path(private))
        server_env |= {"SCCACHE_NO_DAEMON": "1", "SCCACHE_START_SERVER": "1", "SCCACHE_IDLE_TIMEOUT": "0"}
        said = Path(private) / "server.out"  # why it did not start, if it does not
        with said.open("w") as out:
            server = build_place.spawn(place, [tool], server_env, end_with_parent=True, stdin=subprocess.DEVNULL,
                                       stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + SCCACHE_START_S
        while time.monotonic() < deadline and server.poll() is None:
            # the port, not sccache's client: a client that finds no server starts one itself, which would take
            # the port this one is about to listen on
            if _listening(env["SCCACHE_SERVER_PORT"]):
                return server
            time.sleep(0.1)
        _stop_sccache(tool, env, server)
        reason = _server_failure(said.read_text(errors="replace"), env.get("SCCACHE_ERROR_LOG"), SCCACHE_START_S)
    where = settings.remote.location if settings.remote is not None else f"port {env.get('SCCACHE_SERVER_PORT')}"
    raise WheelhouseError(f"the compiler cache's server did not start with {where} ({reason}); check "
                          f"{remote_cache.SETTING} and its credential, or build with {remote_cache.SETTING}=local")


def _server_failure(said: str, log: str | None, waited_s: int) -> str:
    """Why sccache's server did not start, in a line: its own error line (its log holds it when it says
    nothing), with the HTTP status of a store that refused it; never the store's whole answer."""
    text = said
    if log and Path(log).is_file():
        text += "\n" + Path(log).read_text(errors="replace")[-20000:]
    errors = re.findall(r"sccache: error: ([^\n<]*)", text) or re.findall(r"ERROR [^\]]*\] ([^\n<]*)", text)
    status = re.findall(r"status: (\d{3})", text)
    if not errors:
        return " ".join(said.split())[-300:] or f"nothing said in {waited_s} s"
    return errors[-1].strip().rstrip("=>").strip()[:300] + (f" (HTTP {status[-1]})" if status else "")


def _listening(port: str) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", int(port))) == 0


def _stop_sccache(tool: str, env: dict, server: subprocess.Popen) -> None:
    subprocess.run([tool, "--stop-server"], env=env, capture_output=True)
    try:
        server.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()



def _check_projects(row: MatrixRow, wheels: list[Path]) -> None:
    """The build code named the wheels: each must be a project the component publishes, with its METADATA's
    name and version (checked with or without --no-checks, before anything reaches dist/)."""
    from ci.base.errors import CheckFailed
    from ci.model import wheel_packages

    try:
        wheel_packages.check_all(wheels, row.component, wheel_packages.allowed(row.component, row.settings.wheel_packages))
    except CheckFailed as error:
        raise CheckFailed(f"{row.label}: {error}") from None


@contextmanager
def _interpreter_left_unchanged(row: MatrixRow, options: BuildOptions, interpreter: toolchain.Interpreter):
    """Raise, after the block (failed or not), when it changed what the build's interpreter, or the interpreter
    running this tool, reads at start (ci/building/interpreter_state.py: compared by contents, bin/ and pyvenv.cfg too).

    A file the build leaves there runs in every later start of that interpreter: the next builds that reuse the
    row's venv, and every command of this tool, some of them with a token (with --reuse-env they are one
    interpreter). Before comparing, every process the build left running is ended (ci/building/orphans.py), so nothing it
    started writes after the check. The row's venv is ours and is removed (the next build makes it again); from
    any other interpreter what the build added is removed and what it altered is renamed out of the way, so that
    nothing it wrote runs again.
    """
    environ = toolchain.interpreter_environment(options.environ)
    watched = [interpreter_state.start_paths(interpreter.python, environ)]
    if Path(sys.executable).resolve() != interpreter.python.resolve():
        watched.append(interpreter_state.start_paths(sys.executable, environ))
    skip = (options.cache_dir, options.dist_root, REPO_ROOT)
    before = interpreter_state.snapshot(watched, skip=skip)
    try:
        with orphans.adopted() as ended:
            yield
    finally:
        _refuse_changes(row, options, interpreter, interpreter_state.compare(
            before, interpreter_state.snapshot(watched, skip=skip)), ended)


def _refuse_changes(row: MatrixRow, options: BuildOptions, interpreter: toolchain.Interpreter,
                    changes: interpreter_state.Changes, ended: list[int]) -> None:
    # Bytecode is removed, not refused: Python compiles it again from the (compared) source, so removing it loses
    # nothing, and a .pyc planted to match its source's size and mtime never runs.
    for path in changes.bytecode:
        Path(path).unlink(missing_ok=True)
    if not changes:
        return
    venv = interpreter.python.parent.parent
    ours = not options.reuse_env and venv.parent == options.cache_dir / "venvs"
    outside = changes.outside(venv) if ours else changes
    done = interpreter_state.take_back(outside)
    if ended:
        done.append(f"ended {len(ended)} process(es) it left running")
    if ours:
        toolchain.mark_stale(venv)  # not removed here: another build may be running in it
    if ours and not outside:
        raise WheelhouseError(
            f"{row.label}: the build changed what its venv runs at start ({_listed(list(changes.found))}); the venv "
            f"{venv} is made again by the next build; a build must install nothing into its interpreter"
        )
    where = f"its venv (made again by the next build) and {sys.executable}" if ours else \
        str(interpreter.python if options.reuse_env else sys.executable)
    raise WheelhouseError(f"{row.label}: the build changed what {where} runs at every start: {'; '.join(done)}; "
                          "build without --reuse-env, in a shell that holds no token")


def _listed(paths: list[str], most: int = 5) -> str:
    return ", ".join(paths[:most]) + (f" and {len(paths) - most} more" if len(paths) > most else "")


def _check_wheels(row: MatrixRow, wheels: list[Path], torch_dir: Path, build_paths: tuple[str, ...]) -> dict:
    """Run the wheel checks against the build interpreter's torch; raise on failure."""
    from ci.checks import check

    require = row.settings.archs if row.settings.verify_wheel_archs and row.cuda != "cpu" else None
    report = check.check_wheels(wheels, torch_target=torch_dir, require_archs=require, pythons=list(row.pythons),
                                build_paths=build_paths, build_path_exceptions=row.settings.build_path_exceptions,
                                extra_cubins=row.settings.extra_cubins)
    if not report.ok:
        raise WheelhouseError(f"{row.label}: wheel checks failed: {'; '.join(report.problems)}")
    return json.loads(report.to_json())


def _write_metadata(wheel: Path) -> None:
    from ci.formats import metadata

    metadata.extract_metadata(wheel, wheel.parent)
