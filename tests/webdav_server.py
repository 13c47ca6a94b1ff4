"""A real WebDAV server for the compiler cache's tests: WsgiDAV (requirements.txt) in its own process on 127.0.0.1.

It serves one directory twice: ``/cache`` read-write for the user ``writer``, and ``/cache-ro`` read-only for the
user ``reader`` (the server refuses every write there, whatever the client is told), as a store gives a
default-branch build and a pull request's build two credentials. Each user's password is random per server.

``python tests/webdav_server.py DIR`` serves until it is stopped (SIGTERM, SIGINT), for a machine's runs that a
test does not start (tests/gpu/run_on_device.sh's cached sweep): it writes ``DIR/url`` (the writer's
``WHEELHOUSE_COMPILER_CACHE``) and ``DIR/writer.secret`` (its credential) once the server answers.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

WSGIDAV = shutil.which("wsgidav", path=str(Path(sys.executable).parent)) or shutil.which("wsgidav")


@dataclass(frozen=True)
class WebDAV:
    root: Path
    """The directory the server keeps the objects in."""
    port: int
    passwords: dict[str, str]

    def url(self, user: str = "writer") -> str:
        share = "cache" if user == "writer" else "cache-ro"
        return f"webdav+http://{user}@127.0.0.1:{self.port}/{share}"

    def secret_file(self, path: Path, user: str = "writer") -> Path:
        """A credential file as a workflow step writes it (ci/building/remote_cache.py reads and removes it)."""
        path.write_text(f"password={self.passwords[user]}\n")
        path.chmod(0o600)
        return path

    def objects(self) -> list[Path]:
        """The cached objects the server holds (sccache's write probe left out)."""
        return [p for p in self.root.rglob("*") if p.is_file() and p.name != ".sccache_check"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def webdav_server(directory: Path) -> Iterator[WebDAV]:
    """WsgiDAV serving ``directory/objects``; stopped at the end."""
    if WSGIDAV is None:
        raise RuntimeError("wsgidav is not installed: pip install -r requirements.txt")
    root = directory / "objects"
    root.mkdir(parents=True, exist_ok=True)
    passwords = {user: secrets.token_urlsafe(16) for user in ("writer", "reader")}
    port = _free_port()
    config = {
        "host": "127.0.0.1", "port": port, "verbose": 1,
        "provider_mapping": {"/cache": {"root": str(root)}, "/cache-ro": {"root": str(root), "readonly": True}},
        "http_authenticator": {"domain_controller": None, "accept_basic": True, "accept_digest": False,
                               "default_to_digest": False},
        "simple_dc": {"user_mapping": {"/cache": {"writer": {"password": passwords["writer"]}},
                                       "/cache-ro": {"reader": {"password": passwords["reader"]}}}},
    }
    config_file = directory / "wsgidav.yaml"
    config_file.write_text(yaml.safe_dump(config))
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    with (directory / "wsgidav.log").open("w") as log:
        process = subprocess.Popen([WSGIDAV, "--config", str(config_file)], stdout=log, stderr=subprocess.STDOUT,
                                   env=env)
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"wsgidav did not start: {(directory / 'wsgidav.log').read_text()[-2000:]}")
            time.sleep(0.1)
        yield WebDAV(root, port, passwords)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def serve(directory: Path) -> None:
    """Serve ``directory`` (see the module's docstring) until SIGTERM or SIGINT."""
    import signal

    stop = {"now": False}

    def _stop(signum, frame):
        stop["now"] = True

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    with webdav_server(directory) as server:
        server.secret_file(directory / "writer.secret")
        (directory / "url.partial").write_text(server.url() + "\n")
        (directory / "url.partial").replace(directory / "url")  # written last: its presence says the server is up
        while not stop["now"]:
            time.sleep(0.5)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python tests/webdav_server.py DIR")
    serve(Path(sys.argv[1]).resolve())

