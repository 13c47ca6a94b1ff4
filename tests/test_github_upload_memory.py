"""Uploads stream from disk: a large asset never sits in the client's memory (ghapi's helper reads it whole)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

from tests.github_server import GitHubTestServer

REPO = Path(__file__).resolve().parent.parent
SIZE = 400 * 1024 * 1024

CLIENT = """
import sys
from pathlib import Path
from ci.store.github import GitHubStore

store = GitHubStore("o/r", token="test-token", api_url=sys.argv[1])
store.ensure_release("big-1", "big 1", "")
asset = store.upload_asset("big-1", Path(sys.argv[2]))
peak_kib = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(asset.size, asset.digest, peak_kib // 1024)
"""


def test_a_400_mb_upload_keeps_the_client_small(tmp_path):
    wheel = tmp_path / "big_pkg-1.0-py3-none-any.whl"
    with open(wheel, "wb") as handle:  # sparse: costs no disk, reads as zeros
        handle.truncate(SIZE)
    # keep_bytes=False: the server hashes what it receives without holding it
    with GitHubTestServer(token="test-token", keep_bytes=False) as gh:
        result = subprocess.run([sys.executable, "-c", CLIENT, gh.api_url, str(wheel)], cwd=REPO,
                                capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr[-1500:]
    size, digest, peak_mib = result.stdout.split()
    assert int(size) == SIZE
    zeros = hashlib.sha256()
    chunk = bytes(1 << 20)
    for _ in range(SIZE >> 20):
        zeros.update(chunk)
    assert digest == f"sha256:{zeros.hexdigest()}"  # what the server received is the whole file
    print(f"client peak RSS while uploading {SIZE >> 20} MiB: {peak_mib} MiB")
    assert int(peak_mib) < 200, f"client peak RSS {peak_mib} MiB: the upload was read into memory"
