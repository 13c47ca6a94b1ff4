"""All GitHub traffic -- API calls, uploads, asset and artifact downloads, the index's hashing
downloads -- goes through one HTTP client that honours HTTP_PROXY / NO_PROXY (the generated workflows
set a proxy on self-hosted runners). Checked through a loopback forward proxy."""

from __future__ import annotations

import http.client
import io
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from ci.publish.index import DigestCache, build_site
from ci.store.artifacts import GitHubArtifacts
from ci.store.github import GitHubStore
from tests.github_server import GitHubTestServer

TOKEN = "test-token"


class ForwardProxy:
    """A plain-HTTP forward proxy on 127.0.0.1 that records (method, host:port, path) of each request."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str, str]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _forward(self) -> None:
                target = urlsplit(self.path)  # absolute form: http://host:port/path?query
                proxy.seen.append((self.command, target.netloc, target.path))
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("proxy-connection", "connection")}
                conn = http.client.HTTPConnection(target.hostname, target.port, timeout=60)
                conn.request(self.command, target.path + (f"?{target.query}" if target.query else ""), body=body,
                             headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PATCH = do_DELETE = do_PUT = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _exercise(gh: GitHubTestServer, tmp_path: Path) -> None:
    """Every kind of GitHub traffic the store makes."""
    wheel = tmp_path / "demo_pkg-1.0-cp311-cp311-linux_x86_64.whl"
    wheel.write_bytes(b"wheel bytes")
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(wheel.name, wheel.read_bytes())
    gh.seed_artifact(77, "wheel-demo", buf.getvalue())
    with GitHubStore("o/r", token=TOKEN, api_url=gh.api_url, sleep=lambda s: None) as store:
        store.ensure_release("demo-1.0", "demo 1.0 - cucpu py3.11 torch2.13.0", "")
        store.upload_asset("demo-1.0", wheel)  # the uploads host
        assert store.read_asset("demo-1.0", wheel.name) == wheel.read_bytes()  # redirect to object storage
        artifacts = GitHubArtifacts(store.api)
        (artifact,) = artifacts.list_artifacts("77")
        artifacts.download(artifact, tmp_path / "a.zip")  # redirect to signed storage
        with gh.state.lock:  # an asset without a digest: the index downloads it to hash it
            for rel in gh.state.repo("o", "r").releases.values():
                for a in rel.assets.values():
                    a.digest = None
        site = build_site(store.list_releases(), default_world="cpu/torch2.13", fetch=store.fetch, cache=DigestCache())
        assert site.fetches == 1 and site.worlds[0].link_count == 1


def test_all_github_traffic_goes_through_the_proxy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = ForwardProxy()
    try:
        with GitHubTestServer(token=TOKEN) as gh:
            for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
                monkeypatch.delenv(name, raising=False)
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            _exercise(gh, tmp_path)
            api, uploads = urlsplit(gh.api_url).netloc, urlsplit(gh.uploads_url).netloc
            served = len(gh.log)
    finally:
        proxy.close()
    hosts = {host for _, host, _ in proxy.seen}
    kinds = {(method, path.split("/")[1] if path.startswith("/_") else path.rsplit("/", 1)[-1].isdigit())
             for method, _, path in proxy.seen}
    assert hosts == {api, uploads}
    assert ("POST", uploads) in {(m, h) for m, h, _ in proxy.seen}  # the upload
    assert any(p.startswith("/_objects/") for _, _, p in proxy.seen)  # asset downloads (store and index)
    assert any(p.startswith("/_artifacts/") for _, _, p in proxy.seen)  # the artifact download
    assert len(proxy.seen) == served, (len(proxy.seen), served, kinds)  # nothing went around it


def test_no_proxy_is_honoured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proxy = ForwardProxy()
    try:
        with GitHubTestServer(token=TOKEN) as gh:
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            _exercise(gh, tmp_path)
    finally:
        proxy.close()
    assert proxy.seen == []
