"""Helpers for the index tests: wheels written by hand, a byte-counting HTTP server, client runs."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import subprocess
import sys
import threading
import zipfile
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

from wheel_factory import record_hash

from ci.base.digest import sha256_file
from ci.store.model import Asset, Release

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
UV = shutil.which("uv", path=str(VENV_BIN)) or shutil.which("uv")


def wheel_bytes(filename: str, meta: bytes, *, payload: bytes = b"") -> bytes:
    """A valid wheel named ``filename`` whose own METADATA is ``meta``: the index compares sidecars with it."""
    dist, version = filename.split("-")[:2]
    dist_info = f"{dist}-{version}.dist-info"
    members = {
        f"{dist.lower()}/__init__.py": payload,
        f"{dist_info}/METADATA": meta,
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = io.StringIO()
    writer = csv.writer(record, lineterminator="\n")
    for path, data in members.items():
        writer.writerow([path, record_hash(data), len(data)])
    writer.writerow([f"{dist_info}/RECORD", "", ""])
    members[f"{dist_info}/RECORD"] = record.getvalue().encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for path, data in members.items():
            zf.writestr(path, data)
    return buf.getvalue()


def tamper(wheel: Path) -> None:
    """Change a wheel's bytes but keep it a valid zip with the same members (a new archive comment)."""
    before = sha256_file(wheel)
    with zipfile.ZipFile(wheel, "a") as zf:
        zf.comment = b"changed after indexing"
    assert sha256_file(wheel) != before


def file_asset(path: Path, url: str, *, digest: bool = True, asset_id: int | None = None) -> Asset:
    return Asset(
        name=path.name,
        size=path.stat().st_size,
        url=url,
        digest=f"sha256:{sha256_file(path)}" if digest else None,
        id=asset_id,
    )


def release_of(
    tag: str, title: str, files: Sequence[Path], base_url: str, *, digest: bool = True, id_base: int = 0
) -> Release:
    """A release whose assets are ``files`` (wheels and their sidecars) served at ``base_url/<tag>/<name>``."""
    assets = tuple(
        file_asset(p, f"{base_url.rstrip('/')}/{tag}/{p.name}", digest=digest, asset_id=id_base + i)
        for i, p in enumerate(sorted(files))
    )
    return Release(tag=tag, title=title, assets=assets)


def publish_release_files(root: Path, tag: str, wheels: Sequence[Path]) -> list[Path]:
    """Copy wheels (and sidecars next to them) to ``root/<tag>/``; returns the copied paths."""
    out: list[Path] = []
    target = root / tag
    target.mkdir(parents=True, exist_ok=True)
    for wheel in wheels:
        for src in (wheel, Path(str(wheel) + ".metadata")):
            if src.exists():
                dst = target / src.name
                shutil.copyfile(src, dst)
                out.append(dst)
    return out


def file_fetch(root_url: str, root: Path):
    """A fetch callable reading assets whose URL starts with ``root_url`` from ``root``; counts calls."""
    calls: Counter[str] = Counter()

    def fetch(asset: Asset) -> Iterator[bytes]:
        calls[asset.name] += 1
        rel = unquote(asset.url[len(root_url) :].lstrip("/"))
        with (root / rel).open("rb") as fh:
            yield from iter(lambda: fh.read(1 << 20), b"")

    fetch.calls = calls  # type: ignore[attr-defined]
    return fetch


# --------------------------------------------------------------------------- HTTP server


@dataclass
class ServerLog:
    bytes_by_path: Counter[str] = field(default_factory=Counter)
    requests: list[tuple[str, str, str, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def reset(self) -> None:
        with self.lock:
            self.bytes_by_path.clear()
            self.requests.clear()


_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")


def _handler(root: Path, log: ServerLog, ranges: bool, mounts: dict[str, Path]):  # noqa: C901 - a handler class: its methods count here
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            pass

        def _resolve(self) -> Path | None:
            rel = unquote(urlsplit(self.path).path).lstrip("/")
            base = root
            first, _, rest = rel.partition("/")
            if first in mounts:
                base, rel = mounts[first], rest
            path = (base / rel).resolve()
            if base.resolve() not in (path, *path.parents):
                return None
            if path.is_dir():
                if not urlsplit(self.path).path.endswith("/"):
                    return path  # caller redirects
                path = path / "index.html"
            return path if path.is_file() else None

        def _serve(self, body: bool) -> None:
            urlpath = urlsplit(self.path).path
            path = self._resolve()
            if path is not None and path.is_dir():
                self.send_response(301)
                self.send_header("Location", urlpath + "/")
                self.send_header("Content-Length", "0")
                self.end_headers()
                self._record(urlpath, "", 301)
                return
            if path is None:
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                self._record(urlpath, "", 404)
                return
            size = path.stat().st_size
            start, end, status = 0, size - 1, 200
            header = self.headers.get("Range", "")
            match = _RANGE.match(header) if ranges and header else None
            if match and (match[1] or match[2]):
                if match[1]:
                    start = int(match[1])
                    end = min(int(match[2]), size - 1) if match[2] else size - 1
                else:
                    start = max(size - int(match[2]), 0)
                if start > end or start >= size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    self._record(urlpath, header, 416)
                    return
                status = 206
            length = end - start + 1
            self.send_response(status)
            ctype = "text/html; charset=utf-8" if path.suffix == ".html" else "application/octet-stream"
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(length))
            if ranges:
                self.send_header("Accept-Ranges", "bytes")
            if status == 206:
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            self.end_headers()
            sent = 0
            if body:
                with path.open("rb") as fh:
                    fh.seek(start)
                    left = length
                    try:
                        while left:
                            chunk = fh.read(min(left, 1 << 20))
                            if not chunk:
                                break
                            self.wfile.write(chunk)
                            sent += len(chunk)
                            left -= len(chunk)
                    except (BrokenPipeError, ConnectionResetError):
                        pass
            with log.lock:
                log.bytes_by_path[urlpath] += sent
            self._record(urlpath, header, status)

        def _record(self, urlpath: str, header: str, status: int) -> None:
            with log.lock:
                log.requests.append((self.command, urlpath, header, status))

        def do_GET(self) -> None:
            self._serve(True)

        def do_HEAD(self) -> None:
            self._serve(False)

    return Handler


class CountingServer:
    """A loopback HTTP server over ``root`` that counts body bytes sent per path (Range optional)."""

    def __init__(self, root: Path, *, ranges: bool = True, mounts: dict[str, Path] | None = None) -> None:
        self.root = root
        self.log = ServerLog()
        self.ranges = ranges
        self.mounts = dict(mounts or {})
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(root, self.log, ranges, self.mounts))
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> CountingServer:  # Python 3.10 has no typing.Self
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def set_ranges(self, enabled: bool) -> None:
        self.ranges = enabled
        self._server.RequestHandlerClass = _handler(self.root, self.log, enabled, self.mounts)


# --------------------------------------------------------------------------- clients


def client_env(tmp: Path) -> dict[str, str]:
    """The environment for pip/uv runs: no user config, no proxies for loopback, caches under ``tmp``."""
    env = {
        k: v for k, v in os.environ.items() if not k.upper().startswith(("PIP_", "UV_")) and "proxy" not in k.lower()
    }
    env.update(
        {
            "NO_PROXY": "127.0.0.1,localhost",
            "no_proxy": "127.0.0.1,localhost",
            "PIP_CONFIG_FILE": os.devnull,
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "UV_NO_CONFIG": "1",
            "UV_PYTHON_DOWNLOADS": "never",
            "UV_CACHE_DIR": str(tmp / "uv-cache"),
            "XDG_CONFIG_HOME": str(tmp / "xdg"),
        }
    )
    return env


def run(cmd: Sequence[str], env: dict[str, str], *, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(cmd), env=env, capture_output=True, text=True, timeout=timeout, check=False)


def pip_install(index_url: str, target: Path, requirement: str, tmp: Path) -> subprocess.CompletedProcess[str]:
    return run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--isolated",
            "--no-cache-dir",
            "--disable-pip-version-check",
            "--index-url",
            index_url,
            "--target",
            str(target),
            requirement,
        ],
        client_env(tmp),
    )
