"""``invoke which-wheel``, run as a user runs it: the real command, under an interpreter whose torch it reads,
against a published site (a directory, a file:// URL, loopback http), and the commands it prints run by
real pip and real uv in clean venvs beside a stand-in of the package index (tests/install_clients.py).

The user's torch is a stand-in put first on PYTHONPATH (version, CUDA, ABI, git version, GPUs): there is
no GPU or CUDA torch here. The GPU machine runs the same command with its real torch
(tests/gpu/run_on_device.sh upstream, step 2).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from index_helpers import REPO, CountingServer
from install_clients import (
    BUILT_WITH,
    SOURCE_BUILD,
    WORLD,
    WORLD_TORCH,
    build_indexes,
    fresh_venv,
    installed,
    ours_is_installed,
    run_commands,
    user_env,
    user_torch,
)

from ci.publish.catalog import INDEX_RECORD
from ci.publish.which_wheel import FORMS


@pytest.fixture(scope="module")
def indexes(tmp_path_factory):
    return build_indexes(tmp_path_factory.mktemp("which-wheel-indexes"))


def which_wheel(index: str, torch_dir: Path | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if torch_dir is not None:
        env["PYTHONPATH"] = str(torch_dir)
    env.pop("CUDA_VISIBLE_DEVICES", None)
    env["PATH"] = f"{Path(sys.executable).parent}:/usr/bin:/bin"  # no nvidia-smi here; the stand-in says the GPUs
    return subprocess.run([sys.executable, "-m", "invoke", "which-wheel", "--index", index, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120, env=env)


def printed_forms(output: str) -> dict[str, list[str]]:
    """The commands which-wheel prints, by the heading line above them (``pip:``, ``uv:``, ...)."""
    forms: dict[str, list[str]] = {}
    heading = None
    for line in output.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            heading = line[:-1]
            forms[heading] = []
        elif line.startswith("  ") and heading is not None:
            forms[heading].append(line.strip())
        else:
            heading = None
    return {k: v for k, v in forms.items() if v and all(c.startswith(("pip ", "uv ")) for c in v)}


def test_the_matching_world_its_wheel_and_the_commands(indexes, tmp_path):
    torch = user_torch(tmp_path / "user", WORLD_TORCH, cuda="13.0", capabilities=((9, 0),))
    result = which_wheel(str(indexes.site), torch)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert lines[0] == (f"environment: Python {python} on x86_64; torch 2.13.0+cu130 (CUDA 13.0, C++11 ABI on, git "
                        "000000000000); GPUs: stand-in GPU 0 (sm_90) (from torch.cuda)")
    assert lines[1] == f"world: {WORLD} (torch 2.13.x, CUDA 13.0; index {indexes.ours})"
    fits = [line for line in lines if line.startswith("fits: ")]
    assert len(fits) == 1 and fits[0].startswith("fits: flash-attn 2.8.3: flash_attn-2.8.3-cp")
    assert "(sm 8.0, 9.0, 10.0, 10 KiB, torch==2.13.*; release flash-attention-v2.8.3-py" in fits[0]
    assert "does not fit:" not in result.stdout
    forms = printed_forms(result.stdout)
    assert sorted(forms) == sorted(title for _, title in FORMS)
    # torch is installed and on the world's line: no command touches it
    assert not any("torch==" in command for commands in forms.values() for command in commands)


@pytest.mark.parametrize("form", [title for _, title in FORMS])
def test_every_printed_command_takes_our_wheel_and_keeps_the_users_torch(form, indexes, tmp_path):
    """A user with the world's torch runs what which-wheel printed: our wheel, no sdist built, torch untouched
    (the package index offers 2.13.9 and 2.99.0)."""
    result = which_wheel(str(indexes.site), user_torch(tmp_path / "user", WORLD_TORCH, cuda="13.0"))
    commands = printed_forms(result.stdout)[form]
    python = fresh_venv(tmp_path)
    env = user_env(tmp_path, indexes)
    torch = run_commands([f"uv pip install --index {indexes.torch_index} torch=={WORLD_TORCH}"], python, env)
    assert torch.failed is None, torch.output
    ran = run_commands(commands, python, env)
    assert ran.failed is None and SOURCE_BUILD not in ran.output, ran.output
    assert installed(python, tmp_path) == {"einops": "0.8.1", "flash-attn": "2.8.3", "torch": WORLD_TORCH}
    assert ours_is_installed(python)


def test_a_gpu_the_wheel_has_no_kernels_for_is_named(indexes, tmp_path):
    torch = user_torch(tmp_path / "user", WORLD_TORCH, cuda="13.0", capabilities=((12, 0),))
    result = which_wheel(str(indexes.site), torch, "--package", "flash-attn")
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines()[-2:] == [
        "does not fit:", f"  flash-attn: no sm_120 kernels in {WORLD} (built for 8.0, 9.0, 10.0)"]
    assert "pip install" not in result.stdout


def test_a_gpu_of_the_same_major_runs_the_older_minors_cubins(indexes, tmp_path):
    """sm_86 runs sm_80 cubins (same major, higher minor)."""
    result = which_wheel(str(indexes.site), user_torch(tmp_path / "user", WORLD_TORCH, cuda="13.0",
                                                       capabilities=((8, 6),)))
    assert result.returncode == 0 and "does not fit" not in result.stdout, result.stdout


def test_another_abi_an_unknown_package_and_another_torch_build(indexes, tmp_path):
    torch = user_torch(tmp_path / "user", WORLD_TORCH, cuda="13.0", capabilities=((9, 0),), cxx11_abi=False,
                       git_version="1" * 40)
    result = which_wheel(indexes.base_url, torch, "--package", "flash_attn", "--package", "deep-ep")
    assert result.returncode == 1, result.stderr
    assert result.stdout.splitlines()[-3:] == [
        "does not fit:",
        "  flash-attn: built with the C++11 ABI on, your torch has it off",
        f"  deep-ep: not in {WORLD} (it holds flash-attn)",
    ]
    assert (f"note: flash-attn: built against torch {BUILT_WITH['version']} git 000000000000, yours is git "
            "111111111111: the same line, another build of it") in result.stdout


def test_over_loopback_http(indexes, tmp_path):
    with CountingServer(indexes.site) as server:
        result = which_wheel(server.url, user_torch(tmp_path / "user", WORLD_TORCH, cuda="13.0"))
    assert result.returncode == 0, result.stderr
    assert f"world: {WORLD}" in result.stdout and "fits: flash-attn 2.8.3" in result.stdout
    assert ("note: flash-attn: no GPU seen (torch.cuda, nvidia-smi), so its CUDA archs (8.0, 9.0, 10.0) were not "
            "checked") in result.stdout


def test_a_torch_no_world_matches_is_one_line(indexes, tmp_path):
    result = which_wheel(str(indexes.site), user_torch(tmp_path / "user", "2.99.0+cu130", cuda="13.0"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == (f"error: no world of {indexes.site} matches torch 2.99.0+cu130 (cu130/torch2.99): it "
                             f"serves {WORLD}; install the torch of one of them from its torch index\n")


def test_no_torch_is_one_line(indexes, tmp_path):
    absent = tmp_path / "no-torch" / "torch"
    absent.mkdir(parents=True)
    (absent / "__init__.py").write_text('raise ModuleNotFoundError("No module named \'torch\'", name="torch")\n')
    result = which_wheel(str(indexes.site), absent.parent)
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("error: no torch in ") and result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.endswith("install the torch you will run with first; which-wheel matches the wheels to it\n")


@pytest.mark.parametrize("case", ["missing", "not-a-site", "broken-record", "bad-scheme"])
def test_an_index_that_cannot_be_read_is_one_line(case, indexes, tmp_path):
    if case == "missing":
        index, expected = str(tmp_path / "nothing"), "no such directory"
    elif case == "not-a-site":
        index, expected = str(tmp_path), f"holds no {INDEX_RECORD}"
    elif case == "broken-record":
        (tmp_path / INDEX_RECORD).write_text("{not json")
        index, expected = str(tmp_path), "is not JSON"
    else:
        index, expected = "ftp://example.invalid/site", "give a directory, or a file://, http:// or https:// URL"
    result = which_wheel(index, user_torch(tmp_path / "user", WORLD_TORCH, cuda="13.0"))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr.startswith("error: ") and expected in result.stderr and result.stderr.count("\n") == 1
