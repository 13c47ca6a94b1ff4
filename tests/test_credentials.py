"""No credential within reach of build code: an allow-listed environment, and processes above the build
whose /proc/<pid>/environ (their initial environment, readable by the same user) holds none."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ci.model import credentials

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"

# What a hostile build step does to find a token: its own environment, then each ancestor's initial one.
ANCESTOR_WALK = """
import json, os, sys
found, pid = [], os.getpid()
while pid > 1:
    try:
        environ = open(f"/proc/{pid}/environ", "rb").read()
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        break
    if SECRET.encode() in environ:
        found.append(open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\\0", b" ").decode()[:80])
    pid = int(stat.rsplit(")", 1)[1].split()[1])
open(OUT, "w").write(json.dumps(found))
"""


def test_build_environment_is_an_allow_list():
    environ = {"PATH": "/usr/bin", "HOME": "/home/u", "LC_ALL": "C", "CUDA_HOME": "/usr/local/cuda", "CXX": "g++",
               "PIP_INDEX_URL": "https://u:p@mirror/simple", "UV_INDEX_URL": "https://mirror/simple",
               "https_proxy": "http://proxyuser:proxypass@proxy:3128", "WHEELHOUSE_BUILD_MEMORY_GIB": "8",
               "TOKEN": "x", "GITHUB_PAT": "x", "GH_PAT": "x", "GIT_CONFIG_VALUE_0": "x", "CMAKE_API_TOKEN": "x",
               "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/0/bus", "MIRROR_PASSWORD": "verbatim"}
    filtered = credentials.build_environment(environ, pass_env=["MIRROR_PASSWORD"])
    assert filtered.environ == {
        "PATH": "/usr/bin", "HOME": "/home/u", "LC_ALL": "C", "CUDA_HOME": "/usr/local/cuda", "CXX": "g++",
        "PIP_INDEX_URL": "https://mirror/simple", "UV_INDEX_URL": "https://mirror/simple",
        "https_proxy": "http://proxy:3128", "WHEELHOUSE_BUILD_MEMORY_GIB": "8", "MIRROR_PASSWORD": "verbatim"}
    assert filtered.withheld == ("CMAKE_API_TOKEN", "GH_PAT", "GITHUB_PAT", "GIT_CONFIG_VALUE_0", "TOKEN")
    assert filtered.stripped == ("PIP_INDEX_URL", "https_proxy") and filtered.unlisted == 1
    # git gets no GIT_CONFIG_* of the caller and never prompts; its proxy keeps its credentials (only the proxy sees them)
    git = credentials.git_environment(environ)
    assert git["GIT_TERMINAL_PROMPT"] == "0" and git["https_proxy"] == environ["https_proxy"]
    assert "GIT_CONFIG_VALUE_0" not in git and "MIRROR_PASSWORD" not in git


def test_a_process_restarts_without_credentials_so_its_proc_environ_holds_none(tmp_path):
    """Deleting from os.environ leaves /proc/<pid>/environ as it was; the re-exec clears it."""
    script = ("import os, sys\n"
              "from ci.model import credentials\n"
              "credentials.reexec_without_credentials([sys.executable, *sys.orig_argv[1:]], os.environ, "
              "keep={'MIRROR_PASSWORD'})\n"
              "print(open(f'/proc/{os.getpid()}/environ', 'rb').read().decode())\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "GITHUB_TOKEN": "ghp_SECRET", "GH_PAT": "pat_SECRET",
           "MIRROR_PASSWORD": "kept", "SOME_SETTING": "kept too"}
    result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    initial = dict(item.split("=", 1) for item in result.stdout.rstrip("\n").split("\0") if "=" in item)
    assert "SECRET" not in result.stdout
    assert initial["MIRROR_PASSWORD"] == "kept" and initial["SOME_SETTING"] == "kept too"


@pytest.mark.slow
def test_no_process_above_a_nox_build_holds_the_token(tmp_path):
    """The build's setup.py walks its ancestors' /proc/<pid>/environ: nox, started with GITHUB_TOKEN, holds it no more."""
    src = tmp_path / "src"
    shutil.copytree(REPO / "tests" / "fixtures" / "fixture_ext", src)
    out = tmp_path / "found.json"
    (src / "setup.py").write_text(f"SECRET, OUT = 'ghp_SECRET_ABOVE', {str(out)!r}\n{ANCESTOR_WALK}\nsys.exit(1)\n")
    env = {**os.environ, "GITHUB_TOKEN": "ghp_SECRET_ABOVE", "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS),
           "WHEELHOUSE_CACHE": str(tmp_path / "cache")}
    result = subprocess.run([sys.executable, "-m", "nox", "-s", "build-wheelhouse-fixture-3.11", "--", "--reuse-env",
                             "--source", str(src), "--dist", str(tmp_path / "dist")],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode != 0 and "exited with status 1" in result.stderr, result.stderr[-2000:]
    assert json.loads(out.read_text()) == []


def test_no_process_above_a_benchmark_holds_the_token(tmp_path):
    """`invoke bench` runs builds of third-party code: started with GITHUB_TOKEN, it restarts without it first."""
    hook = tmp_path / "hook"
    hook.mkdir()
    out = tmp_path / "found.json"
    # every Python started below runs sitecustomize; the benchmark process walks its ancestors
    (hook / "sitecustomize.py").write_text(
        "import os\n"
        "if b'benchmarks' in open('/proc/self/cmdline', 'rb').read():\n"
        f"    SECRET, OUT = 'ghp_SECRET_BENCH', {str(out)!r}\n"
        + "".join(f"    {line}\n" for line in ANCESTOR_WALK.strip().splitlines()))
    env = {**os.environ, "GITHUB_TOKEN": "ghp_SECRET_BENCH", "PYTHONPATH": f"{hook}{os.pathsep}{REPO}"}
    result = subprocess.run([sys.executable, "-m", "invoke", "bench", "--only", "no-such-figure"],
                            cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0 and "no-such-figure" in result.stdout + result.stderr, result.stderr[-2000:]
    assert json.loads(out.read_text()) == []


def test_a_build_under_a_process_that_holds_the_token_refuses_to_start(tmp_path):
    """`GITHUB_TOKEN=… timeout 600 nox …`: nox drops the token, but `timeout` keeps it readable to the build."""
    marker = tmp_path / "built"
    env = {**os.environ, "GITHUB_TOKEN": "ghp_SECRET_IN_WRAPPER", "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS),
           "WHEELHOUSE_CACHE": str(tmp_path / "cache")}
    result = subprocess.run(["timeout", "300", sys.executable, "-m", "nox", "-s", "build-wheelhouse-fixture-3.11", "--",
                             "--dist", str(marker)], cwd=REPO, env=env, capture_output=True, text=True, timeout=320)
    [line] = [line for line in result.stderr.splitlines() if "GITHUB_TOKEN" in line]
    assert result.returncode != 0, result.stderr[-2000:]
    assert "Session build-wheelhouse-fixture-3.11 aborted: GITHUB_TOKEN is also in the environment of process " in line
    assert "(timeout 300 " in line and "/environ, so nothing is built" in line
    assert "ghp_SECRET_IN_WRAPPER" not in result.stdout + result.stderr and not marker.exists()
    assert not (tmp_path / "cache").exists()  # refused before any source, venv or cache was touched


def test_code_that_builds_nothing_runs_on_under_such_a_process(tmp_path):
    """Tests and lint run no third-party code: the re-exec goes on and leaves the refusal to the builds."""
    script = ("import os, sys\n"
              "from ci.model import credentials\n"
              "credentials.reexec_without_credentials([sys.executable, *sys.orig_argv[1:]], os.environ)\n"
              "print(repr(os.environ.get('GITHUB_TOKEN')))\n"
              "credentials.refuse_if_exposed_above(os.environ)\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "GITHUB_TOKEN": "ghp_SECRET_ABOVE"}
    result = subprocess.run(["timeout", "60", sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert result.stdout.strip() == "None"  # restarted without it
    assert result.returncode == 1 and "UsageError: GITHUB_TOKEN is also in the environment of process " in result.stderr
    assert "ghp_SECRET_ABOVE" not in result.stdout + result.stderr


def test_an_ancestor_is_named_only_for_the_value_it_was_handed(tmp_path):
    """Another value under the same name above us (a stale token in an outer shell) is not what we drop."""
    script = ("import json, os, sys\n"
              "from ci.model import credentials\n"
              "print(json.dumps(credentials.exposed_above({'GITHUB_TOKEN': os.environ['GITHUB_TOKEN']})))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO), "GITHUB_TOKEN": "ghp_OUTER"}
    outer = subprocess.run(["timeout", "60", "env", "GITHUB_TOKEN=ghp_INNER", "timeout", "60", sys.executable, "-c",
                            script], env=env, capture_output=True, text=True, check=True)
    [[_, command, names]] = json.loads(outer.stdout)
    # the inner timeout, started by `env` with ghp_INNER; not the outer one, which holds ghp_OUTER
    assert command.startswith(f"timeout 60 {sys.executable} -c import json, os, sys from ci")
    assert names == ["GITHUB_TOKEN"]
