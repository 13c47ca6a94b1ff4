"""CUDA architecture lists: parsing and coverage on base architectures.

Accepted spellings, separated by ``;``, ``,`` or whitespace: dotted (``8.0``),
undotted (``80``, ``100``), ``sm_90a``/``compute_90``, each with an optional
``a`` (arch-specific) or ``f`` (family) suffix, and ``+PTX`` (any case) on any
entry. Coverage compares *base* architectures: an ``sm_90a`` cubin satisfies a
``9.0`` requirement, ``sm_100f`` satisfies ``10.0``. Unlike a silent filter, a
token that is not an architecture is a :class:`ConfigError`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from ci.errors import ConfigError

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
    """Required architectures with no found cubin of the same base architecture."""
    wanted = required.archs if isinstance(required, ArchList) else tuple(required)
    have = {a.base for a in found}
    return tuple(a for a in wanted if a.base not in have)


def format_archs(archs: Iterable[CudaArch]) -> str:
    return ", ".join(str(a) for a in sorted(set(archs))) or "none"
