"""What a complete wheel of a package holds, where its own files cannot show it.

Most wheels are complete by construction: their extension modules are checked
for Python coverage, torch ABI and CUDA archs. A few carry their kernels as data,
and a build that quietly lost them still makes a valid wheel that fails only
when a model first runs:

``flashinfer-python``
    compiles its kernels at run time from the headers it carries (its own, and
    those of the CUTLASS, CCCL and spdlog submodules); upstream's build backend
    copies a missing submodule as nothing.
``flashinfer-cubin``
    NVIDIA's prebuilt kernels. Each kernel directory holds a ``checksums.txt``
    manifest (``<sha256> <file>`` per line); every ``.cubin`` and header it lists
    must be in the wheel with that digest. Upstream's build downloads only
    those: the ``.so`` entries of the CuTe-DSL manifests are loaded at run
    time, and its own wheels do not carry them.
``flashinfer-jit-cache-<provider>``
    flashinfer's ahead-of-time compile of its kernels for one arch target, one
    shared object per module
    (``flashinfer_jit_cache/providers/<provider>/jit_cache/<module>/<module>.so``);
    which modules exist is decided by flashinfer's ``aot.py`` for the target. A
    provider built here (ci/model/jit_cache.py) names them in its dist-info
    (``wheelhouse-jit-cache.json``: the list ``gen_all_modules`` gave at build
    time, and the archs each module's ninja file compiled for): each must be in
    the wheel, with a cubin for each of its archs (the fatbin scan of the wheel
    checks), and no other module may be; its ``manifest.json`` (what the shim
    reads) must name the same modules, and its entry point must be registered.
``flashinfer-jit-cache``
    built here, the shim over the providers: its selection code, the
    compatibility data it reads, and no module. Upstream's own monolithic wheel
    names no module list, so a rehosted one is asked for at least one module.

:func:`content_problems` returns one line per problem, naming the member.
"""

from __future__ import annotations

import hashlib
import posixpath
from collections.abc import Callable, Sequence

from ci.base import bounded_json
from ci.formats.archive import WheelArchive
from ci.formats.fatbin import MemberArchs

FLASHINFER_HEADERS = (
    "flashinfer/data/include/flashinfer/attention/decode.cuh",
    "flashinfer/data/csrc/single_decode.cu",
    "flashinfer/data/cutlass/include/cutlass/cutlass.h",
    "flashinfer/data/cutlass/tools/util/include/cutlass/util/device_memory.h",
    "flashinfer/data/spdlog/include/spdlog/spdlog.h",
    "flashinfer/data/cccl/cub/cub/cub.cuh",
    "flashinfer/data/cccl/libcudacxx/include/cuda/std/version",
    "flashinfer/data/cccl/thrust/thrust/version.h",
)
CUBIN_ROOT = "flashinfer_cubin/cubins/"
JIT_CACHE_ROOT = "flashinfer_jit_cache/jit_cache/"
# Listed in a manifest but loaded at run time, not shipped (see the module docstring).
_LOADED_AT_RUN_TIME = (".so",)


def _flashinfer_python(archive: WheelArchive) -> list[str]:
    names = set(archive.names())
    return [
        f"{archive.path.name}: lacks {header}, which its JIT compiles kernels with; build from sources with "
        "every header submodule checked out (cutlass, cccl, spdlog)"
        for header in FLASHINFER_HEADERS
        if header not in names
    ]


def _manifest_entries(archive: WheelArchive, manifest: str) -> list[tuple[str, str]]:
    """``(sha256, member)`` for each line of a ``checksums.txt``; members are relative to its directory."""
    base = posixpath.dirname(manifest)
    entries = []
    for line in archive.read_small(manifest).decode("utf-8", "replace").splitlines():
        parts = line.split()
        if len(parts) == 2:
            entries.append((parts[0].lower(), posixpath.join(base, parts[1])))
    return entries


def _sha256(archive: WheelArchive, name: str) -> str:
    digest = hashlib.sha256()
    for block in archive.iter_chunks(name):
        digest.update(block)
    return digest.hexdigest()


def _flashinfer_cubin(archive: WheelArchive) -> list[str]:
    names = set(archive.names())
    manifests = sorted(n for n in names if n.startswith(CUBIN_ROOT) and n.endswith("/checksums.txt"))
    if not manifests:
        return [f"{archive.path.name}: has no {CUBIN_ROOT}**/checksums.txt, so no kernel can be verified; "
                "rehost upstream's wheel or rebuild it with its cubins"]
    problems = []
    for manifest in manifests:
        for expected, member in _manifest_entries(archive, manifest):
            if member.endswith(_LOADED_AT_RUN_TIME):
                continue
            if member not in names:
                problems.append(f"{archive.path.name}: lacks {member}, which {manifest} lists; "
                                "the cubin download was incomplete: rebuild or rehost the wheel")
            elif _sha256(archive, member) != expected:
                problems.append(f"{archive.path.name}: {member} does not match its sha256 in {manifest}; "
                                "rebuild or rehost the wheel")
    return problems


def _flashinfer_jit_cache(archive: WheelArchive, _device: Sequence[MemberArchs]) -> list[str]:
    """The shim built here (a manifest naming its providers), or upstream's monolithic wheel, rehosted."""
    from ci.model import jit_cache

    label = archive.path.name
    names = set(archive.names())
    modules = sorted(n for n in names if n.startswith(JIT_CACHE_ROOT) and n.endswith(".so"))
    manifest_name = f"{archive.dist_info}/{jit_cache.WHEEL_MANIFEST}"
    if manifest_name not in names:  # upstream's wheel, rehosted: it says nothing of what it should hold
        if modules:
            return []
        return [f"{label}: has no compiled module under {JIT_CACHE_ROOT}; "
                "its ahead-of-time compile produced nothing: rebuild or rehost the wheel"]
    needed = (f"{jit_cache.PACKAGE}/__init__.py", f"{jit_cache.PACKAGE}/_cuda_compat.json")
    problems = [f"{label}: lacks {member}, which the shim selects its provider with; assemble the wheel again"
                for member in needed if member not in names]
    problems += [f"{label}: {member} is a module in the shim, which serves its providers' only; rebuild the wheel"
                 for member in modules]
    return problems


def _flashinfer_jit_cache_provider(archive: WheelArchive, device: Sequence[MemberArchs]) -> list[str]:
    """A provider built here: every module its manifest lists, with a cubin of each of its archs, and no other."""
    from ci.model import jit_cache

    label = archive.path.name
    tag = archive.wheel_name.name.removeprefix(jit_cache.PROJECT + "-")
    root = f"{jit_cache.PROVIDERS_PACKAGE}/{tag}/"
    names = set(archive.names())
    manifest_name = f"{archive.dist_info}/{jit_cache.WHEEL_MANIFEST}"
    try:
        manifest = bounded_json.loads(archive.read_small(manifest_name))
        listed = {name: tuple(entry["archs"]) for name, entry in manifest["modules"].items()}
        served = set(bounded_json.loads(archive.read_small(f"{root}manifest.json"))["modules"])
        entry_points = archive.read_small(f"{archive.dist_info}/entry_points.txt").decode("utf-8", "replace")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        return [f"{label}: its manifests are not what this checkout writes ({error}); rebuild the wheel"]
    problems = []
    if f"[{jit_cache.ENTRY_POINT_GROUP}]" not in entry_points or f"{tag} = " not in entry_points:
        problems.append(f"{label}: registers no {jit_cache.ENTRY_POINT_GROUP} entry point {tag}, so the shim "
                        "cannot find it; rebuild the wheel")
    if served != set(listed):
        problems.append(f"{label}: {root}manifest.json names other modules than {manifest_name}; rebuild the wheel")
    cubins = {scan.member: scan.cubins for scan in device}
    for name, archs in sorted(listed.items()):
        member = f"{root}jit_cache/{name}/{name}.so"
        if member not in names:
            problems.append(f"{label}: lacks module {name} ({member}), which flashinfer's AOT list names for "
                            f"{manifest.get('target')}; its shard was incomplete: assemble the wheel again")
            continue
        problem = jit_cache.arch_problem(name, archs, cubins.get(member, ()))
        if problem:
            problems.append(f"{label}: {problem}; rebuild its shard")
    modules = sorted(n for n in names if n.startswith(f"{root}jit_cache/") and n.endswith(".so"))
    unlisted = [m for m in modules if m.removeprefix(f"{root}jit_cache/").split("/")[0] not in listed]
    problems += [f"{label}: {member} is no module of {manifest_name}; rebuild the wheel" for member in unlisted]
    return problems


RULES: dict[str, Callable[[WheelArchive, Sequence[MemberArchs]], list[str]]] = {
    "flashinfer-python": lambda archive, _device: _flashinfer_python(archive),
    "flashinfer-cubin": lambda archive, _device: _flashinfer_cubin(archive),
    "flashinfer-jit-cache": _flashinfer_jit_cache,
}


def content_problems(archive: WheelArchive, device: Sequence[MemberArchs] = ()) -> list[str]:
    """What the wheel lacks of what its package must hold (nothing for packages without a rule); ``device``:
    the fatbin scan of its members (ci/formats/fatbin.py), for the rules that look at archs."""
    name = archive.wheel_name.name
    if name.startswith("flashinfer-jit-cache-"):
        return _flashinfer_jit_cache_provider(archive, device)
    rule = RULES.get(name)
    return rule(archive, device) if rule else []


__all__ = ["RULES", "content_problems"]
