"""Which projects a component may publish: the ``wheel_packages`` versions.yaml gives it.

A build's output comes from upstream build code, so the names of its wheels are not to be trusted:
a component whose ``setup.py`` says ``name="torch"`` must not put a ``torch`` wheel into an index
pip reads. Every step that takes a wheel into a release or an index (the end of a build, a release,
a restore, the index) asks this module, so they agree on one rule:

- a wheel's project (its file name's, PEP 503 normalised) is one of the component's
  ``wheel_packages`` for that arch; a component that lists none publishes only its own name;
- the file name's name and version are the Name and Version of the wheel's own METADATA
  (:func:`ci.formats.metadata.read_metadata`), so the name checked is the one pip installs.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from pathlib import Path

from packaging.utils import canonicalize_name

from ci.base.errors import CheckFailed
from ci.formats.archive import open_wheel
from ci.formats.metadata import read_metadata
from ci.model.versions import Versions

ARCHES = ("x86_64", "aarch64")
"""Every arch an arch_overrides key may name."""


def allowed(component: str, wheel_packages: Iterable[str]) -> frozenset[str]:
    """The normalised projects ``component`` may publish: its wheel_packages, else its own name."""
    return frozenset(canonicalize_name(p) for p in wheel_packages) or frozenset({canonicalize_name(component)})


def by_component(versions: Versions) -> dict[str, frozenset[str]]:
    """Every component's projects over all its arches (an arch override may list other wheel_packages)."""
    return {
        name: frozenset().union(*(allowed(name, component.settings_for(arch).wheel_packages) for arch in ARCHES))
        for name, component in versions.components.items()
    }


def rehosted_by_component(versions: Versions) -> dict[str, frozenset[str]]:
    """Every component's projects that versions.yaml's ``rehost`` downloads from upstream (any arch)."""
    return {
        name: frozenset(canonicalize_name(p) for arch in ARCHES for p in component.settings_for(arch).rehost)
        for name, component in versions.components.items()
    }


def refusal(component: str, project: str, projects: Collection[str]) -> str | None:
    """Why ``component`` may not publish ``project`` (PEP 503 normalised), or None when it may."""
    if project in projects:
        return None
    return (f"project {project!r} is not one component {component} publishes ({', '.join(sorted(projects))}: "
            f"components.{component}.wheel_packages in versions.yaml, or the component's own name when it lists none)")


def checked_metadata(wheel: Path, component: str, projects: Collection[str]) -> bytes:
    """The METADATA bytes of ``wheel`` once its project is one ``component`` publishes; CheckFailed otherwise.

    Its name and version are those of the file name (read_metadata), so the .metadata file made from these
    bytes describes exactly this wheel.
    """
    with open_wheel(wheel) as archive:
        data = read_metadata(archive)
        problem = refusal(component, archive.wheel_name.name, projects)
    if problem:
        raise CheckFailed(f"{wheel.name}: {problem}; a component publishes only its own wheels: fix its build, "
                          "or list the project in its wheel_packages")
    return data


def check_all(wheels: Iterable[Path], component: str, projects: Collection[str]) -> dict[str, bytes]:
    """:func:`checked_metadata` of every wheel, keyed by file name; the first refusal raises."""
    return {wheel.name: checked_metadata(wheel, component, projects) for wheel in wheels}


__all__ = ["ARCHES", "allowed", "by_component", "check_all", "checked_metadata", "refusal", "rehosted_by_component"]
