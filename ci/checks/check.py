"""Run every wheel check and report: what is wrong, where, and which exact bytes passed.

:func:`check_wheels` reads the target torch's exports (if any) once for all
wheels, then reads each wheel once for its digest, validates the archive, checks
METADATA against the filename and Python coverage, and reads each ELF member in
place once for its machine, its libstdc++, its torch ABI (compared as it is read)
and its CUDA architectures: nothing is extracted, so a check writes nothing to
disk but what cuobjdump needs. ``auditwheel show`` runs only when asked (it is
slow on big wheels).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from ci.base.digest import sha256_file
from ci.base.errors import CheckFailed
from ci.checks.abi import (
    AbiResult,
    ElfNeeds,
    TorchExports,
    elf_needs,
    evaluate_abi,
    resolve_torch_target,
    scan_torch_exports,
    static_libstdcxx_problem,
)
from ci.checks.audit import AuditResult, audit_show
from ci.checks.contents import content_problems
from ci.checks.coverage import CoverageResult, check_coverage, parse_pythons
from ci.checks.cuda_libs import LibrarySet, SkewResult, check_skew, pinned_by_torch, toolkit_libraries
from ci.checks.paths import FIXED_BUILD_ROOT, check_build_paths
from ci.formats.archive import open_wheel
from ci.formats.archs import ArchList, CudaArch, format_archs, parse_arch, parse_arch_list
from ci.formats.elf import EM_AARCH64, EM_CUDA, EM_X86_64, ElfFile, is_elf
from ci.formats.fatbin import ArchScan, HeaderBudget, MemberArchs, arch_problems, find_cuobjdump, scan_elf
from ci.formats.metadata import read_metadata, requires_python_of
from ci.formats.record import check_record

REPORT_VERSION = 2
"""2: ``missing`` names the first few missing torch symbols of an ELF, ``missing_count`` counts them all."""


@dataclass(frozen=True)
class WheelReport:
    path: Path
    sha256: str | None
    size: int | None
    problems: tuple[str, ...]
    coverage: CoverageResult | None = None
    abi: AbiResult | None = None
    archs: ArchScan | None = None
    audit: AuditResult | None = None
    cuda_libraries: SkewResult | None = None
    allowed_build_paths: tuple[str, ...] = ()
    """Build paths a shared object names where an import reads them, allowed by versions.yaml (with the reason)."""
    allowed_extra_cubins: tuple[str, ...] = ()
    """Cubins beyond the arch list that the component's own build adds, allowed by versions.yaml (with the reason)."""

    @property
    def filename(self) -> str:
        return self.path.name

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass(frozen=True)
class CheckReport:
    wheels: tuple[WheelReport, ...]
    torch_target: str | None = None
    torch_version: str | None = None
    required_archs: str | None = None
    pythons: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return all(w.ok for w in self.wheels)

    @property
    def problems(self) -> tuple[str, ...]:
        return tuple(p for w in self.wheels for p in w.problems)

    @property
    def digests(self) -> dict[str, str | None]:
        """Wheel filename -> sha256 of the exact bytes checked."""
        return {w.filename: w.sha256 for w in self.wheels}

    def render_text(self) -> str:
        lines: list[str] = []
        for w in self.wheels:
            lines.append(f"{'PASS' if w.ok else 'FAIL'} {w.filename} (sha256 {w.sha256 or 'unreadable'})")
            if w.coverage is not None:
                pys = ", ".join(w.coverage.claimed_pythons) or "none"
                mods = ", ".join(w.coverage.stems) or "none"
                lines.append(f"  pythons: {pys}; extension modules: {mods}")
            if w.abi is not None:
                needed = sum(e.needed for e in w.abi.elves)
                lines.append(
                    f"  torch ABI vs {w.abi.target}: {needed} torch symbol reference(s), "
                    f"{sum(e.missing_count for e in w.abi.elves)} missing"
                )
            if w.archs is not None:
                ptx = format_archs(w.archs.ptx_archs)
                lines.append(f"  CUDA cubins: {format_archs(w.archs.cubin_archs)}; PTX: {ptx}")
            if w.cuda_libraries is not None:
                lines.append(f"  CUDA libraries: {w.cuda_libraries.describe()}")
            if w.audit is not None:
                tag = w.audit.best_tag or "unclassified"
                lines.append(f"  auditwheel: {tag}" + ("" if w.audit.classified else f" ({w.audit.summary})"))
            lines += [f"  build path allowed: {allowed}" for allowed in w.allowed_build_paths]
            lines += [f"  extra cubins allowed: {allowed}" for allowed in w.allowed_extra_cubins]
            for problem in w.problems:
                lines.append(f"  - {problem}")
        failed = sum(1 for w in self.wheels if not w.ok)
        lines.append(f"{len(self.wheels)} wheel(s) checked, {failed} failed.")
        return "\n".join(_printable(line) for line in lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "version": REPORT_VERSION,
            "ok": self.ok,
            "torch_target": self.torch_target,
            "torch_version": self.torch_version,
            "required_archs": self.required_archs,
            "pythons": list(self.pythons),
            "wheels": [_wheel_dict(w) for w in self.wheels],
        }

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)


def _printable(line: str) -> str:
    """A terminal shows the text, not escape sequences hidden in a file or member name (``\\x1b[2J``)."""
    return "".join(c if c.isprintable() else ascii(c)[1:-1] for c in line)


def _wheel_dict(w: WheelReport) -> dict[str, Any]:
    data: dict[str, Any] = {
        "filename": w.filename,
        "sha256": w.sha256,
        "size": w.size,
        "ok": w.ok,
        "problems": list(w.problems),
    }
    if w.allowed_build_paths:
        data["allowed_build_paths"] = list(w.allowed_build_paths)
    if w.allowed_extra_cubins:
        data["allowed_extra_cubins"] = list(w.allowed_extra_cubins)
    if w.coverage is not None:
        data["pythons"] = list(w.coverage.claimed_pythons)
        data["modules"] = [{"member": m.member, "stem": m.stem, "python": m.python} for m in w.coverage.modules]
    if w.abi is not None:
        data["torch_abi"] = {
            "target": w.abi.target,
            "torch_version": w.abi.torch_version,
            "torch_cxx11_abi": w.abi.torch_cxx11_abi,
            "elves": [
                {
                    "member": e.member,
                    "torch_symbols_needed": e.needed,
                    "uses_cxx11_abi": e.uses_cxx11_abi,
                    "missing": [{"mangled": m.mangled, "demangled": m.demangled} for m in e.missing],
                    "missing_count": e.missing_count,
                }
                for e in w.abi.elves
            ],
        }
    if w.archs is not None:
        data["cuda"] = {
            "cubins": [str(a) for a in w.archs.cubin_archs],
            "ptx": [str(a) for a in w.archs.ptx_archs],
            "members": [
                {
                    "member": m.member,
                    "cubins": [str(a) for a in m.cubins],
                    "ptx": [str(a) for a in m.ptx],
                    "method": m.method,
                }
                for m in w.archs.members
            ],
        }
    if w.cuda_libraries is not None:
        data["cuda_libraries"] = {"against": w.cuda_libraries.against, "checked": w.cuda_libraries.checked,
                                  "note": w.cuda_libraries.note}
    if w.audit is not None:
        data["auditwheel"] = {
            "classified": w.audit.classified,
            "consistent_tag": w.audit.consistent_tag,
            "best_tag": w.audit.best_tag,
            "summary": w.audit.summary,
        }
    return data


@dataclass(frozen=True)
class _CudaWorld:
    """The CUDA libraries a wheel is compared with: the ones the target torch pins, and where a missing symbol
    may be found instead (the toolkit the build used)."""

    pinned: LibrarySet
    candidates: tuple[LibrarySet, ...] = ()


def _inspect(path: Path, pythons: tuple[str, ...], exports: TorchExports | None, cuobjdump: Path | None,  # noqa: C901 - the one place every check is called from, in report order
             required: ArchList | None, audit: bool, build_paths: tuple[str, ...] = (),
             build_path_exceptions: Mapping[str, str] | None = None, cuda_world: _CudaWorld | None = None,
             extra_cubins: Mapping[CudaArch, str] | None = None) -> WheelReport:
    if not path.is_file():
        return WheelReport(path, None, None, (f"{path.name}: no such file ({path}); check the path",))
    sha256, size = sha256_file(path), path.stat().st_size
    problems: list[str] = []
    coverage = abi = archs = audit_result = skew = None
    allowed: list[str] = []
    extras_found: list[str] = []
    try:
        with open_wheel(path) as archive:
            requires_python = None
            try:
                requires_python = requires_python_of(read_metadata(archive))
            except CheckFailed as exc:
                problems.append(str(exc))
            coverage = check_coverage(archive, pythons, requires_python)
            problems.extend(coverage.problems)
            problems.extend(check_record(archive))
            machine = _platform_machine(archive.wheel_name.tags)
            needs: list[ElfNeeds] = []
            device: list[MemberArchs] = []
            budget = HeaderBudget()
            for member, stream in archive.shared_objects():
                try:
                    if not is_elf(stream):
                        problems.append(f"{path.name}: member {member.name!r} is named like a shared object but is "
                                        "not an ELF file (Python cannot import it); rebuild the wheel")
                        continue
                    elf = ElfFile(stream, member.name)  # refuses 32-bit and big-endian files itself
                    problem = _machine_problem(member.name, elf.machine, machine)
                    if problem:
                        problems.append(f"{path.name}: {problem}")
                        continue
                    if elf.machine != EM_CUDA:
                        found = elf_needs(member.name, elf, exports)
                        problem = static_libstdcxx_problem(found)
                        if problem:
                            problems.append(f"{path.name}: {problem}")
                        needs.append(found)
                        for finding in check_build_paths(member.name, elf, build_paths, build_path_exceptions or {}):
                            if finding.exception is None:
                                problems.append(finding.problem(path.name))
                            else:
                                allowed.append(finding.describe())
                    scanned = scan_elf(member.name, elf, cuobjdump, budget)
                    if scanned is not None:
                        device.append(scanned)
                except CheckFailed as exc:
                    problems.append(f"{path.name}: {exc}")
            archs = ArchScan(path.name, tuple(device))
            problems.extend(content_problems(archive, device))
            if required is not None:
                extra = extra_cubins or {}
                problems.extend(arch_problems(archs, required, extra))
                built = set(archs.cubin_archs)
                extras_found = [f"{arch.sm}: {reason}" for arch, reason in sorted(extra.items()) if arch in built]
            if exports is not None:
                cuda = bool(device) or any(n.links_cuda for n in needs)
                abi = evaluate_abi(path.name, needs, exports, cuda_wheel=cuda)
                problems.extend(abi.problems)
            if cuda_world is not None:
                skew = check_skew(path.name, needs, cuda_world.pinned, candidates=cuda_world.candidates,
                                  carried={PurePosixPath(name).name for name in archive.names()})
                problems.extend(skew.problems)
        audit_result = audit_show(path) if audit else None
    except CheckFailed as exc:
        problems.append(str(exc))
    return WheelReport(path, sha256, size, tuple(problems), coverage, abi, archs, audit_result, skew, tuple(allowed),
                       tuple(extras_found))


_MACHINES = {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}


def _platform_machine(tags) -> int | None:
    """The ELF machine every platform tag of the wheel names (``manylinux_2_28_x86_64`` -> x86-64), if one."""
    arches = {arch for tag in tags for arch in _MACHINES if tag.platform.endswith("_" + arch)}
    return _MACHINES[arches.pop()] if len(arches) == 1 else None


def _machine_problem(member: str, found: int, machine: int | None) -> str | None:
    """Why a shared object or cubin member cannot be loaded on the wheel's platform, or None."""
    if machine is not None and found not in (machine, EM_CUDA):
        wanted = next(name for name, number in _MACHINES.items() if number == machine)
        return f"member {member!r} is an ELF for machine {found}, not for the wheel's platform ({wanted}); rebuild the wheel"
    return None


def check_wheels(
    paths: Iterable[Path | str],
    *,
    torch_target: Path | str | None = None,
    require_archs: str | ArchList | None = None,
    pythons: str | Iterable[str] | None = None,
    audit: bool = False,
    cuda_home: Path | str | None = None,
    use_cuobjdump: bool = True,
    build_paths: Iterable[str] = (FIXED_BUILD_ROOT,),
    build_path_exceptions: Mapping[str, str] | None = None,
    extra_cubins: Mapping[str, str] | None = None,
    cuda_libraries: LibrarySet | None = None,
    library_candidates: Iterable[LibrarySet] | None = None,
) -> CheckReport:
    """Check wheels; never raises for a defective wheel (it is in the report), only for bad arguments.

    ``torch_target``: a Python interpreter, site-packages, torch dir or torch wheel (see ci.checks.abi).
    ``require_archs``: ``"8.0;9.0a;10.0"``-style list; ``extra_cubins``: the cubins beyond it that the build adds on
    purpose (an arch such as ``10.3a`` -> the reason), which the arch gate accepts; ``pythons``: ``"3.10,3.11"``.
    ``build_paths``: the build's directories, which a shared object must not name for run time (besides any
    site-packages in its rpath; ci/checks/paths.py), unless ``build_path_exceptions`` allows the member.
    ``cuda_libraries``: the CUDA libraries the wheels' versioned symbols must be defined by (ci/checks/cuda_libs.py);
    by default those the torch target pins, when there is one; ``library_candidates``: where a symbol they lack
    may be found, to name in the message (by default the CUDA toolkit of ``cuda_home`` or of the builds).
    """
    wheel_paths = [Path(p) for p in paths]
    required = parse_arch_list(require_archs) if isinstance(require_archs, str) else require_archs
    extra = {parse_arch(arch): reason for arch, reason in (extra_cubins or {}).items()}
    wanted_pythons = parse_pythons(pythons)
    target = resolve_torch_target(torch_target) if torch_target is not None else None
    cuobjdump = find_cuobjdump(cuda_home) if use_cuobjdump else None
    exports = scan_torch_exports(target) if target is not None else None
    searched = tuple(str(p) for p in build_paths)
    pinned = cuda_libraries or (pinned_by_torch(target) if target is not None else None)
    world = None
    if pinned is not None:
        candidates = library_candidates if library_candidates is not None else [toolkit_libraries(_toolkit(cuda_home))]
        world = _CudaWorld(pinned, tuple(candidates))
    reports = [_inspect(p, wanted_pythons, exports, cuobjdump, required, audit, searched, build_path_exceptions, world,
                        extra) for p in wheel_paths]
    return CheckReport(
        wheels=tuple(reports),
        torch_target=target.description if target else None,
        torch_version=target.version if target else None,
        required_archs=str(required) if required else None,
        pythons=wanted_pythons,
    )


def _toolkit(cuda_home: Path | str | None) -> Path | None:
    """The CUDA toolkit a missing symbol may be found in: ``cuda_home``, else the one builds use (ci/building/toolchain.py)."""
    if cuda_home is not None:
        return Path(cuda_home)
    from ci.checks.toolkit import cuda_home as home_of
    from ci.checks.toolkit import find_nvcc

    nvcc = find_nvcc()
    return home_of(nvcc) if nvcc is not None else None


__all__ = ["REPORT_VERSION", "CheckReport", "WheelReport", "check_wheels"]
