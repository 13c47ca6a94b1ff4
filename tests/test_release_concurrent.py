"""Two `invoke release` processes for the two arches of a new release, at the same moment.

The anchor's second job failed on 422 already_exists; ours must converge to
one release holding both arches' wheels and manifests, every time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from build_records import write_record
from wheel_factory import build_wheel

from ci.model import manifest, matrix
from ci.model.versions import load
from ci.publish import provenance
from tests.github_server import GitHubTestServer

REPO = Path(__file__).resolve().parent.parent
REPETITIONS = 20

VERSIONS = """\
build_matrix:
  - {arch: x86_64, cuda: cpu, python: "3.11", torch: "2.13.0", cxx11_abi: "TRUE"}
  - {arch: aarch64, cuda: cpu, python: "3.11", torch: "2.13.0", cxx11_abi: "TRUE"}
components:
  demo:
    source: {path: tests/fixtures/fixture_ext}
    ref: "1.%d"
    builder: fixture
    wheel_packages: [demo-pkg]
    runs_on: ubuntu-24.04
    arch_overrides:
      aarch64: {runs_on: ubuntu-24.04-arm}
"""


def _fake_build(versions, dist: Path) -> None:
    """What a build leaves in dist/: each arch's wheel and its build record (checks passed)."""
    for row in matrix.expand(versions):
        world = dist / row.world
        wheel = build_wheel(world, {"demo_pkg/__init__.py": row.arch.encode()}, version=row.ref,
                            tags=f"cp311-cp311-linux_{row.arch}")
        write_record(dist, row, [wheel], build_config={"arch": row.arch})


def test_two_arch_jobs_create_one_release_every_time(tmp_path):
    with GitHubTestServer(token="test-token") as gh:
        env = {**os.environ, "WHEELHOUSE_STORE": "github:o/r", "WHEELHOUSE_API_URL": gh.api_url,
               "GITHUB_TOKEN": "test-token"}
        for rep in range(REPETITIONS):
            path = tmp_path / f"versions-{rep}.yaml"
            path.write_text(VERSIONS % rep)
            versions = load(path)
            dist = tmp_path / f"dist-{rep}"
            _fake_build(versions, dist)
            jobs = [
                subprocess.Popen(
                    [sys.executable, "-m", "invoke", "release", "--component", "demo", "--python", "3.11",
                     "--torch", "2.13.0", "--arch", arch, "--dist", str(dist)],
                    cwd=REPO, env={**env, "WHEELHOUSE_VERSIONS": str(path)},
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                )
                for arch in ("x86_64", "aarch64")
            ]
            for job in jobs:
                out, err = job.communicate(timeout=120)
                assert job.returncode == 0, f"repetition {rep}: {err[-800:]}"
                assert "test-token" not in out + err

            tag = f"demo-1.{rep}-cpu-py3.11-torch2.13.0"
            with gh.state.lock:
                releases = [r for r in gh.state.repo("o", "r").releases.values() if r.tag_name == tag]
                assert len(releases) == 1, f"repetition {rep}: {len(releases)} releases for {tag}"
                names = sorted(a.name for a in releases[0].assets.values() if a.state == "uploaded")
            creates = gh.counters["POST /repos/{owner}/{repo}/releases"]
            wheels = [f"demo_pkg-1.{rep}-cp311-cp311-linux_{arch}.whl" for arch in ("aarch64", "x86_64")]
            assert names == sorted([
                *wheels, *(f"{wheel}.metadata" for wheel in wheels),  # each made from its wheel by the release
                manifest.asset_name("aarch64"), manifest.asset_name("x86_64"),
                provenance.asset_name("aarch64"), provenance.asset_name("x86_64"),  # one statement per arch job
            ]), names
        # more create calls than releases: the second job lost the race and adopted the release
        print(f"{REPETITIONS} releases, {creates} create calls")
