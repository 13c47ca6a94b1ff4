"""The compiler cache's remote store: which one (a setting), who may write to it, and how its credential
reaches sccache's server and nothing else.

Settings, from the environment (a store's workflow sets them; a maintainer exports them):

- ``WHEELHOUSE_COMPILER_CACHE``: ``local`` (the default: the cache directory alone), ``gha`` (GitHub's cache
  service, in the generated workflows) or ``webdav+https://[user@]host[:port]/path`` (``webdav+http://`` on a
  trusted network; any WebDAV server: WsgiDAV, nginx, bazel-remote, ccache's HTTP storage) for self-hosted
  runners and maintainers. The remote is the second level behind the local directory
  (``SCCACHE_MULTILEVEL_CHAIN=disk,<remote>``): a hit there is copied into the directory.
- ``WHEELHOUSE_COMPILER_CACHE_MODE``: ``read-only`` (the default) or ``read-write``. Only a build whose inputs
  are on the default branch writes (the generated workflows decide it from the event, docs/ci.md); a pull
  request's build, a tag's and a maintainer's without the setting read only, so nothing they compile can
  be served to a release build.
- ``WHEELHOUSE_COMPILER_CACHE_SECRET_FILE``: a file of ``key=value`` lines, the credential: ``password=``
  (with the user of the URL) or ``token=`` for WebDAV; ``results_url=`` and ``runtime_token=`` for ``gha``
  (a workflow step writes them from the job's own ``ACTIONS_RESULTS_URL``/``ACTIONS_RUNTIME_TOKEN``).

The credential never reaches the builder (README, "Credentials and the compiler cache"): the build reads
the file and removes it before any third-party code runs (an sdist's setup.py included), and starts its
own sccache server before the builder with only the cache's settings, the WebDAV credential in a
configuration file of a private directory that is removed once the server has started. The builder's
compiles talk to that server over its port; its environment, its files and ``/proc/<server>/environ``
hold no credential. sccache takes the GitHub cache's token from its environment only, so there the
server's ``/proc/<pid>/environ`` holds it (readable by a process of the same user): the README says
what bounds that.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from ci.base.errors import UsageError

SETTING = "WHEELHOUSE_COMPILER_CACHE"
MODE = "WHEELHOUSE_COMPILER_CACHE_MODE"
SECRET_FILE = "WHEELHOUSE_COMPILER_CACHE_SECRET_FILE"
READ_ONLY, READ_WRITE = "read-only", "read-write"
KEY_PREFIX = "wheelhouse"
"""Where the objects lie on the remote (sccache's key prefix); one namespace for every component: an
object's key is the hash of its compile, so components that compile the same unit share it."""
GHA_VERSION = "wheelhouse-1"
"""The GitHub cache's namespace (SCCACHE_GHA_VERSION): a new value starts an empty cache."""
_SECRET_KEYS = {"webdav": ({"password"}, {"token"}), "gha": ({"results_url", "runtime_token"},)}
_MAX_SECRET_BYTES = 64 * 1024
# What the server needs of the caller's environment to start: nothing else reaches it (a compile runs with
# the environment its client sends, the builder's).
_SERVER_BASICS = ("PATH", "HOME", "TMPDIR", "LANG", "LC_ALL", "SSL_CERT_FILE", "SSL_CERT_DIR")


@dataclass(frozen=True)
class RemoteCache:
    backend: str
    """``gha`` or ``webdav``."""
    location: str
    """Where, for the log and the plan (no credential): the WebDAV URL, or GitHub's cache service."""
    writable: bool
    endpoint: str = ""
    username: str | None = None
    server_env: dict[str, str] = field(default_factory=dict)
    """The cache's settings for the build's server (no credential; the endpoint is in its configuration file):
    the builder may see them too."""

    def describe(self) -> str:
        mode = READ_WRITE if self.writable else READ_ONLY
        return (f"remote {self.location} ({mode}; its credential, from {SECRET_FILE}, goes to the build's sccache "
                "server only)")

    def server_config(self, secret: Mapping[str, str]) -> str:
        """sccache's configuration file for the server: the WebDAV endpoint with its credential (TOML)."""
        if self.backend != "webdav":
            return ""
        # the mode too: sccache takes SCCACHE_WEBDAV_RW_MODE only beside an endpoint from its environment
        lines = ["[cache.webdav]", f"endpoint = {_toml(self.endpoint)}", f"key_prefix = {_toml(KEY_PREFIX)}",
                 f'rw_mode = "{"READ_WRITE" if self.writable else "READ_ONLY"}"']
        if "token" in secret:
            lines.append(f"token = {_toml(secret['token'])}")
        elif "password" in secret:
            lines += [f"username = {_toml(self.username or '')}", f"password = {_toml(secret['password'])}"]
        return "\n".join(lines) + "\n"

    def server_secret_env(self, secret: Mapping[str, str]) -> dict[str, str]:
        """What sccache reads from its environment only: the GitHub cache's URL and token."""
        if self.backend != "gha" or not secret:
            return {}
        return {"ACTIONS_RESULTS_URL": secret["results_url"], "ACTIONS_RUNTIME_TOKEN": secret["runtime_token"],
                "ACTIONS_CACHE_SERVICE_V2": "true"}


def _toml(value: str) -> str:
    """A TOML basic string."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in escaped) + '"'


def from_environment(environ: Mapping[str, str]) -> RemoteCache | None:
    """The remote compiler cache the environment names; None for ``local`` or no setting; a UsageError
    naming the variable and the fix for anything else."""
    value = environ.get(SETTING, "").strip()
    mode = environ.get(MODE, READ_ONLY).strip() or READ_ONLY
    if mode not in (READ_ONLY, READ_WRITE):
        raise UsageError(f"{MODE}={mode!r}: not {READ_ONLY} or {READ_WRITE}; builds whose inputs are on the "
                         f"default branch write ({READ_WRITE}), every other build reads ({READ_ONLY}, the default)")
    if value in ("", "local"):
        return None
    writable = mode == READ_WRITE
    rw = "READ_WRITE" if writable else "READ_ONLY"
    if value == "gha":
        return RemoteCache("gha", "GitHub's cache service", writable, server_env={
            **_levels("gha"), "SCCACHE_GHA_ENABLED": "on", "SCCACHE_GHA_VERSION": GHA_VERSION,
            "SCCACHE_GHA_RW_MODE": rw, MODE: mode})
    if value.startswith(("webdav+https://", "webdav+http://")):
        return _webdav(value, writable)
    raise UsageError(f"{SETTING}={value!r}: not a compiler cache this build knows; set local, gha or "
                     "webdav+https://[user@]host[:port]/path")


def _webdav(value: str, writable: bool) -> RemoteCache:
    parts = urlsplit(value.removeprefix("webdav+"))
    if parts.password is not None:
        raise UsageError(f"{SETTING}: the URL holds a password, which the builder would see; put password=... in "
                         f"the file {SECRET_FILE} names and only the user in the URL")
    if not parts.hostname or any(ch in value for ch in " \"'<>\r\n\t"):
        raise UsageError(f"{SETTING}={value!r}: not a WebDAV URL; write webdav+https://[user@]host[:port]/path")
    netloc = parts.netloc.rsplit("@", 1)[-1]
    endpoint = urlunsplit((parts.scheme, netloc, parts.path or "/", "", ""))
    return RemoteCache("webdav", f"WebDAV {endpoint}", writable, endpoint, parts.username or None, server_env={
        **_levels("webdav"), MODE: READ_WRITE if writable else READ_ONLY})


def _levels(backend: str) -> dict[str, str]:
    """The cache directory first, the remote second: a hit in the directory costs no transfer, a resumed build
    finds its objects there, and a remote hit is copied there. (sccache 0.16 makes every level of the chain
    read-only when the remote is, and then counts no level's hits apart: a reading build reports its hits
    whole; on a fresh machine every one of them is the remote's.) A remote alone read nothing a chain wrote."""
    return {"SCCACHE_MULTILEVEL_CHAIN": f"disk,{backend}"}


def take_secret(environ: Mapping[str, str], remote: RemoteCache | None) -> dict[str, str]:
    """The credential in the file ``WHEELHOUSE_COMPILER_CACHE_SECRET_FILE`` names, read and then removed, so that
    no code the build runs afterwards can read it; empty without the setting (an anonymous remote)."""
    name = environ.get(SECRET_FILE, "").strip()
    if not name:
        return {}
    path = Path(name)
    if remote is None:
        raise UsageError(f"{SECRET_FILE}={name}: a credential for a remote compiler cache, but {SETTING} names none; "
                         f"set {SETTING} or unset {SECRET_FILE}")
    try:
        if path.stat().st_size > _MAX_SECRET_BYTES:
            raise UsageError(f"{SECRET_FILE}={name}: larger than {_MAX_SECRET_BYTES} bytes; it holds key=value lines")
        text = path.read_text()
        path.unlink()
    except OSError as error:
        raise UsageError(f"{SECRET_FILE}={name}: {error.strerror or error}; the build reads the credential there and "
                         "removes the file (write it again for the next build)") from None
    return _parse_secret(text, name, remote)


def _parse_secret(text: str, name: str, remote: RemoteCache) -> dict[str, str]:
    secret: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip() or not value:
            raise UsageError(f"{SECRET_FILE}={name}: line {number} is not key=value")
        secret[key.strip()] = value
    wanted = _SECRET_KEYS[remote.backend]
    if not any(set(secret) == keys for keys in wanted):
        forms = " or ".join(" and ".join(sorted(keys)) for keys in wanted)
        raise UsageError(f"{SECRET_FILE}={name}: holds {', '.join(sorted(secret)) or 'nothing'}; the {remote.backend} "
                         f"cache takes {forms}")
    if "password" in secret and not remote.username:
        raise UsageError(f"{SECRET_FILE}={name}: a password, but the URL of {SETTING} names no user; write "
                         "webdav+https://<user>@host/path")
    return secret


def server_environment(cache_env: Mapping[str, str], remote: RemoteCache | None, secret: Mapping[str, str],
                       environ: Mapping[str, str], private: Path) -> dict[str, str]:
    """The environment the build's own sccache server starts with (ci/building/job.py ``_start_sccache``): the few
    variables a server needs from ``environ``, the cache's ``SCCACHE_*`` settings, and a remote with its
    credential, the WebDAV one in a configuration file (0600) in ``private``, a directory of the caller's that
    it removes once the server has started. Nothing else: a compile runs with the environment its client
    sends, the builder's."""
    env = {name: environ[name] for name in _SERVER_BASICS if name in environ}
    env.update({name: value for name, value in cache_env.items() if name.startswith("SCCACHE_")})
    if remote is None:
        return env
    env.update(remote.server_env)
    env.update(remote.server_secret_env(secret))
    config = remote.server_config(secret)
    if config:
        conf = private / "sccache.toml"
        descriptor = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(config)
        env["SCCACHE_CONF"] = str(conf)
    return env


def remote_hits(stats: Mapping) -> int | None:
    """Hits the remote level served (``sccache --show-stats --stats-format json``'s ``multi_level``); None when
    sccache does not count the levels apart (no remote, or a read-only one)."""
    levels = stats.get("multi_level")
    if not levels:
        return None
    return sum(int(level.get("hits", 0)) for level in levels if "(disk)" not in str(level.get("name", "")))


def stored(stats: Mapping, env: Mapping[str, str]) -> int:
    """How many compiled objects the server has finished storing (or failed to), in every level it writes: a
    remote level stores after the local one, and only in read-write mode."""
    total = int(stats.get("cache_writes", 0)) + int(stats.get("cache_write_errors", 0))
    levels = stats.get("multi_level") or []
    writes_remote = env.get(MODE) == READ_WRITE
    written = [int(level.get("writes", 0)) + int(level.get("write_failures", 0)) for level in levels
               if writes_remote or "(disk)" in str(level.get("name", ""))]
    return min([total, *written])
