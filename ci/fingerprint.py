"""The build-input fingerprint of a row: what, if changed, changes the wheel.

It covers the row's wheel-relevant settings, the resolved source revision
(a moving branch such as apex ``master`` changes it when upstream moves), the
builder script with every ``lib/*.sh`` it sources (transitively), cuDNN
provisioning when required, the declared patches, and the nvcc arch filter
when enabled. Runner labels, ``max_jobs`` and timeouts are deliberately left
out: they change how long a build takes, not what it produces (the anchor
rebuilt everything when they changed).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

from ci.matrix import MatrixRow
from ci.versions import REPO_ROOT

FINGERPRINT_SCHEMA = 1
# `source "$HERE/lib/env.sh"`, `. "${SCRIPT_DIR}/../lib/arch.sh"`, `source lib/x.sh`
# Python helpers a script runs: `"$LIB/bundle_pythons.py"`, `lib/bundle_pythons.py`
_LIB_PY = re.compile(r"(?:\$\{?\w+\}?/|lib/)(?P<name>[\w.-]+\.py)\b")
_SOURCE_LINE = re.compile(r"""^\s*(?:source|\.)\s+["']?(?:\$\{?\w+\}?/)?(?P<path>[\w./-]+\.sh)["']?\s*(?:#.*)?$""")


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def sourced_closure(script: Path) -> list[Path]:
    """``script`` and every shell file it sources, transitively (paths relative to the sourcing file)."""
    seen: list[Path] = []
    pending = [script.resolve()]
    while pending:
        current = pending.pop()
        if current in seen or not current.is_file():
            continue
        seen.append(current)
        text = current.read_text(encoding="utf-8")
        for match in _LIB_PY.finditer(text):
            helper = (current.parent / match["name"]) if current.parent.name == "lib" else current.parent / "lib" / match["name"]
            if helper.is_file() and helper.resolve() not in seen:
                seen.append(helper.resolve())
        for line in text.splitlines():
            match = _SOURCE_LINE.match(line)
            if match:
                # `source "$LIB/env.sh"`: the variable is not evaluated, so look
                # beside the sourcing file, then in the lib/ folder next to it.
                candidates = [current.parent / match["path"], current.parent / "lib" / match["path"]]
                pending.append(next((c for c in candidates if c.is_file()), candidates[0]).resolve())
    return seen


def build_inputs(row: MatrixRow, repo_root: Path = REPO_ROOT) -> list[dict]:
    files = sourced_closure(repo_root / "build_scripts" / f"{row.settings.builder}.sh")
    if row.settings.requires_cudnn:
        files += sourced_closure(repo_root / "build_scripts" / "provision" / "install_cudnn.sh")
    files += [repo_root / patch for patch in row.settings.patches]
    if row.settings.arch_filter:
        files.append(repo_root / "build_scripts" / "nvcc-arch-filter")
    unique = sorted({f.resolve() for f in files if f.is_file()})
    return [{"path": str(f.relative_to(repo_root.resolve())), "sha256": _sha256(f)} for f in unique]


def build_config(row: MatrixRow, source_revision: str | None, repo_root: Path = REPO_ROOT) -> dict:
    """The canonical record that the fingerprint hashes (also stored in the manifest)."""
    s = row.settings
    return {
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
        "builder": s.builder,
        "torch_cuda_arch_list": s.torch_cuda_arch_list,
        "arch_filter": s.arch_filter,
        "requires_cudnn": s.requires_cudnn,
        "extra_env": dict(s.extra_env),
        "wheel_packages": sorted(s.wheel_packages),
        "repair": s.repair,
        "build_inputs": build_inputs(row, repo_root),
    }


def fingerprint(config: dict) -> str:
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode()).hexdigest()
