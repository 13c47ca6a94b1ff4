"""Two publishes into one site directory (adversarial R12): one writes, the other stops naming it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ci.base.errors import WheelhouseError
from ci.publish import site_lock
from ci.store.local import LocalStore

REPO = Path(__file__).resolve().parent.parent
RELEASES = 120


def _invoke(*args: str) -> subprocess.Popen:
    """``invoke publish-index`` of the CPU world the store's releases are in (versions.yaml's first is CUDA's)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WHEELHOUSE_", "GITHUB_"))}
    return subprocess.Popen([sys.executable, "-m", "invoke", *args, "--default-world", "cpu/torch2.13"], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _store(root: Path, count: int) -> LocalStore:
    store = LocalStore(root)
    for i in range(count):
        tag = f"pkg{i}-1.0-cpu-py3.11-torch2.13.0"
        store.ensure_release(tag, f"pkg{i} 1.0 - cpu py3.11 torch2.13.0", "")
        wheel = root.parent / f"pkg{i}-1.0-py3-none-any.whl"
        wheel.write_bytes(b"x" * (i + 1))
        store.upload_asset(tag, wheel)
        wheel.unlink()
    return store


@pytest.mark.parametrize("option", ["--out", "--pages-artifact"])
def test_a_publish_while_another_holds_the_site_stops_naming_it_and_changes_nothing(tmp_path, option):
    store = _store(tmp_path / "store", 3)
    site = tmp_path / "site"
    first = _invoke("publish-index", "--store", str(store.root), option, str(site))
    assert first.wait(timeout=300) == 0, first.stderr.read()  # type: ignore[union-attr]
    before = {p: p.read_bytes() for p in site.rglob("*") if p.is_file()}
    store.delete_release("pkg0-1.0-cpu-py3.11-torch2.13.0")

    with site_lock.held(site):  # this process stands for the run that publishes now
        second = _invoke("publish-index", "--store", str(store.root), option, str(site))
        _, err = second.communicate(timeout=300)
    assert second.returncode == 1, err
    (line,) = err.strip().splitlines()
    holder = json.loads(site_lock.lock_file(site).read_text())
    assert holder["pid"] == os.getpid()
    assert line == (f"error: {site}: another publish is writing this site (process {os.getpid()}, "
                    f"`{holder['command']}`, started {holder['started']}); let it finish, then run this again (it "
                    "publishes the same store's releases)")
    assert {p: p.read_bytes() for p in site.rglob("*") if p.is_file()} == before

    third = _invoke("publish-index", "--store", str(store.root), option, str(site))  # the lock went with its holder
    assert third.wait(timeout=300) == 0, third.stderr.read()  # type: ignore[union-attr]
    assert _linked(site, 3) == [False, True, True]


def _linked(site: Path, count: int) -> list[bool]:
    """Whether each pkg<i>'s page links its wheel (a project whose releases are gone stays, archived, unlinked)."""
    pages = site / "cpu" / "torch2.13" / "simple"
    return [f"pkg{i}-1.0-py3-none-any.whl" in (pages / f"pkg{i}" / "index.html").read_text() for i in range(count)]


def test_two_publishes_at_once_end_in_one_site_and_never_blame_the_directory(tmp_path):
    """The report's run: a store of many releases, 60 of them deleted, two publish-index into its site at once."""
    store = _store(tmp_path / "store", RELEASES)
    site = tmp_path / "site"
    first = _invoke("publish-index", "--store", str(store.root), "--out", str(site))
    assert first.wait(timeout=300) == 0, first.stderr.read()  # type: ignore[union-attr]
    for i in range(RELEASES // 2):
        store.delete_release(f"pkg{i}-1.0-cpu-py3.11-torch2.13.0")
    runs = [_invoke("publish-index", "--store", str(store.root), "--out", str(site), "--allow-shrink")
            for _ in range(2)]
    results = [(run.wait(timeout=300), run.stderr.read()) for run in runs]  # type: ignore[union-attr]
    assert 0 in [code for code, _ in results], results
    for code, err in results:
        assert "cannot write the site" not in err and "Traceback" not in err, err
        if code:
            assert "another publish is writing this site (process " in err.strip().splitlines()[-1], err
    assert _linked(site, RELEASES) == [i >= RELEASES // 2 for i in range(RELEASES)]


def test_the_lock_of_a_site_whose_parent_cannot_hold_it_is_one_error(tmp_path):
    with pytest.raises(WheelhouseError) as error, site_lock.held(Path("/proc/wheelhouse-site")):
        pass
    assert str(error.value) == ("cannot write the site to /proc/wheelhouse-site (No such file or directory); name a "
                                "writable directory")


def test_a_holder_that_writes_its_line_just_after_taking_the_lock_is_named(tmp_path):
    """The holder takes the lock, then writes who it is: a run refused in between waits for the line."""
    import fcntl
    import threading

    site = tmp_path / "site"
    fd = os.open(site_lock.lock_file(site), os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    late = threading.Timer(0.3, lambda: os.pwrite(fd, site_lock._holder_line(), 0))
    late.start()
    try:
        with pytest.raises(WheelhouseError) as refused, site_lock.held(site):
            pass
    finally:
        late.join()
        os.close(fd)
    assert f"another publish is writing this site (process {os.getpid()}, " in str(refused.value)
