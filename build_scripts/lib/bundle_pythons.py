#!/usr/bin/env python3
"""Add a host-only ``_C`` extension for more CPython versions to a built wheel.

DeepGEMM's ``deep_gemm._C`` is host C++ (its CUDA kernels are compiled at run
time), linked against torch. One wheel can therefore serve several Pythons if
it carries one ``_C.cpython-3XY-<platform>.so`` per Python, each built against
the *same* torch. Only the build interpreter (the row's venv) needs torch: a
target Python contributes its headers (INCLUDEPY) and its EXT_SUFFIX.

    bundle_pythons.py WHEEL SRC_DIR INTERPRETER...

For each INTERPRETER whose ABI differs from the running one, compile
SRC_DIR/csrc/python_api.cpp with the include directories and flags of
DeepGEMM's setup.py plus torch's pybind11 ABI flags, then rewrite WHEEL in
place: the new ``.so`` files next to the existing ``_C``, RECORD updated, one
``Tag:`` per Python in WHEEL, and the filename's tags compressed
(``cp311.cp312``). Prints the new wheel path. Run with the row's python.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

PROG = "bundle_pythons"


class BundleError(Exception):
    """One-line failure the caller must fix."""


@dataclass(frozen=True)
class Interpreter:
    path: str
    soabi: str
    ext_suffix: str
    include: str
    tag: str  # cp311


_QUERY = (
    "import json, sys, sysconfig; print(json.dumps({'soabi': sysconfig.get_config_var('SOABI'),"
    " 'ext_suffix': sysconfig.get_config_var('EXT_SUFFIX'), 'include': sysconfig.get_paths()['include'],"
    " 'tag': 'cp%d%d' % sys.version_info[:2]}))"
)


def describe(path: str) -> Interpreter:
    try:
        out = subprocess.run([path, "-c", _QUERY], check=True, capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as exc:
        raise BundleError(f"cannot query interpreter {path}: {exc}") from None
    info = json.loads(out)
    if not Path(info["include"], "Python.h").is_file():
        raise BundleError(f"{path} has no Python.h under {info['include']}; use a Python with development headers")
    return Interpreter(path=path, **info)


def current() -> Interpreter:
    return Interpreter(
        path=sys.executable,
        soabi=sysconfig.get_config_var("SOABI"),
        ext_suffix=sysconfig.get_config_var("EXT_SUFFIX"),
        include=sysconfig.get_paths()["include"],
        tag=f"cp{sys.version_info[0]}{sys.version_info[1]}",
    )


def compile_command(src: Path, target: Interpreter, output: Path) -> list[str]:
    """The g++ line for one target Python, against the running interpreter's torch."""
    import torch
    from torch.utils import cpp_extension

    cuda_home = cpp_extension.CUDA_HOME
    if cuda_home is None:
        raise BundleError("CUDA_HOME is not set and no nvcc was found; DeepGEMM's _C needs the toolkit headers")
    abi_flags: list[str] = []
    for helper in ("_get_pybind11_abi_build_flags", "_get_glibcxx_abi_build_flags"):
        if hasattr(cpp_extension, helper):  # pybind11 internals must match torch's
            abi_flags += getattr(cpp_extension, helper)()
    if not any("_GLIBCXX_USE_CXX11_ABI" in flag for flag in abi_flags):
        abi_flags.append(f"-D_GLIBCXX_USE_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}")
    includes = [
        target.include,
        f"{cuda_home}/include",
        f"{cuda_home}/include/cccl",
        str(src / "csrc"),
        str(src / "deep_gemm" / "include"),
        str(src / "third-party" / "cutlass" / "include"),
        str(src / "third-party" / "fmt" / "include"),
        *cpp_extension.include_paths(device_type="cuda"),
    ]
    libraries = ["c10", "torch", "torch_cpu", "torch_python", "cudart", "nvrtc"]
    if torch.version.cuda:
        libraries += ["c10_cuda", "torch_cuda"]
    cxx = os.environ.get("CXX", "g++").split()
    return [
        *cxx, "-shared", "-fPIC", "-std=c++17", "-O3", "-Wno-psabi", "-Wno-deprecated-declarations",
        "-DTORCH_API_INCLUDE_EXTENSION_H", "-DTORCH_EXTENSION_NAME=_C", *abi_flags,
        *(f"-I{path}" for path in includes),
        str(src / "csrc" / "python_api.cpp"),
        *(f"-L{path}" for path in cpp_extension.library_paths(device_type="cuda")),
        f"-L{cuda_home}/lib64",
        *(f"-l{lib}" for lib in libraries),
        "-o", str(output),
    ]


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


_WHEEL_RE = re.compile(r"^(?P<dist>[^-]+)-(?P<version>[^-]+)(?:-(?P<build>\d[^-]*))?-(?P<py>[^-]+)-(?P<abi>[^-]+)-(?P<plat>[^-]+)\.whl$")


def merge(wheel: Path, extra: dict[str, Path], tags: list[str]) -> Path:
    """Rewrite ``wheel`` with ``extra`` members (arcname -> file) and CPython ``tags``; return the new path."""
    match = _WHEEL_RE.match(wheel.name)
    if not match:
        raise BundleError(f"{wheel.name} is not a wheel filename")
    plat = match["plat"]
    tags = sorted(set(tags), key=lambda t: int(t[2:]))
    joined = ".".join(tags)
    build = f"-{match['build']}" if match["build"] else ""
    target = wheel.with_name(f"{match['dist']}-{match['version']}{build}-{joined}-{joined}-{plat}.whl")
    with zipfile.ZipFile(wheel) as src:
        names = src.namelist()
        dist_info = next((n.split("/")[0] for n in names if n.endswith(".dist-info/WHEEL")), None)
        if dist_info is None:
            raise BundleError(f"{wheel.name} has no .dist-info/WHEEL")
        wheel_name, record_name = f"{dist_info}/WHEEL", f"{dist_info}/RECORD"
        wheel_lines = [line for line in src.read(wheel_name).decode().splitlines() if not line.startswith("Tag:")]
        wheel_lines += [f"Tag: {tag}-{tag}-{plat}" for tag in tags]
        new_wheel_file = ("\n".join(wheel_lines) + "\n").encode()
        rows = [row for row in csv.reader(io.StringIO(src.read(record_name).decode())) if row]
        rows = [row for row in rows if row[0] not in (wheel_name, record_name) and row[0] not in extra]
        tmp = target.with_name(target.name + ".partial")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as dst:
            for info in src.infolist():
                if info.filename in (wheel_name, record_name) or info.filename in extra:
                    continue
                dst.writestr(info, src.read(info.filename), compress_type=info.compress_type)
            for arcname, path in sorted(extra.items()):
                data = path.read_bytes()
                info = zipfile.ZipInfo(arcname, date_time=(1980, 1, 1, 0, 0, 0))
                info.external_attr = 0o755 << 16
                info.compress_type = zipfile.ZIP_DEFLATED
                dst.writestr(info, data)
                rows.append([arcname, _record_hash(data), str(len(data))])
            info = zipfile.ZipInfo(wheel_name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            dst.writestr(info, new_wheel_file, compress_type=zipfile.ZIP_DEFLATED)
            rows.append([wheel_name, _record_hash(new_wheel_file), str(len(new_wheel_file))])
            rows.append([record_name, "", ""])
            out = io.StringIO()
            csv.writer(out, lineterminator="\n").writerows(rows)
            info = zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            dst.writestr(info, out.getvalue().encode(), compress_type=zipfile.ZIP_DEFLATED)
    tmp.replace(target)
    if target != wheel:
        wheel.unlink()
    return target


def bundle(wheel: Path, src: Path, interpreters: list[str]) -> Path:
    row = current()
    with zipfile.ZipFile(wheel) as archive:
        existing = [n for n in archive.namelist() if n.endswith(f"/_C{row.ext_suffix}")]
    if len(existing) != 1:
        raise BundleError(f"{wheel.name}: expected one _C{row.ext_suffix} in the wheel, found {len(existing)}")
    package_dir = existing[0].rsplit("/", 1)[0]
    targets = {row.soabi: row}
    for path in interpreters:
        info = describe(path)
        targets.setdefault(info.soabi, info)
    extra: dict[str, Path] = {}
    with tempfile.TemporaryDirectory(prefix="bundle-") as tmp:
        for info in targets.values():
            if info.soabi == row.soabi:
                continue
            output = Path(tmp) / f"_C{info.ext_suffix}"
            command = compile_command(src, info, output)
            print(f"[wheelhouse] building _C for {info.tag}: {' '.join(command)}", file=sys.stderr, flush=True)
            subprocess.run(command, check=True)
            extra[f"{package_dir}/_C{info.ext_suffix}"] = output
        return merge(wheel, extra, [info.tag for info in targets.values()])


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(f"usage: {PROG}.py WHEEL SRC_DIR INTERPRETER...", file=sys.stderr)
        return 2
    try:
        print(bundle(Path(argv[0]), Path(argv[1]).resolve(), argv[2:]))
    except BundleError as exc:
        print(f"[wheelhouse] error: {PROG}: {exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"[wheelhouse] error: {PROG}: compiler failed with status {exc.returncode}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
