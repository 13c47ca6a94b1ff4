"""Fatbin scanning on real nvcc output, synthetic ELFs, and a GB-sized wheel (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from wheel_factory import (
    NVCC,
    REPO,
    build_wheel,
    cuda_shared_object,
    fatbin_section_bytes,
    host_shared_object,
    write_synthetic_elf,
)

from ci.formats.archs import CudaArch, parse_arch_list
from ci.formats.fatbin import arch_problems, scan_wheel_archs

needs_nvcc = pytest.mark.skipif(not NVCC.is_file(), reason="nvcc not installed")


@pytest.fixture(scope="module")
def cuda_so() -> Path:
    if not NVCC.is_file():
        pytest.skip("nvcc not installed")
    return cuda_shared_object(("80", "90"))


@needs_nvcc
def test_real_fatbin_two_archs(tmp_path: Path, cuda_so: Path) -> None:
    wheel = build_wheel(tmp_path, {"pkg/libkernels.so": cuda_so.read_bytes(), "pkg/__init__.py": b""}, name="pkg")
    scan = scan_wheel_archs(wheel, use_cuobjdump=False)
    assert set(scan.cubin_archs) == {CudaArch(8, 0), CudaArch(9, 0)}
    assert scan.ptx_archs == ()
    (member,) = scan.members
    assert member.member == "pkg/libkernels.so" and member.method == "fatbin"
    assert arch_problems(scan, parse_arch_list("8.0;9.0")) == ()
    # 9.0a asks for sm_90a itself: the plain sm_90 cubin lacks its instructions (tests/test_arch_targets.py)
    assert "9.0a is covered only through sm_90" in arch_problems(scan, parse_arch_list("8.0;9.0a"))[0]
    assert arch_problems(scan, parse_arch_list("8.0;9.0;10.0;12.0")) == (
        f"{wheel.name}: pkg/libkernels.so: device code is missing required CUDA arch(es) 10.0, 12.0 (found cubins "
        "for 8.0, 9.0); add them to TORCH_CUDA_ARCH_LIST and rebuild",
    )


def test_host_only_so_has_no_archs(tmp_path: Path) -> None:
    wheel = build_wheel(
        tmp_path, {"pkg/_C.cpython-311-x86_64-linux-gnu.so": host_shared_object().read_bytes()}, name="pkg"
    )
    scan = scan_wheel_archs(wheel, use_cuobjdump=False)
    assert scan.members == () and scan.cubin_archs == ()
    (problem,) = arch_problems(scan, parse_arch_list("9.0"))
    assert "missing required CUDA arch(es) 9.0 (found cubins for none)" in problem


def test_regex_fallback_when_no_container(tmp_path: Path) -> None:
    elf = tmp_path / "odd.so"
    blob = b"\0junk sm_86 more compute_90 junk\0"
    with open(elf, "wb") as out:
        write_synthetic_elf(out, [(".nv_fatbin", len(blob), [blob])])
    wheel = build_wheel(tmp_path, {"pkg/odd.so": elf.read_bytes()}, name="pkg")
    (member,) = scan_wheel_archs(wheel, use_cuobjdump=False).members
    assert member.method == "regex"
    assert member.cubins == (CudaArch(8, 6),) and member.ptx == (CudaArch(9, 0),)


@needs_nvcc
def test_cuobjdump_output_is_parsed(tmp_path: Path, cuda_so: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tool_dir = tmp_path / "bin"
    tool_dir.mkdir()
    fake = tool_dir / "cuobjdump"
    fake.write_text(
        "#!/bin/sh\necho 'ELF file    1: lib.1.sm_100a.cubin'\necho 'ELF file    2: lib.2.sm_80.cubin'\n"
        "echo 'PTX file    1: lib.1.sm_120.ptx'\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool_dir}:/usr/bin:/bin")
    wheel = build_wheel(tmp_path, {"pkg/libkernels.so": cuda_so.read_bytes()}, name="pkg")
    (member,) = scan_wheel_archs(wheel).members
    assert member.method == "cuobjdump"
    assert member.cubins == (CudaArch(8, 0), CudaArch(10, 0, "a")) and member.ptx == (CudaArch(12, 0),)


_MEASURE = """
import json, resource, sys
sys.path.insert(0, sys.argv[1])
from ci.formats.fatbin import scan_wheel_archs
scan = scan_wheel_archs(sys.argv[2], use_cuobjdump=False)
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(json.dumps({"archs": [str(a) for a in scan.cubin_archs],
                  "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "vmhwm_kb": hwm}))
"""


def _measure(wheel: Path) -> dict:
    """Scan in a grandchild: Linux carries the spawner's peak RSS into ru_maxrss across fork+exec,
    so the pytest process (torch imported) would inflate it; an intermediate shell that forks
    (two commands: no exec shortcut) starts the measured process from a small address space."""
    proc = subprocess.run(
        ["/bin/sh", "-c", '"$0" "$@"; exit $?', sys.executable, "-c", _MEASURE, str(REPO), str(wheel)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout)


@pytest.mark.slow
@needs_nvcc
def test_gigabyte_wheel_scanned_in_bounded_memory(tmp_path: Path, cuda_so: Path) -> None:
    fatbin = fatbin_section_bytes(cuda_so)
    chunk = b"\0" * (8 << 20)
    filler = 140 * len(chunk)  # 1.09 GiB of zeros before the real container
    wheel = tmp_path / "big_pkg-1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_STORED, allowZip64=True) as zf:
        zf.writestr("big_pkg-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: big_pkg\nVersion: 1.0\n")
        info = zipfile.ZipInfo("big_pkg/libhuge.so", date_time=(2024, 1, 1, 0, 0, 0))
        with zf.open(info, "w", force_zip64=True) as member:
            write_synthetic_elf(
                member, [(".nv_fatbin", filler + len(fatbin), [*(chunk for _ in range(filler // len(chunk))), fatbin])]
            )
    assert wheel.stat().st_size >= 1 << 30
    result = _measure(wheel)
    size = wheel.stat().st_size / 2**30
    print(f"peak RSS scanning a {size:.2f} GiB wheel: ru_maxrss {result['maxrss_kb'] / 1024:.1f} MiB, ", end="")
    print(f"VmHWM {result['vmhwm_kb'] / 1024:.1f} MiB")
    assert result["archs"] == ["8.0", "9.0"]
    assert result["maxrss_kb"] < 200 * 1024
    assert result["vmhwm_kb"] < 200 * 1024
