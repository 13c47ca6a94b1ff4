"""One flashinfer-jit-cache provider wheel: the AOT modules of one arch target.

(ci/model/jit_cache.py packs this file as ``flashinfer_jit_cache/providers/<tag>/__init__.py``; it runs in the user's
interpreter.) The ``flashinfer.jit_cache.providers`` entry point of the wheel names :func:`get_provider`, which
answers with the provider's manifest (upstream's schema: provider id, distribution, version, CUDA architectures,
modules) and where its modules are; the flashinfer-jit-cache shim chooses among the installed providers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parent

try:
    from ._build_meta import __git_version__, __version__
except ImportError:  # a checkout, not a wheel
    __version__ = "0.0.0+unknown"
    __git_version__ = "unknown"


def get_provider() -> dict[str, Any]:
    """This provider's manifest, with ``jit_cache_dir``: the directory of its ``<module>/<module>.so`` files."""
    manifest = json.loads((_PACKAGE / "manifest.json").read_text(encoding="utf-8"))
    manifest["jit_cache_dir"] = str(_PACKAGE / "jit_cache")
    return manifest


__all__ = ["get_provider"]
