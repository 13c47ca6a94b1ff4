"""check_wheels: the whole report, on the fixture wheel and crafted failures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from wheel_factory import REPO, build_wheel, host_shared_object

from ci.checks.check import check_wheels

TORCH_WHEELS = REPO / ".cache" / "torch-wheels"
SITE_PACKAGES = Path(__import__("torch").__file__).parent.parent


@pytest.mark.parametrize("target", [Path(sys.executable), SITE_PACKAGES], ids=["python", "site-packages"])
def test_fixture_wheel_passes(fixture_wheel: Path, target: Path) -> None:
    report = check_wheels([fixture_wheel], torch_target=target, pythons="3.11")
    assert report.ok, report.render_text()
    (wheel,) = report.wheels
    assert report.digests == {fixture_wheel.name: wheel.sha256}
    assert wheel.abi is not None and wheel.abi.ok
    text = report.render_text()
    assert text.startswith(f"PASS {fixture_wheel.name} (sha256 {wheel.sha256})")
    assert text.endswith("1 wheel(s) checked, 0 failed.")
    data = json.loads(report.to_json())
    assert data["version"] == 2 and data["ok"] is True
    assert data["wheels"][0]["sha256"] == wheel.sha256
    assert data["wheels"][0]["torch_abi"]["elves"][0]["missing"] == []
    assert data["wheels"][0]["torch_abi"]["elves"][0]["missing_count"] == 0


def test_failures_are_reported_not_raised(tmp_path: Path, fixture_wheel: Path) -> None:
    broken = tmp_path / "broken_pkg-1.0-cp311-cp311-linux_x86_64.whl"
    broken.write_bytes(b"not a zip")
    partial = build_wheel(
        tmp_path,
        {
            "pkg/_C.cpython-311-x86_64-linux-gnu.so": host_shared_object().read_bytes(),
            "pkg/_C.cpython-312-x86_64-linux-gnu.so": host_shared_object().read_bytes(),
            "pkg/_ext.cpython-311-x86_64-linux-gnu.so": host_shared_object().read_bytes(),
        },
        name="pkg",
        tags="cp311.cp312-cp311.cp312-linux_x86_64",
    )
    report = check_wheels([fixture_wheel, broken, partial], torch_target=SITE_PACKAGES, require_archs="8.0")
    assert not report.ok
    ok, bad, part = report.wheels
    assert [p for p in ok.problems if "CUDA arch" not in p] == []
    assert bad.problems == (
        f"{broken.name}: not a readable zip archive (File is not a zip file); rebuild or re-download the wheel",
    )
    assert any("module pkg/_ext has no build for Python 3.12" in p for p in part.problems)
    assert any("c10::needs_string" in p for p in part.problems)
    text = report.render_text()
    assert f"FAIL {broken.name}" in text and text.endswith("3 wheel(s) checked, 3 failed.")
    assert all("\n" not in p for p in report.problems)


def _torch_211_wheel() -> Path:
    found = sorted(TORCH_WHEELS.glob("torch-2.11.0-cp311-cp311-manylinux*_x86_64.whl"))
    if found:
        return found[0]
    TORCH_WHEELS.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.11",
            "--platform",
            "manylinux_2_28_x86_64",
            "torch==2.11.0",
            "-d",
            str(TORCH_WHEELS),
        ],
        check=True,
    )
    return sorted(TORCH_WHEELS.glob("torch-2.11.0-cp311-cp311-manylinux*_x86_64.whl"))[0]


@pytest.mark.network
@pytest.mark.slow
def test_fixture_against_torch_211_wheel_file(fixture_wheel: Path) -> None:
    torch_wheel = _torch_211_wheel()
    report = check_wheels([fixture_wheel], torch_target=torch_wheel)
    print(report.render_text())
    (wheel,) = report.wheels
    assert wheel.abi is not None and wheel.abi.torch_version == "2.11.0"
    missing = [m for e in wheel.abi.elves for m in e.missing]
    assert len(missing) == 1
    assert (
        missing[0].mangled
        == "_ZN3c1010ValueErrorC1ENS_14SourceLocationENSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEE"
    )
    assert missing[0].demangled == (
        "c10::ValueError::ValueError(c10::SourceLocation, "
        "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >)"
    )
    assert not report.ok and len(report.problems) == 1


# --- what pip and the loader agree on: RECORD and ELF members --------------------------------------

SO = "demo_pkg/_C.cpython-311-x86_64-linux-gnu.so"


def _rewritten(wheel: Path, change) -> Path:
    """``wheel`` with its members passed through ``change(members) -> members`` (RECORD left as it was)."""
    import zipfile

    with zipfile.ZipFile(wheel) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    members = change(members)
    wheel.unlink()
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return wheel


def _problems(wheel: Path) -> list[str]:
    report = check_wheels([wheel])
    return list(report.problems)


def test_wheel_without_record_fails_like_pip(tmp_path: Path) -> None:
    wheel = _rewritten(build_wheel(tmp_path, {"demo_pkg/__init__.py": b""}),
                       lambda m: {k: v for k, v in m.items() if not k.endswith("RECORD")})
    assert _problems(wheel) == [f"{wheel.name}: has no demo_pkg-1.0.dist-info/RECORD; pip refuses a wheel without "
                                "RECORD; rebuild the wheel"]
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target",
                          str(tmp_path / "t"), str(wheel)], capture_output=True, text=True)
    assert pip.returncode != 0 and "RECORD" in pip.stderr


def test_record_hash_size_and_listing_are_checked(tmp_path: Path) -> None:
    def tamper(members):
        members["demo_pkg/__init__.py"] = b"print('changed after the build')\n"
        members["demo_pkg/unlisted.py"] = b""
        record = members["demo_pkg-1.0.dist-info/RECORD"].decode()
        members["demo_pkg-1.0.dist-info/RECORD"] = (record + "demo_pkg/gone.py,sha256=x,1\n").encode()
        return members

    wheel = _rewritten(build_wheel(tmp_path, {"demo_pkg/__init__.py": b""}), tamper)
    problems = _problems(wheel)
    assert len(problems) == 3, problems
    assert problems[0].startswith(f"{wheel.name}: member 'demo_pkg/__init__.py' does not match its RECORD hash "
                                  "(sha256=")
    assert problems[1] == (f"{wheel.name}: member 'demo_pkg/unlisted.py' is not listed in "
                           "demo_pkg-1.0.dist-info/RECORD; rebuild the wheel")
    assert problems[2] == (f"{wheel.name}: demo_pkg-1.0.dist-info/RECORD lists 'demo_pkg/gone.py', which the wheel "
                           "does not hold; rebuild the wheel")


def test_extension_module_must_be_an_elf_for_the_platform(tmp_path: Path) -> None:
    not_elf = build_wheel(tmp_path / "a", {SO: b"this is not an ELF file"})
    assert _problems(not_elf) == [f"{not_elf.name}: member '{SO}' is named like a shared object but is not an ELF "
                                  "file (Python cannot import it); rebuild the wheel"]
    so = bytearray(host_shared_object().read_bytes())
    so[18:20] = (183).to_bytes(2, "little")  # e_machine: aarch64
    foreign = build_wheel(tmp_path / "b", {SO: bytes(so)})
    assert _problems(foreign) == [f"{foreign.name}: member '{SO}' is an ELF for machine 183, not for the wheel's "
                                  "platform (x86_64); rebuild the wheel"]


# --- the checks read members in place: they write nothing to disk -----------------------------------------

_WRITES = """
import json, sys
sys.path.insert(0, sys.argv[1])
from ci.checks.check import check_wheels

def written():  # every byte this process passes to write(), whatever the file system
    return int(next(line.split()[1] for line in open("/proc/self/io") if line.startswith("wchar:")))

before = written()
report = check_wheels([sys.argv[2]], torch_target=sys.argv[3], require_archs="9.0")
print(json.dumps({"written": written() - before, "problems": list(report.problems)}))
"""


def test_checks_write_nothing_to_disk_however_large_the_members(tmp_path: Path) -> None:
    """A 32 MiB shared object and a torch wheel, both read where they lie: no member is extracted (a 626 MB
    wheel once cost 1.85 GB of temporary files)."""
    import io

    from hostile_wheels import fatbin_container
    from stand_in_torch import torch_wheel
    from wheel_factory import write_synthetic_elf

    fatbin = bytes(32 << 20) + fatbin_container(90)  # the scan reads all of it to find the container at its end
    big = io.BytesIO()
    write_synthetic_elf(big, [(".nv_fatbin", len(fatbin), [fatbin])])
    wheel = build_wheel(tmp_path / "w", {SO: host_shared_object().read_bytes(), "demo_pkg/libkernels.so": big.getvalue()})
    torch = torch_wheel(tmp_path / "t")
    result = json.loads(subprocess.run([sys.executable, "-c", _WRITES, str(REPO), str(wheel), str(torch)],
                                       capture_output=True, text=True, check=True).stdout)
    assert len(result["problems"]) == 1 and "c10::needs_string" in result["problems"][0]  # it did read them
    assert result["written"] < 64 << 10, result  # c++filt's input, nothing like a member
