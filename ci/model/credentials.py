"""Credentials stay out of third-party code, by construction.

A build runs other people's code: a builder script, the project's setup.py or
CMake, an sdist's setup.py while pip downloads it, and git talking to whatever
host versions.yaml or an upstream's ``.gitmodules`` names. None of it needs our
tokens, and any of it could send them away. So:

- Third-party processes get an **allow-list** environment (:func:`build_environment`):
  only the variables named or prefixed in :data:`ALLOWED_NAMES` / :data:`ALLOWED_PREFIXES`
  pass, never one whose name says it is a credential (:func:`is_credential`), and the
  user and password of every URL in a value are removed (``PIP_INDEX_URL=https://u:p@host``
  arrives as ``https://host``). A component that really needs one more variable, or
  one verbatim (a private mirror's password, say), names it in ``pass_env``.
- git gets the same (:func:`git_environment`) with prompts off; its callers also
  disable credential helpers (:data:`GIT_NO_CREDENTIALS`).
- The processes above the build hold no credential either: ``/proc/<pid>/environ``
  shows a process's *initial* environment to any process of the same user, so
  deleting from ``os.environ`` is not enough. The build entry point re-executes
  itself without them (:func:`reexec_without_credentials`). A process above it that
  handed it a credential (``GITHUB_TOKEN=… timeout 600 nox …``: the ``timeout``)
  still holds it and cannot be cleared from here, so then nothing is built: a build
  refuses with one line naming that process (:func:`refuse_if_exposed_above`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.base import log
from ci.base.errors import UsageError

DENIED_NAMES = frozenset({
    "TOKEN", "PASSWORD", "SECRET",
    "GITHUB_TOKEN", "GH_TOKEN", "GH_ENTERPRISE_TOKEN", "GITHUB_ENTERPRISE_TOKEN", "GITHUB_JWT_TOKEN",
    "GITHUB_APP_PRIVATE_KEY",
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
    "AZURE_CLIENT_SECRET", "AZURE_STORAGE_KEY", "AZURE_STORAGE_CONNECTION_STRING",
    "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CREDENTIALS",
    "TWINE_USERNAME", "TWINE_PASSWORD", "PYPI_API_TOKEN", "UV_PUBLISH_PASSWORD", "UV_PUBLISH_TOKEN",
    "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "NPM_TOKEN", "NODE_AUTH_TOKEN", "CODECOV_TOKEN",
    "DOCKER_PASSWORD", "DOCKER_AUTH_CONFIG", "SSH_AUTH_SOCK", "GIT_ASKPASS", "SSH_ASKPASS",
    "GIT_CONFIG_COUNT", "GIT_CONFIG_PARAMETERS",
})
DENIED_PREFIXES = ("ACTIONS_", "GIT_CONFIG_KEY_", "GIT_CONFIG_VALUE_")
DENIED_SUFFIXES = ("_TOKEN", "_SECRET", "_PASSWORD", "_PASSWD", "_PAT", "_API_KEY", "_ACCESS_KEY", "_PRIVATE_KEY",
                   "_CREDENTIALS", "_AUTH", "_AUTH_CONFIG")

# What builds, sdist downloads and git may see: the basics of a process, the compilers and
# toolkits, pip's and uv's settings, proxies and CA bundles, the wheelhouse's own settings
# (WHEELHOUSE_BUILD_MEMORY_GIB, ...) and the CI flags. Everything else stays behind.
ALLOWED_NAMES = frozenset({
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TERM", "TZ", "TMPDIR", "TEMP", "TMP",
    "COLUMNS", "NO_COLOR", "FORCE_COLOR", "CLICOLOR", "CI", "GITHUB_ACTIONS", "RUNNER_TEMP",
    "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME",
    "CC", "CXX", "CUDAHOSTCXX", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS", "CPATH", "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH", "LIBRARY_PATH", "LD_LIBRARY_PATH", "PKG_CONFIG_PATH", "MAKEFLAGS", "MAX_JOBS",
    "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO",
    "GIT_CONFIG_GLOBAL", "GIT_CONFIG_SYSTEM", "GIT_CONFIG_NOSYSTEM",  # git's configuration files: a site's mirrors
    "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy",
    "PYENV_ROOT", "PYENV_VERSION", "PYTHONPATH", "PYTHONDONTWRITEBYTECODE",
    "SOURCE_DATE_EPOCH", "PYTHONHASHSEED",  # reproducible builds (ci/building/reproducible.py)
})
ALLOWED_PREFIXES = ("LC_", "CUDA_", "CUDNN_", "NVCC_", "NCCL_", "NVSHMEM_", "TORCH_", "CMAKE_", "NINJA_", "CCACHE_",
                    "SCCACHE_", "PIP_", "UV_", "WHEELHOUSE_")

# git's own settings on the command line: no credential helper (an empty value resets the
# list the user's and system's configuration built), no extra HTTP headers, no askpass.
# Set by the re-exec when a process above this one still holds a credential it dropped: names and a pid,
# never a value. Build entry points refuse on it (refuse_if_exposed_above); tests and lint run on.
EXPOSED_ABOVE = "WHEELHOUSE_CREDENTIALS_ABOVE"

GIT_NO_CREDENTIALS = ("-c", "credential.helper=", "-c", "http.extraHeader=", "-c", "core.askPass=")



def is_credential(name: str) -> bool:
    upper = name.upper()
    return upper in DENIED_NAMES or upper.startswith(DENIED_PREFIXES) or upper.endswith(DENIED_SUFFIXES)


def is_allowed(name: str) -> bool:
    return (name in ALLOWED_NAMES or name.startswith(ALLOWED_PREFIXES)) and not is_credential(name)


def strip_userinfo(value: str) -> str:
    """``value`` with the user and password of every URL in it removed."""
    return log.URL_USERINFO.sub(r"\1", value)


@dataclass(frozen=True)
class Filtered:
    """An environment for third-party code and what was kept from it, for the log."""

    environ: dict[str, str]
    withheld: tuple[str, ...]
    """Credentials by name (:func:`is_credential`) that were not passed."""
    unlisted: int
    """How many other variables were not passed (not on the allow-list)."""
    stripped: tuple[str, ...]
    """Variables passed with the credentials of their URLs removed."""

    def describe(self) -> str:
        """One log line: what the build does not get."""
        parts = []
        if self.withheld:
            parts.append(f"credentials {', '.join(self.withheld)}")
        if self.stripped:
            parts.append(f"the URL credentials in {', '.join(self.stripped)}")
        if self.unlisted:
            parts.append(f"{self.unlisted} variable(s) not on the allow-list (ci/model/credentials.py)")
        return (f"withholding from the build: {'; '.join(parts)} (pass_env in versions.yaml passes one)"
                if parts else "")


def build_environment(environ: Mapping[str, str], *, pass_env: Iterable[str] = ()) -> Filtered:
    """The allow-listed part of ``environ``, URL credentials removed; names in ``pass_env`` pass as they are."""
    passed = set(pass_env)
    kept: dict[str, str] = {}
    withheld, stripped, unlisted = [], [], 0
    for name, value in environ.items():
        if name in passed:
            kept[name] = value
        elif is_allowed(name):
            kept[name] = strip_userinfo(value)
            if kept[name] != value:
                stripped.append(name)
        elif is_credential(name):
            withheld.append(name)
        else:
            unlisted += 1
    return Filtered(kept, tuple(sorted(withheld)), unlisted, tuple(sorted(stripped)))


def git_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a git command that talks to third-party hosts: allow-listed, no prompts.

    Proxies keep their credentials here: git needs the proxy, and sends them only to it."""
    env = build_environment(environ).environ
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        if name in environ:
            env[name] = environ[name]
    return {**env, "GIT_TERMINAL_PROMPT": "0"}


def without_credentials(environ: Mapping[str, str], *, keep: Iterable[str] = ()) -> dict[str, str]:
    """``environ`` minus every credential by name (names in ``keep`` stay), for our own processes."""
    kept = set(keep)
    return {name: value for name, value in environ.items() if name in kept or not is_credential(name)}


def reexec_without_credentials(argv: Sequence[str], environ: Mapping[str, str], *, keep: Iterable[str] = ()) -> None:
    """Replace this process by ``argv`` run without credentials, when ``environ`` holds any; else return.

    A process's initial environment stays readable in ``/proc/<pid>/environ`` by every process of
    the same user, whatever ``os.environ`` becomes later: only a fresh exec clears it. The new
    process finds nothing to drop and goes on.
    """
    clean = without_credentials(environ, keep=keep)
    if clean.keys() == environ.keys():
        return
    exposed = exposed_above({name: value for name, value in environ.items() if name not in clean})
    if exposed:  # said by the code about to run builds (refuse_if_exposed_above): tests and lint go on
        pid, command, names = exposed[0]
        clean[EXPOSED_ABOVE] = (
            f"{', '.join(names)} {'is' if len(names) == 1 else 'are'} also in the environment of process {pid}"
            f" ({command}), which started this one:"
            f" code run from here could read it in /proc/{pid}/environ, so nothing is built; run this command"
            f" from a process without it (env -u {names[0]} …, or unset it in the shell or CI step that starts it)")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(argv[0], list(argv), clean)


def refuse_if_exposed_above(environ: Mapping[str, str]) -> None:
    """Before third-party code runs: refuse when a process above still holds a credential we dropped."""
    if environ.get(EXPOSED_ABOVE):
        raise UsageError(environ[EXPOSED_ABOVE])


def exposed_above(dropped: Mapping[str, str], *, proc: Path = Path("/proc")) -> list[tuple[int, str, tuple[str, ...]]]:
    """(pid, command line, names) of each ancestor whose initial environment holds one of ``dropped`` (name and value).

    Only what this process may read is found, which is exactly what code it starts (same user) may read.
    """
    wanted = {f"{name}={value}".encode(): name for name, value in dropped.items()}
    found: list[tuple[int, str, tuple[str, ...]]] = []
    pid = os.getppid()
    while pid > 1:
        folder = proc / str(pid)
        try:
            parent = int((folder / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        try:
            held = sorted({wanted[item] for item in (folder / "environ").read_bytes().split(b"\0") if item in wanted})
            command = " ".join((folder / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ").split())
        except OSError:  # another user's process: unreadable here, and so to the code we start
            held, command = [], ""
        if held:
            for value in dropped.values():  # `env GITHUB_TOKEN=… nox` holds it in its command line too
                command = log.mask(command, value)
            found.append((pid, log.redact(command)[:120], tuple(held)))
        pid = parent
    return found
