"""Where the builder runs: its sources at one fixed path, private to the one build, and how it is stopped.

nvcc writes each source's absolute path into device code (``-lineinfo``) and no flag remaps it
(ci/building/reproducible.py), so two machines build the same bytes only when the sources lie at the same path.
The build directory stays where it is, in the user's cache; the builder runs in a private mount
namespace in which a fresh tmpfs covers :data:`MOUNT_POINT` and the build directory's ``src`` is bound at
``/srv/wheelhouse-src/<component>-<arch>`` (:func:`fixed_path`). Nobody else sees that path, nothing is
shared between users or checkouts, nothing is moved, and nothing outlives the build's processes.

Where the kernel refuses a mount namespace (Docker's default seccomp profile; Ubuntu 24.04's AppArmor
restriction on unprivileged user namespaces, lifted by ``sysctl kernel.apparmor_restrict_unprivileged_userns=0``)
the fallback builds in place, in the build directory's ``src``: just as private, the host code the same
bytes (prefix maps), but device code with line info names the build directory, so two machines agree only
with the namespace. ``WHEELHOUSE_BUILD_PLACE`` chooses: ``namespace`` (the fallback is an error: CI sets it),
``in-place``, or unset (the namespace where it works, else the fallback, said in the log and the record).

The builder runs in a session of its own. A kill of the build stops that session: SIGTERM and SIGINT
through :func:`run`; a SIGKILL skips that, so each run records its builder's session in the build
directory and the next run of that directory first stops whatever of it still runs (:func:`stop_leftovers`).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from ci.base import log
from ci.base.errors import UsageError, WheelhouseError
from ci.checks.paths import FIXED_BUILD_ROOT

MOUNT_POINT = "/srv"
"""A root-owned directory every Linux distribution has (FHS), which no build reads: the namespace covers it
with its own tmpfs, so the fixed path below it needs nothing created on the machine and nobody can rename
it from outside (a mount point in a directory another user can write could be unmounted by them)."""
SETTING = "WHEELHOUSE_BUILD_PLACE"
CHOICES = ("namespace", "in-place")
BUILDER_RECORD = ".builder.json"
NAMESPACE = "private mount namespace"

_CLONE_NEWNS = 0x00020000
_CLONE_NEWUSER = 0x10000000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 0x2, 0x4, 0x1000, 0x4000, 0x40000
_STOP_WAIT_S = 10
_LOG = log.get("build")


def fixed_path(component: str, arch: str) -> Path:
    """Where the builder sees its sources in the namespace, the same on every machine."""
    return Path(FIXED_BUILD_ROOT) / f"{component}-{arch}"


@dataclass(frozen=True)
class BuildPlace:
    sources: Path
    """The build directory's ``src``: the only copy of the sources and of everything compiled there."""
    path: Path
    """Where the builder sees them: :func:`fixed_path`, or ``sources`` itself in place."""
    fallback: str | None = None
    """Why the build runs in place (None: in the private namespace)."""

    @property
    def private_namespace(self) -> bool:
        return self.fallback is None

    def summary(self) -> str:
        """For the build record: ``namespace <path>`` or ``in place: <why>``."""
        return f"namespace {self.path}" if self.fallback is None else f"in place: {self.fallback}"

    def describe(self) -> str:
        if self.fallback is None:
            return f"{self.path} ({NAMESPACE}: the build directory's src bound there, seen by this build alone)"
        return (f"{self.path} (in place: {self.fallback}; device code with line info names this path, so "
                "another machine's build of these sources differs there)")


def choose(sources: Path, component: str, arch: str, environ: Mapping[str, str],
           needed: Mapping[str, str] | None = None) -> BuildPlace:
    """The build place for ``sources``: the namespace where the kernel allows it and nothing the builder
    needs lies under :data:`MOUNT_POINT` (``needed``: the builder's environment), else the fallback, unless
    ``WHEELHOUSE_BUILD_PLACE`` says otherwise."""
    wanted = environ.get(SETTING, "").strip()
    if wanted and wanted not in CHOICES:
        raise UsageError(f"{SETTING}={wanted!r}: not a build place; use {' or '.join(CHOICES)}, or unset it to take "
                         "the namespace where the kernel allows it")
    if wanted == "in-place":
        return BuildPlace(sources, sources, f"{SETTING}=in-place")
    reason = _covered(needed or {}, sources) or namespace_refused()
    if reason is None:
        return BuildPlace(sources, fixed_path(component, arch))
    if wanted == "namespace":
        raise WheelhouseError(f"{SETTING}=namespace, but {reason}; allow user namespaces (on Ubuntu 24.04: sudo sysctl "
                              f"-w kernel.apparmor_restrict_unprivileged_userns=0) or unset {SETTING}")
    return BuildPlace(sources, sources, reason)


def _covered(needed: Mapping[str, str], sources: Path) -> str | None:
    """A path the builder needs that the namespace's tmpfs would cover, as the reason to build in place."""
    words = [str(sources), *(word for value in needed.values() for part in value.split(os.pathsep)
                             for word in part.split())]
    for word in words:
        if word == MOUNT_POINT or word.startswith(MOUNT_POINT + "/"):
            return f"the build needs {word}, which the namespace's own {MOUNT_POINT} would cover"
    return None


def namespace_refused() -> str | None:
    """Why this machine cannot give a build the namespace (None: it can), found by entering one once."""
    global _REFUSED
    if _REFUSED is _UNKNOWN:
        _REFUSED = _probe()
    return _REFUSED  # type: ignore[return-value]


_UNKNOWN = object()
_REFUSED: object = _UNKNOWN


def _probe() -> str | None:
    if not hasattr(os, "unshare") and not _libc_has("unshare"):
        return "this system has no unshare(2)"
    if not os.path.isdir(MOUNT_POINT) and os.getuid() == 0:
        os.makedirs(MOUNT_POINT, mode=0o755, exist_ok=True)  # the FHS directory, on a minimal image that lacks it
    if not os.path.isdir(MOUNT_POINT):
        return f"this machine has no {MOUNT_POINT} to mount the namespace's tmpfs on"
    with tempfile.TemporaryDirectory(prefix="wheelhouse-probe-") as scratch:
        place = BuildPlace(Path(scratch), fixed_path("probe", "any"))
        try:
            code = spawn(place, ["/bin/sh", "-c", "exit 0"], {"PATH": "/usr/bin:/bin"}, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL).wait()
        except WheelhouseError as error:
            return str(error)
    return None if code == 0 else f"a process in the namespace exited with status {code}"


def _libc_has(name: str) -> bool:
    return hasattr(ctypes.CDLL(None), name)


# --- entering the namespace (in the child, between fork and exec) ---------------------------------


def _enter(sources: str, target: str, uid: int, gid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    own_user_namespace = uid != 0  # root needs none, and keeps its own uid either way
    _call(libc.unshare(ctypes.c_int(_CLONE_NEWNS | (_CLONE_NEWUSER if own_user_namespace else 0))), "unshare")
    if own_user_namespace:
        for name, text in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as out:
                out.write(text)
    _mount(libc, None, "/", None, _MS_REC | _MS_PRIVATE, "making its mounts private")
    _mount(libc, "wheelhouse", MOUNT_POINT, "tmpfs", _MS_NOSUID | _MS_NODEV, f"a tmpfs on {MOUNT_POINT}", b"mode=0755")
    os.makedirs(target, mode=0o755)
    # opened here (a mount of the parent's namespace cannot be bound in this one), without following a link:
    # what is bound is the directory the parent checked
    sources_fd = os.open(sources, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_PATH", 0))
    _mount(libc, f"/proc/self/fd/{sources_fd}", target, None, _MS_BIND | _MS_REC, f"binding the sources at {target}")
    os.close(sources_fd)
    os.chdir(target)


def _call(result: int, what: str) -> None:
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _mount(libc: ctypes.CDLL, source: str | None, target: str, fstype: str | None, flags: int, what: str,
           data: bytes | None = None) -> None:
    result = libc.mount(source.encode() if source else None, target.encode(), fstype.encode() if fstype else None,
                        ctypes.c_ulong(flags), data)
    if result != 0:
        number = ctypes.get_errno()
        raise OSError(number, f"{what}: {os.strerror(number)}")


def _join(pid: int, target: str, uid: int) -> None:
    """Join the mount namespace (and user namespace, unless root) of process ``pid``, in ``target``."""
    libc = ctypes.CDLL(None, use_errno=True)
    kinds = ([("user", _CLONE_NEWUSER)] if uid != 0 else []) + [("mnt", _CLONE_NEWNS)]
    for kind, flag in kinds:
        fd = os.open(f"/proc/{pid}/ns/{kind}", os.O_RDONLY)
        try:
            _call(libc.setns(ctypes.c_int(fd), ctypes.c_int(flag)), f"joining the build's {kind} namespace")
        finally:
            os.close(fd)
    os.chdir(target)


def spawn(place: BuildPlace, command: list[str], env: Mapping[str, str], *, join: int | None = None,
          end_with_parent: bool = False, **popen: object) -> subprocess.Popen:
    """Start ``command`` in a session of its own, in ``place``: in the namespace a new one for the build, or the
    one process ``join`` is in (the build's compiler-cache server and its builder share one, so the server
    reads the sources where the compiler names them). ``end_with_parent``: SIGTERM when this process ends,
    however it ends (Linux's parent-death signal)."""
    if not place.private_namespace:
        return subprocess.Popen(command, cwd=place.sources, env=dict(env), start_new_session=True,
                                preexec_fn=_end_with_parent if end_with_parent else None,
                                **popen)  # type: ignore[call-overload]
    resolved = _own_directory(place.sources)
    target, uid, gid = str(place.path), os.getuid(), os.getgid()
    report_r, report_w = os.pipe()

    def in_child() -> None:
        try:
            if join is None:
                _enter(resolved, target, uid, gid)
            else:
                _join(join, target, uid)
            if end_with_parent:
                _end_with_parent()
        except BaseException as error:
            os.write(report_w, str(error).encode(errors="replace")[:500])
            raise

    try:
        return subprocess.Popen(command, env=dict(env), preexec_fn=in_child, start_new_session=True,
                                **popen)  # type: ignore[call-overload]
    except subprocess.SubprocessError:
        os.close(report_w)
        report_w = -1
        detail = os.read(report_r, 600).decode(errors="replace") or "no detail"
        raise WheelhouseError(f"the kernel refused the build a private mount namespace ({detail}); set "
                              f"{SETTING}=in-place to build without one") from None
    finally:
        os.close(report_r)
        if report_w >= 0:
            os.close(report_w)


def _end_with_parent() -> None:
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _own_directory(path: Path) -> str:
    """``path`` with its links resolved, once it is a directory of this user's that nobody else can write."""
    resolved = os.path.realpath(path)
    try:
        info = os.stat(resolved)
    except OSError as error:
        raise WheelhouseError(f"{path}: cannot read the sources ({error.strerror})") from None
    if not os.path.isdir(resolved) or info.st_uid != os.getuid() or info.st_mode & 0o002:
        raise WheelhouseError(f"{path}: the sources must be a directory of this user's that others cannot write "
                              f"(owner uid {info.st_uid}, mode {info.st_mode & 0o777:o}); build from a cache of your own")
    return resolved


# --- running the builder ---------------------------------------------------------------------------


class BuildStopped(KeyboardInterrupt):
    """SIGTERM reached the build (timeout(1), systemd, a CI cancel): it stops the builder like Ctrl-C does."""


def run(place: BuildPlace, command: list[str], env: Mapping[str, str], build_dir: Path, timeout_s: int, *,
        join: int | None = None) -> int | str:
    """Run the builder in its place (in the namespace of process ``join``, if given); its exit status, or
    ``"timeout"`` once ``timeout_s`` passed (its session stopped). Its session is recorded in ``build_dir``
    for :func:`stop_leftovers`.

    SIGINT and SIGTERM stop the builder's whole session (ninja and every compiler below it) before they end
    this process, so the build directory is left as the last compile left it: the next run resumes there."""
    with _terminate_as_interrupt():
        process = spawn(place, command, env, join=join)
        _write_record(build_dir, process.pid)
        try:
            return process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            stop_session(process.pid)
            process.wait()
            return "timeout"
        except KeyboardInterrupt:
            stop_session(process.pid)
            process.wait()
            raise


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    def interrupt(signum: int, frame: object) -> None:
        raise BuildStopped(f"stopped by signal {signum}")

    try:
        previous: Callable | int | None = signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: nobody here can install handlers
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stop_session(session: int, *, wait_s: float = _STOP_WAIT_S) -> list[int]:
    """SIGTERM to every process of ``session``, SIGKILL to what is left after ``wait_s``; the pids it found."""
    found = session_members(session)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_members(session):
            with suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + (wait_s if sig == signal.SIGTERM else 5)
        while session_members(session) and time.monotonic() < deadline:
            time.sleep(0.1)
        if not session_members(session):
            break
    return found


def session_members(session: int) -> list[int]:
    """Live processes (not zombies) whose session is ``session``."""
    members = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 3 and fields[0] != "Z" and int(fields[3]) == session:
            members.append(int(entry.name))
    return members


def _boot_id() -> str:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return ""


def _write_record(build_dir: Path, session: int) -> None:
    record = {"session": session, "boot_id": _boot_id(), "started": int(time.time())}
    partial = build_dir / f"{BUILDER_RECORD}.partial"
    partial.write_text(json.dumps(record))
    partial.replace(build_dir / BUILDER_RECORD)


def stop_leftovers(build_dir: Path) -> list[int]:
    """Stop what an earlier, killed run of this build directory left running (its builder's session: a SIGKILL
    skips every handler); the pids stopped. A session id is not reused while any process of it lives."""
    try:
        record = json.loads((build_dir / BUILDER_RECORD).read_text())
        session, boot = int(record["session"]), str(record["boot_id"])
    except (OSError, ValueError, KeyError, TypeError):
        return []
    if boot != _boot_id() or not session_members(session):
        return []
    started = time.strftime("%H:%M:%S", time.localtime(record.get("started", 0)))
    _LOG.warning(f"stopping what a killed build left running in {build_dir} (session {session}, started {started}): "
                 f"{len(session_members(session))} process(es)")
    return stop_session(session)
