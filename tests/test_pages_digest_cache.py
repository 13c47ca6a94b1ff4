"""A Pages artifact is built on a fresh runner: the digest cache must come from the live site, so a
second publish downloads nothing (finding: every publish re-downloaded every asset without a digest
and every .metadata)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from index_helpers import wheel_bytes

from tests.github_server import GitHubTestServer

REPO = Path(__file__).resolve().parent.parent
TOKEN = "test-token"
OBJECTS = "GET /_objects/{asset_id}/{name}"


def _live_site(root: Path) -> tuple[ThreadingHTTPServer, str]:
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None  # type: ignore[method-assign]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def test_second_artifact_publish_downloads_nothing(tmp_path: Path) -> None:
    live = tmp_path / "live"
    live.mkdir()
    site_server, base_url = _live_site(live)
    try:
        with GitHubTestServer(token=TOKEN) as gh:
            rel = gh.seed_release("wheelhouse-fixture-0.1.0-py3.11-torch2.13.0",
                                  name="wheelhouse-fixture 0.1.0 - cucpu py3.11 torch2.13.0")
            for i in range(3):  # uploaded before GitHub had digests
                wheel = f"wheelhouse_fixture-0.1.{i}-cp311-cp311-linux_x86_64.whl"
                meta = f"Metadata-Version: 2.1\nName: wheelhouse-fixture\nVersion: 0.1.{i}\n".encode()
                gh.state.add_asset(rel, wheel, wheel_bytes(wheel, meta), digest=None)
                gh.state.add_asset(rel, wheel + ".metadata", meta)
            env = {**os.environ, "WHEELHOUSE_STORE": "github:o/r", "WHEELHOUSE_API_URL": gh.api_url,
                   "GITHUB_TOKEN": TOKEN, "WHEELHOUSE_VERSIONS": str(REPO / "tests" / "fixtures" / "versions.yaml")}
            downloads = []
            for run in (1, 2):
                artifact = tmp_path / f"runner-{run}" / "_site"  # a fresh runner each time
                before = gh.counters[OBJECTS]
                result = subprocess.run([sys.executable, "-m", "invoke", "publish-index", "--pages-artifact",
                                         str(artifact), "--base-url", base_url], cwd=REPO, env=env,
                                        capture_output=True, text=True, timeout=120)
                assert result.returncode == 0, result.stderr
                assert "Indexed 3 wheel link(s)" in result.stdout
                assert "could not read the published" not in result.stderr
                downloads.append(gh.counters[OBJECTS] - before)
                shutil.rmtree(live)
                shutil.copytree(artifact, live)  # deploy-pages
            # prune re-publishes the same way
            before = gh.counters[OBJECTS]
            result = subprocess.run([sys.executable, "-m", "invoke", "prune", "--apply", "--pages-artifact",
                                     str(tmp_path / "runner-3" / "_site"), "--base-url", base_url], cwd=REPO, env=env,
                                    capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, result.stderr
            assert "Indexed 3 wheel link(s)" in result.stdout
            downloads.append(gh.counters[OBJECTS] - before)
    finally:
        site_server.shutdown()
        site_server.server_close()
    assert downloads == [6, 0, 0], downloads  # 3 wheels (hashed, METADATA read) + 3 sidecars, then nothing
