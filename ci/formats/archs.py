"""CUDA architecture lists: parsing, and which cubins satisfy which entry of a list.

Accepted spellings, separated by ``;``, ``,`` or whitespace: dotted (``8.0``),
undotted (``80``, ``100``), ``sm_90a``/``compute_90``, each with an optional
``a`` (arch-specific) or ``f`` (family) suffix, and ``+PTX`` (any case) on any
entry. Unlike a silent filter, a token that is not an architecture is a
:class:`ConfigError`.

Each entry of a list is an exact target (:func:`satisfies`): ``9.0`` wants a cubin
built for compute capability 9.0 (``sm_90``, or ``sm_90a``/``sm_90f``, which run
there too), ``9.0a`` wants ``sm_90a`` itself and ``12.0f`` wants ``sm_120f`` itself.
A device may still run other code (a family member's cubin, a lower minor's cubin,
PTX): :func:`fallback` names that path, so the arch gate can refuse a wheel whose
12.1 GPUs would load a 12.0f cubin (flashinfer-cubin 0.6.11 shipped no sm_120/121
kernels and gave wrong results through exactly that path). Which device runs which
target is NVIDIA's rule set, kept as data with its sources in ``cuda_compat.json``.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ci.base.errors import ConfigError

_TOKEN = re.compile(r"^(?:sm_|compute_)?(?:(?P<major>\d{1,2})\.(?P<minor>\d)|(?P<packed>\d{2,3}))(?P<suffix>[af]?)$")
_SPLIT = re.compile(r"[;,\s]+")


@dataclass(frozen=True, order=True)
class CudaArch:
    major: int
    minor: int
    suffix: str = ""
    """``""``, ``"a"`` (arch-specific) or ``"f"`` (family)."""

    @classmethod
    def from_sm(cls, number: int, suffix: str = "") -> CudaArch:
        """``90`` -> 9.0, ``100`` -> 10.0, ``121`` -> 12.1."""
        return cls(number // 10, number % 10, suffix)

    @property
    def base(self) -> CudaArch:
        return CudaArch(self.major, self.minor)

    @property
    def sm(self) -> str:
        return f"sm_{self.major}{self.minor}{self.suffix}"

    @property
    def compute(self) -> str:
        return f"compute_{self.major}{self.minor}{self.suffix}"

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}{self.suffix}"


@dataclass(frozen=True)
class ArchList:
    archs: tuple[CudaArch, ...]
    ptx: bool
    """Whether ``+PTX`` was asked for (on any entry)."""

    def __str__(self) -> str:
        return ";".join(str(a) for a in self.archs) + ("+PTX" if self.ptx else "")


def parse_arch(token: str) -> CudaArch:
    match = _TOKEN.match(token.strip().lower())
    if not match:
        raise ConfigError(f"CUDA arch list: {token!r} is not an architecture; write e.g. 8.0, 90, 9.0a or 12.0f")
    if match["packed"]:
        arch = CudaArch.from_sm(int(match["packed"]), match["suffix"])
    else:
        arch = CudaArch(int(match["major"]), int(match["minor"]), match["suffix"])
    return arch


def parse_arch_list(raw: str | Iterable[str]) -> ArchList:
    """Parse ``"8.0;9.0a 10.0 12.0f"``, ``"80,90"``, ``"9.0+PTX"`` (sorted, unique)."""
    parts = _SPLIT.split(raw) if isinstance(raw, str) else [str(p) for p in raw]
    archs = set()
    ptx = False
    for part in parts:
        token = part.strip()
        if not token:
            continue
        if token.lower().endswith("+ptx"):
            ptx = True
            token = token[:-4]
            if not token:
                continue
        archs.add(parse_arch(token))
    return ArchList(tuple(sorted(archs)), ptx)


def missing_archs(required: ArchList | Iterable[CudaArch], found: Iterable[CudaArch]) -> tuple[CudaArch, ...]:
    """Required architectures no found cubin satisfies as its exact target (:func:`satisfies`)."""
    wanted = required.archs if isinstance(required, ArchList) else tuple(required)
    have = tuple(found)
    return tuple(a for a in wanted if not any(satisfies(cubin, a) for cubin in have))


def satisfies(cubin: CudaArch, wanted: CudaArch) -> bool:
    """Whether a cubin of target ``cubin`` is the exact target a list entry ``wanted`` asks for.

    A plain entry (``9.0``) asks for code built for that compute capability: ``sm_90``, and ``sm_90a`` or
    ``sm_90f``, which run there as well. A suffixed entry asks for that very target: ``9.0a`` for ``sm_90a``
    (its arch-specific instructions), ``12.0f`` for ``sm_120f`` (one cubin for the whole family).
    """
    return cubin.base == wanted.base if not wanted.suffix else cubin == wanted


@dataclass(frozen=True)
class Compatibility:
    """NVIDIA's binary-compatibility rules (``cuda_compat.json``): the devices a cubin or a PTX of a target runs on."""

    capabilities: tuple[CudaArch, ...]
    families: dict[CudaArch, tuple[CudaArch, ...]]
    sources: tuple[str, ...]

    def cubin_runs_on(self, target: CudaArch) -> frozenset[CudaArch]:
        """Compute capabilities (base archs) that load a cubin of ``target``."""
        if target.suffix == "a":
            return frozenset({target.base})
        if target.suffix == "f":
            return frozenset(self.families.get(target.base, (target.base,)))
        same_major = {c for c in self.capabilities if c.major == target.major and c.minor >= target.minor}
        return frozenset(same_major | {target.base})

    def ptx_runs_on(self, target: CudaArch) -> frozenset[CudaArch]:
        """Compute capabilities that compile a PTX of ``target`` just in time."""
        if target.suffix:
            return self.cubin_runs_on(target)
        return frozenset({c for c in self.capabilities if c >= target.base} | {target.base})


COMPAT_FILE = Path(__file__).with_name("cuda_compat.json")


@functools.cache
def compatibility() -> Compatibility:
    data = json.loads(COMPAT_FILE.read_text(encoding="utf-8"))
    families = {parse_arch(base): tuple(parse_arch(m) for m in members) for base, members in data["families"].items()}
    return Compatibility(tuple(parse_arch(c) for c in data["compute_capabilities"]), families, tuple(data["sources"]))


def fallback(wanted: CudaArch, cubins: Iterable[CudaArch], ptx: Iterable[CudaArch] = ()) -> str | None:
    """How the devices of ``wanted`` would still get device code when no cubin is its exact target: the first
    cubin that runs there (a family member's, a lower minor's, another flavour of the same capability), else
    a PTX compiled just in time; None when nothing runs there."""
    rules = compatibility()
    device = wanted.base
    for cubin in sorted(cubins):
        if device in rules.cubin_runs_on(cubin):
            return _how(wanted, cubin)
    for code in sorted(ptx):
        if device in rules.ptx_runs_on(code):
            return f"the PTX {code.compute}, compiled just in time on {device} devices"
    return None


def _how(wanted: CudaArch, cubin: CudaArch) -> str:
    device = wanted.base
    if cubin.base != device:
        rule = "family" if cubin.suffix == "f" else "minor-version"
        return f"{cubin.sm}, which {device} devices load by {rule} compatibility"
    if wanted.suffix == "f":
        members = ", ".join(str(m) for m in sorted(compatibility().cubin_runs_on(wanted)))
        return f"{cubin.sm}, which is not the family target {wanted.sm} (one cubin for {members})"
    return f"{cubin.sm}, which lacks the arch-specific instructions of {wanted.sm}"


def stray_archs(required: ArchList, cubins: Iterable[CudaArch],
                accepted: Iterable[CudaArch] = ()) -> tuple[CudaArch, ...]:
    """Cubins built for a compute capability no entry of ``required`` names (nvcc's default arch of a device
    link, a setup.py's own -gencode), but the exact targets in ``accepted``: those a component's own build
    adds on purpose (versions.yaml's ``extra_cubins``)."""
    asked = {a.base for a in required.archs}
    allowed = set(accepted)
    return tuple(sorted({c for c in cubins if c.base not in asked and c not in allowed}))


def format_archs(archs: Iterable[CudaArch]) -> str:
    return ", ".join(str(a) for a in sorted(set(archs))) or "none"
