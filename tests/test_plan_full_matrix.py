"""invoke plan's decision for the full real matrix against the GitHub test server.

Complete releases for every row of versions.yaml: every row skips and no wheel
byte is downloaded. Changing one build input rebuilds exactly the rows it affects.
"""

from __future__ import annotations

import copy
import hashlib
import re
from pathlib import Path

import yaml

from ci.flows import plan
from ci.model import fingerprint, manifest, matrix
from ci.model.matrix import MatrixRow
from ci.model.versions import DEFAULT_VERSIONS, load
from ci.store.github import GitHubStore
from tests.github_server import GitHubTestServer

REVISION = "c0ffee" * 6 + "c0ff"


def resolve(row: MatrixRow) -> str:
    return REVISION  # a fixed upstream commit for every component; no network


def _wheel_name(package: str, row: MatrixRow) -> str:
    platform = {"x86_64": "linux_x86_64", "aarch64": "linux_aarch64"}[row.arch]
    python = ".".join(f"cp{p.replace('.', '')}" for p in row.pythons)
    return f"{package.replace('-', '_')}-1.0-{python}-{python}-{platform}.whl"


def seed_complete_releases(gh: GitHubTestServer, versions) -> dict[int, str]:
    """One release per tag with its wheels (synthetic bytes, real digests) and per-arch manifests."""
    wheel_ids: dict[int, str] = {}
    rows = matrix.expand(versions)
    for tag in sorted({row.release_tag for row in rows}):
        release_rows = [row for row in rows if row.release_tag == tag]
        assets: list[tuple[str, bytes]] = []
        synthetic: list[tuple[str, int, str]] = []
        for row in release_rows:
            entries = []
            for package in row.settings.wheel_packages:
                name = _wheel_name(package, row)
                size = 150_000_000  # what the anchor would download per wheel and row
                digest = hashlib.sha256(name.encode()).hexdigest()
                synthetic.append((name, size, f"sha256:{digest}"))
                entries.append(manifest.WheelEntry(name, digest, size))
            config = fingerprint.declared_config(versions, row, REVISION)  # as the build records it
            stored = manifest.Manifest(
                component=row.component, release_tag=tag, arch=row.arch, pythons=row.pythons, torch=row.torch,
                fingerprint=fingerprint.fingerprint(config), build_config=config, wheels=tuple(entries),
                checks_passed=True, source={"kind": "git", "revision": REVISION},
            )
            assets.append((manifest.asset_name(row.arch), stored.to_json().encode()))
        release = gh.seed_release(tag, name=matrix.release_title(versions, release_rows[0]), assets=assets,
                                  synthetic_assets=synthetic)
        wheel_ids.update({asset.id: asset.name for asset in release.assets.values() if asset.name.endswith(".whl")})
    return wheel_ids


def _versions_with(tmp_path: Path, edit) -> object:
    data = yaml.safe_load(DEFAULT_VERSIONS.read_text())
    data = copy.deepcopy(data)
    edit(data)
    path = tmp_path / "versions.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return load(path)


def test_full_matrix_skips_without_downloading_a_wheel_and_rebuilds_only_what_changed(tmp_path):
    versions = load()
    rows = matrix.expand(versions)
    releases = len({row.release_tag for row in rows})
    with GitHubTestServer(token="test-token") as gh:
        wheel_ids = seed_complete_releases(gh, versions)
        store = GitHubStore("o/r", token="test-token", api_url=gh.api_url)
        gh.reset_counters()

        result = plan.decide(versions, rows, store, resolve=resolve)
        reasons = {d.row.label: d.reason for d in result.decisions if d.build}
        assert reasons == {}, reasons
        downloads = [p for m, p, _ in gh.requests() if m == "GET" and re.fullmatch(r"/repos/o/r/releases/assets/\d+", p)]
        assert len(downloads) == len(rows)  # one manifest per row
        assert gh.counters["GET /repos/{owner}/{repo}/releases/tags/{tag}"] == 0  # assets come from the listing
        assert not {int(p.rsplit("/", 1)[1]) for p in downloads} & set(wheel_ids), "a wheel was downloaded"
        assert result.manifest_bytes < len(rows) * 8_000
        list_calls = gh.counters["GET /repos/{owner}/{repo}/releases"]
        assert list_calls == -(-releases // 100)  # pages of 100 releases

        # one component's extra_env changes: exactly its four rows build
        changed = _versions_with(tmp_path, lambda d: d["components"]["flash-mla"]["extra_env"].update(NVCC_THREADS="4"))
        decided = plan.decide(changed, matrix.expand(changed), store, resolve=resolve)
        assert sorted(d.row.label for d in decided.decisions if d.build) == sorted(
            r.label for r in matrix.expand(changed) if r.component == "flash-mla"
        )
        assert all(d.reason.startswith("build inputs changed") for d in decided.decisions if d.build)

        # an aarch64-only override changes: exactly apex's two aarch64 rows build
        changed = _versions_with(
            tmp_path, lambda d: d["components"]["apex"]["arch_overrides"]["aarch64"].update(torch_cuda_arch_list="9.0")
        )
        decided = plan.decide(changed, matrix.expand(changed), store, resolve=resolve)
        assert sorted((d.row.component, d.row.arch) for d in decided.decisions if d.build) == [
            ("apex", "aarch64"), ("apex", "aarch64")
        ]

        # upstream moved (apex tracks master): apex's four rows build
        moved = plan.decide(versions, rows, store, resolve=lambda r: "beef" * 10 if r.component == "apex" else REVISION)
        assert sorted({d.row.component for d in moved.decisions if d.build}) == ["apex"]
        assert sum(d.build for d in moved.decisions) == 4

        # max_jobs and runs_on are not build inputs: nothing builds
        tuned = _versions_with(tmp_path, lambda d: d["components"]["apex"].update(max_jobs=64, runs_on="big-runner"))
        assert not plan.decide(tuned, matrix.expand(tuned), store, resolve=resolve).to_build

