"""The walking skeleton: the main job end to end on the local default.

It takes the fixture extension through the path every real component takes
(pinned venv with torch 2.13 -> build script -> wheel checks -> release in the
local store -> PEP 503 index), prints the pip command that installs it, and
then proves that command: a fresh venv, pip install from the index it wrote,
import, call the op. No GitHub token, no GPU.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from pathlib import Path

from ci.base import log
from ci.base.errors import WheelhouseError
from ci.building import job, toolchain
from ci.model import matrix, wheel_packages
from ci.model.versions import REPO_ROOT, load
from ci.publish import pages, release
from ci.store.local import LocalStore

_LOG = log.get("demo")

FIXTURE_VERSIONS = REPO_ROOT / "tests" / "fixtures" / "versions.yaml"
PACKAGE = "wheelhouse-fixture"

SMOKE_TEST = (
    "import torch, wheelhouse_fixture as w\n"
    "out = w.scaled_add(torch.ones(4), torch.arange(4.0), 2.0)\n"
    "assert out.tolist() == [1.0, 3.0, 5.0, 7.0], out\n"
    "try:\n"
    "    w.scaled_add(torch.ones(3), torch.ones(2))\n"
    "except ValueError as exc:\n"
    "    print('shape check raised ValueError as designed:', str(exc).splitlines()[0])\n"
    "else:\n"
    "    raise SystemExit('shape check did not raise')\n"
    "print('wheelhouse_fixture.scaled_add =', out.tolist())\n"
)


def run(*, cache_dir: Path, store_root: Path = REPO_ROOT / "wheelhouse", dist_root: Path = REPO_ROOT / "dist") -> str:
    """Run the demo; returns the pip command it proved."""
    versions = load(FIXTURE_VERSIONS)
    (row,) = matrix.select(matrix.expand(versions), versions=versions, arch=job.host_arch())

    _LOG.info(f"1/5 build {row.label} through build_scripts/{row.settings.builder}.sh")
    result = job.run(versions, row, job.BuildOptions(cache_dir=cache_dir, dist_root=dist_root))

    _LOG.info(f"2/5 release {row.release_tag} into the local store {store_root}")
    store = LocalStore(store_root)
    release.apply(release.plan(versions, row, dist_root), store)

    site = store_root / "site"
    _LOG.info(f"3/5 index every world of the store into {site}")
    where = pages.IndexWhere(pages.DirectoryTarget(site), site.as_uri(), row.world,
                             wheel_packages.by_component(versions), pages.context_of(versions))
    outcome = pages.publish(store, where)
    for warning in outcome.warnings:
        _LOG.info(f"warning: {warning}")

    index_url = f"{site.as_uri()}/{row.world}/simple/"
    command = f"pip install --index-url {index_url} {PACKAGE}"
    _LOG.info(f"4/5 install it with:\n\n    {command}\n")

    _LOG.info("5/5 proving it: a fresh venv, torch, then exactly that command, then import and call")
    _LOG.info(_prove(row, index_url))
    _LOG.info(f"demo passed: {', '.join(w.name for w in result.wheels)} installs from {index_url} and runs")
    return command


def _prove(row, index_url: str) -> str:
    """Install from the index into a fresh venv and call the op; returns the smoke test's output."""
    with tempfile.TemporaryDirectory(prefix="wheelhouse-demo-") as tmp:
        venv = Path(tmp) / "venv"
        python = venv / "bin" / "python"
        _check([str(toolchain.find_python(row.python)), "-m", "venv", str(venv)], "create the fresh venv")
        index = toolchain.torch_index(row)
        _check(toolchain.install_command(python, row, index), f"install torch {row.torch} into the fresh venv")
        _check([str(python), "-m", "pip", "install", "--disable-pip-version-check", "--index-url", index_url, PACKAGE],
               f"pip install {PACKAGE} from {index_url}")
        # Import from outside the repository so the installed package, not the sources, is what runs.
        result = subprocess.run([str(python), "-c", SMOKE_TEST], capture_output=True, text=True, cwd=tmp)
        if result.returncode != 0:
            raise WheelhouseError(f"the installed {PACKAGE} failed its smoke test: {result.stderr.strip().splitlines()[-1]}")
        return result.stdout.strip()


def _check(cmd: list[str], what: str) -> None:
    """Run one step of the proof with its output streamed (a torch install takes a while)."""
    log.run_streamed(cmd, what, hint=f"the command was {shlex.join(cmd)[:200]}", logger=_LOG)
