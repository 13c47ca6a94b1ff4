"""Row venvs: uv creates them, links torch from its cache, and passes pip's index options on."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ci.base.errors import WheelhouseError
from ci.building import toolchain
from ci.model import matrix
from ci.model.versions import load

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"


def _fixture_row():
    (row,) = matrix.expand(load(FIXTURE_VERSIONS))
    return row


def _torch_library(python: Path) -> Path:
    out = subprocess.run([str(python), "-c", "import torch, os; print(os.path.dirname(torch.__file__))"],
                         capture_output=True, text=True, check=True).stdout.strip()
    (lib,) = Path(out, "lib").glob("libtorch_cpu.so")
    return lib


@pytest.mark.skipif(toolchain.find_uv() is None, reason="needs uv (requirements-tools.txt)")
def test_second_row_venv_links_torch_from_uvs_cache(tmp_path, monkeypatch):
    """Two venvs of the same pins at two paths share torch's files (hardlinks into uv's cache), both
    pass the row's verification, and both have pip, which the builders run."""
    # two WHEELHOUSE_CACHEs, one uv cache: the one the fixture builds use, so a second run is warm
    monkeypatch.setenv("UV_CACHE_DIR", str(REPO / ".cache" / "uv"))
    row = _fixture_row()
    index = toolchain.torch_index(row)
    first = toolchain.prepare_venv(row, tmp_path / "a", index=index)
    second = toolchain.prepare_venv(row, tmp_path / "b", index=index, installer="uv")
    for python in (first, second):
        assert toolchain.verify(python, row).torch_version.split("+")[0] == row.torch
        subprocess.run([str(python), "-m", "pip", "--version"], check=True, capture_output=True)
    one, two = _torch_library(first), _torch_library(second)
    assert one != two and os.stat(one).st_ino == os.stat(two).st_ino, "torch was unpacked again"
    # the pinned venv is reused as it is
    assert toolchain.prepare_venv(row, tmp_path / "a", index=index) == first


def test_uv_cache_defaults_to_beside_the_venvs(tmp_path, monkeypatch):
    """On the venvs' file system uv links instead of copying; an explicit UV_CACHE_DIR wins."""
    assert toolchain.uv_cache_env(tmp_path, {})["UV_CACHE_DIR"] == str(tmp_path / "uv")
    assert toolchain.uv_cache_env(tmp_path, {"UV_CACHE_DIR": "/srv/uv"})["UV_CACHE_DIR"] == "/srv/uv"


def test_uv_gets_pips_index_options(monkeypatch):
    """uv does not read pip's configuration: its index URL, extra indexes, find-links and constraints
    are passed on, env before files; a row's own index replaces pip's index URL."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", "file:///srv/mirror/simple")
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", "file:///srv/a/simple file:///srv/b/simple")
    monkeypatch.setenv("PIP_FIND_LINKS", "/srv/wheels")
    monkeypatch.setenv("PIP_CONSTRAINT", "/srv/constraints.txt")
    cmd = toolchain.uv_install_command("uv", "/v/bin/python", ["torch==2.13.0"], None)
    assert cmd[:5] == ["uv", "pip", "install", "--python", "/v/bin/python"]
    text = " ".join(cmd)
    assert "--index-url file:///srv/mirror/simple" in text
    assert "--extra-index-url file:///srv/a/simple --extra-index-url file:///srv/b/simple" in text
    assert "--find-links /srv/wheels" in text and "--constraint /srv/constraints.txt" in text
    # pip's rule: the best version of all indexes; then the requirements, after the options
    assert cmd[-4:] == ["--index-strategy", "unsafe-best-match", "--", "torch==2.13.0"]
    row_index = toolchain.uv_install_command("uv", "/v/bin/python", ["torch==2.13.0"], "https://idx.invalid/cu130")
    assert row_index.count("--index-url") == 1 and "https://idx.invalid/cu130" in row_index
    assert "--find-links" in row_index  # pip keeps its find-links and extra indexes under --index-url too


def test_uv_asked_for_but_missing_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(toolchain, "find_uv", lambda: None)
    with pytest.raises(WheelhouseError, match="uv is not installed"):
        toolchain.prepare_venv(_fixture_row(), tmp_path, index=None, installer="uv")
    assert not (tmp_path / "venvs").exists()


@pytest.mark.skipif(toolchain.find_uv() is None, reason="needs uv (requirements-tools.txt)")
def test_a_requirement_is_never_read_as_an_option(tmp_path):
    """`--` ends the installers' options: a requirement that starts with '-' is refused as a requirement."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    cmd = toolchain.uv_install_command(toolchain.find_uv(), venv / "bin" / "python", ["--help"], None)
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "Usage:" not in result.stdout, result.stdout[:300]
    assert "--help" in result.stderr
    row = _fixture_row()
    pip = toolchain.install_command(venv / "bin" / "python", row, "https://idx.invalid/cpu")
    assert pip[pip.index("--") + 1:] == toolchain.torch_requirements(row)


def _stand_in_venv(venv: Path, interpreter: Path) -> None:
    """What a real make leaves that the venv lock reads, without the minutes of installing torch: the venv's
    interpreter link and its ready file."""
    python = toolchain.venv_python(venv)
    python.parent.mkdir(parents=True, exist_ok=True)
    python.unlink(missing_ok=True)
    python.symlink_to(interpreter)
    (venv / toolchain.READY).write_text("{}\n")


def test_a_venv_whose_python_is_gone_is_made_again(tmp_path, monkeypatch):
    """A venv links to the interpreter it was made from. One made from a temporary interpreter (a test's python3.11
    on PATH, an uninstalled pyenv version) kept its ready file after that interpreter went, and every later build
    of the row stopped at `No such file or directory: .../bin/python`."""
    base = tmp_path / "gone" / "python3.11"
    base.parent.mkdir()
    base.symlink_to(sys.executable)
    made: list[Path] = []

    def make(row, venv, *, index, installer):
        made.append(venv)
        _stand_in_venv(venv, base if len(made) == 1 else Path(sys.executable))

    monkeypatch.setattr(toolchain, "_make_venv", make)
    row = _fixture_row()
    first = toolchain.prepare_venv(row, tmp_path / "cache", index=None)
    assert toolchain.prepare_venv(row, tmp_path / "cache", index=None) == first and len(made) == 1
    shutil.rmtree(base.parent)
    assert not first.exists()  # the venv's link now points nowhere
    second = toolchain.prepare_venv(row, tmp_path / "cache", index=None)
    assert second == first and len(made) == 2 and second.exists()
    assert subprocess.run([str(second), "-c", "pass"]).returncode == 0


def test_a_make_that_leaves_no_interpreter_is_one_error_not_a_loop(tmp_path, monkeypatch):
    def make(row, venv, *, index, installer):  # the ready file, and no interpreter
        venv.mkdir(parents=True, exist_ok=True)
        (venv / toolchain.READY).write_text("{}\n")

    monkeypatch.setattr(toolchain, "_make_venv", make)
    with pytest.raises(WheelhouseError, match=r"made, but .*/bin/python is missing or links to nothing; remove "):
        toolchain.prepare_venv(_fixture_row(), tmp_path, index=None)


def test_a_stale_venv_is_made_again_only_once_no_build_runs_in_it(tmp_path, monkeypatch):
    """Builds on one machine share a row's venv; one whose build changed it marks it stale, and the venv is made
    again only after every build running in it has ended (parallel builds once removed it under each other)."""
    made: list[float] = []

    def make(row, venv, *, index, installer):
        made.append(time.monotonic())
        _stand_in_venv(venv, Path(sys.executable))

    monkeypatch.setattr(toolchain, "_make_venv", make)
    row = _fixture_row()
    with toolchain.pinned_venv(row, tmp_path, index=None) as python:  # a build running in the venv
        assert len(made) == 1
        assert toolchain.prepare_venv(row, tmp_path, index=None) == python and len(made) == 1  # shared, not remade
        toolchain.mark_stale(python.parent.parent)
        waiter = threading.Thread(target=toolchain.prepare_venv, args=(row, tmp_path), kwargs={"index": None})
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive() and len(made) == 1  # the next build waits for the one running in it
        ended = time.monotonic()
    waiter.join(10)
    assert not waiter.is_alive() and len(made) == 2 and made[1] >= ended
