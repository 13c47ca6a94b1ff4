"""which-wheel as the site serves it: one file of the standard library, the same answers as packaging gives for
versions, specifiers and this interpreter's wheel tags, and, in a fresh venv that holds only torch (the real
CPU torch 2.13.0, no checkout on its path), run from the site over loopback HTTP, it prints the world and
commands that install and import the wheel.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from index_helpers import REPO, CountingServer, client_env
from install_clients import lock_capable_pip, run_commands, shell_env
from made_once import one_maker
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import sys_tags
from packaging.version import InvalidVersion
from packaging.version import Version as PackagingVersion
from provenance_helpers import release_fixture
from stamp_helpers import simple_index, torch_stand_in
from test_which_wheel import printed_forms

from ci.flows.demo import FIXTURE_VERSIONS, SMOKE_TEST
from ci.publish import which_wheel
from ci.publish.which_wheel import FORMS, SERVED_NAME, Version, interpreter_tags, served_copy, version_in

VERSIONS = ["2.13.0", "2.13.0+cpu", "2.13.0+cu130", "2.13.1", "2.13", "2.13.0a0", "2.13.0rc1", "2.13.0.dev20250101",
            "2.13.0.post1", "2.12.9", "2.14.0", "1!2.13.0", "2.13.0a0+git1234", "3.11", "3.9", "3.10.4", "3.13.0b1",
            "2.8.3", "2.8.3.post2", "0.6.13", "v1.0", "1.0-1", "1.0.0.0"]
SPECIFIERS = ["==2.13.*", "==2.13.0", "==2.13", ">=2.13", "<2.14", "<2.13", ">2.13", ">2.13.0", "!=2.13.*", "~=2.13",
              "~=2.13.0", ">=3.9", ">=3.10,<3.13", "!=3.11.*", "==2.13.0+cpu", "<=2.13.0", ">=2.13.0a0", "===2.13.0",
              "==1!2.13.*", ">2.8.3", "<2.8.3.post2", "", ">=3.9, !=3.10.*"]


@pytest.mark.parametrize("specifier", SPECIFIERS)
def test_specifiers_answer_as_packaging_does(specifier):
    for version in VERSIONS:
        try:
            expected: bool | None = PackagingVersion(version) in SpecifierSet(specifier)
        except (InvalidVersion, InvalidSpecifier):
            expected = None
        assert version_in(version, specifier) == expected, (version, specifier)


def test_versions_order_as_packaging_orders_them():
    for a, b in itertools.product(VERSIONS, repeat=2):
        ours_a, ours_b = Version.parse(a), Version.parse(b)
        assert ours_a is not None and ours_b is not None
        assert (ours_a.key < ours_b.key) == (PackagingVersion(a) < PackagingVersion(b)), (a, b)
        assert (ours_a.key == ours_b.key) == (PackagingVersion(a) == PackagingVersion(b)), (a, b)
    assert Version.parse("not a version") is None and Version.parse("2.13.0 ; rm") is None


def test_this_interpreters_tags_are_pips_in_pips_order():
    assert [f"{i}-{a}-{p}" for i, a, p in interpreter_tags()] == [str(t) for t in sys_tags()]


def test_the_file_runs_on_the_standard_library_alone(tmp_path):
    """``python -I -S``: no site-packages, no user site, no environment: only the standard library can be imported."""
    script = tmp_path / SERVED_NAME
    script.write_bytes(served_copy("https://owner.github.io/wheelhouse"))
    result = subprocess.run([sys.executable, "-I", "-S", str(script), "--index", str(tmp_path)], capture_output=True,
                            text=True, timeout=60, cwd=tmp_path)
    assert (result.returncode, result.stdout) == (2, ""), result.stderr
    assert result.stderr == f"error: {tmp_path}: holds no wheelhouse-index.json; pass the root of a site invoke " \
                            "publish-index wrote (the folder or URL with its index.html)\n"
    helped = subprocess.run([sys.executable, "-I", "-S", str(script), "--help"], capture_output=True, text=True)
    assert "(default: https://owner.github.io/wheelhouse)" in " ".join(helped.stdout.split())


def test_the_served_copy_is_this_module_with_the_sites_url_as_its_default():
    source = Path(which_wheel.__file__).read_text().splitlines()
    served = served_copy("https://owner.github.io/wheelhouse").decode().splitlines()
    changed = [(a, b) for a, b in zip(source, served, strict=True) if a != b]
    assert changed == [("DEFAULT_INDEX: str | None = None",
                        "DEFAULT_INDEX: str | None = 'https://owner.github.io/wheelhouse'")]
    with pytest.raises(ValueError, match="holds"):
        served_copy("https://owner.github.io/x'; import os; os.system('id')  #")


# --------------------------------------------------------------------------- a fresh venv with only torch

TORCH_REQUIREMENT = "torch==2.13.0"
TORCH_VENVS = REPO / ".cache" / "torch-venvs"


def _venv_key() -> str:
    """What the cached venv is made of: this Python and the requirement (a change of either is another venv)."""
    made_of = f"{sys.version}|{os.path.realpath(sys.executable)}|{TORCH_REQUIREMENT}|v1"
    return hashlib.sha256(made_of.encode()).hexdigest()[:16]


def torch_venv() -> Path:
    """A venv holding torch 2.13.0 and what it requires, and nothing else, made once with this machine's own pip
    configuration (a CPU torch from local disk here) and kept under .cache/ by what it is made of."""
    venv = TORCH_VENVS / _venv_key()
    with one_maker(venv):
        _make_torch_venv(venv)
    return venv


def _make_torch_venv(venv: Path) -> None:
    done = venv / ".complete"
    if not done.exists():
        shutil.rmtree(venv, ignore_errors=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
        proc = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                               "--disable-pip-version-check", TORCH_REQUIREMENT], capture_output=True, text=True,
                              timeout=1200)
        if proc.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            pytest.fail(f"{TORCH_REQUIREMENT} does not install here: {proc.stderr.strip()[-600:]}")
        done.write_text(TORCH_REQUIREMENT + "\n")


def copy_of(venv: Path, to: Path) -> Path:
    """A venv of its own that shares the cached venv's files by hard link (seconds, not a second install): what an
    install writes is new files, and the few that name the venv's path (scripts, activate) are rewritten."""
    subprocess.run(["cp", "-al", str(venv), str(to)], check=True, timeout=300)
    for script in (to / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            data = script.read_bytes()
            if str(venv).encode() in data:
                script.unlink()
                script.write_bytes(data.replace(str(venv).encode(), str(to).encode()))
                script.chmod(0o755)
    return to


@pytest.fixture(scope="module")
def served_store(fixture_wheel, tmp_path_factory):
    """The fixture row released into a local store, the store's root served over loopback HTTP, and its site
    published by ``invoke publish-index --base-url <that URL>/site``: the portable local site."""
    root = tmp_path_factory.mktemp("served")
    released = release_fixture(fixture_wheel, root)
    with CountingServer(released.store.root) as server:
        site_url = f"{server.url}/site"
        env = {**os.environ, "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS), "WHEELHOUSE_STORE": str(released.store.root)}
        env.pop("GITHUB_REPOSITORY", None)
        published = subprocess.run([sys.executable, "-m", "invoke", "publish-index", "--base-url", site_url], cwd=REPO,
                                   env=env, capture_output=True, text=True, timeout=300)
        assert published.returncode == 0, published.stdout + published.stderr
        yield released, site_url


def user_package_index(root: Path) -> str:
    """The package index the user's installers are configured for: a pip that reads lock files, and a torch
    2.13.0 without the CPU label (as the package index's CUDA build is named), which nothing may pull."""
    return simple_index(root, [lock_capable_pip(), torch_stand_in(root / "wheels", "2.13.0")])


@pytest.fixture(scope="module")
def printed(served_store, tmp_path_factory):
    """What the site's which-wheel.py printed in a fresh venv holding only torch, run from the user's own directory
    as ``python3 <(curl -fsSL <site>/which-wheel.py)``, and the shell environment it ran in."""
    _, site_url = served_store
    tmp = tmp_path_factory.mktemp("user")
    elsewhere = tmp / "elsewhere"  # no checkout on the path: the user's own directory
    elsewhere.mkdir()
    python = copy_of(torch_venv(), tmp / "venv") / "bin" / "python"
    env = shell_env(python, {**client_env(tmp), "PIP_INDEX_URL": user_package_index(tmp / "pkg-index")})
    env["UV_DEFAULT_INDEX"] = env["PIP_INDEX_URL"]
    curl = subprocess.run(["bash", "-c", f"python3 <(curl -fsSL {site_url}/{SERVED_NAME})"], cwd=elsewhere, env=env,
                          capture_output=True, text=True, timeout=300)
    assert curl.returncode == 0, curl.stdout + curl.stderr
    return site_url, curl.stdout, env, elsewhere


def test_a_fresh_torch_venv_runs_the_sites_which_wheel_by_curl_and_by_uv_run(printed):
    site_url, output, env, elsewhere = printed
    lines = output.splitlines()
    assert lines[0].startswith("environment: Python 3.11 on x86_64; torch 2.13.0+cpu (CPU, C++11 ABI on, git ")
    assert lines[1] == f"world: cpu/torch2.13 (torch 2.13.x, CPU; index {site_url}/cpu/torch2.13/simple/)"
    assert lines[2].startswith("fits: wheelhouse-fixture 0.1.0: wheelhouse_fixture-0.1.0-cp311-cp311-linux_x86_64.whl "
                               "(no CUDA code, ")
    assert sorted(printed_forms(output)) == sorted(title for _, title in FORMS)
    uv_run = subprocess.run(["uv", "run", "--quiet", f"{site_url}/{SERVED_NAME}"], cwd=elsewhere, env=env,
                            capture_output=True, text=True, timeout=300)
    assert (uv_run.returncode, uv_run.stdout) == (0, output), uv_run.stderr


def _install_and_call(printed, title: str, tmp_path: Path) -> None:
    _, output, env, elsewhere = printed
    commands = printed_forms(output)[title]
    fresh = copy_of(torch_venv(), tmp_path / "venv") / "bin" / "python"
    ran = run_commands(commands, fresh, {k: v for k, v in env.items() if k not in ("VIRTUAL_ENV", "PATH")})
    assert ran.failed is None, ran.output
    smoke = subprocess.run([str(fresh), "-W", "ignore", "-c", SMOKE_TEST], cwd=elsewhere, capture_output=True,
                           text=True, timeout=120)
    assert smoke.returncode == 0 and "scaled_add = [1.0, 3.0, 5.0, 7.0]" in smoke.stdout, smoke.stderr
    torch = subprocess.run([str(fresh), "-c", "import torch; print(torch.__version__)"], capture_output=True,
                           text=True, timeout=120)
    assert torch.stdout.strip() == "2.13.0+cpu", ran.output  # the user's torch, kept


def test_the_printed_pip_commands_install_the_wheel_from_the_served_site_and_it_runs(printed, tmp_path):
    _install_and_call(printed, "pip", tmp_path)


@pytest.mark.parametrize("title", [title for attribute, title in FORMS if attribute != "pip"])
def test_every_other_printed_form_installs_the_wheel_and_it_runs(printed, title, tmp_path):
    """The uv form and both lock-file forms (pip's starting from the pip a fresh venv has)."""
    _install_and_call(printed, title, tmp_path)
