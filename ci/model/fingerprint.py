"""The build-input fingerprint of a row: what, if changed, changes the wheel.

It covers the row's wheel-relevant settings, the resolved source revision
(a moving branch such as apex ``master`` changes it when upstream moves), the
builder script, every file of ``build_scripts/lib/`` and
``build_scripts/provision/`` and the nvcc arch filter, and the declared
patches. The helpers are hashed whole rather than followed through the
builder's ``source`` lines: a resolver that misreads one line (``source
"$LIB/flashinfer.sh"`` from ``flashinfer.sh`` once resolved to the builder
itself) would keep serving an old wheel, while hashing a helper a builder does
not use only costs a rebuild (fail closed).

Which settings are wheel-relevant is declared once, by ``x-build-input`` in
versions.schema.json: the ``true`` ones form the config's settings block. Runner
labels, ``max_jobs`` and timeouts are ``false``: they change how long a build
takes, not what it produces (the anchor rebuilt everything when they changed).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ci.base.digest import sha256_file
from ci.model.matrix import MatrixRow
from ci.model.versions import BUILD_INPUT_SETTINGS, REPO_ROOT, SETTING_DEFAULTS, Versions

FINGERPRINT_SCHEMA = 2
SHARED_INPUTS = ("build_scripts/lib", "build_scripts/provision", "build_scripts/nvcc-arch-filter")
"""Paths under the repository whose every file is an input of every row."""


def shared_inputs(repo_root: Path = REPO_ROOT) -> list[Path]:
    """Every file of :data:`SHARED_INPUTS` (bytecode caches aside)."""
    files: list[Path] = []
    for rel in SHARED_INPUTS:
        path = repo_root / rel
        candidates = [path] if path.is_file() else sorted(path.rglob("*"))
        files += [f for f in candidates if f.is_file() and "__pycache__" not in f.parts]
    return files


FILE_SETTINGS = frozenset({"patches"})
"""Build-input settings that name repository files: :func:`build_inputs` hashes each file's path and bytes, which
is all the list says, so the settings block leaves them out."""
UNORDERED_SETTINGS = frozenset({"wheel_packages", "rehost"})
LEFT_OUT_AT_DEFAULT = frozenset({"rehost"})
"""Build inputs added after releases were published: at their default, which is what every build before them did,
they stay out of the settings block, so the fingerprints those releases recorded still hold."""
"""List settings whose order means nothing (which distributions a build keeps): hashed sorted."""


def _canonical(name: str, value: Any) -> Any:
    """A setting's value as the settings block holds it (JSON: lists, and mappings as dicts)."""
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, tuple):
        return sorted(value) if name in UNORDERED_SETTINGS else list(value)
    return value


def settings_block(row: MatrixRow) -> dict[str, Any]:
    """The row's build-input settings (:data:`ci.model.versions.BUILD_INPUT_SETTINGS`) but those hashed as files."""
    return {name: _canonical(name, getattr(row.settings, name)) for name in BUILD_INPUT_SETTINGS
            if name not in FILE_SETTINGS
            and not (name in LEFT_OUT_AT_DEFAULT and getattr(row.settings, name) == SETTING_DEFAULTS[name])}


def build_inputs(row: MatrixRow, repo_root: Path = REPO_ROOT) -> list[dict]:
    files = [repo_root / "build_scripts" / f"{row.settings.builder}.sh", *shared_inputs(repo_root)]
    files += [repo_root / patch for patch in row.settings.patches]
    unique = sorted({f.resolve() for f in files if f.is_file()})
    return [{"path": str(f.relative_to(repo_root.resolve())), "sha256": sha256_file(f)} for f in unique]


def build_config(row: MatrixRow, source_revision: str | None, repo_root: Path = REPO_ROOT, *,
                 submodules: tuple[str, ...] | None = None) -> dict:
    """The canonical record that the fingerprint hashes (also stored in the manifest).

    ``submodules``: the only submodules checked out, when the component names them (another
    selection is other sources at the same revision).
    """
    config: dict[str, Any] = {
        "schema": FINGERPRINT_SCHEMA,
        "component": row.component,
        "ref": row.ref,
        "source_revision": source_revision,
        "arch": row.arch,
        "cuda": row.cuda,
        "python": row.python,
        "pythons": list(row.pythons),
        "torch": row.torch,
        "torch_vision": row.torch_vision,
        "torch_audio": row.torch_audio,
        "cxx11_abi": row.cxx11_abi,
        **settings_block(row),
        "build_inputs": build_inputs(row, repo_root),
    }
    if submodules is not None:
        config["source_submodules"] = list(submodules)
    return config


def declared_config(versions: Versions, row: MatrixRow, source_revision: str | None) -> dict:
    """:func:`build_config` with the submodule selection the component declares: what a build of that
    revision records, for plans that fetch nothing."""
    selection = versions.component(row.component).source.selected_submodules
    return build_config(row, source_revision, submodules=selection)


def fingerprint(config: dict) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
