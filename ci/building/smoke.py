"""Smoke tests: a row's wheels installed as a user installs them, then the component's own commands.

After the wheel checks and before anything reaches dist/, each command of the row's ``smoke_test``
(versions.yaml) runs with ``bash -c`` from an empty directory, in a fresh venv that holds:

- the row's torch (with torchvision and torchaudio where the row names them), installed as the row's build
  venv is (ci/building/toolchain.py; uv links torch from its cache, so this takes seconds); with --reuse-env, the
  build interpreter's own packages, named by a ``.pth`` file (such a machine may reach no index);
- the row's wheels from the build, ``--no-deps``, then the requirements their METADATA declares.

Nothing from the job's PYTHONPATH or user site reaches the venv, its installs or its commands.

cibuildwheel's ``test-command`` runs the same way against each wheel it builds. A build runner has no GPU:
where the machine has no ``libcuda.so.1`` (an import that links the driver would fail), NVIDIA's driver stub
from the CUDA toolkit (``lib64/stubs/libcuda.so``) is linked as ``libcuda.so.1`` first on LD_LIBRARY_PATH,
as TransformerEngine's own CI imports its wheel on a runner without a GPU. The first command that fails, or
runs past :data:`SMOKE_TIMEOUT_S`, fails the row in one line naming it and its last output line.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from ci.base import log
from ci.base.errors import WheelhouseError
from ci.building import toolchain
from ci.checks import toolkit
from ci.formats.archive import open_wheel
from ci.formats.metadata import read_metadata
from ci.model import credentials
from ci.model.matrix import MatrixRow

SMOKE_TIMEOUT_S = 900
"""One command's limit: an import and one operation take seconds; a hang must not hold the build job."""
_LOG = log.get("smoke")


@dataclass(frozen=True)
class SmokeResult:
    commands: tuple[str, ...]
    seconds: float
    torch: str
    """Where the venv's torch came from."""
    driver: str
    """What stood for the CUDA driver."""
    requirements: tuple[str, ...]
    """The wheels' declared requirements installed beside them."""

    def to_json(self) -> dict:
        return {"commands": list(self.commands), "seconds": round(self.seconds, 1), "torch": self.torch,
                "driver": self.driver, "requirements": list(self.requirements), "ok": True}


def describe_plan(row: MatrixRow) -> str | None:
    """The dry-run plan's line, or None for a row without a smoke test."""
    commands = row.settings.smoke_test
    if not commands:
        return None
    return (f"smoke test: {len(commands)} command(s) in a fresh venv with torch {row.torch} and the wheels "
            f"(--no-deps, then their declared requirements): {'; '.join(commands)}")


def run(row: MatrixRow, wheels: list[Path], *, cache_dir: Path, index: str | None, environ: dict[str, str],
        reuse: toolchain.Interpreter | None = None) -> SmokeResult | None:
    """Run the row's smoke test against ``wheels``; None when it has none. ``reuse``: the build interpreter of
    --reuse-env, whose packages the venv sees in place of a torch install."""
    commands = row.settings.smoke_test
    if not commands:
        return None
    started = time.monotonic()
    (cache_dir / "smoke").mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{row.component}-", dir=cache_dir / "smoke") as work:
        root = Path(work)
        # the venv's own packages and what the installs put there, nothing the job's PYTHONPATH holds: pip would
        # count a requirement found there as installed, and the commands run without it
        env = _without_outside_packages(credentials.build_environment(environ).environ)
        venv = _venv(row, root / "venv", cache_dir=cache_dir, index=index, env=env, reuse=reuse)
        requirements = _install(row, venv, wheels, env=env, offline_ok=reuse is not None)
        run_env = _command_environment(env, root / "venv")
        if row.cuda != "cpu" and "CUDA_HOME" not in run_env and (nvcc := toolkit.find_nvcc(env)) is not None:
            run_env["CUDA_HOME"] = str(toolkit.cuda_home(nvcc))  # the toolkit a JIT (DeepGEMM's) compiles with
        driver, stub_env = _driver(row, venv.python, run_env, root)
        run_env.update(stub_env)
        (root / "run").mkdir()
        for command in commands:
            _run_command(row, command, cwd=root / "run", env=run_env, driver=driver)
    return SmokeResult(tuple(commands), time.monotonic() - started, venv.torch, driver, tuple(requirements))


@dataclass(frozen=True)
class _Venv:
    python: Path
    torch: str
    """Where its torch came from."""
    install: list[str]
    """The command that installs into it, without what to install."""
    uv: str | None = None


def _venv(row: MatrixRow, venv: Path, *, cache_dir: Path, index: str | None, env: dict[str, str],
          reuse: toolchain.Interpreter | None) -> _Venv:
    python = toolchain.venv_python(venv)
    if reuse is not None:
        # no pip in it (ensurepip may be missing from the machine's Python): the build interpreter's pip installs
        # into it, and the interpreter's packages (torch among them) come after its own, so the wheels win
        _step([str(reuse.python), "-m", "venv", "--without-pip", str(venv)], "create the smoke test's venv", env)
        (Path(_site_packages(python, env)) / "wheelhouse-build-interpreter.pth").write_text(
            "".join(f"{d}\n" for d in reuse.site_dirs))
        return _Venv(python, f"the build interpreter's packages ({reuse.python}, torch {reuse.torch_version})",
                     [str(reuse.python), "-m", "pip", "--python", str(python), "install", "--disable-pip-version-check"])
    uv = toolchain.find_uv()
    base = toolchain.find_python(row.python)
    what = f"install torch {row.torch} into the smoke test's venv"
    source = f"{' '.join(toolchain.torch_requirements(row))} from {index or 'the configured index'}"
    if uv:
        uv_env = toolchain.uv_cache_env(cache_dir, env)
        _step([uv, "venv", "--quiet", "--python", str(base), str(venv)], "create the smoke test's venv", uv_env)
        _step(toolchain.uv_install_command(uv, python, toolchain.torch_requirements(row), index), what, uv_env)
        return _Venv(python, source, [uv, "pip", "install", "--python", str(python)], uv)
    _step([str(base), "-m", "venv", str(venv)], "create the smoke test's venv", env)
    _step(toolchain.install_command(python, row, index), what, env)
    return _Venv(python, source, [str(python), "-m", "pip", "install", "--disable-pip-version-check"])


def _site_packages(python: Path, env: dict[str, str]) -> str:
    import subprocess

    return subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=env).stdout.strip()


def _install(row: MatrixRow, venv: _Venv, wheels: list[Path], *, env: dict[str, str], offline_ok: bool) -> list[str]:
    """The wheels with --no-deps, then their declared requirements; returns those requirements."""
    _step([*venv.install, "--no-deps", "--no-index", "--", *map(str, wheels)],
          "install the built wheels into the smoke test's venv", env)
    requirements = declared_requirements(wheels, row.python)
    if not requirements:
        return []
    # offline (--reuse-env on a machine without an index), pip's retries would only stretch the failure out
    retries = ["--retries", "1", "--timeout", "15"] if offline_ok else []
    _LOG.info(f"installing the wheels' declared requirements: {' '.join(requirements)}")
    result = log.stream(_install_command(venv, requirements, retries), env=env, logger=_LOG)
    if result.returncode != 0:
        if offline_ok:  # --reuse-env: the machine may reach no index; the commands say whether it matters
            missing = _install_each(venv, requirements, retries, env)
            _LOG.warning(f"could not install {len(missing)} of the {len(requirements)} declared requirements here "
                         f"({', '.join(missing)[:200]}: {result.last_line[:200]}); the smoke test runs with the build "
                         "interpreter's packages in their place")
        else:
            raise WheelhouseError(log.redact(
                f"{row.label}: smoke test: the wheels' declared requirements cannot be installed beside them "
                f"({result.last_line[:300]}); fix the requirements the wheels declare, or what the index offers"))
    return requirements


def _install_each(venv: _Venv, requirements: list[str], retries: list[str], env: dict[str, str]) -> list[str]:
    """Each requirement on its own, with what it needs, where all of them at once could not be installed (an
    offline machine whose PIP_FIND_LINKS holds some of them: the GPU machine's TransformerEngine needs pydantic,
    flashinfer apache-tvm-ffi); returns those that could not be installed."""
    return [requirement for requirement in requirements
            if log.stream(_install_command(venv, [requirement], retries), env=env, logger=_LOG).returncode != 0]


def _install_command(venv: _Venv, requirements: list[str], retries: list[str]) -> list[str]:
    if venv.uv:
        return toolchain.uv_install_command(venv.uv, venv.python, requirements, None)
    return [*venv.install, *retries, "--", *requirements]


def declared_requirements(wheels: list[Path], python: str) -> list[str]:
    """The Requires-Dist of ``wheels`` that apply to CPython ``python`` on this machine (no extras), less the
    wheels' own projects, in order and once each."""
    own: set[str] = set()
    declared: list[str] = []
    for wheel in wheels:
        with open_wheel(wheel) as archive:
            own.add(archive.wheel_name.name)
            metadata = read_metadata(archive).decode("utf-8")
        declared += [line.split(":", 1)[1].strip() for line in metadata.splitlines()
                     if line.startswith("Requires-Dist:")]
    environment: dict[str, str] = {**{k: str(v) for k, v in default_environment().items()},
                                   "python_version": python, "python_full_version": f"{python}.0", "extra": ""}
    wanted: dict[str, None] = {}
    for text in declared:
        try:
            requirement = Requirement(text)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        if canonicalize_name(requirement.name) not in own:
            wanted[str(requirement)] = None
    return list(wanted)


def _without_outside_packages(env: dict[str, str]) -> dict[str, str]:
    """``env`` less what adds packages to every interpreter (PYTHONPATH, PYTHONHOME, the user site)."""
    inside = {key: value for key, value in env.items() if key not in ("PYTHONPATH", "PYTHONHOME")}
    inside["PYTHONNOUSERSITE"] = "1"
    return inside


def _command_environment(env: dict[str, str], venv: Path) -> dict[str, str]:
    """``env`` (already without outside packages: run() strips them once, for the installs too) in ``venv``."""
    return {**env, "PATH": os.pathsep.join([str(venv / "bin"), env.get("PATH", "")]), "VIRTUAL_ENV": str(venv),
            "PYTHONDONTWRITEBYTECODE": "1"}


DRIVER = "libcuda.so.1"


def _driver(row: MatrixRow, python: Path, env: dict[str, str], root: Path) -> tuple[str, dict[str, str]]:
    """(what stands for the CUDA driver, the variables that put it there)."""
    if row.cuda == "cpu":
        return "none (a CPU row)", {}
    import subprocess

    probe = subprocess.run([str(python), "-c", f"import ctypes; ctypes.CDLL({DRIVER!r})"], env=env,
                           capture_output=True)
    if probe.returncode == 0:
        return f"this machine's {DRIVER}", {}
    stub = find_driver_stub(env)
    if stub is None:
        return f"none: no {DRIVER} here and no driver stub in the CUDA toolkit (lib64/stubs/libcuda.so)", {}
    folder = root / "driver-stub"
    folder.mkdir()
    (folder / DRIVER).symlink_to(stub)
    library_path = os.pathsep.join(p for p in (str(folder), env.get("LD_LIBRARY_PATH", "")) if p)
    return f"the CUDA driver stub {stub}", {"LD_LIBRARY_PATH": library_path}


def find_driver_stub(env: dict[str, str]) -> Path | None:
    """NVIDIA's driver stub of the CUDA toolkit builds use (CUDA_HOME, else the nvcc found), if it ships one."""
    nvcc = toolkit.find_nvcc(env)
    if nvcc is None:
        return None
    home = toolkit.cuda_home(nvcc)
    for candidate in (home / "lib64" / "stubs", home / "lib" / "stubs", *sorted(home.glob("targets/*/lib/stubs"))):
        if (candidate / "libcuda.so").is_file():
            return candidate / "libcuda.so"
    return None


def _run_command(row: MatrixRow, command: str, *, cwd: Path, env: dict[str, str], driver: str) -> None:
    _LOG.info(f"smoke test: {command}")
    result = log.stream(["timeout", "--kill-after=30", str(SMOKE_TIMEOUT_S), "bash", "-c", command], env=env, cwd=cwd,
                        logger=_LOG)
    if result.returncode == 0:
        return
    shown = command if len(command) <= 200 else command[:180] + "..."
    if result.returncode == 124:
        why = f"ran past {SMOKE_TIMEOUT_S} s (last output: {result.last_line[:300]})"
    else:
        why = f"exited with status {result.returncode}: {result.last_line[:300]}"
    hint = f" (CUDA driver: {driver})" if DRIVER in result.last_line and row.cuda != "cpu" else ""
    raise WheelhouseError(log.redact(f"{row.label}: smoke test failed: `{shown}` {why}{hint}; the wheels stay out of "
                                     "dist/ (run the command in a venv with them to see all of its output)"))


def _step(command: list[str], what: str, env: dict[str, str]) -> None:
    log.run_streamed(command, what, env=env, logger=_LOG, hint=shlex.join(command)[:200])
