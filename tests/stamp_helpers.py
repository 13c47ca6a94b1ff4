"""Helpers for the torch pin and SBOM tests: the fixture row's real build facts, stand-in torch wheels,
a shared object that links a (stub) torch library, and the CycloneDX validator."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from wheel_factory import build_wheel

from ci.base.digest import sha256_file
from ci.building import sbom, sources, toolchain
from ci.model import matrix
from ci.model.versions import load

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"
FIXTURE_EXT = REPO / "tests" / "fixtures" / "fixture_ext"


def fixture_row():
    versions = load(FIXTURE_VERSIONS)
    (row,) = matrix.expand(versions)
    return versions, row


def fixture_facts(env: dict[str, str] | None = None) -> dict[str, Any]:
    """What a build of the fixture row records, gathered from the real parts: the fixture's source
    directory and the test interpreter (torch 2.13 CPU), as ci/building/job.py gathers them."""
    versions, row = fixture_row()
    checkout = sources.local_directory(FIXTURE_EXT)
    interpreter = toolchain.verify(sys.executable, row)
    return sbom.build_facts(versions, row, checkout, interpreter, env if env is not None else {"PATH": "/usr/bin:/bin"})


def torch_stand_in(out_dir: Path, version: str) -> Path:
    """A tiny pure-Python wheel named torch (no multi-GB install), ``version`` as given (``2.13.0+cu130``)."""
    return build_wheel(out_dir, name="torch", version=version, tags="py3-none-any", requires_python=None)


def simple_index(root: Path, wheels: list[Path]) -> str:
    """A PEP 503 index over ``wheels`` (one project each, sha256 fragments) in ``root``; its file:// URL."""
    projects: dict[str, list[Path]] = {}
    for wheel in wheels:
        projects.setdefault(wheel.name.split("-")[0].lower().replace("_", "-"), []).append(wheel)
    (root / "simple").mkdir(parents=True, exist_ok=True)
    for project, files in projects.items():
        folder = root / "simple" / project
        folder.mkdir(parents=True, exist_ok=True)
        links = []
        for wheel in sorted(files):
            shutil.copyfile(wheel, folder / wheel.name)
            href = wheel.name.replace("+", "%2B")
            links.append(f'<a href="{href}#sha256={sha256_file(wheel)}">{wheel.name}</a><br>')
        (folder / "index.html").write_text("<!DOCTYPE html><html><body>\n" + "\n".join(links) + "\n</body></html>\n")
    (root / "simple" / "index.html").write_text(
        "<!DOCTYPE html><html><body>\n" + "\n".join(f'<a href="{p}/">{p}</a><br>' for p in sorted(projects))
        + "\n</body></html>\n")
    return (root / "simple").as_uri() + "/"


def linked_shared_object(tmp: Path, library: str) -> Path:
    """A real host shared object whose DT_NEEDED names ``library`` (a stub built beside it, e.g. libc10.so)."""
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "stub.cpp").write_text("int stub_value() { return 1; }\n")
    (tmp / "user.cpp").write_text("int stub_value();\nint user_value() { return stub_value() + 1; }\n")
    subprocess.run(["g++", "-shared", "-fPIC", "stub.cpp", "-o", library], cwd=tmp, check=True)
    name = library.removeprefix("lib").split(".so", 1)[0]
    subprocess.run(["g++", "-shared", "-fPIC", "user.cpp", "-L.", f"-l{name}", "-Wl,--no-as-needed", "-o", "user.so"],
                   cwd=tmp, check=True)
    return tmp / "user.so"


def validate_cyclonedx(document: dict[str, Any]) -> None:
    """Fail with the validator's own message unless ``document`` is valid CycloneDX 1.6 JSON.

    cyclonedx-python-lib's strict JSON validator carries the 1.6 schema and the schemas it refers
    to (SPDX licence ids, JSF), so this reads nothing from the network.
    """
    from cyclonedx.schema import SchemaVersion
    from cyclonedx.validation.json import JsonStrictValidator

    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(document))
    assert error is None, f"not valid CycloneDX 1.6: {error}"
