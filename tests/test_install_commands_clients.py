"""The install commands our pages print, run as a user runs them: real pip and real uv, clean venvs, our
served index plus a local stand-in of the package index that offers a higher-versioned sdist of the same
name and newer torches (tests/install_clients.py).

Each command must give: the component from our world (our wheel, no sdist built), torch on the world's
line (``2.13.0+cu130`` from the world's torch index, not ``2.13.9`` or ``2.99.0`` from the package
index), and the component's other dependency (einops) from the package index.
"""

from __future__ import annotations

import html
import json
import re
import sys
import zipfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
from index_helpers import UV, client_env, run
from install_clients import (
    SDIST,
    SOURCE_BUILD,
    WORLD,
    WORLD_TORCH,
    build_indexes,
    fresh_venv,
    install_forms,
    installed,
    lock_capable_pip,
    ours_is_installed,
    printed_blocks,
    run_commands,
    user_env,
)
from provenance_helpers import release_fixture
from stamp_helpers import simple_index, torch_stand_in
from wheel_factory import build_wheel

from ci.publish.catalog import Context
from ci.publish.pages import DirectoryTarget, IndexWhere, publish
from ci.publish.which_wheel import LOCK_PIP

EXPECTED = {"einops": "0.8.1", "flash-attn": "2.8.3", "torch": WORLD_TORCH}


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    return build_indexes(tmp_path_factory.mktemp("install-indexes"))


def _assert_ours(ran, python, tmp_path):
    assert SOURCE_BUILD not in ran.output, ran.output
    assert ran.failed is None, ran.output
    assert SDIST not in ran.output, ran.output  # not even downloaded
    assert installed(python, tmp_path) == EXPECTED, ran.output
    assert ours_is_installed(python), ran.output


@pytest.mark.parametrize("form", ["pip", "uv"])
@pytest.mark.parametrize("page", ["index.html", f"{WORLD}/index.html"])
def test_the_pages_commands_take_our_wheel_and_the_worlds_torch(form, page, indexes, tmp_path):
    """The landing page's command as a new user runs it. The page printed
    ``pip install --extra-index-url <world>/simple/ flash-attn`` and no uv command: pip merged the indexes,
    took the package index's flash_attn-2.8.3.post2 sdist and started building it."""
    path = indexes.site / page
    assert path.is_file(), f"the site has no {page}"
    commands = install_forms(path.read_text()).get(form)
    assert commands, f"{page} prints no {form} install command"
    python = fresh_venv(tmp_path)
    _assert_ours(run_commands(commands, python, user_env(tmp_path, indexes)), python, tmp_path)


@pytest.mark.parametrize("form", ["pip-locked", "uv-locked"])
def test_the_lock_file_forms_install_our_wheel_by_its_hash(form, indexes, tmp_path):
    """pylock.flash-attn.toml: pip 26.3 (``-r``, with --no-deps) and uv install exactly its wheel."""
    commands = install_forms((indexes.site / WORLD / "index.html").read_text()).get(form)
    assert commands and any("pylock.flash-attn.toml" in c for c in commands), commands
    python = fresh_venv(tmp_path)
    _assert_ours(run_commands(commands, python, user_env(tmp_path, indexes)), python, tmp_path)


def test_a_lock_file_refuses_other_bytes(indexes, tmp_path):
    """The lock's sha256 is checked: a wheel replaced behind its URL is refused, by pip and by uv."""
    lock = (indexes.site / WORLD / "pylock.flash-attn.toml").read_text()
    (url,) = re.findall(r'^url = "(.*)"$', lock, re.M)
    wheel = Path(unquote(urlsplit(url).path))
    changed = tmp_path / wheel.name
    changed.write_bytes(wheel.read_bytes())
    with zipfile.ZipFile(changed, "a") as archive:
        archive.comment = b"replaced"
    tampered = tmp_path / "pylock.flash-attn.toml"
    tampered.write_text(lock.replace(url, changed.as_uri()))
    for command in (f"pip install --no-deps -r {tampered}", f"uv pip install -r {tampered}"):
        python = fresh_venv(tmp_path, command.split()[0])
        if command.startswith("pip "):  # the lock form's first line: a pip that reads lock files
            upgraded = run_commands([f"pip install 'pip>={LOCK_PIP}'"], python, user_env(tmp_path, indexes))
            assert upgraded.failed is None, upgraded.output
        ran = run_commands([command], python, user_env(tmp_path, indexes))
        assert ran.failed == command, ran.output
        assert "flash-attn" not in installed(python, tmp_path)
        assert re.search(r"(?i)hash", ran.output), ran.output


def test_the_uv_project_form_takes_our_wheel_and_the_worlds_torch(indexes, tmp_path):
    """The pyproject.toml tables the page prints, with the dependencies it names, in a project `uv sync` installs."""
    page = (indexes.site / WORLD / "index.html").read_text()
    tables = next(lines for lines in printed_blocks(page) if lines and lines[0] == "[[tool.uv.index]]")
    dependencies = html.unescape(re.search(r'<code class="uv-dependencies">([^<]*)</code>', page)[1]).split(", ")
    project = tmp_path / "app"
    project.mkdir()
    (project / "pyproject.toml").write_text(
        '[project]\nname = "app"\nversion = "0"\nrequires-python = ">=3.10"\n'
        f"dependencies = {json.dumps(dependencies)}\n\n" + "\n".join(tables) + "\n")
    assert UV
    proc = run([UV, "sync", "--project", str(project), "--python", sys.executable], user_env(tmp_path, indexes))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    python = project / ".venv" / "bin" / "python"
    assert SOURCE_BUILD not in proc.stderr
    assert installed(python, tmp_path) == EXPECTED
    assert ours_is_installed(python)


# --------------------------------------------------------------------------- a CPU world

CPU_WORLD = "cpu/torch2.13"


@pytest.fixture(scope="module")
def cpu_world(fixture_wheel, tmp_path_factory):
    """The fixture's CPU world, published from a local store; its torch index offers ``2.13.0+cpu``; the package
    index offers the torch a stock installer finds there for Linux, ``2.13.0`` built for CUDA (it requires an
    ``nvidia-cublas-cu13``, also there), and the pip that reads lock files."""
    root = tmp_path_factory.mktemp("cpu-world")
    released = release_fixture(fixture_wheel, root)
    torch_index = simple_index(root / "torch-index", [torch_stand_in(root / "torch-wheels", "2.13.0+cpu")])
    cuda_torch = build_wheel(root / "pkg-wheels", name="torch", version="2.13.0", tags="py3-none-any",
                             requires_python=None, requires=["nvidia-cublas-cu13"])
    cublas = build_wheel(root / "pkg-wheels", name="nvidia_cublas_cu13", version="13.0.0", tags="py3-none-any",
                         requires_python=None)
    package_index = simple_index(root / "package-index", [cuda_torch, cublas, lock_capable_pip()])
    site = released.store.root / "site"
    where = IndexWhere(DirectoryTarget(site), site.as_uri(), CPU_WORLD,
                       context=Context(torch_indexes={CPU_WORLD: torch_index.rstrip("/")}))
    publish(released.store, where)
    return site, package_index


@pytest.mark.parametrize("form", ["pip", "uv", "pip-locked", "uv-locked"])
def test_a_cpu_worlds_commands_install_the_cpu_torch_not_the_package_indexs_cuda_torch(form, cpu_world, tmp_path):
    """A fresh venv without torch runs the CPU world's printed commands: torch 2.13.0+cpu from the world's torch
    index, no nvidia-* package; uv's command names the torch index too (it took the package index's before)."""
    site, package_index = cpu_world
    commands = install_forms((site / CPU_WORLD / "index.html").read_text())[form]
    python = fresh_venv(tmp_path)
    env = {**client_env(tmp_path), "PIP_INDEX_URL": package_index, "UV_DEFAULT_INDEX": package_index}
    ran = run_commands(commands, python, env)
    assert ran.failed is None, ran.output
    assert installed(python, tmp_path) == {"torch": "2.13.0+cpu", "wheelhouse-fixture": "0.1.0"}, ran.output
