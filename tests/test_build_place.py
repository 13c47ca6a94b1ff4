"""The build place (ci/building/build_place.py): the sources at one fixed path in a mount namespace of the build's own,
nothing shared between users or checkouts, nothing moved, and a killed build that resumes with what it compiled.

The kill tests run a real build (torch's extension builder, g++, ninja, sccache) in a process of its own and kill
that process the way the third adversarial round did (R6, R7, R15); the build holds on one translation unit
(a compiler that waits while a file exists) so the kill lands while the builder runs.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest
from fixture_versions import without_smoke_test

from ci.base.errors import UsageError, WheelhouseError
from ci.building import build_place, job
from ci.model import matrix
from ci.model.versions import load
from tests.test_build import HOLDING_CXX, _resumable_source

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"
NAMESPACE_REFUSED = build_place.namespace_refused()
needs_namespace = pytest.mark.skipif(NAMESPACE_REFUSED is not None, reason=f"no mount namespace here: {NAMESPACE_REFUSED}")
needs_compilers = pytest.mark.skipif(
    shutil.which("g++") is None or shutil.which("ninja", path=str(Path(sys.executable).parent)) is None,
    reason="needs g++ and ninja")


def _place(tmp_path: Path, component: str = "demo") -> build_place.BuildPlace:
    sources = tmp_path / "build" / "src"
    sources.mkdir(parents=True)
    (sources / "setup.py").write_text("print('these sources')\n")
    return build_place.choose(sources, component, "x86_64", {})


# --- where the builder runs ------------------------------------------------------------------------


@needs_namespace
def test_the_builder_sees_its_sources_at_one_fixed_path_that_only_its_build_sees(tmp_path):
    place = _place(tmp_path)
    assert place.private_namespace and place.path == Path("/srv/wheelhouse-src/demo-x86_64")
    script = f"ls > {tmp_path}/seen-files; pwd > seen-cwd; touch built-here; ls /srv > seen-srv"
    assert build_place.run(place, ["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}, tmp_path / "build", 30) == 0
    sources = place.sources
    assert (sources / "seen-cwd").read_text().strip() == "/srv/wheelhouse-src/demo-x86_64"
    assert (tmp_path / "seen-files").read_text().split() == ["setup.py"]
    assert (sources / "built-here").is_file()  # written through the bind: the build directory holds it
    assert (sources / "seen-srv").read_text().split() == ["wheelhouse-src"]  # the machine's /srv stays out of sight
    assert not Path("/srv/wheelhouse-src").exists()  # and nothing of the build is in the machine's
    record = json.loads((tmp_path / "build" / build_place.BUILDER_RECORD).read_text())
    assert record["session"] > 1 and record["boot_id"]


@needs_namespace
def test_two_builds_of_one_component_at_once_each_have_the_fixed_path_to_themselves(tmp_path):
    """One fixed path, two builds at the same moment (two checkouts, two users): neither waits for the other
    (the old shared directory made the second wait without limit, R8) and each sees only its own sources."""
    places = [_place(tmp_path / name) for name in ("one", "two")]
    for name, place in zip(("one", "two"), places, strict=True):
        (place.sources / "mine").write_text(name)
    script = "sleep 2; (cat mine; echo; pwd) > seen"
    started = time.monotonic()
    processes = [build_place.spawn(place, ["/bin/sh", "-c", script], {"PATH": "/usr/bin:/bin"}) for place in places]
    assert [process.wait(timeout=30) for process in processes] == [0, 0]
    assert time.monotonic() - started < 4  # side by side
    for name, place in zip(("one", "two"), places, strict=True):
        assert (place.sources / "seen").read_text().split() == [name, "/srv/wheelhouse-src/demo-x86_64"]


def _python_for(uid: int) -> str | None:
    """An interpreter user ``uid`` may run (this one's may lie in a directory only its owner can enter)."""
    for candidate in (sys.executable, "/usr/bin/python3"):
        probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", candidate, "-c", "0"],
                               capture_output=True)
        if probe.returncode == 0:
            return candidate
    return None


NOBODY = 65534


@pytest.mark.skipif(os.getuid() != 0 or shutil.which("setpriv") is None,
                    reason="needs root to run a second user (setpriv)")
def test_a_second_user_gets_the_fixed_path_in_a_namespace_of_their_own(tmp_path, request):
    """R8: the old canonical root, made first by one user, gave every other user's build a PermissionError
    traceback. Here another user builds while this user's build holds the same fixed path."""
    python = _python_for(NOBODY)
    if python is None:
        pytest.skip("no interpreter the second user may run")
    theirs = Path(tempfile.mkdtemp(prefix="wheelhouse-second-user-"))  # pytest's own directory is root's alone
    request.addfinalizer(lambda: shutil.rmtree(theirs, ignore_errors=True))
    (theirs / "build" / "src").mkdir(parents=True)
    (theirs / "build" / "src" / "mine").write_text("the second user's sources\n")
    shutil.chown(theirs, NOBODY, NOBODY)
    for path in theirs.rglob("*"):
        shutil.chown(path, NOBODY, NOBODY)
    theirs.chmod(0o755)
    ours = _place(tmp_path / "ours")
    holding = build_place.spawn(ours, ["/bin/sh", "-c", "sleep 30"], {"PATH": "/usr/bin:/bin"})
    try:
        script = textwrap.dedent(f"""\
            import sys
            sys.path.insert(0, {str(REPO)!r})
            from pathlib import Path
            from ci.building import build_place
            place = build_place.choose(Path({str(theirs / 'build' / 'src')!r}), "demo", "x86_64", {{}})
            print(place.describe())
            code = build_place.run(place, ["/bin/sh", "-c", "pwd; cat mine; id -u"], {{"PATH": "/usr/bin:/bin"}},
                                   Path({str(theirs / 'build')!r}), 30)
            print("exit", code)
        """)
        result = subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", python, "-c",
                                 script], capture_output=True, text=True, cwd=theirs, timeout=60)
    finally:
        build_place.stop_session(holding.pid)
        holding.wait()
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stdout.splitlines()
    assert "private mount namespace" in lines[0], lines
    assert lines[1:] == ["/srv/wheelhouse-src/demo-x86_64", "the second user's sources", str(NOBODY), "exit 0"]


def test_sources_behind_a_link_or_that_others_can_write_are_not_bound(tmp_path):
    """R1: a path another user can write or redirect never becomes the build's working directory."""
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "build" / "src"
    link.parent.mkdir()
    link.symlink_to(real)
    if NAMESPACE_REFUSED is None:  # a link is resolved once and its target checked, then bound by what it was
        place = build_place.choose(link, "demo", "x86_64", {})
        assert build_place.run(place, ["/bin/sh", "-c", "pwd > cwd"], {"PATH": "/usr/bin:/bin"}, tmp_path, 30) == 0
        assert (real / "cwd").read_text().strip() == str(place.path)
    real.chmod(0o777)
    with pytest.raises(WheelhouseError, match=r"must be a directory of this user's that others cannot write"):
        build_place.spawn(build_place.BuildPlace(link, build_place.fixed_path("demo", "x86_64")), ["true"], {})


def test_the_place_setting_is_one_of_two_and_a_required_namespace_is_never_given_up_silently(tmp_path):
    sources = tmp_path / "src"
    sources.mkdir()
    forced = build_place.choose(sources, "demo", "x86_64", {build_place.SETTING: "in-place"})
    assert forced.path == sources and not forced.private_namespace and "in-place" in forced.describe()
    with pytest.raises(UsageError, match=r"WHEELHOUSE_BUILD_PLACE='chroot': not a build place; use namespace or in-place"):
        build_place.choose(sources, "demo", "x86_64", {build_place.SETTING: "chroot"})
    # a builder that needs a path under /srv cannot have the namespace's tmpfs there: in place, or refused
    needed = {"CUDA_HOME": "/srv/cuda-13.0"}
    fallback = build_place.choose(sources, "demo", "x86_64", {}, needed)
    assert fallback.path == sources and "the build needs /srv/cuda-13.0" in fallback.fallback
    with pytest.raises(WheelhouseError, match=r"WHEELHOUSE_BUILD_PLACE=namespace, but the build needs /srv/cuda-13.0"):
        build_place.choose(sources, "demo", "x86_64", {build_place.SETTING: "namespace"}, needed)


def test_in_place_the_builder_runs_in_the_build_directory(tmp_path):
    sources = tmp_path / "build" / "src"
    sources.mkdir(parents=True)
    place = build_place.choose(sources, "demo", "x86_64", {build_place.SETTING: "in-place"})
    assert build_place.run(place, ["/bin/sh", "-c", "pwd > cwd"], {"PATH": "/usr/bin:/bin"}, tmp_path / "build", 30) == 0
    assert (sources / "cwd").read_text().strip() == str(sources)


# --- kills ----------------------------------------------------------------------------------------

DRIVER = """\
import sys
sys.path.insert(0, {repo!r})
from pathlib import Path
from ci.building import job
from ci.base import log
from ci.model import matrix
from ci.model.versions import load
log.configure()
versions = load(Path({versions!r}))
row = matrix.expand(versions)[0]
options = job.BuildOptions(cache_dir=Path({cache!r}), dist_root=Path({dist!r}), reuse_env=True,
                             source=Path({source!r}))
job.run(versions, row, options)
"""


def _driver(tmp_path: Path, cache: Path, source: Path, hold: Path, compiles: Path, *, place: str = ""):
    cxx = tmp_path / "holding-cxx"
    cxx.write_text(HOLDING_CXX)
    cxx.chmod(0o755)
    versions = tmp_path / "versions.yaml"  # the held sources are not the fixture's: its smoke test does not apply
    versions.write_text(without_smoke_test())
    script = DRIVER.format(repo=str(REPO), versions=str(versions), cache=str(cache),
                           dist=str(tmp_path / "dist"), source=str(source))
    env = {**os.environ, "CXX": str(cxx), "WHEELHOUSE_TEST_HOLD": str(hold), "WHEELHOUSE_TEST_COMPILES": str(compiles)}
    if place:
        env[build_place.SETTING] = place
    return [sys.executable, "-c", script], env


def _wait_for(condition, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _sccache_servers(cache: Path) -> list[int]:
    """Processes that are sccache servers of this cache: ``sccache`` with no argument (a client names the
    compiler), whose environment names the cache's directory."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if len(argv) != 2 or not argv[0].endswith(b"sccache") or argv[1]:
                continue
            if str(cache).encode() in (entry / "environ").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found


@needs_compilers
@pytest.mark.parametrize("sig,place", [(signal.SIGKILL, ""), (signal.SIGTERM, ""), (signal.SIGKILL, "in-place")],
                         ids=["sigkill", "sigterm", "sigkill-in-place"])
def test_a_killed_build_resumes_with_what_it_compiled_and_leaves_nothing_running(tmp_path, sig, place):
    """R6, R7, R15: the old build moved its sources to a shared directory for the build's duration; a SIGKILL or
    SIGTERM stranded them there with every object compiled, and the next run deleted them. Now they never move:
    the next run stops what the killed one left running, resumes in the build directory and compiles only the
    unit the first did not finish; no compiler-cache server outlives the kill."""
    source = _resumable_source(tmp_path)
    cache, hold, compiles = tmp_path / "cache", tmp_path / "hold", tmp_path / "compiles"
    command, env = _driver(tmp_path, cache, source, hold, compiles, place=place)
    hold.touch()
    log = tmp_path / "first.log"  # a file, not a pipe: what a SIGKILL leaves running would hold a pipe open
    with log.open("w") as out:
        first = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=out)
    _wait_for(lambda: compiles.exists() and "quick.cpp" in compiles.read_text(), "quick.cpp to compile")
    (build_dir,) = (cache / "builds").iterdir()
    record = json.loads((build_dir / build_place.BUILDER_RECORD).read_text())
    _wait_for(lambda: any((build_dir / "src").rglob("quick.o")), "quick.o")
    time.sleep(1)  # the compiler is holding on held.cpp
    first.send_signal(sig)  # the build process alone, as the OOM killer or timeout(1) would
    assert first.wait(timeout=120) != 0
    stderr = log.read_text()
    if sig == signal.SIGTERM:  # stopped the builder's session itself, like Ctrl-C
        assert build_place.session_members(record["session"]) == [], stderr[-2000:]
    _wait_for(lambda: not _sccache_servers(cache), "the build's sccache server to end", timeout=30)
    assert (build_dir / "src" / "setup.py").is_file() and list((build_dir / "src").rglob("quick.o"))
    assert (build_dir / ".incomplete").is_file()

    compiles.unlink()
    # what the kill left running still holds on the old file; this run's compiler holds on nothing
    second = subprocess.run(command, env={**env, "WHEELHOUSE_TEST_HOLD": str(tmp_path / "not-held")},
                            capture_output=True, text=True, timeout=600)
    hold.unlink()
    assert second.returncode == 0, second.stderr[-3000:]
    assert f"resuming the interrupted build in {build_dir}" in second.stderr
    if sig == signal.SIGKILL:  # its compiler was still holding: the second run stopped it first
        assert "process(es) a killed build of wheelhouse-fixture" in second.stderr, second.stderr[-3000:]
    assert compiles.read_text().split() == ["held.cpp"]  # quick.cpp was not compiled again
    assert build_place.session_members(record["session"]) == []
    assert not _sccache_servers(cache)
    assert list((tmp_path / "dist").rglob("*.whl"))


# --- the old shared directory, attacked as in the third round ----------------------------------------


OLD_ROOT = Path("/tmp/wheelhouse-src")


@needs_compilers
@pytest.mark.skipif(os.getuid() != 0, reason="needs root to plant another user's directory")
def test_another_users_directory_at_the_old_shared_path_cannot_reach_a_build(tmp_path):
    """R1: the old builds moved their sources into a fixed directory of the shared temporary directory and
    trusted whatever was there: a user who made it first ran code in the victim's build, truncated the victim's
    file through the lock's symbolic link and received the sources. A build now never looks there."""
    if OLD_ROOT.exists() or OLD_ROOT.is_symlink():
        pytest.skip(f"{OLD_ROOT} exists on this machine (another checkout's build of the old code made it)")
    victim = tmp_path / "victim-home" / ".bashrc"
    victim.parent.mkdir()
    victim.write_text("precious settings\n")
    attacker = tmp_path / "mal"
    attacker.mkdir()
    (attacker / "setup.py").write_text(f"open({str(tmp_path / 'PWNED')!r}, 'w').write('attacker code ran')\n")
    OLD_ROOT.mkdir(mode=0o777)
    try:
        OLD_ROOT.chmod(0o777)
        (OLD_ROOT / "wheelhouse-fixture-x86_64.lock").symlink_to(victim)
        (OLD_ROOT / "wheelhouse-fixture-x86_64").symlink_to(attacker)
        for path in (OLD_ROOT, OLD_ROOT / "wheelhouse-fixture-x86_64.lock", OLD_ROOT / "wheelhouse-fixture-x86_64"):
            os.lchown(path, NOBODY, NOBODY)
        source = _resumable_source(tmp_path)
        command, env = _driver(tmp_path, tmp_path / "cache", source, tmp_path / "no-hold", tmp_path / "compiles")
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    finally:
        shutil.rmtree(OLD_ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    assert victim.read_text() == "precious settings\n"
    assert not (tmp_path / "PWNED").exists()
    assert sorted(p.name for p in attacker.iterdir()) == ["setup.py"]  # the victim's sources never went there
    assert list((tmp_path / "dist").rglob("wheelhouse_fixture-*.whl"))


# --- a build's own lock: a clear line that names the holder -----------------------------------------


def test_a_build_of_a_row_already_building_twice_names_the_builds_that_hold_it(tmp_path):
    versions = load(FIXTURE_VERSIONS)
    (row,) = matrix.expand(versions)
    build_dir = tmp_path / "cache" / "builds" / "demo"
    first = job._claim(build_dir, row)
    second = job._claim(build_dir, row)
    try:
        with pytest.raises(WheelhouseError) as refused:
            job._claim(build_dir, row)
        message = str(refused.value)
        assert f"another build of this row is running in {build_dir}" in message
        assert f"pid {os.getpid()}, started " in message and "running for " in message
    finally:
        first[1].close()
        second[1].close()
