"""The build manifest attached to every release, one per arch.

A release holds the wheels of one (component, Python, torch) for every arch.
Each arch's build uploads its own ``wheelhouse-build-manifest-<arch>.json``
after its wheels, so two arch jobs never rewrite one shared file (the anchor's
single manifest was uploaded first and raced between arches). The manifest
says which exact wheel digests passed which checks under which build-input
fingerprint; the skip plan reads it instead of downloading wheels.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from ci.base import bounded_json
from ci.base.errors import WheelhouseError

SCHEMA = 1
KIND = "wheelhouse-build-manifest"
PREFIX = "wheelhouse-build-manifest-"


def asset_name(arch: str) -> str:
    return f"{PREFIX}{arch}.json"


def arch_of(asset: str) -> str | None:
    if asset.startswith(PREFIX) and asset.endswith(".json"):
        return asset[len(PREFIX) : -len(".json")]
    return None


@dataclass(frozen=True)
class WheelEntry:
    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    component: str
    release_tag: str
    arch: str
    pythons: tuple[str, ...]
    torch: str
    fingerprint: str
    build_config: dict
    wheels: tuple[WheelEntry, ...]
    checks_passed: bool
    source: dict
    restored: bool = False

    def to_json(self) -> str:
        return json.dumps(
            {
                "schema": SCHEMA,
                "kind": KIND,
                "component": self.component,
                "release_tag": self.release_tag,
                "arch": self.arch,
                "pythons": list(self.pythons),
                "torch": self.torch,
                "fingerprint": self.fingerprint,
                "build_config": self.build_config,
                "source": self.source,
                "checks_passed": self.checks_passed,
                "restored": self.restored,
                "wheels": [{"name": w.name, "sha256": w.sha256, "size": w.size} for w in self.wheels],
            },
            indent=2,
            sort_keys=True,
        ) + "\n"


def parse(data: bytes, *, where: str) -> Manifest:
    """Read a manifest; anything unexpected raises (callers treat that as "build")."""
    try:
        raw = bounded_json.loads(data)
    except ValueError as exc:
        raise WheelhouseError(f"{where}: manifest is not JSON ({exc})") from None
    if not isinstance(raw, dict) or raw.get("kind") != KIND:
        raise WheelhouseError(f"{where}: not a wheelhouse build manifest")
    if raw.get("schema") != SCHEMA:
        raise WheelhouseError(f"{where}: manifest schema {raw.get('schema')} is not {SCHEMA}; the row rebuilds")
    try:
        return Manifest(
            component=raw["component"],
            release_tag=raw["release_tag"],
            arch=raw["arch"],
            pythons=tuple(raw["pythons"]),
            torch=raw["torch"],
            fingerprint=raw["fingerprint"],
            build_config=raw["build_config"],
            wheels=tuple(WheelEntry(w["name"], w["sha256"], int(w["size"])) for w in raw["wheels"]),
            checks_passed=bool(raw["checks_passed"]),
            source=raw.get("source", {}),
            restored=bool(raw.get("restored", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise WheelhouseError(f"{where}: manifest lacks or mistypes {exc}") from None

