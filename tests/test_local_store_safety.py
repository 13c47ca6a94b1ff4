"""The local store under concurrent writers and crashes: no record update is lost, and a process
killed at any step leaves a store whose records match the bytes and that the next run completes."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest

from ci.base.errors import RemoteError
from ci.maintenance import migrate
from ci.store import local
from ci.store.local import LocalStore
from tests.crash_points import kill_at_every_step

TAG = "demo-1.0-py3.11-torch2.13.0"
TITLE = "demo 1.0 - cucpu py3.11 torch2.13.0"
WRITES = [(local.os, "replace"), (local.os, "rename"), (local.shutil, "copyfile"), (local, "_atomic_write")]
"""Every step of the store that changes the file system."""


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def assert_records_match_bytes(root: Path) -> dict[str, dict[str, str]]:
    """Every asset a reader sees has exactly the bytes its record claims; returns {tag: {name: sha256}}."""
    store = LocalStore(root)
    seen = {}
    for release in store.list_releases():
        seen[release.tag] = {}
        for asset in release.assets:
            data = store.read_asset(release.tag, asset.name)
            assert (asset.size, asset.sha256) == (len(data), _sha(data)), f"{release.tag}/{asset.name}"
            seen[release.tag][asset.name] = asset.sha256
    return seen


def test_concurrent_processes_writing_one_release_lose_nothing(tmp_path: Path) -> None:
    """Four processes upload 25 assets each into one release at once (two arch jobs do this)."""
    store = LocalStore(tmp_path / "store")
    store.ensure_release(TAG, TITLE, "")
    files = []
    for writer in range(4):
        for i in range(25):
            f = tmp_path / "in" / f"w{writer}" / f"a{writer}-{i}.bin"
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_bytes(os.urandom(64 << 10))
            files.append(f)
    pids = []
    for writer in range(4):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                mine = LocalStore(tmp_path / "store")
                for f in sorted((tmp_path / "in" / f"w{writer}").iterdir()):
                    mine.upload_asset(TAG, f)
                code = 0
            finally:
                os._exit(code)
        pids.append(pid)
    assert all(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0 for pid in pids)
    seen = assert_records_match_bytes(tmp_path / "store")
    assert seen[TAG] == {f.name: _sha(f.read_bytes()) for f in files}


def test_clobber_killed_at_every_step_keeps_records_true_and_the_rerun_completes(tmp_path: Path) -> None:
    old, new = tmp_path / "old" / "w.whl", tmp_path / "new" / "w.whl"
    for f, data in ((old, b"old" * 1000), (new, b"new" * 2000)):
        f.parent.mkdir()
        f.write_bytes(data)
    root = tmp_path / "store"
    outcomes = []

    def prepare(k: int) -> None:
        shutil.rmtree(root, ignore_errors=True)
        store = LocalStore(root)
        store.ensure_release(TAG, TITLE, "")
        store.upload_asset(TAG, old)

    def check(k: int) -> None:
        seen = assert_records_match_bytes(root)  # whatever the moment of death
        outcomes.append(seen[TAG]["w.whl"])
        assert seen[TAG]["w.whl"] in (_sha(old.read_bytes()), _sha(new.read_bytes())), k
        LocalStore(root).upload_asset(TAG, new, clobber=True)  # the next run
        assert assert_records_match_bytes(root)[TAG] == {"w.whl": _sha(new.read_bytes())}, k
        record = json.loads((root / "releases" / TAG / "release.json").read_text())
        assert "pending" not in record, k
        assert sorted(p.name for p in (root / "releases" / TAG / "assets").iterdir()) == ["w.whl"], k  # no temp left

    steps = kill_at_every_step(lambda: LocalStore(root).upload_asset(TAG, new, clobber=True), WRITES,
                               prepare=prepare, check=check)
    print(f"local clobber: killed at each of {steps} steps; records matched the bytes every time")
    assert steps >= 6 and set(outcomes) == {_sha(old.read_bytes()), _sha(new.read_bytes())}


def test_retag_killed_at_every_step_converges(tmp_path: Path) -> None:
    """migrate-tags --apply on a local store, killed at each file-system step, then run again."""
    old_tag, new_tag = "other-0.2", "other-0.2-cpu-py3.11-torch2.13.0"
    wheel = tmp_path / "other-0.2-py3-none-any.whl"
    wheel.write_bytes(b"wheel")
    root = tmp_path / "store"

    def prepare(k: int) -> None:
        shutil.rmtree(root, ignore_errors=True)
        store = LocalStore(root)
        store.ensure_release(old_tag, "other 0.2 - cucpu py3.11 torch2.13.0", "")
        store.upload_asset(old_tag, wheel)

    def apply() -> None:
        store = LocalStore(root)
        migrate.apply(migrate.plan_for(store), store)

    def check(k: int) -> None:
        assert_records_match_bytes(root)
        apply()  # the next run
        again = migrate.plan_for(LocalStore(root))
        assert not again.renames, k  # converged: nothing left to rename
        releases = LocalStore(root).list_releases()
        assert [r.tag for r in releases] == [new_tag], k
        assert [a.url for a in releases[0].assets] == [(root / "releases" / new_tag / "assets" / wheel.name).as_uri()]

    steps = kill_at_every_step(apply, WRITES, prepare=prepare, check=check)
    print(f"local retag: killed at each of {steps} steps; every re-run converged")
    assert steps >= 4


def test_a_store_that_does_not_exist_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RemoteError, match=r"local store .*stroe does not exist .*WHEELHOUSE_STORE"):
        LocalStore(tmp_path / "stroe", must_exist=True)
    (tmp_path / "store" / "releases").mkdir(parents=True)
    assert LocalStore(tmp_path / "store", must_exist=True).list_releases() == []


def test_assets_and_records_are_readable_by_others(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "store")
    store.ensure_release(TAG, TITLE, "")
    f = tmp_path / "w.whl"
    f.write_bytes(b"x")
    store.upload_asset(TAG, f)
    for path in (tmp_path / "store" / "releases" / TAG / "release.json", tmp_path / "store" / "releases" / TAG / "assets" / "w.whl"):
        assert path.stat().st_mode & 0o044 == 0o044, path


def test_a_dead_writers_temporary_copy_is_removed_and_a_live_ones_is_kept(tmp_path: Path) -> None:
    import fcntl

    store = LocalStore(tmp_path / "store")
    store.ensure_release(TAG, TITLE, "")
    assets = tmp_path / "store" / "releases" / TAG / "assets"
    dead = assets / ".w.whl.new-dead1234"  # a copy whose writer was killed
    dead.write_bytes(b"half a wheel")
    live = assets / ".v.whl.new-live5678"  # a copy another writer is making right now
    live.write_bytes(b"copying")
    with live.open("rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        f = tmp_path / "x.whl"
        f.write_bytes(b"x")
        store.upload_asset(TAG, f)
        assert not dead.exists() and live.exists()


def _release_with_one_asset(tmp_path: Path) -> tuple[LocalStore, Path, Path]:
    """(store, the release folder, the asset's source file ``w.whl`` holding b"old", uploaded)."""
    store = LocalStore(tmp_path / "store")
    store.ensure_release(TAG, TITLE, "")
    wheel = tmp_path / "w.whl"
    wheel.write_bytes(b"old")
    store.upload_asset(TAG, wheel)
    return store, tmp_path / "store" / "releases" / TAG, wheel


def _edit_record(folder: Path, **changes: object) -> None:
    record = json.loads((folder / "release.json").read_text())
    record.update(changes)
    (folder / "release.json").write_text(json.dumps(record))


@pytest.mark.parametrize("file", [
    "../../../../victim.txt",  # out of the store
    "../release.json",  # the release's own record
    "w.whl",  # the asset itself, not a temporary copy of it
    ".other.whl.new-abc123",  # another asset's temporary copy
    ".w.whl.new-../../victim.txt",
    ".w.whl.new-",
    7,
])
def test_a_pending_entry_may_name_only_a_temporary_copy_of_its_asset(tmp_path: Path, file: object) -> None:
    store, folder, wheel = _release_with_one_asset(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    _edit_record(folder, pending={"w.whl": {"size": 1, "sha256": "0" * 64, "file": file}})
    expected = (f"local store: {folder / 'release.json'} is not a release record (pending entry 'w.whl' names file "
                f"{file!r}, not a temporary copy '.w.whl.new-<random>' in assets/); restore it from a copy or remove "
                "that release folder")
    for read in (store.list_releases, lambda: store.get_release(TAG)):
        with pytest.raises(RemoteError) as refused:
            read()
        assert str(refused.value) == expected
    wheel.write_bytes(b"new")
    with pytest.raises(RemoteError, match="is not a release record"):
        store.upload_asset(TAG, wheel, clobber=True)
    assert victim.read_text() == "precious"
    assert (folder / "assets" / "w.whl").read_bytes() == b"old"


def test_an_asset_name_in_a_record_that_leaves_the_assets_folder_is_refused(tmp_path: Path) -> None:
    store, folder, _ = _release_with_one_asset(tmp_path)
    _edit_record(folder, assets={"../../../victim.txt": {"size": 1, "sha256": "0" * 64}})
    with pytest.raises(RemoteError, match=r"\(assets entry '../../../victim.txt' is not an asset name "):
        store.list_releases()


def test_a_pending_clobber_of_ours_still_settles(tmp_path: Path) -> None:
    """The stricter record check accepts what upload_asset itself writes: a killed clobber is finished."""
    store, folder, _ = _release_with_one_asset(tmp_path)
    temporary = folder / "assets" / ".w.whl.new-k2_x9q0a"
    temporary.write_bytes(b"new")
    _edit_record(folder, pending={"w.whl": {"size": 3, "sha256": _sha(b"new"), "file": temporary.name}})
    assert store.get_release(TAG).asset("w.whl").sha256 == _sha(b"old")  # not renamed yet: the old bytes
    other = tmp_path / "x.whl"
    other.write_bytes(b"x")
    store.upload_asset(TAG, other)  # the next writer settles: rolls the unrenamed copy back
    assert not temporary.exists() and "pending" not in json.loads((folder / "release.json").read_text())
