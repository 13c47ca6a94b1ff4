"""Replay recorded GitHub traffic (octokit/fixtures ``normalized-fixture.json``) to a client.

The :class:`ReplayServer` answers the n-th request it receives with the n-th recorded response
(status, JSON body and the headers that matter), its hosts rewritten to the replay server's API and
uploads ports, and logs what the client actually sent so a test can compare the two sequences.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

_KEEP_HEADERS = ("content-type", "link", "location", "retry-after", "x-ratelimit-limit", "x-ratelimit-remaining",
                 "x-ratelimit-reset", "x-ratelimit-used", "x-ratelimit-resource")


@dataclass(frozen=True)
class Exchange:
    method: str
    path: str
    query_names: tuple[str, ...]
    body: Any
    status: int
    response: Any
    headers: dict[str, str]
    host: str


def load_fixture(path: Path) -> list[Exchange]:
    out = []
    for rec in json.loads(path.read_text()):
        url = urlsplit(rec["path"])
        host = "uploads" if "uploads." in rec["scope"] else "api"
        headers = rec["headers"] if isinstance(rec["headers"], dict) else dict(zip(rec["headers"][::2], rec["headers"][1::2], strict=True))
        out.append(Exchange(rec["method"].upper(), url.path, tuple(sorted(parse_qs(url.query, keep_blank_values=True))),
                            rec.get("body"), int(rec["status"]), rec.get("response"),
                            {k.lower(): str(v) for k, v in headers.items()}, host))
    return out


def shape(method: str, path: str, query_names: tuple[str, ...]) -> tuple[str, str, tuple[str, ...]]:
    """A request modulo ids: numbers in the path become ``{id}``."""
    return method.upper(), re.sub(r"/\d+(?=/|$)", "/{id}", path), tuple(sorted(query_names))


@dataclass
class ReplayServer:
    exchanges: list[Exchange]
    received: list[tuple[str, str, tuple[str, ...], str, bytes]] = field(default_factory=list)
    """(method, path, query names, host role, body) of each request received."""
    api_url: str = ""
    uploads_url: str = ""

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: list[ThreadingHTTPServer] = []

    def _rewrite(self, value: Any) -> Any:
        text = json.dumps(value)
        text = text.replace("https://uploads.github.com", self.uploads_url).replace(
            "https://api.github.com", self.api_url).replace("https://github.com", self.api_url)
        return json.loads(text)

    def __enter__(self) -> ReplayServer:
        replay = self
        for role in ("api", "uploads"):
            class Handler(BaseHTTPRequestHandler):
                protocol_version = "HTTP/1.1"
                host_role = role

                def log_message(self, format: str, *args: object) -> None:
                    pass

                def _any(self) -> None:
                    n = int(self.headers.get("Content-Length") or 0)
                    body = self.rfile.read(n) if n else b""
                    url = urlsplit(self.path)
                    with replay._lock:
                        idx = len(replay.received)
                        replay.received.append((self.command, url.path,
                                                tuple(sorted(parse_qs(url.query, keep_blank_values=True))),
                                                self.host_role, body))
                    if idx >= len(replay.exchanges):
                        payload = b'{"message": "no more recorded exchanges"}'
                        self.send_response(599)
                    else:
                        ex = replay.exchanges[idx]
                        payload = b"" if ex.status == 204 or ex.response in ("", None) else json.dumps(
                            replay._rewrite(ex.response)).encode()
                        self.send_response(ex.status)
                        for k in _KEEP_HEADERS:
                            if k in ex.headers:
                                self.send_header(k, replay._rewrite(ex.headers[k]) if k in ("link", "location")
                                                 else ex.headers[k])
                    if payload or self.command != "DELETE":
                        self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)

                do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _any

            srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
            srv.daemon_threads = True
            threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            self._servers.append(srv)
        self.api_url = f"http://127.0.0.1:{self._servers[0].server_address[1]}"
        self.uploads_url = f"http://127.0.0.1:{self._servers[1].server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()

    def received_shapes(self) -> list[tuple[str, str, tuple[str, ...]]]:
        return [shape(m, p, q) for m, p, q, _, _ in self.received]

    def recorded_shapes(self) -> list[tuple[str, str, tuple[str, ...]]]:
        return [shape(e.method, e.path, e.query_names) for e in self.exchanges]
