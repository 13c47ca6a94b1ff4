"""The pages a person reads: the landing page (``index.html``) and one page per world (``<world>/index.html``).

Made from the catalog (ci/catalog.py), as the JSON records are. Per world: a table of its components by
Python and CPU arch, each cell the newest wheel a user of that Python and arch gets, with its CUDA archs
(what our fatbin scan found in it), its size, its torch pin and a link to its release; then the install
commands (ci/install_commands.py) and the world's lock files. Retired worlds and components stay listed,
marked with their PEP 792 status. Static HTML, no JavaScript: it is served by GitHub Pages and read on a
phone (a viewport, tables that scroll sideways inside their box, text that wraps).

The landing page's first table keeps its cells ``<tr><td>world</td><td>packages</td><td>files</td>``:
ci/site_marker.py counts the wheel links of a site published before the marker from them.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from packaging.version import Version

from ci import which_wheel
from ci.catalog import ARCHIVED, Catalog, ProjectEntry, WheelEntry, WorldEntry
from ci.install_commands import WHY_THEY_DIFFER, project_dependencies, uv_project
from ci.which_wheel import ANY, InstallCommands, commands, lock_name, size_text, wheel_axes

_STYLE = """\
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 72em; padding: 0 0.8em; line-height: 1.4; }
pre { background: #f4f4f4; padding: 0.5em; overflow-x: auto; white-space: pre-wrap; word-break: break-all; }
code { word-break: break-all; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.5em; vertical-align: top; text-align: left; }
td small { display: block; color: #444; }
.status { color: #8a4b00; font-weight: bold; }
@media (max-width: 40em) { body { font-size: 0.9em; } th, td { padding: 0.2em 0.3em; } }"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def page(title: str, body: Sequence[str]) -> bytes:
    lines = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{esc(title)}</title>", f"<style>\n{_STYLE}\n</style>", "</head>", "<body>", *body,
             "</body>", "</html>", ""]
    return "\n".join(lines).encode("utf-8")


# --------------------------------------------------------------------------- axes of the table


def _fits(wheel: WheelEntry, python: str, arch: str) -> bool:
    pythons, archs = wheel_axes(wheel.filename)
    if arch not in archs and ANY not in archs:
        return False
    if python == ANY:
        return True
    admitted = python in pythons or ANY in pythons or any(
        p.startswith(">=") and Version(p[2:]) <= Version(python) for p in pythons)
    return admitted and wheel.python_admits(python)


def columns(world: WorldEntry) -> list[tuple[str, str]]:
    """(Python, arch) of every column: the concrete Pythons and archs the world's wheels name."""
    pythons: set[str] = set()
    archs: set[str] = set()
    for project in world.projects:
        for wheel in project.newest_wheels():
            found_pythons, found_archs = wheel_axes(wheel.filename)
            pythons |= {p for p in found_pythons if p != ANY and not p.startswith(">=")}
            archs |= found_archs - {ANY}
    return [(p, a) for p in sorted(pythons, key=Version) or [ANY] for a in sorted(archs) or [ANY]]


def cell_wheel(project: ProjectEntry, python: str, arch: str) -> WheelEntry | None:
    fitting = [w for w in project.newest_wheels() if _fits(w, python, arch)]
    return sorted(fitting, key=lambda w: w.filename)[0] if fitting else None


# --------------------------------------------------------------------------- what a cell says


def archs_text(wheel: WheelEntry) -> str:
    return which_wheel.archs_text(wheel.facts)


def pin_text(wheel: WheelEntry) -> str:
    return which_wheel.pin_text(wheel.facts)


def _cell(wheel: WheelEntry | None) -> str:
    if wheel is None:
        return "<td>—</td>"
    return (f'<td><a href="{esc(wheel.release_url)}">{esc(wheel.version)}</a>'
            f"<small>{esc(archs_text(wheel))}</small><small>{esc(size_text(wheel.size))}</small>"
            f"<small>{esc(pin_text(wheel))}</small></td>")


def _status_line(what: str, status_value: str, reason: str) -> str:
    return f'<p class="status">{esc(what)} is {esc(status_value)}: {esc(reason)}</p>'


# --------------------------------------------------------------------------- a world


def _commands_html(world: WorldEntry, forms: InstallCommands, requirements: Sequence[str]) -> list[str]:
    return ["<h3>Install</h3>", f"<p>{esc(WHY_THEY_DIFFER)}</p>",
            "<p>pip: torch from the world's torch index, our wheel from our index alone, then its other "
            "dependencies from your usual index (what is installed stays):</p>", _pre(forms.pip),
            "<p>uv:</p>", _pre(forms.uv),
            "<p>Verifiable: a PEP 751 lock file of the newest wheels, by sha256 (pip 26.1 or later, uv); the last "
            "line brings the other dependencies:</p>", _pre(forms.pip_locked), _pre(forms.uv_locked),
            '<p>In a uv project, these tables in pyproject.toml, with <code class="uv-dependencies">'
            + esc(", ".join(project_dependencies(world, requirements))) + "</code> among its dependencies:</p>",
            f"<pre>{esc(uv_project(world, requirements))}</pre>"]


def _pre(lines: Iterable[str]) -> str:
    return "<pre>" + esc("\n".join(lines)) + "</pre>"


def world_section(world: WorldEntry, *, base_url: str, heading: str = "h2", here: str = "") -> list[str]:
    """The table, the commands and the lock files of one world; ``here``: the world's folder relative to the
    page (``cu130/torch2.13/`` on the landing page, empty on the world's own)."""
    body = [f'<{heading} id="{esc(world.path)}">{esc(world.path)}</{heading}>']
    torch_from = world.torch_index or "your installer's configured index"
    body.append(f"<p>torch {esc(world.torch)}.x, {'CPU' if world.cuda == 'cpu' else 'CUDA ' + esc(world.cuda)}; "
                f"torch from <code>{esc(torch_from)}</code>; index <code>{esc(world.index_url)}</code></p>")
    if not world.status.active:
        body.append(_status_line(f"The world {world.path}", world.status.value, world.status.reason))
    served = [p for p in world.projects if p.status.value != ARCHIVED and p.newest_wheels()]
    retired = [p for p in world.projects if p not in served]
    if served:
        cols = columns(world)
        body.append('<div class="scroll"><table>')
        body.append("<tr><th>component</th>" + "".join(
            f"<th>Python {esc(p)}<br>{esc(a)}</th>" for p, a in cols) + "</tr>")
        for project in served:
            label = esc(project.name)
            if not project.status.active:
                label += f'<small class="status">{esc(project.status.value)}</small>'
            body.append(f"<tr><th>{label}</th>" + "".join(_cell(cell_wheel(project, p, a)) for p, a in cols) + "</tr>")
        body.append("</table></div>")
        requirements = [f"{p.name}=={p.newest}" for p in served if p.status.active] or [
            f"{p.name}=={p.newest}" for p in served]
        example = requirements[:1]
        forms = commands(world, example, lock_base=f"{base_url}/{world.path}")
        body += _commands_html(world, forms, example)
        others = [r.split("==")[0] for r in requirements[1:]]
        if others:
            body.append(f"<p>The same for the other components: {esc(', '.join(others))}.</p>")
        body.append("<p>Lock files: " + ", ".join(
            f'<a href="{esc(here + lock_name(p.name))}">{esc(lock_name(p.name))}</a>' for p in served) + "</p>")
    elif world.status.active:
        body.append("<p>No wheels are published in this world yet.</p>")
    for project in retired:
        body.append(_status_line(project.name, project.status.value, project.status.reason))
    return body


def render_world_page(world: WorldEntry, *, base_url: str, site_name: str) -> bytes:
    body = [f'<p><a href="../../index.html">{esc(site_name)}</a> / {esc(world.path)}</p>',
            *world_section(world, base_url=base_url, heading="h1"),
            '<p>Machine-readable: <a href="wheelhouse-world.json">wheelhouse-world.json</a>; the simple index: '
            '<a href="simple/index.html">simple/</a></p>']
    return page(f"{site_name} {world.path}", body)


# --------------------------------------------------------------------------- the landing page


def render_landing(catalog: Catalog, *, base_url: str, site_name: str, link_counts: dict[str, int]) -> bytes:
    body = [f"<h1>{esc(site_name)}</h1>",
            "<p>Prebuilt wheels, one package index per CUDA/torch world. Pick the world that matches your torch build"
            " (a wheel from another world may import and then crash).</p>",
            "<p>Which one is yours: from a checkout of the wheelhouse repository, <code>invoke which-wheel --index "
            f"{esc(base_url)}</code> reads the torch, Python, platform and GPUs of the interpreter it runs under and "
            "prints the world, the commands, and what does not fit and why.</p>"]
    if not catalog.worlds:
        body.append("<p>No wheels are published yet.</p>")
    body.append('<div class="scroll"><table>')
    body.append("<tr><th>world</th><th>packages</th><th>files</th><th>index</th><th>status</th><th>page</th></tr>")
    for world in catalog.worlds:
        marker = " (also served at /simple/)" if world.path == catalog.default_world else ""
        served = [p for p in world.projects if p.status.value != ARCHIVED]
        body.append(
            f"<tr><td>{esc(world.path)}{esc(marker)}</td><td>{len(served)}</td><td>{link_counts.get(world.path, 0)}</td>"
            f'<td><a href="{esc(world.path)}/simple/index.html">{esc(world.path)}/simple/</a></td>'
            f"<td>{esc(world.status.value)}</td>"
            f'<td><a href="{esc(world.path)}/index.html">{esc(world.path)}</a></td></tr>')
    body.append("</table></div>")
    for world in catalog.worlds:
        body += world_section(world, base_url=base_url, here=f"{world.path}/")
    body.append('<p>Machine-readable: <a href="wheelhouse-index.json">wheelhouse-index.json</a>.</p>')
    return page(f"{site_name} package indexes", body)
