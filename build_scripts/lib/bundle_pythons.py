#!/usr/bin/env python3
"""Turn a one-Python wheel of a torch extension into one wheel for several CPythons.

Bundle mode (versions.yaml ``bundle_pythons: true``) builds one wheel whose
extension modules exist once per CPython, side by side
(``pkg/_C.cpython-310-x86_64-linux-gnu.so``, ``..-311-..``, ...), all compiled
against the *same* torch: the build interpreter's (the row's venv). The other
Pythons need no torch; each contributes only its headers (``Python.h``,
``pyconfig.h``) and its ``EXT_SUFFIX``, so a bare uv-managed or pyenv
interpreter is enough.

    bundle_pythons.py WHEEL|DIST_DIR SRC_DIR INTERPRETER...

Run it with the build interpreter, after the builder's normal ``pip wheel``
for that interpreter, from the same environment (the variables the project's
setup.py reads must still be exported). It:

1. describes every INTERPRETER (SOABI, EXT_SUFFIX, include dirs, ``cp3XY``
   tag) and keeps one per SOABI; the build interpreter must be one of them;
2. for each target other than the build interpreter, re-runs the project's
   own extension build, ``setup.py build_ext --force`` in SRC_DIR, under the
   build interpreter, with its sysconfig and setuptools' distutils pointed at
   the target's include directories and EXT_SUFFIX (``SETUPTOOLS_EXT_SUFFIX``),
   into a fresh build directory; every compiler and linker flag, torch's
   include and library paths, its C++11 ABI and pybind11 ABI flags come from
   the project's setup.py and torch's BuildExtension exactly as in the first
   build;
3. requires the same set of extension modules as the wheel already holds for
   the build interpreter (a module missing for one Python, or one the wheel
   does not have, is an error naming both);
4. rewrites the wheel with the wheelhouse's raw-copy writer
   (``ci.formats.rewrite.add_members``, imported from this repository): the new
   modules next to the existing ones, RECORD with their hashes and sizes, one
   ``Tag:`` per Python in WHEEL, and the filename's tags compressed
   (``cp310.cp311.cp312.cp313``); every other member's bytes are copied as they
   are. Prints the path.

Limits: the extension must be a setuptools ``Extension`` (torch's
``CppExtension``/``CUDAExtension`` included) built by ``build_ext``; a
CMake/scikit-build/meson build, a setup.py that chooses sources or flags from
``sys.version_info``, or one that hard-codes the running interpreter's include
directory, is not handled (build one wheel per Python instead). The module
code must not depend on the Python minor beyond its headers. Limited-API
(abi3) and free-threaded builds are refused: the former needs no bundle, the
latter has another ABI tag.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from dataclasses import asdict, dataclass
from pathlib import Path

PROG = "bundle_pythons"
_BUILD_EXT_FLAG = "--build-ext-for"


class BundleError(Exception):
    """One-line failure the caller must fix."""


@dataclass(frozen=True)
class Interpreter:
    path: str
    version: str  # 3.12
    soabi: str
    ext_suffix: str
    include: str
    platinclude: str
    tag: str  # cp312
    free_threaded: bool = False


_QUERY = r"""
import json, sys, sysconfig
paths = sysconfig.get_paths()
print(json.dumps({
    "path": sys.executable,
    "version": "%d.%d" % sys.version_info[:2],
    "soabi": sysconfig.get_config_var("SOABI"),
    "ext_suffix": sysconfig.get_config_var("EXT_SUFFIX"),
    "include": paths["include"],
    "platinclude": paths["platinclude"],
    "tag": "cp%d%d" % sys.version_info[:2],
    "free_threaded": bool(sysconfig.get_config_var("Py_GIL_DISABLED")),
}))
"""


def describe(path: str) -> Interpreter:
    """Ask an interpreter (which needs no torch) for what a build for it needs."""
    try:
        proc = subprocess.run([path, "-I", "-c", _QUERY], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BundleError(f"cannot run interpreter {path}: {exc}") from None
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[0]
        raise BundleError(f"cannot run interpreter {path}: {last}")
    info = Interpreter(**json.loads(proc.stdout.strip().splitlines()[-1]))
    if info.free_threaded:
        raise BundleError(f"{path} is a free-threaded Python ({info.soabi}); bundle mode covers standard CPython only")
    if not info.soabi or not info.ext_suffix:
        raise BundleError(f"{path} reports no SOABI/EXT_SUFFIX; use a CPython interpreter")
    for key in ("include", "platinclude"):
        header = "Python.h" if key == "include" else "pyconfig.h"
        if not Path(getattr(info, key), header).is_file():
            raise BundleError(
                f"{path} (Python {info.version}) has no {header} under {getattr(info, key)}; "
                "use an interpreter with development headers (uv-managed and pyenv builds have them)"
            )
    return info


def current() -> Interpreter:
    return describe(sys.executable)


def unique_by_soabi(interpreters: list[Interpreter]) -> list[Interpreter]:
    """First interpreter of each SOABI, sorted by Python version."""
    seen: dict[str, Interpreter] = {}
    for info in interpreters:
        seen.setdefault(info.soabi, info)
    return sorted(seen.values(), key=lambda i: tuple(int(p) for p in i.version.split(".")))


# --- the per-target extension build (runs in a child build interpreter) -------------------------


def _point_sysconfig_at(target: Interpreter) -> None:
    """Make this process's sysconfig and distutils describe ``target``'s headers and suffix.

    Only what an extension build reads about the *target* changes: EXT_SUFFIX,
    SOABI and the include directories. The compiler, its flags and everything
    about torch stay the build interpreter's.
    """
    overrides = {
        "EXT_SUFFIX": target.ext_suffix,
        "SOABI": target.soabi,
        "INCLUDEPY": target.include,
        "CONFINCLUDEPY": target.platinclude,
    }
    sysconfig.get_config_vars().update(overrides)
    original_get_paths = sysconfig.get_paths

    def get_paths(*args, **kwargs):
        paths = dict(original_get_paths(*args, **kwargs))
        paths["include"], paths["platinclude"] = target.include, target.platinclude
        return paths

    def get_path(name, *args, **kwargs):
        return get_paths(*args, **kwargs)[name]

    sysconfig.get_paths, sysconfig.get_path = get_paths, get_path

    import setuptools  # noqa: F401  (installs setuptools' distutils before the import below)

    modules = []
    try:
        from setuptools._distutils import sysconfig as local_sysconfig

        modules.append(local_sysconfig)
    except ImportError:
        pass
    try:
        from distutils import sysconfig as distutils_sysconfig  # the same module unless SETUPTOOLS_USE_DISTUTILS=stdlib

        if distutils_sysconfig not in modules:
            modules.append(distutils_sysconfig)
    except ImportError:
        pass
    for module in modules:
        module.get_config_vars().update(overrides)
        original = module.get_python_inc

        def get_python_inc(plat_specific=False, prefix=None, _original=original):
            if prefix is not None:
                return _original(plat_specific, prefix)
            return target.platinclude if plat_specific else target.include

        module.get_python_inc = get_python_inc


def build_ext_main(target_json: str, build_lib: str, build_temp: str) -> int:
    """Child entry point: run the project's ``build_ext`` for one target Python in the cwd."""
    import runpy

    target = Interpreter(**json.loads(target_json))
    _point_sysconfig_at(target)
    os.environ["SETUPTOOLS_EXT_SUFFIX"] = target.ext_suffix
    here = os.getcwd()
    sys.path.insert(0, here)
    sys.argv = ["setup.py", "build_ext", "--force", "--build-lib", build_lib, "--build-temp", build_temp]
    if Path("setup.py").is_file():
        runpy.run_path(str(Path(here, "setup.py")), run_name="__main__")
    else:  # pyproject-only setuptools project ([tool.setuptools] ext-modules)
        from setuptools import setup

        setup()
    return 0


# --- the parent: build every target, then merge -----------------------------------------------------


def _module_key(member: str, ext_suffix: str) -> tuple[str, str] | None:
    """``(prefix, import path stem)`` of a wheel member built with ``ext_suffix``; None otherwise.

    ``pkg/_C.cpython-311-x86_64-linux-gnu.so`` -> ``("", "pkg/_C")``;
    ``n-1.0.data/platlib/pkg/_C...so`` -> ``("n-1.0.data/platlib/", "pkg/_C")``.
    """
    if not member.endswith(ext_suffix):
        return None
    stem = member[: -len(ext_suffix)]
    match = re.match(r"^([^/]+\.data/(?:platlib|purelib)/)(.*)$", stem)
    return (match[1], match[2]) if match else ("", stem)


def build_for(target: Interpreter, src: Path, work: Path, env: dict[str, str] | None = None) -> dict[str, Path]:
    """Run the project's build_ext for ``target`` under this interpreter; ``{stem: built file}``."""
    build_lib, build_temp = work / "lib", work / "temp"
    shutil.rmtree(work, ignore_errors=True)
    build_lib.mkdir(parents=True)
    build_temp.mkdir()
    command = [sys.executable, str(Path(__file__).resolve()), _BUILD_EXT_FLAG, json.dumps(asdict(target)),
               str(build_lib), str(build_temp)]
    child_env = {**(env if env is not None else os.environ), "SETUPTOOLS_EXT_SUFFIX": target.ext_suffix}
    print(f"[wheelhouse] building the extension modules for Python {target.version} ({target.soabi}) with "
          f"{sys.executable}: setup.py build_ext, headers {target.include}", file=sys.stderr, flush=True)
    proc = subprocess.run(command, cwd=src, env=child_env)
    if proc.returncode != 0:
        raise BundleError(f"setup.py build_ext for Python {target.version} failed with status {proc.returncode} "
                          "(see the compiler output above)")
    built = {}
    for path in sorted(build_lib.rglob(f"*{target.ext_suffix}")):
        built[path.relative_to(build_lib).as_posix()[: -len(target.ext_suffix)]] = path
    return built


def find_wheel(path: Path) -> Path:
    if path.is_file():
        return path
    wheels = sorted(path.glob("*.whl")) if path.is_dir() else []
    if len(wheels) != 1:
        names = ", ".join(w.name for w in wheels) or "none"
        raise BundleError(f"expected exactly one wheel in {path} to bundle Pythons into, found: {names}")
    return wheels[0]


def bundle(wheel: Path, src: Path, interpreters: list[str], work_root: Path | None = None) -> Path:
    build = current()
    targets = unique_by_soabi([describe(path) for path in interpreters])
    if build.soabi not in {t.soabi for t in targets}:
        raise BundleError(
            f"the build interpreter {build.path} (Python {build.version}) is not one of the bundle's Pythons "
            f"({', '.join(t.version for t in targets)}); build with one of them"
        )
    with zipfile.ZipFile(wheel) as archive:
        members = [n for n in archive.namelist() if not n.endswith("/")]
    own = {key[1]: key[0] for m in members if (key := _module_key(m, build.ext_suffix))}
    if not own:
        abi3 = [m for m in members if m.endswith(".abi3.so")]
        hint = (f" (it has limited-API modules {', '.join(abi3)}, which serve every Python already; "
                "drop bundle_pythons)") if abi3 else ""
        raise BundleError(f"{wheel.name} has no extension module built for Python {build.version} "
                          f"(*{build.ext_suffix}){hint}; bundle mode needs a compiled extension")
    extra: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="bundle-", dir=work_root) as tmp:
        for target in targets:
            if target.soabi == build.soabi:
                continue
            built = build_for(target, src, Path(tmp) / target.soabi)
            missing = sorted(set(own) - set(built))
            unexpected = sorted(set(built) - set(own))
            if missing:
                raise BundleError(
                    f"the build for Python {target.version} produced no {', '.join(missing)} "
                    f"(expected {missing[0]}{target.ext_suffix}); the wheel has it for Python {build.version}"
                )
            if unexpected:
                raise BundleError(
                    f"the build for Python {target.version} produced {', '.join(unexpected)}, which the wheel "
                    f"for Python {build.version} does not have; the extension set must not depend on the Python"
                )
            for stem, path in built.items():
                extra[f"{own[stem]}{stem}{target.ext_suffix}"] = path
        return merge(wheel, extra, [t.tag for t in targets])


# --- the wheel rewrite -------------------------------------------------------------------------------


def _rewrite_library():
    """The wheelhouse's wheel reader and raw-copy writer (ci/formats/), from this repository.

    Imported only here, in the parent: the per-target child puts the project's checkout first on
    sys.path, and a checkout may have a ``ci`` package of its own.
    """
    root = str(Path(__file__).resolve().parents[2])
    if root not in sys.path:
        sys.path.insert(0, root)
    from ci.base.errors import CheckFailed
    from ci.formats import archive, rewrite

    return archive, rewrite, CheckFailed


def merge(wheel: Path, extra: dict[str, Path], tags: list[str]) -> Path:
    """Rewrite ``wheel`` with ``extra`` members (arcname -> file) and CPython ``tags``; return the new path.

    ci.formats.rewrite.add_members writes it: the wheel's members are copied raw, the modules added
    before .dist-info, WHEEL's ``Tag:`` lines replaced, and RECORD updated for both.
    """
    archive, rewrite, CheckFailed = _rewrite_library()
    try:
        with archive.open_wheel(wheel) as opened:
            name, dist_info = opened.wheel_name, opened.dist_info
            wheel_name = f"{dist_info}/WHEEL"
            if wheel_name not in opened.names():
                raise BundleError(f"{wheel.name} has no {wheel_name}")
            wheel_text = opened.read_small(wheel_name).decode()
        platforms = sorted({tag.platform for tag in name.tags})
        if len(platforms) != 1:
            raise BundleError(f"{wheel.name}: several platform tags ({'.'.join(platforms)}); "
                              "bundle a single-platform wheel")
        plat = platforms[0]
        tags = sorted(set(tags), key=lambda t: int(t[2:]))
        joined = ".".join(tags)
        build = f"-{name.build}" if name.build else ""
        target = wheel.with_name(f"{name.distribution}-{name.version}{build}-{joined}-{joined}-{plat}.whl")
        # Blank lines dropped too: in this email-header format one would end the headers before the tags.
        lines = [line for line in wheel_text.splitlines() if line.strip() and not line.startswith("Tag:")]
        lines += [f"Tag: {tag}-{tag}-{plat}" for tag in tags]
        rewrite.add_members(wheel, target, extra, {wheel_name: ("\n".join(lines) + "\n").encode()})
    except CheckFailed as exc:
        raise BundleError(str(exc)) from None
    if target != wheel:
        wheel.unlink()
    return target


def main(argv: list[str]) -> int:
    if argv and argv[0] == _BUILD_EXT_FLAG:
        if len(argv) != 4:
            print(f"usage: {PROG}.py {_BUILD_EXT_FLAG} TARGET_JSON BUILD_LIB BUILD_TEMP", file=sys.stderr)
            return 2
        return build_ext_main(*argv[1:])
    if len(argv) < 3:
        print(f"usage: {PROG}.py WHEEL|DIST_DIR SRC_DIR INTERPRETER...", file=sys.stderr)
        return 2
    try:
        print(bundle(find_wheel(Path(argv[0])), Path(argv[1]).resolve(), argv[2:]))
    except BundleError as exc:
        print(f"[wheelhouse] error: {PROG}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
