"""Fetch a component's sources: a git ref, an sdist release, or a local directory.

Git checkouts are cached by (url, ref) under the cache directory and made
clean on every use (reset, clean -ffdx, submodules too), so a build never sees
files from an earlier ref. Fetches are shallow and retried: the anchor met
transient "shallow file has changed" failures and flaky proxies.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import shutil
import signal
import subprocess
import tarfile
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.utils import canonicalize_name

from ci.base import log
from ci.base.digest import sha256_file
from ci.base.errors import WheelhouseError
from ci.formats.archive import unsafe_member
from ci.model import credentials, naming
from ci.model.versions import REPO_ROOT, Component

FETCH_ATTEMPTS = 4
LS_REMOTE_TIMEOUT_S = 60.0
"""ls-remote answers in a second or two; one still silent after a minute waits on something that will not
come (a host that accepts and never replies, a helper reading a descriptor), and `invoke plan` must end."""
_LOG = log.get("sources")


@dataclass(frozen=True)
class Checkout:
    """A clean source tree ready to copy into a build directory."""

    path: Path
    kind: str
    location: str
    ref: str
    revision: str
    """git commit, sdist sha256, or a digest of the directory's files."""
    submodules: tuple[str, ...] | None = None
    """git: the only submodules checked out, when the component names them."""

    def describe(self) -> dict:
        described: dict[str, object] = {"kind": self.kind, "location": self.location, "ref": self.ref, "revision": self.revision}
        if self.submodules is not None:
            described["submodules"] = list(self.submodules)
        return described


def _git_command(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """git talks to hosts that versions.yaml and upstreams' .gitmodules name: it gets no credential (an
    allow-listed environment, credential helpers off) and never prompts. The user's and the system's git
    configuration still apply: that is where a site points github.com at its mirror (insteadOf)."""
    return ["git", *credentials.GIT_NO_CREDENTIALS, *args], credentials.git_environment(os.environ)


def _git(args: list[str], cwd: Path | None = None, *, check: bool = True,
         timeout: float | None = None) -> subprocess.CompletedProcess:
    command, env = _git_command(args)
    result = _run_bounded(command, cwd=cwd, env=env, timeout=timeout)
    if check and result.returncode != 0:
        raise subprocess.CalledProcessError(result.returncode, command, result.stdout, result.stderr)
    return result


def _run_bounded(command: list[str], *, cwd: Path | None, env: dict, timeout: float | None) -> subprocess.CompletedProcess:
    """``command``'s exit status and output, without stdin (git must never wait for input). Past
    ``timeout`` seconds (or on Ctrl-C) its whole process group is killed, the remote helpers and ssh that
    git started included, and the exception raised."""
    with subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except BaseException:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _git_streamed(args: list[str], cwd: Path) -> log.Streamed:
    """A long git command (fetch, submodule update) with its output and progress shown as it comes."""
    command, env = _git_command(args)
    return log.stream(command, cwd=cwd, env=env, logger=_LOG)


def resolve_ref(url: str, ref: str, *, timeout: float = LS_REMOTE_TIMEOUT_S) -> str | None:
    """The commit ``ref`` points at, without cloning (``git ls-remote``); a SHA resolves to itself."""
    if _looks_like_sha(ref):
        return ref
    # `--` ends git's options: a URL or ref such as `--upload-pack=<command>` would run that command.
    try:
        result = _git(["ls-remote", "--", url, ref, f"refs/tags/{ref}^{{}}", f"refs/heads/{ref}"], check=False,
                      timeout=timeout)
    except subprocess.TimeoutExpired:
        raise WheelhouseError(log.redact(f"git ls-remote {url} {ref} did not answer within {timeout:g} s; check the "
                                         "URL and the network, then re-run")) from None
    if result.returncode != 0:
        return None
    lines = [line.split("\t") for line in result.stdout.splitlines() if "\t" in line]
    peeled = [sha for sha, name in lines if name.endswith("^{}")]
    return (peeled or [sha for sha, _ in lines] or [None])[0]


def _looks_like_sha(ref: str) -> bool:
    return len(ref) == 40 and all(c in "0123456789abcdef" for c in ref)


def fetch_git(url: str, ref: str, cache_dir: Path, *, submodules: bool | tuple[str, ...],
              component: str = "") -> Checkout:
    """A clean shallow checkout of ``ref``; ``submodules``: all (True), none, or only these paths."""
    key = hashlib.sha256(url.encode()).hexdigest()[:12]
    path = cache_dir / "sources" / "git" / f"{key}-{naming.sanitize_ref(ref)}"
    if not (path / ".git").is_dir():
        shutil.rmtree(path, ignore_errors=True)
        path.mkdir(parents=True)
        _git(["init", "-q"], path)
        _git(["remote", "add", "--", "origin", url], path)
    last_error = ""
    for attempt in range(1, FETCH_ATTEMPTS + 1):
        _LOG.info(f"fetching {url} {ref}" + (f" (attempt {attempt} of {FETCH_ATTEMPTS})" if attempt > 1 else ""))
        result = _git_streamed(["fetch", "--progress", "--depth", "1", "--", "origin", ref], path)
        if result.returncode == 0:
            break
        last_error = result.last_line
        if any(text in result.text() for text in ("couldn't find remote ref", "not our ref", "not found", "invalid refspec")):
            where = f"components.{component}.ref" if component else "ref"
            raise WheelhouseError(f"{where}: '{ref}' not found in {url}; use an existing branch, tag or commit")
        time.sleep(min(2**attempt, 10))
    else:
        raise WheelhouseError(log.redact(f"git fetch {url} {ref} failed {FETCH_ATTEMPTS} times: {last_error}; "
                                         "check the URL and network"))
    _git(["checkout", "-q", "--detach", "--force", "FETCH_HEAD"], path)
    _git(["clean", "-q", "-ffdx"], path)
    # A cached checkout may hold submodules that another selection fetched: start from none.
    _git(["submodule", "deinit", "-q", "--force", "--all"], path)
    named = isinstance(submodules, tuple)
    selected = _selected_submodules(path, submodules, url, ref, component) if isinstance(submodules, tuple) else ()
    if submodules:
        _git(["submodule", "sync", "-q", "--recursive"], path)
        _LOG.info(f"fetching the submodules of {url} {ref}" + (f": {', '.join(selected)}" if selected else ""))
        result = _git_streamed(["submodule", "update", "--progress", "--init", "--recursive", "--force", "--depth", "1",
                                "--", *selected], path)
        if result.returncode != 0:
            raise WheelhouseError(log.redact(f"git submodule update in {url} {ref} failed: {result.last_line}; "
                                             "check the submodule URLs and the network, then re-run"))
        _git(["submodule", "foreach", "-q", "--recursive", "git clean -q -ffdx && git reset -q --hard"], path)
    revision = _git(["rev-parse", "HEAD"], path).stdout.strip()
    return Checkout(path, "git", url, ref, revision, selected if named else None)


def _selected_submodules(path: Path, wanted: tuple[str, ...], url: str, ref: str, component: str) -> tuple[str, ...]:
    """``wanted``, each checked to be a submodule of the checkout (a typo must not build without it)."""
    gitlinks = [line.split("\t", 1)[1] for line in _git(["ls-files", "-s"], path).stdout.splitlines()
                if line.startswith("160000 ")]
    unknown = [p for p in wanted if p.strip("/") not in gitlinks]
    if unknown:
        where = f"components.{component}.source.submodules" if component else "source.submodules"
        raise WheelhouseError(
            f"{where}: {', '.join(unknown)} is not a submodule of {url} at {ref}; "
            f"its submodules are: {', '.join(gitlinks) or 'none'}"
        )
    return tuple(p.strip("/") for p in wanted)


def sdist_downloads(cache_dir: Path) -> Path:
    """Where downloaded sdists are kept (inputs, checked by their sha256; never build state)."""
    return cache_dir / "sources" / "sdist"


def fetch_sdist(name: str, version: str, cache_dir: Path, *, python: str, expected_sha256: str | None = None,
                env: dict | None = None) -> Checkout:
    """Download ``name==version`` as an sdist from the package index and unpack it.

    pip prepares the sdist's metadata while downloading, which runs its
    setup.py: ``env`` carries the build environment (CUDA_HOME) that many
    CUDA projects' setup.py need even for that. A downloaded archive is cached
    and never fetched again.
    """
    downloads = sdist_downloads(cache_dir)
    downloads.mkdir(parents=True, exist_ok=True)
    archives = _sdist_archives(downloads, name, version)
    if not archives:
        _LOG.info(f"downloading the sdist {name}=={version}")
        result = log.stream(
            [python, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
             "-d", str(downloads), "--", f"{name}=={version}"],
            env=env, logger=_LOG,
        )
        archives = _sdist_archives(downloads, name, version)
        if result.returncode != 0 and not archives:
            raise WheelhouseError(log.redact(
                f"sdist {name}=={version} could not be downloaded: {result.last_line[:200]}; check the name and "
                f"version, or put the archive into {downloads}"
            ))
    archive = archives[0]
    sha256 = sha256_file(archive)
    if expected_sha256 and sha256 != expected_sha256:
        raise WheelhouseError(
            f"sdist {archive.name}: sha256 {sha256} does not match source.sha256 {expected_sha256}; "
            "the release changed or the pin is wrong"
        )
    target = cache_dir / "sources" / "unpacked" / f"{canonicalize_name(name)}-{version}-{sha256[:12]}"
    if not target.is_dir():
        staging = target.with_name(target.name + ".tmp")
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        _unpack(archive, staging)
        roots = [p for p in staging.iterdir() if p.is_dir()]
        (roots[0] if len(roots) == 1 else staging).rename(target)
        shutil.rmtree(staging, ignore_errors=True)
    return Checkout(target, "sdist", name, version, sha256)


def _sdist_archives(folder: Path, name: str, version: str) -> list[Path]:
    stems = {f"{name}-{version}", f"{name.replace('-', '_')}-{version}"}
    return sorted(p for p in folder.iterdir() if any(p.name.startswith(s + ".") for s in stems))


def _unpack(archive: Path, dest: Path) -> None:
    dest = dest.resolve()
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                reason = unsafe_member(info)
                if reason:
                    raise WheelhouseError(f"{archive.name}: member {info.orig_filename!r} {reason}; refusing the "
                                          "archive (nothing extracted)")
            zf.extractall(dest)
        return
    with tarfile.open(archive) as tf:
        tf.extractall(dest, filter="data")


# Build leftovers in a local source directory are not sources: they must not
# change the fingerprint nor be copied into a build.
LOCAL_IGNORE = (".git", "build", "dist", "__pycache__", "*.egg-info", "*.so", ".eggs")


def _ignored(relative: Path) -> bool:
    return any(fnmatch.fnmatch(part, pattern) for part in relative.parts for pattern in LOCAL_IGNORE)


def local_directory(path: Path) -> Checkout:
    path = path.resolve()
    if not path.is_dir():
        raise WheelhouseError(f"--source {path}: not a directory; pass the path of a source checkout")
    digest = hashlib.sha256()
    for file in sorted(p for p in path.rglob("*") if p.is_file() and not _ignored(p.relative_to(path))):
        digest.update(str(file.relative_to(path)).encode() + b"\0")
        digest.update(hashlib.sha256(file.read_bytes()).digest())
    return Checkout(path, "path", str(path), "local", digest.hexdigest())


def fetch(component: Component, cache_dir: Path, *, python: str, override: Path | None = None,
          env: dict | None = None) -> Checkout:
    """The clean sources of ``component`` (or of ``override``, a local checkout)."""
    if override is not None:
        return local_directory(Path(override))
    source = component.source
    if source.kind == "git":
        return fetch_git(source.location, component.ref, cache_dir, submodules=source.submodules, component=component.name)
    if source.kind == "sdist":
        return fetch_sdist(source.location, component.ref, cache_dir, python=python, expected_sha256=source.sha256,
                           env=env)
    return local_directory(REPO_ROOT / source.location)


def describe_plan(component: Component, override: Path | None = None) -> str:
    if override is not None:
        return f"local directory {override}"
    source = component.source
    if source.kind == "git":
        if source.selected_submodules:
            subs = f" with submodules {', '.join(source.selected_submodules)}"
        else:
            subs = " with submodules" if source.submodules else ""
        return f"git {source.location} @ {component.ref} (shallow{subs}, cleaned)"
    if source.kind == "sdist":
        pin = f", sha256 {source.sha256}" if source.sha256 else ""
        return f"sdist {source.location}=={component.ref} from the package index{pin}"
    return f"repository directory {source.location}"
