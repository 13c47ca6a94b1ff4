"""The build interpreter of a row: a venv pinned to its Python, torch and CUDA.

``prepare`` finds the row's Python (PATH, pyenv, or a uv-managed interpreter),
makes a venv for it (cached by the exact pins, so a second build reuses it),
installs torch from the row's index and verifies what it got. ``verify`` is
the same check for an existing interpreter (``--reuse-env``): torch version,
torch's CUDA major.minor, the CUDA toolkit nvcc reports, and the libstdc++ ABI
must all match the row, or the build stops with one line saying what to fix.
"""

from __future__ import annotations

import ast
import contextlib
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ci.base import log
from ci.base.errors import WheelhouseError
from ci.checks.abi import links_libstdcxx_dynamically
from ci.checks.toolkit import find_nvcc, nvcc_version
from ci.formats.elf import ElfFile
from ci.model import credentials
from ci.model.matrix import MatrixRow

TORCH_INDEX_BASE = "https://download.pytorch.org/whl"
BUILD_TOOLS = ("setuptools", "wheel", "ninja", "packaging")
_LOG = log.get("toolchain")

_PROBE = (
    "import json, sys, sysconfig\n"
    "info = {'python': '%d.%d' % sys.version_info[:2], 'executable': sys.executable,\n"
    "        'ext_suffix': sysconfig.get_config_var('EXT_SUFFIX'), 'include': sysconfig.get_paths()['include'],\n"
    "        'site_dirs': sorted({sysconfig.get_paths()['purelib'], sysconfig.get_paths()['platlib']})}\n"
    "try:\n"
    "    import torch\n"
    "    info.update(torch=torch.__version__, torch_cuda=torch.version.cuda,\n"
    "                cxx11_abi=bool(torch.compiled_with_cxx11_abi()), torch_dir=torch.__path__[0])\n"
    "except Exception as exc:\n"
    "    info.update(torch=None, torch_error='%s: %s' % (type(exc).__name__, exc))\n"
    "print(json.dumps(info))\n"
)


@dataclass(frozen=True)
class Interpreter:
    """What a verified build interpreter reports about itself."""

    python: Path
    python_version: str
    torch_version: str
    torch_cuda: str | None
    cxx11_abi: bool
    torch_dir: Path
    nvcc: Path | None
    nvcc_version: str | None
    site_dirs: tuple[Path, ...] = ()
    """Where the interpreter installs packages (a build must leave them as they are)."""

    def describe(self) -> dict:
        return {
            "python": str(self.python),
            "python_version": self.python_version,
            "torch": self.torch_version,
            "torch_cuda": self.torch_cuda,
            "cxx11_abi": self.cxx11_abi,
            "nvcc": str(self.nvcc) if self.nvcc else None,
            "nvcc_version": self.nvcc_version,
        }


def torch_index(row: MatrixRow, override: str | None = None) -> str | None:
    """The index torch comes from; None means pip's own configuration.

    Precedence: WHEELHOUSE_TORCH_INDEX, the row's ``torch_index``, then the
    one derived from the CUDA version (``.../whl/cu130``, ``.../whl/cpu``).
    """
    chosen = override or row.torch_index
    if chosen == "default":
        return None
    if chosen:
        return chosen
    if row.cuda == "cpu":
        return f"{TORCH_INDEX_BASE}/cpu"
    major, minor = row.cuda.split(".")[:2]
    return f"{TORCH_INDEX_BASE}/cu{major}{minor}"


def torch_requirements(row: MatrixRow) -> list[str]:
    reqs = [f"torch=={row.torch}"]
    if row.torch_vision:
        reqs.append(f"torchvision=={row.torch_vision}")
    if row.torch_audio:
        reqs.append(f"torchaudio=={row.torch_audio}")
    return reqs


def install_command(python: Path | str, row: MatrixRow, index: str | None) -> list[str]:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
    if index:
        # torch's own indexes also carry its dependencies (nvidia-*, triton, sympy...).
        cmd += ["--index-url", index]
    # `--` ends the options: a requirement that starts with '-' is never read as one
    return [*cmd, "--", *torch_requirements(row)]


def find_uv() -> str | None:
    """uv from PATH or beside this interpreter (requirements-tools.txt installs it), or None."""
    found = shutil.which("uv")
    if found:
        return found
    beside = Path(sys.executable).parent / "uv"
    return str(beside) if beside.is_file() else None


def uv_install_command(uv: str, python: Path | str, requirements: list[str], index: str | None) -> list[str]:
    """``uv pip install`` into ``python``'s venv with the index options pip would use.

    uv does not read pip's configuration (pip.conf, PIP_* variables): its index URL, extra indexes,
    find-links and constraints are passed on, and uv takes the best version across all of them as
    pip does. A row's own index replaces pip's index URL, as ``--index-url`` does for pip.
    """
    options = pip_index_options()
    cmd = [uv, "pip", "install", "--python", str(python)]
    if index:
        cmd += ["--index-url", index]
    elif options.get("index-url"):
        cmd += ["--index-url", options["index-url"][0]]
    for key in ("extra-index-url", "find-links", "constraint"):
        for value in options.get(key, []):
            cmd += [f"--{key}", value]
    if options.get("no-index") and options["no-index"][0].lower() in ("1", "true", "yes", "on"):
        cmd.append("--no-index")
    return [*cmd, "--index-strategy", "unsafe-best-match", "--", *requirements]


_PIP_KEYS = ("index-url", "extra-index-url", "find-links", "constraint", "no-index")


def pip_index_options() -> dict[str, list[str]]:
    """pip's configured index options (``pip config list``: files and PIP_* variables), env first."""
    result = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True)
    found: dict[str, tuple[int, list[str]]] = {}
    rank = {":env:": 3, "install": 2, "global": 1}
    for line in result.stdout.splitlines() if result.returncode == 0 else []:
        name, sep, raw = line.partition("=")
        section, _, key = name.rpartition(".")
        if not sep or key not in _PIP_KEYS or section not in rank:
            continue
        try:
            value = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            continue
        if rank[section] >= found.get(key, (0, []))[0]:
            found[key] = (rank[section], str(value).split())
    return {key: values for key, (_, values) in found.items()}


def find_python(version: str, *, uv: str | None = None) -> Path:
    """An interpreter that runs as ``version`` (``3.12``): PATH, pyenv, then uv (which downloads one).

    Every candidate is run once: a PATH entry can exist and not run (a pyenv shim for a version
    pyenv does not select), and a build would only find out after a long compile.
    """
    candidates = [shutil.which(f"python{version}")]
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if pyenv_root.is_dir():
        pyenv_pythons = sorted(
            (str(p) for p in pyenv_root.glob(f"{version}.*/bin/python{version}") if p.is_file()),
            key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parent.parent.name.split(".")],
            reverse=True,
        )
        candidates += pyenv_pythons
    for candidate in candidates:
        if candidate and _runs_as(candidate, version):
            return Path(candidate)
    uv = uv or shutil.which("uv") or str(Path(sys.executable).parent / "uv")
    if uv and Path(uv).exists():
        # uv's managed builds carry headers, which per-Python bundle builds need.
        result = subprocess.run([uv, "python", "find", "--managed-python", version], capture_output=True, text=True)
        if result.returncode != 0:
            _LOG.info(f"installing Python {version} with uv")
            log.stream([uv, "python", "install", version], logger=_LOG)  # a failure shows as "no working Python"
            result = subprocess.run([uv, "python", "find", "--managed-python", version], capture_output=True, text=True)
        if result.returncode == 0 and result.stdout.strip() and _runs_as(result.stdout.strip(), version):
            return Path(result.stdout.strip())
    raise WheelhouseError(
        f"no working Python {version} on PATH, in pyenv, or through uv; install one (e.g. `uv python install {version}`)"
    )


def _runs_as(python: str, version: str) -> bool:
    result = subprocess.run([python, "-I", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                            capture_output=True, text=True, env=interpreter_environment())
    return result.returncode == 0 and result.stdout.strip() == version


def interpreter_environment(environ: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to start a build interpreter with: without credentials, writing no bytecode.

    A build may have dropped a ``.pth`` into the interpreter (it runs at every start) or changed its
    packages; no start of it may see a token, whatever it runs.
    """
    environ = dict(os.environ if environ is None else environ)
    return {**credentials.build_environment(environ).environ, "PYTHONDONTWRITEBYTECODE": "1"}


def probe(python: Path | str, env: dict[str, str] | None = None) -> dict:
    result = subprocess.run([str(python), "-c", _PROBE], capture_output=True, text=True,
                            env=interpreter_environment(env))
    if result.returncode != 0 or not result.stdout.strip():
        raise WheelhouseError(f"{python}: cannot run this interpreter ({result.stderr.strip()[-200:]}); check the path")
    return json.loads(result.stdout.strip().splitlines()[-1])



_CXX_PROBE = '#include <string>\nint wheelhouse_probe() { return static_cast<int>(std::string("probe").size()); }\n'


def check_cxx(env: dict[str, str]) -> str | None:
    """The C++ compiler builds will use (CXX, else ``c++`` as torch does), checked to link libstdc++ dynamically;
    None when there is none (a pure-Python component needs none). CUDAHOSTCXX, nvcc's host compiler in CMake
    builds (TransformerEngine), is checked the same way when it is set.

    A compiler that links it statically (``-static-libstdc++``, or a wrapper whose
    library path has only libstdc++.a) makes extensions that crash beside torch's
    shared libstdc++ (std::regex); the wheel checks refuse them, but only after the
    build. This finds out in a second, before it.
    """
    cxx = env.get("CXX") or "c++"
    found = _check_links_libstdcxx_dynamically("CXX", cxx, env)
    host = env.get("CUDAHOSTCXX")
    if host and host != cxx:
        _check_links_libstdcxx_dynamically("CUDAHOSTCXX", host, env)
    return found


def _check_links_libstdcxx_dynamically(variable: str, compiler: str, env: dict[str, str]) -> str | None:
    """``compiler`` when a shared library it links needs libstdc++.so; None when it cannot be run."""
    with tempfile.TemporaryDirectory(prefix="wheelhouse-cxx-") as tmp:
        source, library = Path(tmp) / "probe.cpp", Path(tmp) / "probe.so"
        source.write_text(_CXX_PROBE)
        try:
            result = subprocess.run([*shlex.split(compiler), "-shared", "-fPIC", str(source), "-o", str(library)],
                                    capture_output=True, text=True, env=env)
        except OSError:
            return None  # no compiler: nothing links libstdc++ wrongly; a builder that needs one fails itself
        if result.returncode != 0:
            tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
            raise WheelhouseError(f"{variable}={compiler}: cannot build a shared library ({tail}); point {variable} "
                                  "at a working C++ compiler")
        with open(library, "rb") as fp:
            needed = ElfFile(fp, str(library)).needed_libraries()
    if not links_libstdcxx_dynamically(needed):
        raise WheelhouseError(
            f"{variable}={compiler} links libstdc++ statically (its shared libraries do not need libstdc++.so.6); "
            "extensions built with it crash beside torch's shared libstdc++: point it at a compiler that links it "
            "dynamically, e.g. the system g++ (CC, CXX and CUDAHOSTCXX alike)"
        )
    return compiler




def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def verify(python: Path | str, row: MatrixRow, *, env: dict[str, str] | None = None) -> Interpreter:
    """Check that ``python`` can build ``row``; one line naming the mismatch otherwise."""
    info = probe(python, env)
    where = f"{python}"
    if info["python"] != row.python:
        raise WheelhouseError(
            f"{where} is Python {info['python']} but the row wants {row.python}; "
            f"run the session for Python {info['python']} or use a {row.python} interpreter"
        )
    if not info.get("torch"):
        raise WheelhouseError(
            f"{where}: torch is not importable ({info.get('torch_error', '')}); install torch=={row.torch} "
            "or drop --reuse-env to get a pinned venv"
        )
    public = info["torch"].split("+", 1)[0]
    if public != row.torch:
        raise WheelhouseError(
            f"{where} has torch {info['torch']} but the row wants {row.torch}; "
            f"install torch=={row.torch} there or drop --reuse-env to get a pinned venv"
        )
    torch_cuda = info.get("torch_cuda")
    if row.cuda == "cpu":
        if torch_cuda:
            raise WheelhouseError(
                f"{where} has a CUDA {torch_cuda} torch but the row is CPU-only; install the CPU build of torch {row.torch}"
            )
    else:
        if not torch_cuda:
            raise WheelhouseError(
                f"{where} has a CPU-only torch {info['torch']} but the row wants CUDA {_major_minor(row.cuda)}; "
                f"install torch {row.torch} from {TORCH_INDEX_BASE}/cu{''.join(row.cuda.split('.')[:2])}"
            )
        if _major_minor(torch_cuda) != _major_minor(row.cuda):
            raise WheelhouseError(
                f"{where} has torch built for CUDA {torch_cuda} but the row wants CUDA {_major_minor(row.cuda)}; "
                "install the matching torch build or change the row's cuda"
            )
    abi_wanted = row.cxx11_abi == "TRUE"
    if bool(info["cxx11_abi"]) != abi_wanted:
        raise WheelhouseError(
            f"{where}: torch was built with _GLIBCXX_USE_CXX11_ABI={int(info['cxx11_abi'])} but the row says "
            f"cxx11_abi {row.cxx11_abi}; fix the row or install the other torch build"
        )
    nvcc = find_nvcc(env)
    found_version = nvcc_version(nvcc) if nvcc else None
    if row.cuda != "cpu":
        if nvcc is None:
            home = (env or os.environ).get("CUDA_HOME") or (env or os.environ).get("CUDA_PATH")
            where = f"CUDA_HOME={home} has no bin/nvcc" if home else "no nvcc found (CUDA_HOME, PATH, /usr/local/cuda)"
            raise WheelhouseError(
                f"{where}; install the CUDA {_major_minor(row.cuda)} toolkit and point CUDA_HOME at it"
            )
        if found_version != _major_minor(row.cuda):
            raise WheelhouseError(
                f"{nvcc} is CUDA {found_version} but the row wants CUDA {_major_minor(row.cuda)}; "
                f"point CUDA_HOME at a CUDA {_major_minor(row.cuda)} toolkit"
            )
    return Interpreter(
        python=Path(python),
        python_version=info["python"],
        torch_version=info["torch"],
        torch_cuda=torch_cuda,
        cxx11_abi=bool(info["cxx11_abi"]),
        torch_dir=Path(info["torch_dir"]),
        nvcc=nvcc,
        nvcc_version=found_version,
        site_dirs=tuple(Path(d) for d in info.get("site_dirs", ())),
    )


def venv_key(row: MatrixRow, index: str | None) -> str:
    pins = json.dumps([row.python, torch_requirements(row), index, BUILD_TOOLS])
    return f"py{row.python}-torch{row.torch}-" + hashlib.sha256(pins.encode()).hexdigest()[:10]


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def plan_install_command(row: MatrixRow, venv: Path, index: str | None) -> list[str]:
    """The torch install a build would run into ``venv``, for the plan (pip's own options left out)."""
    if find_uv():
        cmd = ["uv", "pip", "install", "--python", str(venv_python(venv))]
        return [*cmd, *(["--index-url", index] if index else []), "--index-strategy", "unsafe-best-match",
                "--", *torch_requirements(row)]
    return ["python", *install_command(venv_python(venv), row, index)[1:]]


def uv_cache_env(cache_dir: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """UV_CACHE_DIR as set, else under ``cache_dir``: on the venvs' file system, uv links files from its
    cache into a venv instead of copying them (torch's several GB)."""
    environ = dict(os.environ if environ is None else environ)
    return {**environ, "UV_CACHE_DIR": environ.get("UV_CACHE_DIR") or str(cache_dir / "uv")}


READY = ".wheelhouse-ready"
"""The file a venv gets when it is complete; without it the next build makes the venv again."""


def prepare_venv(row: MatrixRow, cache_dir: Path, *, index: str | None, installer: str | None = None) -> Path:
    """A venv pinned to the row (reused when its pins match); returns its python. A build that runs in it
    holds it with :func:`pinned_venv` instead."""
    with pinned_venv(row, cache_dir, index=index, installer=installer) as python:
        return python


@contextlib.contextmanager
def pinned_venv(row: MatrixRow, cache_dir: Path, *, index: str | None,
                installer: str | None = None) -> Iterator[Path]:
    """The row's venv, made when missing or stale, held while the caller builds in it.

    Builds of one machine share a venv: each holds a shared lock on it, and it is made again only under an
    exclusive one, once no build runs in it (a venv removed under a running build would change what that
    build's interpreter runs). ``installer``: ``uv`` (the default when uv is found) or ``pip``. uv unpacks torch
    once into its cache and links it into every later venv; pip unpacks it again for each venv.
    """
    if installer == "uv" and find_uv() is None:
        raise WheelhouseError("uv is not installed: pip install -r requirements-tools.txt, or build with pip")
    venv = cache_dir / "venvs" / venv_key(row, index)
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f"{venv.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        while not _ready(venv):
            fcntl.flock(lock, fcntl.LOCK_EX)  # waits for the builds still running in a stale venv
            if not _ready(venv):
                _make_venv(row, venv, index=index, installer=installer)
                if not _ready(venv):  # never loop on a make that cannot succeed
                    raise WheelhouseError(f"{venv}: made, but {venv_python(venv)} is missing or links to nothing; "
                                          f"remove {venv} and build again")
            fcntl.flock(lock, fcntl.LOCK_SH)  # not atomic: the loop checks the venv again
        yield venv_python(venv)


def _ready(venv: Path) -> bool:
    """Made, and its interpreter still there: a venv links to the Python it was made from, which can go (a
    temporary interpreter, an uninstalled pyenv version) and leave the venv unable to start."""
    return (venv / READY).is_file() and venv_python(venv).exists()


def mark_stale(venv: Path) -> None:
    """The venv is made again by the next build that takes it, once no build runs in it."""
    (venv / READY).unlink(missing_ok=True)


def _make_venv(row: MatrixRow, venv: Path, *, index: str | None, installer: str | None) -> None:
    cache_dir = venv.parent.parent
    uv = find_uv() if installer in (None, "uv") else None
    base = find_python(row.python)
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    python = venv_python(venv)
    what = (f"install torch {row.torch} (index: {index or 'pip default'}; name another with WHEELHOUSE_TORCH_INDEX, "
            "see the README's 'Building offline or from a mirror')")
    _LOG.info(f"creating venv {venv} from {base}" + (" with uv" if uv else ""))
    if uv:
        env = uv_cache_env(cache_dir)
        _run([uv, "venv", "--quiet", "--python", str(base), str(venv)], "create the venv", env=env)
        _LOG.info(f"installing {' '.join(torch_requirements(row))}" + (f" from {index}" if index else ""))
        _run(uv_install_command(uv, python, torch_requirements(row), index), what, env=env)
        # pip too: builders run `python -m pip wheel`
        _run(uv_install_command(uv, python, ["pip", *BUILD_TOOLS], None), "install build tools", env=env)
    else:
        _run([str(base), "-m", "venv", str(venv)], "create the venv")
        _LOG.info(f"installing {' '.join(torch_requirements(row))}" + (f" from {index}" if index else ""))
        _run(install_command(python, row, index), what)
        _run([str(python), "-m", "pip", "install", "--disable-pip-version-check", "-q", "--", *BUILD_TOOLS],
             "install build tools")
    normalise_header_mtimes(venv)
    (venv / READY).write_text(json.dumps({"python": row.python, "torch": row.torch, "index": index}) + "\n")


HEADER_MTIME = 315532800  # 1980-01-01, the earliest time a zip (a wheel) can record


def normalise_header_mtimes(venv: Path) -> int:
    """Give every file under the venv's torch/include one fixed mtime; returns how many.

    GCC's ``#pragma once`` takes two headers of equal contents and equal mtime for one file and reads
    only the first (torch has dozens of identical ``ATen/ops/*_native.h``). Which of them share an mtime
    depends on how fast the installer unpacked them, so one venv's preprocessed kernel could lack lines
    another's had, and the compiler cache missed between Pythons (seen: the fixture's CUDA kernel).
    With one mtime every venv dedups them alike. uv hardlinks files from its cache: the cache's copies
    get the same mtime, which no build reads.
    """
    count = 0
    for include in venv.glob("lib/python*/site-packages/torch/include"):
        for path in include.rglob("*"):
            if path.is_file() and not path.is_symlink():
                os.utime(path, (HEADER_MTIME, HEADER_MTIME))
                count += 1
    return count


def _run(cmd: list[str], what: str, env: dict[str, str] | None = None) -> None:
    """Run an install step with its output streamed; on failure one line with its last output line."""
    log.run_streamed(cmd, what, env=env, logger=_LOG)
