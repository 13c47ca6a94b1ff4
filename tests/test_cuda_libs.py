"""CUDA-library skew: a wheel's versioned CUDA symbols against the libraries its torch pins.

Fast: a small versioned library pair built here with gcc and a version script, shipped as two nvidia-cublas
wheels, a stand-in torch that requires the older one through a cuda-toolkit extra (as torch 2.13 does), and
an extension linked against the newer one; read both as wheel files and installed by pip. Network: the real
nvidia-cuda-runtime wheels torch 2.13.0 pins (13.0.96) and a later one (13.2.75) from the package index, and an
extension built here against the later one's libcudart.
"""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from nvidia_wheels import cached_wheel
from stand_in_torch import _files as torch_files
from wheel_factory import build_wheel

from ci.checks.check import check_wheels
from ci.checks.cuda_libs import from_wheels, is_cuda_library, shipped_by

LIBRARY = "libcublasLt.so.13"
OLD_API = "int cublasLtOld(void) { return 1; }\n"
NEW_API = OLD_API + "int cublasLtNew(void) { return 2; }\n"
EXTENSION = "extern int cublasLtOld(void);\nextern int cublasLtNew(void);\nint kernel_entry(void) { return cublasLtOld() + cublasLtNew(); }\n"
TOOLKIT_REQUIRES = ["nvidia-cublas==13.0.0.*; extra == 'cublas'"]
TORCH_REQUIRES = ["cuda-toolkit[cublas]==13.0.3; platform_system == 'Linux'", "filelock"]


def _gcc(out: Path, source: str, *flags: str) -> Path:
    (out.parent / (out.name + ".c")).write_text(source)
    subprocess.run(["gcc", "-shared", "-fPIC", str(out.parent / (out.name + ".c")), "-o", str(out), *flags], check=True)
    return out


@pytest.fixture(scope="module")
def versioned_pair(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """libcublasLt.so.13 as 13.0.0 (cublasLtOld) and 13.2.0 (and cublasLtNew), one version node as NVIDIA's have,
    each in an nvidia-cublas wheel; an extension linked against 13.2.0."""
    work = tmp_path_factory.mktemp("pair")
    script = work / "lib.map"
    script.write_text(f"{LIBRARY} {{ global: cublasLt*; local: *; }};\n")
    libs = {}
    for version, source in (("13.0.0", OLD_API), ("13.2.0", NEW_API)):
        folder = work / version
        folder.mkdir()
        libs[version] = _gcc(folder / LIBRARY, source, f"-Wl,--version-script={script}", f"-Wl,-soname,{LIBRARY}")
    extension = _gcc(work / "_kernels.so", EXTENSION, f"-L{libs['13.2.0'].parent}", f"-l:{LIBRARY}")
    wheels = work / "wheels"
    return {
        "old": build_wheel(wheels, {f"nvidia/cu13/lib/{LIBRARY}": libs["13.0.0"].read_bytes()}, name="nvidia_cublas",
                           version="13.0.0", tags="py3-none-manylinux_2_27_x86_64"),
        "new": build_wheel(work / "newer", {f"nvidia/cu13/lib/{LIBRARY}": libs["13.2.0"].read_bytes()},
                           name="nvidia_cublas", version="13.2.0", tags="py3-none-manylinux_2_27_x86_64"),
        "toolkit": build_wheel(wheels, {}, name="cuda_toolkit", version="13.0.3", tags="py3-none-any",
                               requires=TOOLKIT_REQUIRES),
        "torch": build_wheel(wheels, torch_files(cuda=True), name="torch", version="2.13.0",
                             tags="cp311-cp311-manylinux_2_28_x86_64", requires=TORCH_REQUIRES),
        "extension": build_wheel(work / "ext", {"pkg/_kernels.so": extension.read_bytes(), "pkg/__init__.py": b""},
                                 name="pkg"),
    }


def test_cuda_library_names() -> None:
    assert all(is_cuda_library(name) for name in ("libcublasLt.so.13", "libcudart.so.13", "libcudnn.so.9",
                                                   "libnccl.so.2", "libnvshmem_host.so.3", "libnvrtc.so.13",
                                                   "libcusparse.so.12", "libcurand.so.10", "libnvJitLink.so.13"))
    assert not any(is_cuda_library(name) for name in ("libcuda.so.1", "libnvidia-ml.so.1", "libc.so.6",
                                                       "libstdc++.so.6", "libc10.so", "libtorch_cuda.so"))


def test_newer_symbol_than_the_pinned_library_is_refused(versioned_pair: dict[str, Path]) -> None:
    pinned = from_wheels([versioned_pair["torch"], versioned_pair["toolkit"], versioned_pair["old"]])
    report = check_wheels([versioned_pair["extension"]], cuda_libraries=pinned,
                          library_candidates=[shipped_by([versioned_pair["new"]])])
    (problem,) = report.problems
    assert problem == (
        f"pkg-1.0-cp311-cp311-linux_x86_64.whl: pkg/_kernels.so needs 1 symbol(s) of {LIBRARY} that nvidia-cublas "
        f"13.0.0 (torch's pin) does not define: cublasLtNew@{LIBRARY}; nvidia-cublas 13.2.0 would "
        f"(nvidia_cublas-13.2.0-py3-none-manylinux_2_27_x86_64.whl: {LIBRARY} defines it): build against "
        "nvidia-cublas 13.0.0 (torch's pin), or pin a torch that requires nvidia-cublas>=13.2.0")
    wheel = report.wheels[0]
    assert wheel.cuda_libraries is not None and wheel.cuda_libraries.checked == {LIBRARY: 2}


def test_the_pinned_library_that_defines_them_passes(versioned_pair: dict[str, Path]) -> None:
    newer_torch_world = from_wheels([versioned_pair["torch"], versioned_pair["new"],
                                     build_wheel(versioned_pair["new"].parent, {}, name="cuda_toolkit",
                                                 version="13.2.0", tags="py3-none-any",
                                                 requires=["nvidia-cublas==13.2.0.*; extra == 'cublas'"])])
    report = check_wheels([versioned_pair["extension"]], cuda_libraries=newer_torch_world)
    assert report.ok, report.problems
    assert "CUDA libraries: versioned symbols vs torch 2.13.0's nvidia-* wheels" in report.render_text()


def test_installed_world_read_from_site_packages(versioned_pair: dict[str, Path], tmp_path: Path) -> None:
    """As a build reads it: pip installs torch and its pins; the check reads their dist-info and RECORD in place."""
    site = tmp_path / "site-packages"
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(site),
                    str(versioned_pair["torch"]), str(versioned_pair["toolkit"]), str(versioned_pair["old"])],
                   check=True)
    report = check_wheels([versioned_pair["extension"]], torch_target=site)
    (problem,) = report.problems
    assert f"needs 1 symbol(s) of {LIBRARY} that nvidia-cublas 13.0.0 (torch's pin) does not define" in problem
    assert problem.endswith("; no library here defines cublasLtNew: build against nvidia-cublas 13.0.0 (torch's pin) or "
                            "pin a torch whose nvidia-cublas does")


def test_library_no_pin_provides_is_refused(versioned_pair: dict[str, Path], tmp_path: Path) -> None:
    other_torch = build_wheel(tmp_path, torch_files(cuda=True), name="torch", version="2.13.0",
                              tags="cp311-cp311-manylinux_2_28_x86_64", requires=["nvidia-nccl-cu13==2.29.7"])
    nccl = build_wheel(tmp_path, {"nvidia/nccl/lib/libnccl.so.2": b"\x7fELF"}, name="nvidia_nccl_cu13",
                       version="2.29.7", tags="py3-none-manylinux_2_18_x86_64")
    report = check_wheels([versioned_pair["extension"]], cuda_libraries=from_wheels([other_torch, nccl]))
    (problem,) = report.problems
    assert problem.startswith(f"pkg-1.0-cp311-cp311-linux_x86_64.whl: pkg/_kernels.so needs {LIBRARY}, which neither "
                              "the wheel nor torch 2.13.0's nvidia-* wheels in the given wheels provide")


def test_a_torch_without_nvidia_pins_is_not_compared(versioned_pair: dict[str, Path], tmp_path: Path) -> None:
    system_torch = build_wheel(tmp_path, torch_files(cuda=True), name="torch", version="2.13.0",
                               tags="cp311-cp311-manylinux_2_28_x86_64", requires=["filelock"])
    report = check_wheels([versioned_pair["extension"]], cuda_libraries=from_wheels([system_torch]))
    assert report.ok
    assert ("CUDA libraries: not checked: torch 2.13.0 requires no nvidia-* wheel (its CUDA libraries come from the "
            "system)") in report.render_text()
    # a torch wheel downloaded alone (CI's recheck): its pins are not beside it, so nothing is claimed missing
    alone = tmp_path / "alone"
    torch = build_wheel(alone, torch_files(cuda=True), name="torch", version="2.13.0",
                        tags="cp311-cp311-manylinux_2_28_x86_64", requires=TORCH_REQUIRES)
    report = check_wheels([versioned_pair["extension"]], torch_target=torch)
    assert report.ok
    assert f"not checked: the CUDA wheels torch 2.13.0 requires (cuda-toolkit) are not in {alone}" in report.render_text()


# --- real nvidia-* wheels ----------------------------------------------------------------------------

REAL_EXTENSION = """\
extern int cudaGetDeviceCount(int*);
extern int cudaDeviceGetDevResource(int, void*, int);  /* new in CUDA 13.2's runtime */
int probe(void) { int n = 0; cudaGetDeviceCount(&n); return n + cudaDeviceGetDevResource(0, 0, 0); }
"""


@pytest.mark.network
def test_real_cudart_wheels(tmp_path: Path) -> None:
    """torch 2.13.0 pins nvidia-cuda-runtime 13.0.96 (through cuda-toolkit[cudart]==13.0.3); an extension built
    against 13.2.75's libcudart takes cudaDeviceGetDevResource, which 13.0.96 lacks."""
    pinned_runtime = cached_wheel("nvidia-cuda-runtime", "13.0.96")
    newer_runtime = cached_wheel("nvidia-cuda-runtime", "13.2.75")
    toolkit = cached_wheel("cuda-toolkit", "13.0.3.0")
    world = tmp_path / "world"
    world.mkdir()
    for wheel in (pinned_runtime, toolkit):
        (world / wheel.name).symlink_to(wheel)
    torch = build_wheel(world, torch_files(cuda=True), name="torch", version="2.13.0",
                        tags="cp311-cp311-manylinux_2_28_x86_64",
                        requires=["cuda-toolkit[cudart]==13.0.3; platform_system == 'Linux'"])
    lib_dir = tmp_path / "cudart-13.2"
    with zipfile.ZipFile(newer_runtime) as zf:
        (lib_dir / "libcudart.so.13").parent.mkdir(parents=True)
        (lib_dir / "libcudart.so.13").write_bytes(zf.read("nvidia/cu13/lib/libcudart.so.13"))
    extension = _gcc(tmp_path / "_probe.so", REAL_EXTENSION, f"-L{lib_dir}", "-l:libcudart.so.13")
    wheel = build_wheel(tmp_path / "ext", {"pkg/_probe.so": extension.read_bytes()}, name="pkg")
    report = check_wheels([wheel], torch_target=torch, library_candidates=[shipped_by([newer_runtime])])
    (problem,) = report.problems
    assert problem == (
        "pkg-1.0-cp311-cp311-linux_x86_64.whl: pkg/_probe.so needs 1 symbol(s) of libcudart.so.13 that "
        "nvidia-cuda-runtime 13.0.96 (torch's pin) does not define: cudaDeviceGetDevResource@libcudart.so.13; "
        f"nvidia-cuda-runtime 13.2.75 would ({newer_runtime.name}: libcudart.so.13 defines it): build against "
        "nvidia-cuda-runtime 13.0.96 (torch's pin), or pin a torch that requires nvidia-cuda-runtime>=13.2.75")
    assert report.wheels[0].cuda_libraries.checked == {"libcudart.so.13": 2}
    # the same extension built against the pinned library passes
    with zipfile.ZipFile(pinned_runtime) as zf:
        (tmp_path / "cudart-13.0" / "libcudart.so.13").parent.mkdir()
        (tmp_path / "cudart-13.0" / "libcudart.so.13").write_bytes(zf.read("nvidia/cu13/lib/libcudart.so.13"))
    older = _gcc(tmp_path / "_older.so", REAL_EXTENSION.replace("+ cudaDeviceGetDevResource(0, 0, 0)", "")
                 .replace("extern int cudaDeviceGetDevResource(int, void*, int);  /* new in CUDA 13.2's runtime */\n",
                          ""), f"-L{tmp_path / 'cudart-13.0'}", "-l:libcudart.so.13")
    fine = build_wheel(tmp_path / "fine", {"pkg/_probe.so": older.read_bytes()}, name="pkg")
    assert check_wheels([fine], torch_target=torch).ok
