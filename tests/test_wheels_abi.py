"""Torch ABI check: the fixture extension against the venv's torch, and crafted mismatches."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from wheel_factory import build_wheel, host_shared_object

from ci.base.errors import CheckFailed
from ci.checks.abi import check_torch_abi, resolve_torch_target, torch_expected

TORCH_DIR = Path(__import__("torch").__file__).parent


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("_ZN3c106detail14torchCheckFailEPKcS2_jS2_", True),
        ("_ZNK2at10TensorBase4sizeEl", True),
        ("_ZN5torch8autograd12VariableInfoC1Ev", True),
        ("_ZTVN3c1011StorageImplE", True),
        ("_ZTIN2at6TensorE", True),
        ("_ZN6caffe28TypeMeta3NewEv", True),
        ("_ZN8pybind116detail11type_casterIN2at6TensorEvE4loadENS_6handleEb", True),
        ("_Z16THPVariable_WrapRKN2at10TensorBaseE", True),
        ("THPVariableClass", True),
        ("aoti_torch_get_device_type", True),
        ("PyLong_AsLong", False),
        ("_ZNSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEE9_M_createERmm", False),
        ("_Z3fooRKN2at6TensorE", False),  # the extension's own function taking a Tensor
        ("_ZN6mylibs3atXEv", False),
        ("memcpy", False),
    ],
)
def test_torch_expected_rule(name: str, expected: bool) -> None:
    assert torch_expected(name) is expected


@pytest.mark.parametrize("kind", ["python", "site-packages", "torch-dir"])
def test_fixture_passes_against_venv_torch(fixture_wheel: Path, kind: str) -> None:
    target = {"python": Path(sys.executable), "site-packages": TORCH_DIR.parent, "torch-dir": TORCH_DIR}[kind]
    result = check_torch_abi(fixture_wheel, target)
    assert result.ok, result.problems
    (elf,) = result.elves
    assert elf.member == "wheelhouse_fixture/_C.cpython-311-x86_64-linux-gnu.so"
    assert elf.needed >= 5 and elf.missing == ()
    assert elf.uses_cxx11_abi is True and result.torch_cxx11_abi is True
    assert result.torch_version.startswith("2.13")


def test_missing_symbol_and_old_abi_are_reported(tmp_path: Path) -> None:
    so = host_shared_object(["-D_GLIBCXX_USE_CXX11_ABI=0"])
    wheel = build_wheel(tmp_path, {"demo_pkg/_C.cpython-311-x86_64-linux-gnu.so": so.read_bytes()})
    result = check_torch_abi(wheel, TORCH_DIR)
    assert not result.ok
    old_string = "std::basic_string<char, std::char_traits<char>, std::allocator<char> >"
    assert result.missing == {
        "demo_pkg/_C.cpython-311-x86_64-linux-gnu.so": (f"c10::needs_string({old_string} const&)",)
    }
    assert result.elves[0].uses_cxx11_abi is False
    assert len(result.problems) == 2
    assert "needs 1 symbol(s) that torch 2.13.0+cpu" in result.problems[0]
    assert result.problems[1].endswith("built with _GLIBCXX_USE_CXX11_ABI=1; rebuild with -D_GLIBCXX_USE_CXX11_ABI=1")


def test_bad_targets_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(CheckFailed, match="does not exist"):
        resolve_torch_target(tmp_path / "nope")
    with pytest.raises(CheckFailed, match="neither a torch package dir nor a site-packages"):
        resolve_torch_target(tmp_path)
    bare = tmp_path / "python-without-torch"
    bare.write_text("#!/bin/sh\necho null\n")
    bare.chmod(0o755)
    with pytest.raises(CheckFailed, match="torch is not installed for this interpreter"):
        resolve_torch_target(bare)


@pytest.mark.parametrize("static", [False, True], ids=["shared-libstdc++", "static-libstdc++"])
def test_an_extension_with_its_own_libstdcxx_beside_torch_is_refused(tmp_path: Path, static: bool) -> None:
    """Linked to torch (DT_NEEDED libc10.so) with libstdc++ inside: std::regex breaks at run time (seen on the
    GPU machine, whose CXX wrapper adds -static-libstdc++), so the wheel must not ship; needs no torch target."""
    from ci.checks.check import check_wheels

    flags = [f"-L{TORCH_DIR / 'lib'}", "-Wl,--no-as-needed", "-lc10", *(["-static-libstdc++"] if static else [])]
    so = host_shared_object(flags)
    wheel = build_wheel(tmp_path, {"demo_pkg/_C.cpython-311-x86_64-linux-gnu.so": so.read_bytes()})
    report = check_wheels([wheel])
    static_problems = [p for p in report.problems if "libstdc++ was linked in statically" in p]
    if static:
        assert static_problems == [
            f"{wheel.name}: demo_pkg/_C.cpython-311-x86_64-linux-gnu.so links libc10.so but not libstdc++.so.6: "
            "libstdc++ was linked in statically (-static-libstdc++, or a compiler wrapper that adds it), and beside "
            "torch's shared one std::regex crashes at run time; build with a compiler that links libstdc++ "
            "dynamically (CXX)"]
    else:
        assert static_problems == []


def test_any_shared_object_with_its_own_libstdcxx_is_refused(tmp_path: Path) -> None:
    """Not only modules that link torch: a helper library with -static-libstdc++ carries a second libstdc++ too."""
    from ci.checks.check import check_wheels

    static = build_wheel(tmp_path / "static", {"demo_pkg/libhelper.so": host_shared_object(["-static-libstdc++"])
                                               .read_bytes()})
    problems = [p for p in check_wheels([static]).problems if "libstdc++" in p]
    assert len(problems) == 1
    assert re.fullmatch(
        re.escape(f"{static.name}: demo_pkg/libhelper.so defines the C++ runtime's ") + r"(__gxx_personality_v0|"
        r"__cxa_throw|__cxa_begin_catch|_ZSt9terminatev|_ZNSt6locale7classicEv|_ZNSt8ios_base4InitC1Ev)"
        + re.escape(" but does not link libstdc++.so.6: libstdc++ was linked in statically (-static-libstdc++, or a "
                    "compiler wrapper that adds it), and beside torch's shared one std::regex crashes at run time; "
                    "build with a compiler that links libstdc++ dynamically (CXX)"), problems[0])
    shared = build_wheel(tmp_path / "shared", {"demo_pkg/libhelper.so": host_shared_object().read_bytes()})
    assert check_wheels([shared]).ok


@pytest.mark.parametrize("cuda_torch", [False, True], ids=["cpu-torch", "cuda-torch"])
def test_cuda_wheel_against_a_cpu_torch_is_told_so(tmp_path: Path, cuda_torch: bool) -> None:
    """Checked against a CPU build, a CUDA wheel misses torch's CUDA symbols: the fix is the row's CUDA torch."""
    from hostile_wheels import SHT_PROGBITS, elf, fatbin_container
    from stand_in_torch import torch_dir

    from ci.checks.check import check_wheels

    kernels = elf([(".nv_fatbin", SHT_PROGBITS, fatbin_container(90), 0, 0)])
    wheel = build_wheel(tmp_path / "w", {"demo_pkg/_C.cpython-311-x86_64-linux-gnu.so": host_shared_object()
                                         .read_bytes(), "demo_pkg/libkernels.so": kernels})
    torch = torch_dir(tmp_path / "t", cuda=cuda_torch)
    (problem,) = check_wheels([wheel], torch_target=torch).problems
    assert problem.startswith(f"{wheel.name}: demo_pkg/_C.cpython-311-x86_64-linux-gnu.so needs 1 symbol(s) that "
                              f"torch 2.13.0 (torch at {torch}) does not export: c10::needs_string(")
    if cuda_torch:
        assert problem.endswith("; rebuild against that torch")
    else:
        assert problem.endswith(f"; torch at {torch} is a CPU build; a CUDA wheel needs the row's CUDA torch "
                                "(pass it to --torch)")
