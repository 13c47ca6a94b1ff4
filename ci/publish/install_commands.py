"""The install commands the landing page and ``invoke which-wheel`` print, and each world's lock files.

The commands themselves are made by ci/publish/which_wheel.py (:func:`ci.publish.which_wheel.commands`), the one file the
site also serves to users, so the page and which-wheel print the same lines; here are the lock files and
the uv project tables.

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

from collections.abc import Sequence

from ci.publish.catalog import ProjectEntry, WorldEntry
from ci.publish.which_wheel import InstallCommands, commands, lock_name

__all__ = ["WHY_THEY_DIFFER", "InstallCommands", "commands", "lock_name", "project_dependencies", "pylock",
           "uv_project"]

WHY_THEY_DIFFER = (
    "pip merges all the indexes it is given and installs the highest version it finds, so a higher-versioned "
    "package of the same name on the package index would win: its commands take torch and our wheels each "
    "from their own index alone; uv takes every package from the first index that has it, so one command "
    "with our index first does the same."
)


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
    """A TOML basic string: quotes and backslashes escaped, and every control character (DEL too, which TOML
    forbids raw) as ``\\uXXXX``."""
    escaped = (f"\\{c}" if c in '"\\' else f"\\u{ord(c):04x}" if ord(c) < 0x20 or ord(c) == 0x7F else c
               for c in text)
    return '"' + "".join(escaped) + '"'


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
