"""requirements-tools.txt declares every package that ci/, tasks.py and noxfile.py import by name,
each with an exact pin (CI jobs that plan, release or index install only that file)."""

from __future__ import annotations

import ast
import re
import sys
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent


def imported_distributions() -> dict[str, str]:
    """distribution -> the file that imports it, for every third-party import of the commands' code."""
    provided = packages_distributions()
    found: dict[str, str] = {}
    for path in sorted([*(REPO / "ci").rglob("*.py"), REPO / "tasks.py", REPO / "noxfile.py"]):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "ci":
                    continue
                for dist in provided.get(top, [top]):
                    found.setdefault(canonicalize_name(dist), str(path.relative_to(REPO)))
    return found


def test_every_imported_package_is_pinned_in_requirements_tools():
    pins = {}
    for line in (REPO / "requirements-tools.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and re.fullmatch(r"[0-9][0-9a-z.]*", version), f"not an exact pin: {line}"
            pins[canonicalize_name(name)] = version
    imported = imported_distributions()
    assert {"httpx2", "fasttransport", "ghapi", "tqdm"} <= set(imported)  # the check sees direct imports
    missing = {dist: where for dist, where in imported.items() if dist not in pins}
    assert missing == {}, f"add these to requirements-tools.txt with an exact pin: {missing}"
