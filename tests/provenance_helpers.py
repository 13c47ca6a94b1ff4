"""A released fixture row for the provenance and verify-wheel tests: the fixture wheel stamped with the
row's real build facts, a build record as ci/building/job.py writes it, and the real release path into a
local store (wheels, .metadata, provenance, manifest)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, replace
from pathlib import Path

from build_records import record_of
from stamp_helpers import FIXTURE_EXT, fixture_facts, fixture_row

from ci.building import sources
from ci.building.stamp import stamp_wheel
from ci.model import build_record, fingerprint, manifest
from ci.model.matrix import MatrixRow
from ci.model.versions import Versions
from ci.publish import provenance, release
from ci.store.local import LocalStore

RUN_ENV = {"GITHUB_ACTIONS": "true", "GITHUB_SERVER_URL": "https://github.com", "GITHUB_REPOSITORY": "octo/wheelhouse",
           "GITHUB_RUN_ID": "4242", "GITHUB_RUN_ATTEMPT": "2"}


@dataclass(frozen=True)
class Released:
    versions: Versions
    row: MatrixRow
    dist: Path
    """The build output (dist root), as the build leaves it."""
    store: LocalStore
    assets: Path
    """The release's assets, as `gh release download TAG -D DIR` leaves them."""
    wheel: Path
    """The released wheel, as a user downloads it."""

    @property
    def manifest(self) -> Path:
        return self.assets / manifest.asset_name(self.row.arch)

    @property
    def provenance(self) -> Path:
        return self.assets / provenance.asset_name(self.row.arch)


def built_row(fixture_wheel: Path, dist: Path) -> tuple[Versions, MatrixRow]:
    """The fixture row's build output in ``dist``: its stamped wheel and build record."""
    versions, row = fixture_row()
    world = dist / row.world
    world.mkdir(parents=True)
    wheel = world / fixture_wheel.name
    shutil.copyfile(fixture_wheel, wheel)
    facts = fixture_facts()
    stamp_wheel(wheel, torch_version=row.torch, pin_mode=row.settings.torch_pin, facts=facts)
    checkout = sources.local_directory(FIXTURE_EXT)
    config = fingerprint.build_config(row, checkout.revision)
    record = replace(record_of(row, [wheel]), fingerprint=fingerprint.fingerprint(config), build_config=config,
                     source=checkout.describe(), sbom=facts)
    record.write(build_record.path_for(row, dist))
    return versions, row


def release_fixture(fixture_wheel: Path, root: Path, env: dict[str, str] | None = None) -> Released:
    dist = root / "dist"
    versions, row = built_row(fixture_wheel, dist)
    store = LocalStore(root / "store")
    release.apply(release.plan(versions, row, dist, env=RUN_ENV if env is None else env), store)
    assets = store.releases_dir / row.release_tag / "assets"
    download = root / "download"
    download.mkdir()
    wheel = download / fixture_wheel.name
    shutil.copyfile(assets / fixture_wheel.name, wheel)
    return Released(versions, row, dist, store, assets, wheel)
