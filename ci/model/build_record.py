"""The build record: what a successful build leaves beside its wheels, ``dist/<world>/<release tag>-<arch>.build.json``.

It says which matrix row was built, from which sources (``source``, ``build_config`` and its
``fingerprint``), with which toolchain, how long each phase took, what the wheel checks found, what the
wheels' SBOMs were written from, which ninja steps the build time went to, and the digest of every wheel.
``ci/building/job.py`` writes it, ``ci/publish/release.py`` reads it back to publish exactly those wheels, and it
becomes the release's build manifest (:meth:`BuildRecord.to_manifest`).

Its own module, not part of ``ci/model/manifest.py``: the record is the build's output file (its name, format
and validation), the manifest is a release asset; the record feeds the manifest, not the other way round.
A record is validated once, when it is read, against ``schemas/build_record.schema.json``: every field is present
with its JSON type, so the code after :meth:`BuildRecord.from_json` uses fields and never meets a ``KeyError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ci.base import bounded_json, json_schema
from ci.base.errors import ConfigError
from ci.model.manifest import Manifest, WheelEntry
from ci.model.matrix import MatrixRow

SCHEMA = 2
ROW_IDENTITY = ("component", "ref", "python", "bundle_pythons", "arch", "cuda", "torch")
"""The matrix-entry fields that say which row a record is of: a release checks them against its own row."""

SCHEMA_FILE = Path(__file__).resolve().parent / "schemas" / "build_record.schema.json"


def file_name(row: MatrixRow) -> str:
    return f"{row.release_tag}-{row.arch}.build.json"


def path_for(row: MatrixRow, dist_root: Path) -> Path:
    """Where the build of ``row`` into ``dist_root`` leaves its record."""
    return dist_root / row.world / file_name(row)


@dataclass(frozen=True)
class BuildRecord:
    row: dict[str, Any]
    """The built row as its matrix entry (:meth:`MatrixRow.to_json`), kept whole."""
    fingerprint: str
    build_config: dict[str, Any]
    source: dict[str, Any]
    toolchain: dict[str, Any]
    compiler_cache: str | None
    compiler_cache_stats: dict[str, int] | None
    compiler_cache_misses: list[str] | None
    """The translation units the compiler cache could not serve (ci/formats/cache_log.py); None when not known."""
    durations: dict[str, float]
    """Seconds per phase: toolchain_s, source_s, build_s, checks_s and total_s."""
    checks: dict[str, Any]
    """The wheel checks' report; ``{"ran": false}`` for a build with the checks turned off."""
    wheels: tuple[WheelEntry, ...]
    sbom: dict[str, Any]
    ninja_steps: dict[str, Any]
    modules: dict[str, Any] | None = None
    """Per-module compile seconds of a build by shards (ci/model/jit_cache.py ``record_modules``), else None."""

    @property
    def checks_passed(self) -> bool:
        return self.checks.get("ok") is True

    @property
    def pythons(self) -> tuple[str, ...]:
        return tuple(self.row["bundle_pythons"]) or (self.row["python"],)

    def to_manifest(self) -> Manifest:
        return Manifest(
            component=self.row["component"],
            release_tag=self.row["release_tag"],
            arch=self.row["arch"],
            pythons=self.pythons,
            torch=self.row["torch"],
            fingerprint=self.fingerprint,
            build_config=self.build_config,
            wheels=self.wheels,
            checks_passed=self.checks_passed,
            source=self.source,
        )

    def to_json(self) -> str:
        optional = {"modules": self.modules} if self.modules is not None else {}
        return json.dumps(
            {
                **optional,
                "schema": SCHEMA,
                "row": self.row,
                "fingerprint": self.fingerprint,
                "build_config": self.build_config,
                "source": self.source,
                "toolchain": self.toolchain,
                "compiler_cache": self.compiler_cache,
                "compiler_cache_stats": self.compiler_cache_stats,
                "compiler_cache_misses": self.compiler_cache_misses,
                "durations": self.durations,
                "checks": self.checks,
                "wheels": [{"name": w.name, "sha256": w.sha256, "size": w.size} for w in self.wheels],
                "sbom": self.sbom,  # what each wheel's SBOM (ci/building/sbom.py) was written from
                "ninja_steps": self.ninja_steps,  # which objects the build time went to
            },
            indent=2,
            sort_keys=True,
        ) + "\n"

    def write(self, path: Path) -> None:
        """Write the record to ``path`` atomically: a crash never leaves half a record."""
        partial = path.with_name(path.name + ".partial")
        partial.write_text(self.to_json(), encoding="utf-8")
        partial.replace(path)

    @classmethod
    def read(cls, path: Path, *, fix: str = "rebuild the row") -> BuildRecord:
        """The record at ``path``, validated; any problem is one :class:`ConfigError` line ending in ``fix``."""
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not a readable build record ({exc}); {fix}") from None
        return cls.from_json(text, where=str(path), fix=fix)

    @classmethod
    def from_json(cls, text: str | bytes, *, where: str, fix: str = "rebuild the row") -> BuildRecord:
        try:
            raw = bounded_json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{where}: not a readable build record ({exc}); {fix}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: holds a JSON {type(raw).__name__}, not a build record; {fix}")
        problem = _problem(raw)
        if problem:
            raise ConfigError(f"{where}: {problem}; {fix}")
        return cls(
            row=raw["row"],
            fingerprint=raw["fingerprint"],
            build_config=raw["build_config"],
            source=raw["source"],
            toolchain=raw["toolchain"],
            compiler_cache=raw["compiler_cache"],
            compiler_cache_stats=raw["compiler_cache_stats"],
            compiler_cache_misses=raw["compiler_cache_misses"],
            durations=raw["durations"],
            checks=raw["checks"],
            wheels=tuple(WheelEntry(w["name"], w["sha256"], w["size"]) for w in raw["wheels"]),
            sbom=raw["sbom"],
            ninja_steps=raw["ninja_steps"],
            modules=raw.get("modules"),
        )


def _problem(raw: dict[str, Any]) -> str | None:
    """What is wrong with a parsed record, naming the JSON path of the bad value; None when it is a whole record of
    this schema (:data:`SCHEMA_FILE`). A record of another schema number is named so before its fields are read."""
    if "schema" in raw and isinstance(raw["schema"], int) and raw["schema"] != SCHEMA:
        return f"build record schema {raw['schema']!r}, but this checkout reads schema {SCHEMA}"
    problem = json_schema.problem(raw, SCHEMA_FILE)
    return f"build record {problem}" if problem else None
