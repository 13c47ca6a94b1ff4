"""A local store's site that others can use: ``publish-index --base-url URL`` with the site inside the store
points the wheel links at the store served beside it (installing from another directory over loopback HTTP is
tests/test_which_wheel_standalone.py); elsewhere it says the links stay ``file://``. And every URL that reaches
a printed command is one which-wheel accepts: ``--base-url`` and versions.yaml's ``torch_index`` are refused in
one line when they hold a control character or a shell metacharacter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from index_helpers import REPO
from provenance_helpers import release_fixture

from ci.flows.demo import FIXTURE_VERSIONS
from ci.publish.which_wheel import SAFE_URL


def publish(store: Path, *args: str, versions: Path = FIXTURE_VERSIONS) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(versions), "WHEELHOUSE_STORE": str(store)}
    env.pop("GITHUB_REPOSITORY", None)
    return subprocess.run([sys.executable, "-m", "invoke", "publish-index", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def store(fixture_wheel, tmp_path_factory) -> Path:
    return release_fixture(fixture_wheel, tmp_path_factory.mktemp("portable")).store.root


def _wheel_urls(site: Path) -> list[str]:
    record = json.loads((site / "cpu" / "torch2.13" / "wheelhouse-world.json").read_text())
    return [w["url"] for p in record["projects"] for w in p["wheels"]]


def test_the_site_inside_the_store_links_the_wheels_where_the_store_is_served(store, tmp_path):
    result = publish(store, "--base-url", "http://127.0.0.1:8123/site")
    assert result.returncode == 0, result.stderr
    (url,) = _wheel_urls(store / "site")
    assert url.startswith("http://127.0.0.1:8123/releases/wheelhouse-fixture-0.1.0-cpu-py3.11-torch2.13.0/assets/")
    lock = (store / "site" / "cpu" / "torch2.13" / "pylock.wheelhouse-fixture.toml").read_text()
    assert f'url = "{url}"' in lock and "file://" not in lock
    assert "warning" not in result.stderr
    # and back: without --base-url the site is this machine's again, file:// throughout
    again = publish(store)
    assert again.returncode == 0 and _wheel_urls(store / "site")[0].startswith("file://"), again.stderr


def test_a_site_outside_the_store_says_its_wheel_links_stay_file_urls(store, tmp_path):
    result = publish(store, "--out", str(tmp_path / "site"), "--base-url", "http://127.0.0.1:8123/site")
    assert result.returncode == 0, result.stderr
    assert _wheel_urls(tmp_path / "site")[0].startswith("file://")
    assert (f"warning: the wheel links stay file:// URLs of the store {store}, which only this machine opens: "
            f"publish into the store ({store / 'site'}, the default) with --base-url naming that folder's URL, and "
            "serve the store's root there") in result.stderr


@pytest.mark.parametrize("base_url", ["https://127.0.0.1:9/x\x7fy", "https://127.0.0.1:9/x\ny", "https://h/a\x1b[2Jb",
                                      "https://h/a;touch${IFS}x", "https://h/$(id)", "https://h/a`id`",
                                      "https://h/a'b", "https://h/a b"])
def test_a_base_url_a_command_or_a_lock_file_cannot_hold_is_one_line(base_url, store, tmp_path):
    result = publish(store, "--out", str(tmp_path / "site"), "--base-url", base_url)
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: base URL ")
    assert "\x7f" not in result.stderr and "\x1b" not in result.stderr
    assert not (tmp_path / "site").exists()


@pytest.mark.parametrize("torch_index", ["https://127.0.0.1:9/whl;touch${IFS}$W/PWNED-ti;", "https://h/whl|id",
                                         "https://h/$(id)", "https://h/whl&id", "https://h/`id`", "https://h/(x)"])
def test_a_torch_index_with_shell_metacharacters_is_refused_when_the_file_is_loaded(torch_index, tmp_path):
    versions = tmp_path / "versions.yaml"
    versions.write_text(FIXTURE_VERSIONS.read_text().replace("torch_index: default", f"torch_index: '{torch_index}'"))
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(versions)}
    result = subprocess.run([sys.executable, "-m", "invoke", "matrix"], cwd=REPO, env=env, capture_output=True,
                            text=True, timeout=120)
    assert (result.returncode, result.stdout) == (2, ""), result.stdout + result.stderr
    assert result.stderr.count("\n") == 1 and "build_matrix[0].torch_index" in result.stderr, result.stderr


def test_the_schema_admits_the_urls_which_wheel_admits():
    schema = json.loads((REPO / "versions.schema.json").read_text())
    pattern = schema["$defs"]["matrix_entry"]["properties"]["torch_index"]["pattern"]
    assert pattern == f"^(?:default|{SAFE_URL.pattern})$"
