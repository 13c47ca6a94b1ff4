"""The install commands our pages print, run as a user runs them: real pip and real uv, clean venvs, our
served index plus a local stand-in of the package index that offers a higher-versioned sdist of the same
name and newer torches (tests/install_clients.py).

Each command must give: the component from our world (our wheel, no sdist built), torch on the world's
line (``2.13.0+cu130`` from the world's torch index, not ``2.13.9`` or ``2.99.0`` from the package
index), and the component's other dependency (einops) from the package index.
"""

from __future__ import annotations

import pytest
from install_clients import (
    SDIST,
    SOURCE_BUILD,
    WORLD,
    WORLD_TORCH,
    build_indexes,
    fresh_venv,
    install_forms,
    installed,
    ours_is_installed,
    run_commands,
    user_env,
)

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
