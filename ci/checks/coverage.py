"""Python coverage: every CPython a wheel claims has a build of every extension module.

An extension module is a member named ``<stem>.cpython-<XY>[flags]-<platform>.so``
(or ``<stem>.abi3.so``, which serves every claimed CPython at or above the
wheel's lowest claimed ``cp3X`` tag). Its *stem* (``pkg/_C``) identifies the
module; for each CPython in the wheel's tags (``cp311.cp312`` claims 3.11 and
3.12) and each one required explicitly, every stem must have a build. The
reverse is checked too: a ``cpython-312`` module in a wheel whose tags claim
only 3.11 is flagged, as is a module built for a different machine than the
platform tag names. Plain ``x.so`` files (no SOABI) are not modules for this
check: they are libraries, or importable by any Python.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from ci.base.errors import ConfigError
from ci.formats.archive import WheelArchive, WheelName
from ci.model.naming import version_key

_SOABI_MODULE = re.compile(
    r"^(?P<stem>.+)\.cpython-(?P<major>\d)(?P<minor>\d+)(?P<flags>[a-z]*)-(?P<platform>[^./]+)\.so$"
)
_ABI3_MODULE = re.compile(r"^(?P<stem>.+)\.abi3\.so$")
_CP_TAG = re.compile(r"^cp(?P<major>\d)(?P<minor>\d+)$")
_PY_TAG = re.compile(r"^py(?P<major>\d)(?P<minor>\d*)$")
_PLATFORM_MACHINES = ("x86_64", "aarch64", "ppc64le", "s390x", "i686", "armv7l", "riscv64")


@dataclass(frozen=True)
class ExtensionModule:
    member: str
    stem: str
    python: str | None
    """``3.11``; None for an abi3 module."""
    platform: str | None
    """The SOABI platform part (``x86_64-linux-gnu``); None for abi3."""


@dataclass(frozen=True)
class CoverageResult:
    wheel: str
    claimed_pythons: tuple[str, ...]
    """CPythons the tags claim (``3.11``), sorted."""
    required_pythons: tuple[str, ...]
    modules: tuple[ExtensionModule, ...]
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def stems(self) -> tuple[str, ...]:
        return tuple(sorted({m.stem for m in self.modules}))


def parse_pythons(spec: str | Iterable[str] | None) -> tuple[str, ...]:
    """``"3.10,3.11"`` (or an iterable of ``3.X``/``cp3X``/``3X``) -> ``("3.10", "3.11")``."""
    if spec is None:
        return ()
    items = spec.replace(";", ",").replace(" ", ",").split(",") if isinstance(spec, str) else list(spec)
    result = set()
    for raw in items:
        token = str(raw).strip().lower().removeprefix("cp").removeprefix("py")
        if not token:
            continue
        if re.fullmatch(r"\d\.\d+", token):
            result.add(token)
        elif re.fullmatch(r"3\d+", token):
            result.add(f"{token[0]}.{token[1:]}")
        else:
            raise ConfigError(f"--pythons: {raw!r} is not a Python version; write e.g. 3.10,3.11")
    return tuple(sorted(result, key=version_key))


def claimed_pythons(name: WheelName) -> tuple[tuple[str, ...], bool]:
    """CPython versions named by ``cpXY`` interpreter tags, and whether any tag uses abi3."""
    versions = set()
    abi3 = False
    for tag in name.tags:
        match = _CP_TAG.match(tag.interpreter)
        if match:
            versions.add(f"{match['major']}.{match['minor']}")
        abi3 = abi3 or tag.abi == "abi3"
    return tuple(sorted(versions, key=version_key)), abi3


def tags_admit(name: WheelName, version: str) -> bool:
    """Whether pip on CPython ``version`` (``3.12``) would take the wheel by its tags alone.

    ``cp312`` names that Python; ``cp39-abi3`` serves 3.9 and later; ``py3`` serves every 3.x and
    ``py310`` 3.10 and later (pip's own order of compatible tags).
    """
    major, minor = (int(part) for part in version.split("."))
    for tag in name.tags:
        cp = _CP_TAG.match(tag.interpreter)
        if cp and int(cp["major"]) == major and (
            int(cp["minor"]) == minor or (tag.abi == "abi3" and int(cp["minor"]) <= minor)
        ):
            return True
        py = _PY_TAG.match(tag.interpreter)
        if py and int(py["major"]) == major and (not py["minor"] or int(py["minor"]) <= minor):
            return True
    return False


def requires_python_problems(label: str, requires_python: str | None, required: Iterable[str]) -> list[str]:
    """Each required Python that the wheel's Requires-Python excludes (pip would refuse it there)."""
    if not requires_python:
        return []
    try:
        specifier = SpecifierSet(requires_python)
    except InvalidSpecifier:
        return [f"{label}: METADATA Requires-Python {requires_python!r} is not a valid specifier; rebuild the wheel"]
    return [
        f"{label}: its Requires-Python {requires_python!r} excludes Python {version}, which this row builds for; "
        "fix python_versions in versions.yaml or the project's requires-python"
        for version in required
        if not specifier.contains(f"{version}.0", prereleases=True)
    ]


def extension_modules(members: Iterable[str]) -> tuple[ExtensionModule, ...]:
    found = []
    for name in members:
        if ".data/" in name and "/purelib/" not in name and "/platlib/" not in name:
            continue  # scripts, headers, data: not importable modules
        stem_name = name
        if ".data/" in name:  # name-1.0.data/platlib/pkg/_C...so -> pkg/_C...so
            stem_name = name.split("/", 2)[2] if name.count("/") >= 2 else name
        match = _SOABI_MODULE.match(stem_name)
        if match:
            found.append(ExtensionModule(name, match["stem"], f"{match['major']}.{match['minor']}", match["platform"]))
            continue
        match = _ABI3_MODULE.match(stem_name)
        if match:
            found.append(ExtensionModule(name, match["stem"], None, None))
    return tuple(found)


def _platform_machines(name: WheelName) -> set[str]:
    machines = set()
    for tag in name.tags:
        for machine in _PLATFORM_MACHINES:
            if tag.platform.endswith(machine):
                machines.add(machine)
    return machines


def check_coverage(archive: WheelArchive, pythons: str | Iterable[str] | None = None,
                   requires_python: str | None = None) -> CoverageResult:
    """Check an open wheel; ``pythons`` adds CPythons that must be covered (``"3.10,3.11"``), which its
    METADATA's ``requires_python`` must admit too."""
    name = archive.wheel_name
    label = name.filename
    claimed, abi3 = claimed_pythons(name)
    required = parse_pythons(pythons)
    modules = extension_modules(m.name for m in archive.members if not m.is_dir)
    problems: list[str] = []

    for version in required:
        if not tags_admit(name, version):
            tags = ".".join(sorted({t.interpreter for t in name.tags}))
            problems.append(f"{label}: tags ({tags}) do not claim Python {version}, which is required; build for it")
        elif version not in claimed:  # py3, or abi3: the wheel serves it without naming it
            claimed = tuple(sorted({*claimed, version}, key=version_key))
    problems.extend(requires_python_problems(label, requires_python, required))

    machines = _platform_machines(name)
    by_stem: dict[str, list[ExtensionModule]] = {}
    for module in modules:
        by_stem.setdefault(module.stem, []).append(module)
        if module.python is not None and module.python not in claimed:
            problems.append(
                f"{label}: {module.member} is built for Python {module.python} but the wheel tags claim "
                f"{', '.join(claimed) or 'no CPython'}; fix the tags or drop the module"
            )
        if module.platform and machines and not any(module.platform.startswith(m) for m in machines):
            problems.append(
                f"{label}: {module.member} is built for {module.platform} but the platform tag names "
                f"{', '.join(sorted(machines))}; build it for the tagged platform"
            )
    if modules and not claimed and not abi3:
        problems.append(f"{label}: has extension modules but its tags claim no CPython; tag it cpXY")

    lowest = min(claimed, key=version_key) if claimed else None
    for version in sorted(set(claimed) | set(required), key=version_key):
        for stem, builds in sorted(by_stem.items()):
            covered = any(b.python == version for b in builds) or any(
                b.python is None and lowest is not None and version_key(version) >= version_key(lowest)
                for b in builds
            )
            if covered:
                continue
            sample = next((b for b in builds if b.platform), None)
            platform = sample.platform if sample else "<platform>"
            expected = f"{stem}.cpython-{version.replace('.', '')}-{platform}.so"
            problems.append(f"{label}: module {stem} has no build for Python {version} (expected {expected})")

    return CoverageResult(
        wheel=label,
        claimed_pythons=claimed,
        required_pythons=required,
        modules=modules,
        problems=tuple(problems),
    )
