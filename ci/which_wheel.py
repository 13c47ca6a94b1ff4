"""``invoke which-wheel``: which world and wheel fit the interpreter it runs under, and the commands for them.

It reads the user's side: the installed torch (version, ``torch.version.cuda``, the C++11 ABI,
``torch.version.git_version``), the Python and platform, and each GPU's compute capability (through
``torch.cuda``, else ``nvidia-smi``; both optional). It reads the published index: its
``wheelhouse-index.json`` and each world's ``wheelhouse-world.json`` (ci/catalog.py), from a directory
or a ``file://``/``http(s)://`` URL, so it reports only what is really there, with the CUDA archs our
fatbin scan recorded in each wheel. It prints the matching world, the pip and uv commands
(ci/install_commands.py) for the wheels that fit, and for each that does not, why.

No torch, a torch no world of the index matches, an index that cannot be read: one line each, exit 2.
A component asked for with ``--package`` that does not fit: exit 1.
"""

from __future__ import annotations

import importlib
import json
import platform
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.tags import Tag, sys_tags
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from ci import landing
from ci.catalog import ARCHIVED, INDEX_RECORD, WORLD_RECORD, Catalog, ProjectEntry, WheelEntry, WorldEntry
from ci.errors import UsageError
from ci.install_commands import commands
from ci.naming import world_path
from ci.wheel_facts import WheelFacts
from ci.wheels.archs import CudaArch, format_archs

_HTTP_TIMEOUT_S = 30


# --------------------------------------------------------------------------- the user's side


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: CudaArch


@dataclass(frozen=True)
class UserEnvironment:
    python: str
    """``3.11``"""
    machine: str
    """``x86_64``"""
    torch: str | None = None
    torch_cuda: str | None = None
    torch_hip: str | None = None
    cxx11_abi: bool | None = None
    torch_git: str | None = None
    gpus: tuple[Gpu, ...] = ()
    gpu_source: str = "none"
    """Where the GPUs were read: ``torch.cuda``, ``nvidia-smi`` or ``none``."""
    tags: tuple[Tag, ...] = field(default=(), repr=False)
    """The wheel tags this interpreter installs, most preferred first."""

    @property
    def world(self) -> str | None:
        """The world of this torch (``cu130/torch2.13``, ``cpu/torch2.13``); None for a ROCm build."""
        if self.torch is None or self.torch_hip:
            return None
        return world_path(self.torch_cuda or "cpu", self.torch)

    def line(self) -> str:
        torch = f"torch {self.torch}" if self.torch else "no torch"
        if self.torch:
            build = f"CUDA {self.torch_cuda}" if self.torch_cuda else (f"ROCm {self.torch_hip}" if self.torch_hip else "CPU")
            abi = {True: "C++11 ABI on", False: "C++11 ABI off", None: "C++11 ABI unknown"}[self.cxx11_abi]
            torch += f" ({build}, {abi}, git {(self.torch_git or 'unknown')[:12]})"
        gpus = ", ".join(f"{g.name} (sm_{g.capability.major}{g.capability.minor})" for g in self.gpus) or "none seen"
        return (f"environment: Python {self.python} on {self.machine}; {torch}; GPUs: {gpus}"
                + (f" (from {self.gpu_source})" if self.gpus else ""))


def _nvidia_smi_gpus() -> tuple[Gpu, ...]:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return ()
    try:
        proc = subprocess.run([smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True,
                              text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    found = []
    for line in proc.stdout.splitlines() if proc.returncode == 0 else []:
        name, _, cap = line.rpartition(",")
        major, _, minor = cap.strip().partition(".")
        if major.isdigit() and minor.isdigit():
            found.append(Gpu(name.strip(), CudaArch(int(major), int(minor))))
    return tuple(found)


def read_environment(*, nvidia_smi: Callable[[], tuple[Gpu, ...]] = _nvidia_smi_gpus) -> UserEnvironment:
    """The environment of this interpreter; torch is imported here (its absence is not an error yet)."""
    python = f"{sys.version_info[0]}.{sys.version_info[1]}"
    machine = platform.machine()
    tags = tuple(sys_tags())
    try:
        with warnings.catch_warnings():  # torch's own import-time warnings (no numpy) are not the answer
            warnings.simplefilter("ignore")
            # the user's torch, whatever it is: not a requirement of ours (requirements-tools.txt pins none)
            torch = importlib.import_module("torch")
    except ImportError:
        return UserEnvironment(python, machine, tags=tags, gpus=nvidia_smi(), gpu_source="nvidia-smi")
    version = getattr(torch, "version", None)
    cxx11 = getattr(torch, "compiled_with_cxx11_abi", None)
    gpus: tuple[Gpu, ...] = ()
    source = "none"
    cuda = getattr(torch, "cuda", None)
    try:
        if cuda is not None and cuda.is_available():
            gpus = tuple(Gpu(str(cuda.get_device_name(i)), CudaArch(*cuda.get_device_capability(i)))
                         for i in range(cuda.device_count()))
            source = "torch.cuda"
    except Exception:  # a driver that torch cannot talk to: nvidia-smi may still say what is there
        gpus = ()
    if not gpus:
        gpus = nvidia_smi()
        source = "nvidia-smi" if gpus else "none"
    return UserEnvironment(
        python, machine, str(torch.__version__), getattr(version, "cuda", None), getattr(version, "hip", None),
        bool(cxx11()) if callable(cxx11) else None, getattr(version, "git_version", None), gpus, source, tags)


# --------------------------------------------------------------------------- the published index


def _reader(location: str) -> Callable[[str], bytes | None]:
    """``read(relative path)`` for a site directory or URL: the bytes, or None when there is no such file."""
    parts = urlsplit(location)
    if parts.scheme in ("http", "https"):
        base = location.rstrip("/")

        def read_url(rel: str) -> bytes | None:
            try:
                with urllib.request.urlopen(f"{base}/{rel}", timeout=_HTTP_TIMEOUT_S) as response:
                    return response.read()
            except urllib.error.HTTPError as exc:
                if exc.code == 404:
                    return None
                raise UsageError(f"{location}: reading {rel} answered HTTP {exc.code}; check the URL") from None
            except (urllib.error.URLError, OSError) as exc:
                raise UsageError(f"{location}: cannot be read ({getattr(exc, 'reason', exc)}); check the URL or "
                                 "pass the site's directory") from None

        return read_url
    if parts.scheme == "file":
        root = Path(unquote(parts.path))
    elif not parts.scheme:
        root = Path(location)
    else:
        raise UsageError(f"--index {location!r}: give a directory, or a file://, http:// or https:// URL of the site")
    if not root.is_dir():
        raise UsageError(f"--index {location}: no such directory; pass the folder invoke publish-index wrote "
                         "(e.g. wheelhouse/site) or its URL")

    def read_file(rel: str) -> bytes | None:
        try:
            return (root / rel).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            return None
        except OSError as exc:
            raise UsageError(f"{root / rel}: cannot be read ({exc.strerror})") from None

    return read_file


def _json(data: bytes, where: str) -> dict:
    try:
        doc = json.loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{where} is not JSON ({exc}); publish the index again (invoke publish-index)") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{where} is not an index record; publish the index again (invoke publish-index)")
    return doc


def read_index(location: str) -> Catalog:
    """The catalog the site at ``location`` publishes (its root, or one world's folder)."""
    read = _reader(location)
    index = read(INDEX_RECORD)
    if index is None:
        single = read(WORLD_RECORD)
        if single is None:
            raise UsageError(f"{location}: holds no {INDEX_RECORD}; pass the root of a site invoke publish-index "
                             "wrote (the folder or URL with its index.html)")
        return Catalog((_world(single, f"{location}/{WORLD_RECORD}"),))
    doc = _json(index, f"{location}/{INDEX_RECORD}")
    worlds = []
    try:
        records = [str(w["record"]) for w in doc["worlds"]]
        default = doc.get("default_world")
    except (KeyError, TypeError) as exc:
        raise UsageError(f"{location}/{INDEX_RECORD} lacks {exc}; publish the index again") from None
    for rel in records:
        data = read(rel)
        if data is None:
            raise UsageError(f"{location}: {INDEX_RECORD} names {rel}, which is not there; publish the index again")
        worlds.append(_world(data, f"{location}/{rel}"))
    return Catalog(tuple(worlds), default)


def _world(data: bytes, where: str) -> WorldEntry:
    try:
        return WorldEntry.from_json(_json(data, where))
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"{where} is not a world record this tool wrote ({exc}); publish the index again") from None


# --------------------------------------------------------------------------- the answer


@dataclass(frozen=True)
class Fit:
    project: str
    wheel: WheelEntry | None
    problems: tuple[str, ...] = ()
    """Why it does not fit (empty: it fits)."""
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Answer:
    environment: UserEnvironment
    world: WorldEntry
    fits: tuple[Fit, ...]
    requested: bool

    @property
    def fitting(self) -> tuple[Fit, ...]:
        return tuple(f for f in self.fits if not f.problems)

    @property
    def exit_code(self) -> int:
        if not self.fitting:
            return 1
        return 1 if self.requested and any(f.problems for f in self.fits) else 0

    def render(self) -> str:
        world = self.world
        lines = [self.environment.line(),
                 f"world: {world.path} (torch {world.torch}.x, "
                 f"{'CPU' if world.cuda == 'cpu' else 'CUDA ' + world.cuda}; index {world.index_url})"]
        if not world.status.active:
            lines.append(f"note: the world {world.path} is {world.status.value}: {world.status.reason}")
        for fit in self.fitting:
            wheel = fit.wheel
            if wheel is None:
                continue
            lines.append(f"fits: {fit.project} {wheel.version}: {wheel.filename} ({landing.archs_text(wheel)}, "
                         f"{landing.size_text(wheel.size)}, {landing.pin_text(wheel)}; release {wheel.release})")
        lines += [f"note: {note}" for fit in self.fits for note in fit.notes]
        requirements = [f"{f.project}=={f.wheel.version}" for f in self.fitting if f.wheel is not None]
        if requirements:
            forms = commands(world, requirements, lock_base=world.index_url.removesuffix("/").removesuffix("/simple"),
                             torch_installed=True)
            lines.append(f"torch {self.environment.torch} is installed and on the world's line: the commands keep it")
            for title, form in (("pip", forms.pip), ("uv", forms.uv),
                                ("verifiable, from the PEP 751 lock files (pip)", forms.pip_locked),
                                ("verifiable, from the PEP 751 lock files (uv)", forms.uv_locked)):
                lines.append(f"{title}:")
                lines += [f"  {command}" for command in form]
        unfit = [problem for fit in self.fits for problem in fit.problems]
        if unfit:
            lines.append("does not fit:")
            lines += [f"  {problem}" for problem in unfit]
        return "\n".join(lines)


def _abi(value: str | None) -> bool | None:
    if value is None or value == "":
        return None
    return value.strip().lower() in ("true", "1", "yes")


def _runs_on(facts: WheelFacts, gpu: CudaArch) -> bool:
    """Whether a GPU of compute capability ``gpu`` runs the wheel's device code: a cubin of its major and a
    minor at most its own (an arch-specific ``a`` cubin only on its exact arch), or PTX it can compile."""
    for cubin in facts.cubins:
        if cubin.major == gpu.major and cubin.minor <= gpu.minor and (cubin.suffix != "a" or cubin.minor == gpu.minor):
            return True
    return any(p.suffix == "" and (p.major, p.minor) <= (gpu.major, gpu.minor) for p in facts.ptx)


def _axes_text(wheels: Sequence[WheelEntry]) -> str:
    labels = set()
    for wheel in wheels:
        pythons, archs = landing.wheel_axes(wheel.filename)
        labels |= {f"Python {p} on {a}" for p in pythons for a in archs}
    return ", ".join(sorted(labels))


def _version_in(version: str, specifier: str) -> bool:
    try:
        return Version(version) in SpecifierSet(specifier)
    except (InvalidVersion, InvalidSpecifier):
        return True


def fit(project: ProjectEntry, world: WorldEntry, env: UserEnvironment) -> Fit:  # noqa: C901 - one check after the other
    """Whether the project's newest wheel fits ``env``, and if not, why."""
    where = world.path
    if project.status.value == ARCHIVED:
        return Fit(project.name, None, (f"{project.name}: retired from {where} ({project.status.reason})",))
    wheels = project.newest_wheels()
    rank = {tag: i for i, tag in enumerate(env.tags)}
    compatible = [(min(rank[t] for t in parse_wheel_filename(w.filename)[3] if t in rank), w) for w in wheels
                  if any(t in rank for t in parse_wheel_filename(w.filename)[3]) and w.python_admits(env.python)]
    if not compatible:
        return Fit(project.name, None, (f"{project.name}: no wheel for Python {env.python} on {env.machine} in {where} "
                                        f"(wheels for {_axes_text(wheels) or 'nothing'})",))
    wheel = min(compatible, key=lambda pair: (pair[0], pair[1].filename))[1]
    problems, notes = [], []
    if project.status.value != "active":
        notes.append(f"{project.name} is {project.status.value} in {where}: {project.status.reason}")
    facts = wheel.facts
    if facts is None:
        notes.append(f"{project.name}: {wheel.filename} has no record of its CUDA archs and torch build")
        return Fit(project.name, wheel, (), tuple(notes))
    if facts.torch_pin and env.torch and not _version_in(env.torch, facts.torch_pin):
        problems.append(f"{project.name}: pins torch{facts.torch_pin}; yours is {env.torch}")
    built = facts.built_with or {}
    built_abi = _abi(built.get("cxx11_abi"))
    if built_abi is not None and env.cxx11_abi is not None and built_abi != env.cxx11_abi:
        problems.append(f"{project.name}: built with the C++11 ABI {'on' if built_abi else 'off'}, your torch has it "
                        f"{'on' if env.cxx11_abi else 'off'}")
    if built.get("git_version") and env.torch_git and built["git_version"] != env.torch_git:
        notes.append(f"{project.name}: built against torch {built.get('version')} git {built['git_version'][:12]}, "
                     f"yours is git {env.torch_git[:12]}: the same line, another build of it")
    if not facts.archs_known:
        notes.append(f"{project.name}: {wheel.filename} has no record of its CUDA archs")
    elif facts.has_device_code:
        built_for = format_archs(facts.cubins) + (f"; PTX {format_archs(facts.ptx)}" if facts.ptx else "")
        for gpu in env.gpus:
            if not _runs_on(facts, gpu.capability):
                problems.append(f"{project.name}: no sm_{gpu.capability.major}{gpu.capability.minor} kernels in {where} "
                                f"(built for {built_for})")
        if not env.gpus:
            notes.append(f"{project.name}: no GPU seen (torch.cuda, nvidia-smi), so its CUDA archs ({built_for}) "
                         "were not checked")
    return Fit(project.name, wheel, tuple(dict.fromkeys(problems)), tuple(notes))


def which_wheel(catalog: Catalog, env: UserEnvironment, *, location: str, packages: Sequence[str] = ()) -> Answer:
    """The world of ``env``'s torch in ``catalog`` and the fit of each package (default: every one it serves)."""
    if env.torch is None:
        raise UsageError(f"no torch in {sys.executable}: install the torch you will run with first; which-wheel "
                         "matches the wheels to it")
    wanted = env.world
    world = catalog.world(wanted) if wanted else None
    served = [w.path for w in catalog.worlds if w.status.value != ARCHIVED]
    if world is None or world.status.value == ARCHIVED:
        build = "a ROCm build" if env.torch_hip else (wanted or "")
        raise UsageError(f"no world of {location} matches torch {env.torch} ({build}): it serves "
                         f"{', '.join(served) or 'no world'}; install the torch of one of them from its torch index")
    names: list[str] = [canonicalize_name(p) for p in packages]
    fits = []
    for name in names or [p.name for p in world.projects if p.status.value != ARCHIVED]:
        project = world.project(name)
        if project is None:
            held = ", ".join(p.name for p in world.projects if p.status.value != ARCHIVED) or "nothing"
            fits.append(Fit(name, None, (f"{name}: not in {world.path} (it holds {held})",)))
        else:
            fits.append(fit(project, world, env))
    return Answer(env, world, tuple(fits), bool(names))
