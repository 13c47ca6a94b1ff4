"""``auditwheel show`` and ``repair`` for our wheels, run as subprocesses.

``show`` is informational: its summary (the platform tag the wheel is
consistent with, the one its symbol versions allow) goes into the check
report, and a wheel auditwheel cannot classify is reported, not fatal.

``repair`` grafts nothing that the runtime already provides: torch, CUDA,
NCCL and NVSHMEM libraries are excluded (``DEFAULT_EXCLUDES``); with nothing
to graft no ELF patching is needed, so ``patcher="auto"`` falls back to
auditwheel's ``none`` patcher when ``patchelf`` is not installed.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ci.base.errors import CheckFailed
from ci.formats.archive import open_wheel
from ci.formats.record import check_record

DEFAULT_EXCLUDES: tuple[str, ...] = (
    "libtorch*.so*",
    "libc10*.so*",
    "libshm*.so*",
    "libcaffe2*.so*",
    "libcu*.so*",
    "libnv*.so*",
    "libnccl*.so*",
    "libnvshmem*.so*",
    "libcaffe2_nvrtc.so*",
    "libgomp*.so*",
)
"""Libraries that torch and the CUDA wheels bring at runtime; never vendored into our wheels."""

_CONSISTENT = re.compile(r'is consistent with the following platform tag:\s*"([^"]+)"')
_CONSTRAINED = re.compile(r'constrains the platform tag to\s*"([^"]+)"')
_WRITTEN = re.compile(r"Fixed-up wheel written to\s+(\S+\.whl)")


@dataclass(frozen=True)
class AuditResult:
    wheel: str
    classified: bool
    """False when auditwheel could not classify the wheel (reported, not fatal)."""
    consistent_tag: str | None
    """The platform tag auditwheel found the wheel consistent with."""
    best_tag: str | None
    """The tag its versioned symbols constrain it to (what a repair can reach)."""
    summary: str
    """auditwheel's text, whitespace-normalised to one paragraph."""


def auditwheel_command(auditwheel: Path | str | None = None) -> list[str]:
    """The auditwheel beside the running interpreter (its venv), else ``python -m auditwheel``."""
    if auditwheel is not None:
        return [str(auditwheel)]
    sibling = Path(sys.executable).parent / "auditwheel"
    if sibling.is_file():
        return [str(sibling)]
    return [sys.executable, "-m", "auditwheel"]


def audit_show(wheel: Path | str, *, auditwheel: Path | str | None = None) -> AuditResult:
    wheel = Path(wheel)
    try:
        proc = subprocess.run(
            [*auditwheel_command(auditwheel), "show", str(wheel)], capture_output=True, text=True, timeout=600
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return AuditResult(wheel.name, False, None, None, f"auditwheel could not run: {exc}")
    text = " ".join(proc.stdout.split())
    if proc.returncode != 0 or not text:
        errors = [ln for ln in proc.stderr.splitlines() if ln.strip() and not ln.startswith(("INFO:", "DEBUG:"))]
        reason = " ".join((errors[-1] if errors else f"exit status {proc.returncode}").split())
        return AuditResult(wheel.name, False, None, None, f"auditwheel could not classify the wheel: {reason}")
    consistent = _CONSISTENT.search(text)
    constrained = _CONSTRAINED.search(text)
    best = constrained.group(1) if constrained else (consistent.group(1) if consistent else None)
    return AuditResult(wheel.name, True, consistent.group(1) if consistent else None, best, text)


def audit_repair(
    wheel: Path | str,
    out_dir: Path | str,
    *,
    plat: str = "auto",
    excludes: Sequence[str] = DEFAULT_EXCLUDES,
    patcher: str = "auto",
    auditwheel: Path | str | None = None,
) -> Path:
    """Repair ``wheel`` to a manylinux tag into ``out_dir``; returns the repaired wheel's path."""
    wheel = Path(wheel)
    # auditwheel extracts with zipfile (a '../' name is re-rooted, a symlink becomes a file) and repacks
    # from RECORD: an unsafe archive would come out looking safe, and one without a valid RECORD ends in
    # auditwheel's traceback, so both are refused before, and the result checked after.
    with open_wheel(wheel) as archive:
        problems = check_record(archive)
    if problems:
        raise CheckFailed(f"{problems[0]} (refusing to repair it)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if patcher == "auto":
        patcher = "patchelf" if shutil.which("patchelf") else "none"
    with tempfile.TemporaryDirectory(prefix="auditwheel-", dir=out_dir) as tmp:
        cmd = [*auditwheel_command(auditwheel), "repair", "--plat", plat, "--patcher", patcher, "-w", tmp]
        for pattern in excludes:
            cmd += ["--exclude", pattern]
        try:
            proc = subprocess.run([*cmd, str(wheel)], capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.SubprocessError) as exc:
            raise CheckFailed(f"{wheel.name}: auditwheel repair could not run ({exc}); install auditwheel") from None
        produced = sorted(Path(tmp).glob("*.whl"))
        if proc.returncode != 0 or len(produced) != 1:
            raise CheckFailed(f"{wheel.name}: auditwheel repair to {plat} failed: {_reason(proc)}")
        with open_wheel(produced[0]) as archive:
            problems = check_record(archive)
        if problems:
            raise CheckFailed(f"{wheel.name}: auditwheel repair to {plat} wrote a wheel that fails its checks: "
                              f"{problems[0]}")
        target = out_dir / produced[0].name
        produced[0].replace(target)
    return target


def _reason(proc: subprocess.CompletedProcess) -> str:
    """auditwheel's own words: its last error line, else its last INFO line (where it explains a refusal)."""
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    errors = [ln for ln in lines if not ln.startswith(("INFO:", "DEBUG:"))]
    infos = [ln.split(":", 2)[-1] for ln in lines if ln.startswith("INFO:")]
    return " ".join((errors or infos or [f"exit status {proc.returncode}"])[-1].split())
