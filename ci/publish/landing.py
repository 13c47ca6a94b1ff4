"""The pages a person reads: the landing page (``index.html``) and one page per world (``<world>/index.html``).

Made from the catalog (ci/publish/catalog.py), as the JSON records are. The landing page says how to tell one's world
(the torch one-liner, or the site's ``which-wheel.py``), then, per world, a table of its components by Python
and CPU arch: each cell the newest wheel a user of that Python and arch gets, linked directly with its sha256
(``#sha256=``, as the simple index links it), its CUDA archs (what our fatbin scan found in it), size and
torch pin; then the install commands for every component (ci/publish/which_wheel.py makes them, as which-wheel prints
them) and the world's lock files. Retired worlds and components stay listed, marked with their PEP 792 status.

Static HTML first: everything is on the page without JavaScript (GitHub Pages serves it; a phone reads it:
a viewport, wide tables scroll inside their box, the world table fits the width). A few lines of script add
the selector (a world, Python and CPU arch, or the pasted one-liner's output, which shows only what fits) and
copy buttons beside each command.

The landing page's first table keeps its cells ``<tr><td>world</td><td>packages</td><td>files</td>``:
ci/publish/site_marker.py counts the wheel links of a site published before the marker from them.
"""

from __future__ import annotations

import html
from collections.abc import Iterable, Sequence

from packaging.version import Version

from ci.publish import which_wheel
from ci.publish.catalog import ARCHIVED, Catalog, ProjectEntry, WheelEntry, WorldEntry
from ci.publish.install_commands import WHY_THEY_DIFFER, project_dependencies, uv_project
from ci.publish.which_wheel import ANY, SERVED_NAME, InstallCommands, commands, lock_name, size_text, wheel_axes

_STYLE = """\
body { font-family: system-ui, sans-serif; margin: 0 auto; max-width: 72em; padding: 0 0.8em; line-height: 1.4; }
pre { background: #f4f4f4; padding: 0.5em; overflow-x: auto; white-space: pre-wrap; word-break: break-all; margin: 0; }
code { word-break: break-all; }
.scroll { overflow-x: auto; }
table { border-collapse: collapse; margin: 0.5em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.5em; vertical-align: top; text-align: left; }
td small { display: block; color: #444; }
table.worlds { width: 100%; table-layout: fixed; }
table.worlds td, table.worlds th { overflow-wrap: anywhere; }
.status { color: #8a4b00; font-weight: bold; }
.help, .picker { background: #eef4ff; border: 1px solid #bcd; padding: 0.3em 0.8em; margin: 0.5em 0; }
.picker { display: none; }
.picker label { display: inline-block; margin: 0.2em 1em 0.2em 0; }
.picker input { width: 100%; max-width: 40em; box-sizing: border-box; font-family: monospace; }
.cmd { position: relative; margin: 0.4em 0; }
.copy { display: none; position: absolute; top: 0.2em; right: 0.2em; font-size: 0.8em; }
.js .picker, .js .copy { display: block; }
.js .cmd pre { padding-right: 4.5em; }
@media (max-width: 40em) { body { font-size: 0.9em; } th, td { padding: 0.2em 0.3em; } }"""
_SCRIPT = """\
document.documentElement.classList.add("js");
function wheelhousePick(form) {
  var world = form.world.value, python = form.python.value, arch = form.arch.value;
  document.querySelectorAll("section.world").forEach(function (s) { s.hidden = !!world && s.dataset.world !== world; });
  document.querySelectorAll("[data-python]").forEach(function (c) {
    c.hidden = (!!python && c.dataset.python !== python && c.dataset.python !== "any") ||
               (!!arch && c.dataset.arch !== arch && c.dataset.arch !== "any");
  });
}
function wheelhouseParse(form) {
  var words = form.paste.value.trim().split(/\\s+/), version = /^(\\d+)\\.(\\d+)/.exec(words[0] || "");
  if (!version) { form.said.value = ""; return; }
  var local = (words[0].split("+")[1] || "").toLowerCase(), cuda = words[1] || "", tag = "";
  if (/^\\d+\\.\\d+/.test(cuda)) { tag = "cu" + cuda.split(".").slice(0, 2).join(""); }
  else if (/^cu\\d+$/.test(local)) { tag = local; }
  else if (local === "cpu" || cuda === "None") { tag = "cpu"; }
  var world = tag + "/torch" + version[1] + "." + version[2];
  words.slice(1).forEach(function (w) {
    if (/^3\\.\\d+$/.test(w) && form.python.querySelector('option[value="' + w + '"]')) { form.python.value = w; }
    if (form.arch.querySelector('option[value="' + w + '"]')) { form.arch.value = w; }
  });
  if (!tag) { form.said.value = "torch " + words[0] + " does not say its CUDA: paste the whole line the one-liner prints"; }
  else if (form.world.querySelector('option[value="' + world + '"]')) { form.world.value = world; form.said.value = "your world: " + world; }
  else { form.said.value = "no world of this site serves torch " + words[0] + " (" + world + ")"; }
  wheelhousePick(form);
}
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll("button.copy").forEach(function (b) {
    b.addEventListener("click", function () {
      navigator.clipboard.writeText(b.parentNode.querySelector("pre").textContent).then(function () { b.textContent = "copied"; });
    });
  });
});"""
ONE_LINER = ('python -c "import torch, sys, platform; print(torch.__version__, torch.version.cuda, '
             "'%d.%d' % sys.version_info[:2], platform.machine())\"")
"""What a user runs to tell their world, and pastes into the selector: ``2.13.0+cu130 13.0 3.12 x86_64``."""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def page(title: str, body: Sequence[str]) -> bytes:
    lines = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             '<meta name="viewport" content="width=device-width, initial-scale=1">',
             f"<title>{esc(title)}</title>", f"<style>\n{_STYLE}\n</style>", f"<script>\n{_SCRIPT}\n</script>",
             "</head>", "<body>", *body, "</body>", "</html>", ""]
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


def _cell(wheel: WheelEntry | None, python: str, arch: str) -> str:
    axes = f'data-python="{esc(python)}" data-arch="{esc(arch)}"'
    if wheel is None:
        return f"<td {axes}>—</td>"
    href = wheel.url + (f"#sha256={wheel.sha256}" if wheel.sha256 else "")
    digest = f"<small>sha256 <code>{esc(wheel.sha256[:16])}…</code></small>" if wheel.sha256 else ""
    return (f'<td {axes}><a href="{esc(href)}" title="{esc(wheel.filename)}">{esc(wheel.version)}</a>{digest}'
            f"<small>{esc(archs_text(wheel))}</small><small>{esc(size_text(wheel.size))}</small>"
            f'<small>{esc(pin_text(wheel))}</small><small><a href="{esc(wheel.release_url)}">release</a></small></td>')


def _status_line(what: str, status_value: str, reason: str) -> str:
    return f'<p class="status">{esc(what)} is {esc(status_value)}: {esc(reason)}</p>'


# --------------------------------------------------------------------------- a world


def _commands_html(world: WorldEntry, forms: InstallCommands, requirements: Sequence[str]) -> list[str]:
    return ["<h3>Install</h3>", f"<p>{esc(WHY_THEY_DIFFER)}</p>",
            f"<p>Every component of the world ({esc(', '.join(r.split('==')[0] for r in requirements))}); leave out "
            "the ones you do not need. pip: torch from the world's torch index, our wheels from our index alone, "
            "then their other dependencies from your usual index (what is installed stays):</p>", _pre(forms.pip),
            "<p>uv:</p>", _pre(forms.uv),
            f"<p>Verifiable: a PEP 751 lock file of the newest wheels, by sha256 (pip {which_wheel.LOCK_PIP} or later, "
            "which the first line brings; uv); the last line brings the other dependencies:</p>",
            _pre(forms.pip_locked), _pre(forms.uv_locked),
            '<p>In a uv project, these tables in pyproject.toml, with <code class="uv-dependencies">'
            + esc(", ".join(project_dependencies(world, requirements))) + "</code> among its dependencies:</p>",
            _pre([uv_project(world, requirements)])]


def _pre(lines: Iterable[str]) -> str:
    return '<div class="cmd"><button type="button" class="copy">copy</button><pre>' + esc("\n".join(lines)) + "</pre></div>"


def world_section(world: WorldEntry, *, base_url: str, heading: str = "h2", here: str = "") -> list[str]:
    """The table, the commands and the lock files of one world; ``here``: the world's folder relative to the
    page (``cu130/torch2.13/`` on the landing page, empty on the world's own)."""
    body = [f'<section class="world" data-world="{esc(world.path)}">',
            f'<{heading} id="{esc(world.path)}">{esc(world.path)}</{heading}>']
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
            f'<th data-python="{esc(p)}" data-arch="{esc(a)}">Python {esc(p)}<br>{esc(a)}</th>' for p, a in cols)
            + "</tr>")
        for project in served:
            label = esc(project.name)
            if not project.status.active:
                label += f'<small class="status">{esc(project.status.value)}</small>'
            body.append(f"<tr><th>{label}</th>" + "".join(_cell(cell_wheel(project, p, a), p, a) for p, a in cols)
                        + "</tr>")
        body.append("</table></div>")
        requirements = [f"{p.name}=={p.newest}" for p in served if p.status.active] or [
            f"{p.name}=={p.newest}" for p in served]
        forms = commands(world, requirements, lock_base=f"{base_url}/{world.path}")
        body += _commands_html(world, forms, requirements)
        body.append("<p>Lock files: " + ", ".join(
            f'<a href="{esc(here + lock_name(p.name))}">{esc(lock_name(p.name))}</a>' for p in served) + "</p>")
    elif world.status.active:
        body.append("<p>No wheels are published in this world yet.</p>")
    for project in retired:
        body.append(_status_line(project.name, project.status.value, project.status.reason))
    return [*body, "</section>"]


def render_world_page(world: WorldEntry, *, base_url: str, site_name: str) -> bytes:
    body = [f'<p><a href="../../index.html">{esc(site_name)}</a> / {esc(world.path)}</p>',
            *world_section(world, base_url=base_url, heading="h1"),
            '<p>Machine-readable: <a href="wheelhouse-world.json">wheelhouse-world.json</a>; the simple index: '
            '<a href="simple/index.html">simple/</a></p>']
    return page(f"{site_name} {world.path}", body)


# --------------------------------------------------------------------------- the landing page


def _which_world(catalog: Catalog, base_url: str) -> list[str]:
    """How to tell one's world: for everyone, in words; with JavaScript, the selector."""
    worlds = [w.path for w in catalog.worlds if w.status.value != ARCHIVED]
    pythons = sorted({p for w in catalog.worlds for p, _ in columns(w) if p != ANY}, key=Version)
    archs = sorted({a for w in catalog.worlds for _, a in columns(w) if a != ANY})
    options = "".join(f'<option value="{esc(v)}">{esc(v)}</option>' for v in worlds)
    return [
        '<div class="help"><p><b>Which world is yours?</b> In the environment you will run in, this prints torch\'s '
        "version and CUDA, Python and CPU arch (<code>2.13.0+cu130 13.0 3.12 x86_64</code> is the world "
        "<code>cu130/torch2.13</code>; <code>2.13.0+cpu None …</code> is <code>cpu/torch2.13</code>):</p>",
        _pre([ONE_LINER]),
        "<p>Or let the site's own script read torch, Python, platform and GPUs and print the world, the wheels "
        "that fit (and why the others do not) and the commands; it needs nothing but Python "
        f'(<a href="{SERVED_NAME}">{SERVED_NAME}</a>, the same code as <code>invoke which-wheel</code>):</p>',
        _pre([f"python3 <(curl -fsSL {base_url}/{SERVED_NAME})",
              f"uv run {base_url}/{SERVED_NAME}    # with the environment's venv active"]),
        "</div>",
        '<form class="picker" onsubmit="return false"><p><b>Show what fits:</b></p>'
        '<label>world <select name="world" onchange="wheelhousePick(this.form)"><option value="">every world</option>'
        f"{options}</select></label>"
        '<label>Python <select name="python" onchange="wheelhousePick(this.form)"><option value="">any</option>'
        + "".join(f'<option value="{esc(p)}">{esc(p)}</option>' for p in pythons) + "</select></label>"
        '<label>CPU <select name="arch" onchange="wheelhousePick(this.form)"><option value="">any</option>'
        + "".join(f'<option value="{esc(a)}">{esc(a)}</option>' for a in archs) + "</select></label>"
        '<label style="display:block">or paste what the one-liner printed '
        '<input name="paste" placeholder="2.13.0+cu130 13.0 3.12 x86_64" oninput="wheelhouseParse(this.form)">'
        '</label><output name="said"></output></form>',
    ]


def render_landing(catalog: Catalog, *, base_url: str, site_name: str, link_counts: dict[str, int]) -> bytes:
    body = [f"<h1>{esc(site_name)}</h1>",
            "<p>Prebuilt wheels, one package index per CUDA/torch world. Pick the world that matches your torch build"
            " (a wheel from another world may import and then crash).</p>", *_which_world(catalog, base_url)]
    if not catalog.worlds:
        body.append("<p>No wheels are published yet.</p>")
    body.append('<table class="worlds">')
    body.append("<tr><th>world</th><th>packages</th><th>files</th><th>status, pages</th></tr>")
    for world in catalog.worlds:
        marker = " (also served at /simple/)" if world.path == catalog.default_world else ""
        served = [p for p in world.projects if p.status.value != ARCHIVED]
        body.append(
            f"<tr><td>{esc(world.path)}{esc(marker)}</td><td>{len(served)}</td><td>{link_counts.get(world.path, 0)}</td>"
            f'<td>{esc(world.status.value)}: <a href="#{esc(world.path)}">below</a>, '
            f'<a href="{esc(world.path)}/index.html">its page</a>, '
            f'<a href="{esc(world.path)}/simple/index.html">simple/</a></td></tr>')
    body.append("</table>")
    for world in catalog.worlds:
        body += world_section(world, base_url=base_url, here=f"{world.path}/")
    body.append('<p>Machine-readable: <a href="wheelhouse-index.json">wheelhouse-index.json</a>.</p>')
    return page(f"{site_name} package indexes", body)
