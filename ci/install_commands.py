"""The install commands the landing page and ``invoke which-wheel`` print, and each world's lock files.

What every form guarantees, whatever the package index (the installer's default) holds under the
same names: each component comes from our world's index, torch from the world's torch index, and
nothing is built from source.

- pip merges every index it is given and takes the highest version of a name across all of them
  (so ``--extra-index-url <ours>`` loses to a higher-versioned sdist on the package index). Its form
  is three steps, each with one index: torch from the torch index; our wheels from our index alone,
  ``--no-deps``; then the wheels' other dependencies from the installer's default index, which finds
  our wheels and torch already installed and keeps them.
- uv takes each name only from the first index that has it (its default ``first-index`` strategy),
  so one command with our index before the torch index does the same.
- The verifiable form: ``<world>/pylock.<project>.toml`` (PEP 751) lists the project's newest wheels
  with their sha256; pip (``-r``, pip 26.1 and later) and uv (``uv pip install -r``) install from it
  and refuse other bytes. It holds our wheels only (torch and the other dependencies come from their
  own indexes), so pip takes it with ``--no-deps`` and the dependencies follow as above.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from ci.catalog import ProjectEntry, WorldEntry

WHY_THEY_DIFFER = (
    "pip merges all the indexes it is given and installs the highest version it finds, so a higher-versioned "
    "package of the same name on the package index would win: its commands take torch and our wheels each "
    "from their own index alone; uv takes every package from the first index that has it, so one command "
    "with our index first does the same."
)


def lock_name(project: str) -> str:
    """``pylock.<project>.toml``: the PEP 751 name of a named lock file."""
    return f"pylock.{project}.toml"


@dataclass(frozen=True)
class InstallCommands:
    """Each form as the lines to run, in order."""

    pip: tuple[str, ...]
    uv: tuple[str, ...]
    pip_locked: tuple[str, ...]
    uv_locked: tuple[str, ...]
    uv_project: str
    """The pyproject.toml lines that pin the same indexes for a uv project."""


def _q(text: str) -> str:
    return shlex.quote(text)


def commands(world: WorldEntry, requirements: Sequence[str], *, lock_base: str, torch_installed: bool = False) -> InstallCommands:
    """The commands that install ``requirements`` (``flash-attn==2.8.3``, names of ``world``'s projects)
    from ``world``; ``lock_base``: the URL of the world's folder (its lock files). With ``torch_installed``
    (which-wheel found the world's torch), the torch step is left out."""
    names = [r.split("==", 1)[0] for r in requirements]
    wanted = " ".join(_q(r) for r in requirements)
    torch = _q(world.torch_requirement)
    pip_torch = (f"pip install --index-url {world.torch_index} {torch}" if world.torch_index
                 else f"pip install {torch}")
    uv_torch = (f"uv pip install --index {world.torch_index} {torch}" if world.torch_index
                else f"uv pip install {torch}")
    first = () if torch_installed else (pip_torch,)
    uv_first = () if torch_installed else (uv_torch,)
    pip = (*first, f"pip install --no-deps --index-url {world.index_url} {wanted}", f"pip install {wanted}")
    uv_indexes = f"--index {world.index_url}" + (f" --index {world.torch_index}" if world.torch_index else "")
    uv = (f"uv pip install {uv_indexes} {wanted}",)
    locks = " ".join(f"-r {lock_base}/{lock_name(n)}" for n in names)
    pip_locked = (*first, f"pip install --no-deps {locks}", f"pip install {wanted}")
    uv_locked = (*uv_first, f"uv pip install {locks}", f"uv pip install {uv_indexes} {wanted}")
    return InstallCommands(pip, uv, pip_locked, uv_locked, uv_project(world, requirements))


def uv_index_name(world: str) -> str:
    return "wheelhouse-" + world.replace("/", "-")


def uv_project(world: WorldEntry, requirements: Sequence[str]) -> str:
    """The ``tool.uv`` tables of a uv project's pyproject.toml: our world's index and the torch index, both
    explicit (used only for the packages ``tool.uv.sources`` points at them). The project's dependencies
    must name torch too (:func:`project_dependencies`): sources apply to direct dependencies only."""
    name = uv_index_name(world.path)
    lines = ["[[tool.uv.index]]", f'name = "{name}"', f'url = "{world.index_url}"', "explicit = true", ""]
    torch_source = ""
    if world.torch_index:
        torch_name = "pytorch-" + world.path.split("/")[0]
        lines += ["[[tool.uv.index]]", f'name = "{torch_name}"', f'url = "{world.torch_index}"', "explicit = true", ""]
        torch_source = f'torch = {{ index = "{torch_name}" }}'
    lines.append("[tool.uv.sources]")
    lines += [f'{r.split("==", 1)[0]} = {{ index = "{name}" }}' for r in requirements]
    if torch_source:
        lines.append(torch_source)
    return "\n".join(lines)


def project_dependencies(world: WorldEntry, requirements: Sequence[str]) -> tuple[str, ...]:
    """What the project's ``[project] dependencies`` must hold for :func:`uv_project`'s sources to apply."""
    return (*requirements, world.torch_requirement)


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def pylock(project: ProjectEntry, world: WorldEntry) -> bytes | None:
    """``pylock.<project>.toml`` of the project's newest wheels (every Python and arch: the installer picks the
    one for its interpreter); None when the project has no wheel to lock (archived, or no hashes)."""
    wheels = project.newest_wheels()
    if not wheels or any(w.sha256 is None for w in wheels):
        return None
    lines = ['lock-version = "1.0"', 'created-by = "wheelhouse"', "",
             "[[packages]]", f"name = {_toml_string(project.name)}", f"version = {_toml_string(str(project.newest))}",
             f"index = {_toml_string(world.index_url)}"]
    for wheel in wheels:
        lines += ["", "[[packages.wheels]]", f"name = {_toml_string(wheel.filename)}", f"url = {_toml_string(wheel.url)}",
                  f"size = {wheel.size}", f"hashes = {{ sha256 = {_toml_string(wheel.sha256 or '')} }}"]
    return ("\n".join(lines) + "\n").encode()
