"""The architecture as the code has it: ci/'s packages are layers, each importing only the ones below it, and no
module imports itself back through others. Run by ``nox -s lint`` as well as with the tests.

Imports are read from the source (``ast``), those inside functions too: a lazy import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CI = REPO / "ci"
LAYERS = ("base", "formats", "model", "checks", "timing", "store", "building", "publish", "maintenance", "flows")
"""Lowest first. base: errors, digests, logging, bounded JSON; formats: the file formats (wheels, ELF, fat
binaries, arch lists, build logs); model: versions.yaml and what is derived from it; checks: what a wheel must
satisfy; timing: plans from measured data; store: releases; build: one row's build job; publish: releases,
provenance, the index, which-wheel; maintenance: migrate, restore, prune; flows: workflows, the skip plan, the
demo."""
MOST_AT_THE_TOP = 12


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The ci modules ``path`` imports (``from ci.x import y`` names module ``ci.x.y`` when that is a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("ci.")}
        elif isinstance(node, ast.ImportFrom) and node.module and (node.module == "ci" or node.module.startswith("ci.")):
            for alias in node.names:
                name = f"{node.module}.{alias.name}"
                found.add(name if name in modules else node.module)
    return {name for name in found if name in modules and name != "ci"}


def _graph() -> dict[str, set[str]]:
    files = {_module(path): path for path in CI.rglob("*.py")}
    return {module: _imports(path, set(files)) - {module} for module, path in files.items()}


def _layer(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.index(parts[1]) if len(parts) > 1 and parts[1] in LAYERS else None


GRAPH = _graph()


def test_every_module_lies_in_a_layer():
    assert sorted(m for m in GRAPH if m != "ci" and _layer(m) is None and m != "ci.__main__") == []


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_a_module_imports_only_its_own_layer_and_those_below(module):
    own = _layer(module)
    if own is None:  # ci itself and `python -m ci`: the top
        return
    upward = sorted(target for target in GRAPH[module] if (_layer(target) or 0) > own)
    assert upward == [], f"{module} ({LAYERS[own]}) imports from above: {upward}"


def test_no_module_imports_itself_back_through_others():
    """Strongly connected components of the module graph (Tarjan's algorithm): every one a single module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(GRAPH):
        if node not in index:
            visit(node)
    assert cycles == []


def test_the_ground_floors_import_nothing_above_them():
    """The file formats import only the ground (errors, digests, logging, bounded JSON)."""
    for module, targets in GRAPH.items():
        if _layer(module) == LAYERS.index("formats"):
            assert {t.split(".")[1] for t in targets} <= {"base", "formats"}, (module, targets)


def test_the_top_of_ci_names_at_most_a_dozen_entries():
    entries = sorted(p.name for p in CI.iterdir() if p.name != "__pycache__")
    assert len(entries) <= MOST_AT_THE_TOP, entries
    assert {p.name for p in CI.iterdir() if p.is_dir() and p.name != "__pycache__"} == set(LAYERS)


def test_the_library_never_imports_the_command_layer_or_the_tests():
    for path in CI.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            assert not any(n.split(".")[0] in ("tasks", "noxfile", "tests", "benchmarks") for n in names), path
