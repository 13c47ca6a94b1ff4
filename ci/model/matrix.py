"""Expand validated versions into build rows, in one deterministic order.

Rows come out with components sorted by name and, inside a component, in
build_matrix order. A component with ``bundle_pythons`` gets one row per
(arch, CUDA, torch): that row builds with the newest of its Pythons and packs
the extension for all of them into one wheel (see README, "Bundle mode").
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from ci.base.errors import ConfigError
from ci.model import naming
from ci.model.versions import Component, MatrixEntry, Settings, Versions


@dataclass(frozen=True)
class MatrixRow:
    component: str
    ref: str
    arch: str
    cuda: str
    python: str
    torch: str
    torch_vision: str
    torch_audio: str
    cxx11_abi: str
    torch_index: str
    settings: Settings
    bundle_pythons: tuple[str, ...] = ()
    """Every Python the row's wheel covers, when the component bundles them."""

    @property
    def pythons(self) -> tuple[str, ...]:
        return self.bundle_pythons or (self.python,)

    @property
    def release_python(self) -> str:
        """The Python part of the release tag: ``3.12``, or ``3.11-3.12`` for a bundle."""
        return "-".join(self.pythons)

    @property
    def release_tag(self) -> str:
        return naming.release_tag(self.component, self.ref, self.cuda, self.release_python, self.torch)

    @property
    def world(self) -> str:
        return naming.world_path(self.cuda, self.torch)

    @property
    def session(self) -> str:
        return naming.session_name(self.component, self.python)

    @property
    def label(self) -> str:
        return f"{self.component} ({self.arch} {naming.cuda_label(self.cuda)} py{'+'.join(self.pythons)} torch{self.torch})"

    def title_segments(self) -> list[naming.TitleSegment]:
        return [naming.TitleSegment(self.arch, self.cuda, python, self.torch) for python in self.pythons]

    def to_json(self) -> dict:
        """One flat GitHub Actions matrix entry (one key per workflow input)."""
        s = self.settings
        return {
            "component": self.component,
            "ref": self.ref,
            "release_tag": self.release_tag,
            "session": self.session,
            "world": self.world,
            "builder": s.builder,
            "arch": self.arch,
            "runs_on": json.dumps(list(s.runs_on_labels) if not isinstance(s.runs_on, str) else s.runs_on),
            "cuda": self.cuda,
            "python": self.python,
            "bundle_pythons": list(self.bundle_pythons),
            "torch": self.torch,
            "torch_vision": self.torch_vision,
            "torch_audio": self.torch_audio,
            "cxx11_abi": self.cxx11_abi,
            "torch_cuda_arch_list": s.torch_cuda_arch_list or "",
            "arch_filter": s.arch_filter,
            "verify_wheel_archs": s.verify_wheel_archs,
            "extra_cubins": ";".join(s.extra_cubins),
            "requires_cudnn": s.requires_cudnn,
            "max_jobs": s.max_jobs,
            "build_timeout": s.build_timeout,
            "job_timeout_minutes": s.job_timeout_minutes,
            "shards": s.shards,
            "wheel_packages": list(s.wheel_packages),
            "extra_env": json.dumps(dict(s.extra_env), sort_keys=True),
        }


def _row(component: Component, entry: MatrixEntry, bundle: tuple[str, ...] = ()) -> MatrixRow:
    return MatrixRow(
        component=component.name,
        ref=component.ref,
        arch=entry.arch,
        cuda=entry.cuda,
        python=entry.python,
        torch=entry.torch,
        torch_vision=entry.torch_vision,
        torch_audio=entry.torch_audio,
        cxx11_abi=entry.cxx11_abi,
        torch_index=entry.torch_index,
        settings=component.settings_for(entry.arch),
        bundle_pythons=bundle,
    )


def component_rows(versions: Versions, component: Component) -> list[MatrixRow]:
    return [_row(component, entry, bundle) for entry, bundle in component.builds_of(versions.build_matrix)]


def expand(versions: Versions) -> list[MatrixRow]:
    rows: list[MatrixRow] = []
    for name in sorted(versions.components):
        rows.extend(component_rows(versions, versions.components[name]))
    return rows


def session_rows(versions: Versions) -> list[MatrixRow]:
    """One row per (component, Python) the component builds: the nox sessions.

    For a plain component that is its matrix rows of the first arch listing
    that Python (nox builds for the machine's arch; see ``for_host``). For a
    bundle component every Python gets a session that builds the whole bundle
    with that Python as the build interpreter.
    """
    rows: list[MatrixRow] = []
    for name in sorted(versions.components):
        component = versions.components[name]
        seen: set[str] = set()
        for entry in versions.build_matrix:
            if not component.builds(entry) or entry.python in seen:
                continue
            seen.add(entry.python)
            bundle: tuple[str, ...] = ()
            if component.bundle_pythons:
                bundle = tuple(
                    sorted(
                        {e.python for e in versions.build_matrix if component.builds(e) and e.arch == entry.arch
                         and e.torch == entry.torch and e.cuda == entry.cuda},
                        key=naming.version_key,
                    )
                )
            rows.append(_row(component, entry, bundle))
    return rows


def select(
    rows: Iterable[MatrixRow],
    *,
    versions: Versions,
    component: str | None = None,
    arch: str | None = None,
    python: str | None = None,
    torch: str | None = None,
    cuda: str | None = None,
) -> list[MatrixRow]:
    """Filter rows; unknown filter values are errors naming the known ones."""
    rows = list(rows)
    if component not in (None, "all"):
        versions.component(component)  # raises with the known names
        rows = [row for row in rows if row.component == component]
    checks = (
        ("arch", arch, sorted({e.arch for e in versions.build_matrix})),
        ("python", python, sorted({e.python for e in versions.build_matrix}, key=naming.version_key)),
        ("torch", torch, sorted({e.torch for e in versions.build_matrix})),
        ("cuda", cuda, sorted({e.cuda for e in versions.build_matrix})),
    )
    for field_name, wanted, known in checks:
        if wanted in (None, "all"):
            continue
        if wanted not in known:
            raise ConfigError(
                f"{versions.path.name}: no build_matrix row has {field_name} '{wanted}'; known: {', '.join(known)}"
            )
        if field_name == "python":
            rows = [row for row in rows if wanted in row.pythons]
        else:
            rows = [row for row in rows if getattr(row, field_name) == wanted]
    return rows


def compile_group(row: MatrixRow) -> tuple[str, str, str, str]:
    """The rows that compile the same objects but for the Python: one component, arch, CUDA and torch.

    They share one compiler cache key (docs/ci.md), so every object without Python headers that one of
    them compiled is a cache hit for the others.
    """
    return (row.component, row.arch, row.cuda, row.torch)


def stages(rows: Iterable[MatrixRow]) -> tuple[list[MatrixRow], list[MatrixRow]]:
    """(first, rest): the rows to build first, and those that start from the compiler cache the first saved.

    Of each compile group (:func:`compile_group`) the lowest Python builds first; the group's other
    Pythons follow, all at once. A component with ``stage_pythons: false`` has every row in the first
    stage. Each list keeps the order of ``rows``; different groups (archs, worlds) are never ordered
    against each other: every first row runs at once, and so does every other row.
    """
    rows = list(rows)
    leaders: dict[tuple[str, str, str, str], MatrixRow] = {}
    for row in rows:
        group = compile_group(row)
        if group not in leaders or naming.version_key(row.python) < naming.version_key(leaders[group].python):
            leaders[group] = row
    first = [row for row in rows if not row.settings.stage_pythons or leaders[compile_group(row)] is row]
    rest = [row for row in rows if row not in first]
    return first, rest


def release_rows(versions: Versions, row: MatrixRow) -> list[MatrixRow]:
    """Every matrix row that shares ``row``'s release: same component, world (CUDA major.minor, or CPU),
    Pythons and torch; in practice its rows of the other arch."""
    return [
        other
        for other in component_rows(versions, versions.component(row.component))
        if other.release_tag == row.release_tag
    ]


def release_title(versions: Versions, row: MatrixRow) -> str:
    segments = [segment for other in release_rows(versions, row) for segment in other.title_segments()]
    return naming.release_title(row.component, row.ref, segments)
