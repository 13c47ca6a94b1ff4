"""flashinfer-jit-cache as the wheelhouse builds it: the shim over one provider wheel per arch target.

(ci/model/jit_cache.py packs this file as ``flashinfer_jit_cache/__init__.py``; it runs in the user's interpreter.)

flashinfer (0.6.13 and later) takes its ahead-of-time modules from ``flashinfer_jit_cache.get_jit_cache_dir()``.
The modules live in provider wheels (``flashinfer-jit-cache-sm90a``...), each the AOT inventory compiled for one
arch target and registered in the ``flashinfer.jit_cache.providers`` entry-point group, as upstream's provider
wheels are. ``get_jit_cache_dir()`` returns the directory of the installed provider that serves every GPU
flashinfer compiles for (FLASHINFER_CUDA_ARCH_LIST, else the visible devices, each named as flashinfer names it:
9.x is sm90a, 12.0 sm120f, other 12.x and 10 and later sm_XYa, earlier ones plain), the best first:

1. exact: the provider was built for that very target;
2. family: its target is a family target (sm120f) whose family holds the GPU (12.1);
3. baseline: its target is a plain one (sm80) of the GPU's major and a lower minor, which the GPU loads.

A provider of another version than this shim's is never taken. Without a provider for every GPU it returns a
directory of no module: flashinfer compiles what it needs (with its JIT off, it names the missing module). Which
device loads which target is ``_cuda_compat.json``, the wheelhouse's data of NVIDIA's compatibility rules.
"""

from __future__ import annotations

import importlib.metadata
import json
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

JIT_CACHE_PROVIDER_ENTRY_POINT_GROUP = "flashinfer.jit_cache.providers"
JIT_CACHE_PROVIDER_SCHEMA_VERSION = 1
_PACKAGE = Path(__file__).resolve().parent
jit_cache_dir = _PACKAGE / "jit_cache"
"""The directory of no module, for a machine no installed provider serves."""
EXACT, FAMILY, BASELINE = 0, 1, 2
_ARCH = re.compile(r"^(?:sm_?|compute_)?(?:(\d{1,2})\.(\d)|(\d{1,2})(\d))([af]?)$")

try:
    from ._build_meta import __git_version__, __version__
except ImportError:  # a checkout, not a wheel
    __version__ = "0.0.0+unknown"
    __git_version__ = "unknown"


@dataclass(frozen=True)
class JitCacheProvider:
    """One installed provider wheel, as its manifest describes it."""

    provider_id: str
    distribution: str
    version: str
    jit_cache_dir: Path
    cuda_architectures: frozenset[str]
    modules: frozenset[str]


def _parse(name: str) -> tuple[int, int, str]:
    """(major, minor, suffix) of ``sm90a``, ``sm_120f``, ``9.0a`` or ``86``."""
    match = _ARCH.match(name.strip().lower())
    if not match:
        raise ValueError(f"not a CUDA arch: {name!r}")
    major, minor = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    return int(major), int(minor), match.group(5)


def _name(major: int, minor: int, suffix: str) -> str:
    return f"sm{major}{minor}{suffix}"


def _provider(provider_id: str, manifest: Mapping[str, Any]) -> JitCacheProvider:
    if manifest.get("schema_version") != JIT_CACHE_PROVIDER_SCHEMA_VERSION:
        raise ValueError(f"manifest schema {manifest.get('schema_version')!r}")
    architectures = frozenset(_name(*_parse(str(arch))) for arch in manifest["cuda_architectures"])
    modules = frozenset(str(module) for module in manifest["modules"])
    if not architectures or not modules:
        raise ValueError("a provider without architectures or modules")
    return JitCacheProvider(provider_id, str(manifest["distribution"]), str(manifest["version"]),
                            Path(str(manifest["jit_cache_dir"])).resolve(), architectures, modules)


def get_jit_cache_providers() -> tuple[JitCacheProvider, ...]:
    """The providers installed (the entry points of their group), by provider id; an unreadable one is skipped."""
    found = []
    points: Any = importlib.metadata.entry_points()
    group = (points.select(group=JIT_CACHE_PROVIDER_ENTRY_POINT_GROUP) if hasattr(points, "select")
             else points.get(JIT_CACHE_PROVIDER_ENTRY_POINT_GROUP, ()))  # Python 3.9's mapping of groups
    for entry_point in group:
        try:
            found.append(_provider(entry_point.name, entry_point.load()()))
        except Exception as error:  # one broken provider must not take the others with it
            logger.warning("ignoring flashinfer jit-cache provider %s: %s", entry_point.name, error)
    return tuple(sorted(found, key=lambda provider: provider.provider_id))


def _normalized(major: int, minor: int) -> str:
    """A device's target as flashinfer's CompilationContext names it."""
    if major == 9:
        return _name(major, minor, "a")
    if major == 12:
        return _name(major, minor, "f" if minor == 0 else "a")
    return _name(major, minor, "a" if major >= 10 else "")


def target_architectures() -> frozenset[str]:
    """What flashinfer compiles for: FLASHINFER_CUDA_ARCH_LIST (``8.0 9.0a``), else every visible GPU."""
    listed = os.environ.get("FLASHINFER_CUDA_ARCH_LIST", "").split()
    if listed:
        targets = set()
        for token in listed:
            major, minor, suffix = _parse(token)
            targets.add(_name(major, minor, suffix) if suffix else _normalized(major, minor))
        return frozenset(targets)
    try:
        import torch

        return frozenset(_normalized(*torch.cuda.get_device_capability(device))
                         for device in range(torch.cuda.device_count()))
    except Exception:  # no torch, no driver: no GPU to serve
        return frozenset()


def _families() -> dict[str, tuple[str, ...]]:
    data = json.loads((_PACKAGE / "_cuda_compat.json").read_text(encoding="utf-8"))
    return {base: tuple(members) for base, members in data["families"].items()}


def _tier(provider: JitCacheProvider, target: str, families: Mapping[str, tuple[str, ...]]) -> int | None:
    """How well ``provider`` serves GPUs of ``target``: EXACT, FAMILY or BASELINE; None when they load none of it."""
    if target in provider.cuda_architectures:
        return EXACT
    major, minor, _ = _parse(target)
    device = f"{major}.{minor}"
    best = None
    for architecture in provider.cuda_architectures:
        p_major, p_minor, suffix = _parse(architecture)
        if suffix == "f" and device in families.get(f"{p_major}.{p_minor}", (f"{p_major}.{p_minor}",)):
            best = FAMILY
        elif not suffix and p_major == major and p_minor <= minor and best is None:
            best = BASELINE
    return best


def select_provider(targets: Iterable[str] | None = None,
                    providers: Iterable[JitCacheProvider] | None = None) -> JitCacheProvider | None:
    """The installed provider of this shim's version that serves every target best (see the module doc)."""
    wanted = frozenset(targets) if targets is not None else target_architectures()
    if not wanted:
        return None
    families = _families()
    ranked = []
    for provider in providers if providers is not None else get_jit_cache_providers():
        if provider.version != __version__:
            continue
        tiers = [_tier(provider, target, families) for target in sorted(wanted)]
        if all(tier is not None for tier in tiers):
            ranked.append((max(t for t in tiers if t is not None), provider.provider_id, provider))
    return min(ranked, key=lambda item: item[:2])[2] if ranked else None


def get_jit_cache_dir() -> str:
    """The directory flashinfer takes its ahead-of-time modules from: the selected provider's (module doc)."""
    provider = select_provider()
    return str(provider.jit_cache_dir if provider is not None else jit_cache_dir)


__all__ = [
    "JIT_CACHE_PROVIDER_ENTRY_POINT_GROUP",
    "JIT_CACHE_PROVIDER_SCHEMA_VERSION",
    "JitCacheProvider",
    "get_jit_cache_dir",
    "get_jit_cache_providers",
    "select_provider",
    "target_architectures",
]
