"""Exact arch targets: the gate against real nvcc 13.0 output, NVIDIA's compatibility rules as data, stray cubins."""

from __future__ import annotations

import json
import subprocess
import zipfile
from pathlib import Path

import pytest
from nvidia_wheels import cached_wheel
from wheel_factory import NVCC, build_wheel, gencode_shared_object

from ci.checks.check import check_wheels
from ci.formats.archs import (
    COMPAT_FILE,
    CudaArch,
    compatibility,
    fallback,
    parse_arch,
    parse_arch_list,
    satisfies,
    stray_archs,
)
from ci.formats.fatbin import arch_problems, scan_wheel_archs

needs_nvcc = pytest.mark.skipif(not NVCC.is_file(), reason="nvcc not installed")


def _gate(tmp_path: Path, gencodes: tuple[str, ...], arch_list: str, *, device_link: bool = False,
          accepted: tuple[CudaArch, ...] = ()) -> tuple[str, ...]:
    so = gencode_shared_object(gencodes, device_link=device_link)
    wheel = build_wheel(tmp_path, {"pkg/libkernels.so": so.read_bytes(), "pkg/__init__.py": b""}, name="pkg")
    return arch_problems(scan_wheel_archs(wheel, use_cuobjdump=False), parse_arch_list(arch_list), accepted)


# --- the rules, as data ---------------------------------------------------------------------------


def test_rules_are_data_with_their_sources() -> None:
    data = json.loads(COMPAT_FILE.read_text())
    assert any("Binary Compatibility" in source for source in data["sources"])
    assert any("Feature Availability" in source for source in data["sources"])
    rules = compatibility()
    assert rules.cubin_runs_on(parse_arch("12.0f")) == {CudaArch(12, 0), CudaArch(12, 1)}
    assert rules.cubin_runs_on(parse_arch("10.0f")) == {CudaArch(10, 0), CudaArch(10, 3)}
    assert rules.cubin_runs_on(parse_arch("12.0a")) == {CudaArch(12, 0)}
    assert rules.cubin_runs_on(parse_arch("8.0")) == {CudaArch(8, 0), CudaArch(8, 6), CudaArch(8, 7), CudaArch(8, 8),
                                                      CudaArch(8, 9)}
    assert CudaArch(9, 0) not in rules.cubin_runs_on(parse_arch("8.0"))  # never across a major
    assert CudaArch(12, 0) in rules.ptx_runs_on(parse_arch("9.0"))  # PTX is compiled for any later device


def test_exact_target_semantics() -> None:
    assert satisfies(parse_arch("9.0a"), parse_arch("9.0"))  # a plain entry takes any flavour built for it
    assert satisfies(parse_arch("10.0f"), parse_arch("10.0"))
    assert not satisfies(parse_arch("9.0"), parse_arch("9.0a"))
    assert not satisfies(parse_arch("12.0a"), parse_arch("12.0f"))
    assert not satisfies(parse_arch("12.0f"), parse_arch("12.1"))
    assert fallback(parse_arch("12.1"), [parse_arch("12.0f")]) == "sm_120f, which 12.1 devices load by family compatibility"
    assert fallback(parse_arch("8.6"), [parse_arch("8.0")]) == "sm_80, which 8.6 devices load by minor-version compatibility"
    assert fallback(parse_arch("10.0"), [parse_arch("9.0")]) is None
    assert stray_archs(parse_arch_list("8.0;9.0a"), [parse_arch("7.5"), parse_arch("9.0a")]) == (CudaArch(7, 5),)
    # an accepted extra is that exact target only: 10.3a accepts sm_103a, not sm_103 or sm_75
    built = [parse_arch(a) for a in ("9.0", "10.0a", "10.3a", "10.3", "7.5")]
    assert stray_archs(parse_arch_list("9.0;10.0"), built, [parse_arch("10.3a")]) == (CudaArch(7, 5), CudaArch(10, 3))


# --- the gate on real nvcc output -------------------------------------------------------------------


@needs_nvcc
def test_exact_targets_pass(tmp_path: Path) -> None:
    gencodes = ("compute_90a,code=sm_90a", "compute_120f,code=sm_120f")
    assert _gate(tmp_path, gencodes, "9.0a 12.0f") == ()
    assert _gate(tmp_path, gencodes, "9.0;12.0") == ()


@needs_nvcc
def test_family_fallback_is_refused(tmp_path: Path) -> None:
    """flashinfer-cubin's failure: no sm_121 kernel, so a 12.1 GPU loads the 12.0 family's cubin."""
    (problem,) = _gate(tmp_path, ("compute_120f,code=sm_120f",), "12.0f 12.1a")
    assert problem == ("pkg-1.0-cp311-cp311-linux_x86_64.whl: pkg/libkernels.so: 12.1a is covered only through "
                       "sm_120f, which 12.1 devices load by family compatibility; the arch list asks for the exact "
                       "target sm_121a: build that -gencode (code=sm_121a)")


@needs_nvcc
def test_other_flavour_of_the_same_arch_is_refused(tmp_path: Path) -> None:
    (problem,) = _gate(tmp_path, ("compute_90,code=sm_90",), "9.0a")
    assert "9.0a is covered only through sm_90, which lacks the arch-specific instructions of sm_90a" in problem
    (problem,) = _gate(tmp_path, ("compute_120a,code=sm_120a",), "12.0f")
    assert "12.0f is covered only through sm_120a, which is not the family target sm_120f (one cubin for 12.0, 12.1)" \
        in problem


@needs_nvcc
def test_ptx_fallback_is_refused(tmp_path: Path) -> None:
    (problem,) = _gate(tmp_path, ("compute_90,code=compute_90",), "9.0a")
    assert "9.0a is covered only through the PTX compute_90, compiled just in time on 9.0 devices" in problem
    problems = _gate(tmp_path, ("compute_90,code=compute_90",), "10.0")
    assert problems == ("pkg-1.0-cp311-cp311-linux_x86_64.whl: pkg/libkernels.so: 10.0 is covered only through the "
                        "PTX compute_90, compiled just in time on 10.0 devices; the arch list asks for the exact target "
                        "sm_100: build that -gencode (code=sm_100)",)


@needs_nvcc
def test_device_link_default_is_a_stray_cubin(tmp_path: Path) -> None:
    stray_default = ("pkg-1.0-cp311-cp311-linux_x86_64.whl: pkg/libkernels.so: cubins for sm_75, which the arch "
                     "list (9.0a) does not ask for: nvcc's default arch of a device link (-dlink) or a compile "
                     "without -gencode; pass the list's -gencode flags to every nvcc step, the device link too, "
                     "or, where the component's own build adds them on purpose, name them with the reason in its "
                     "extra_cubins in versions.yaml")
    assert _gate(tmp_path, ("compute_90a,code=sm_90a",), "9.0a", device_link=True) == (stray_default,)
    # a declared extra cubin does not let nvcc's default through
    assert _gate(tmp_path, ("compute_90a,code=sm_90a",), "9.0a", device_link=True,
                 accepted=(parse_arch("10.3a"),)) == (stray_default,)


# TransformerEngine's CMake (transformer_engine/common/CMakeLists.txt) compiles its Blackwell-specific kernels for
# 100a and 103a whenever the list has 10.0: its gencodes for a 9.0;10.0 list
TRANSFORMER_ENGINE_GENCODES = ("compute_90,code=sm_90", "compute_100,code=sm_100", "compute_100a,code=sm_100a",
                               "compute_103a,code=sm_103a")


@needs_nvcc
def test_a_cubin_the_build_adds_on_purpose_passes_only_where_versions_yaml_names_it(tmp_path: Path) -> None:
    so = gencode_shared_object(TRANSFORMER_ENGINE_GENCODES).read_bytes()
    wheel = build_wheel(tmp_path, {"te/libtransformer_engine.so": so, "te/__init__.py": b""}, name="te")
    refused = check_wheels([wheel], require_archs="9.0;10.0", use_cuobjdump=False)
    assert [p.split(": ", 2)[2][:63] for p in refused.problems] == [
        "cubins for sm_103a, which the arch list (9.0;10.0) does not ask"]
    reason = "the build adds it beside 10.0: its arch-specific kernels for B300"
    accepted = check_wheels([wheel], require_archs="9.0;10.0", extra_cubins={"10.3a": reason}, use_cuobjdump=False)
    assert accepted.ok, accepted.problems
    assert accepted.wheels[0].allowed_extra_cubins == (f"sm_103a: {reason}",)
    assert f"  extra cubins allowed: sm_103a: {reason}" in accepted.render_text().splitlines()
    assert json.loads(accepted.to_json())["wheels"][0]["allowed_extra_cubins"] == [f"sm_103a: {reason}"]
    # another flavour of that arch is not the target named
    other = check_wheels([wheel], require_archs="9.0;10.0", extra_cubins={"10.3f": reason}, use_cuobjdump=False)
    assert [p.split(": ", 2)[2][:26] for p in other.problems] == ["cubins for sm_103a, which "]
    assert other.wheels[0].allowed_extra_cubins == ()


@needs_nvcc
def test_each_shared_object_must_hold_the_list(tmp_path: Path) -> None:
    """Two objects that together cover the list do not make one that lacks an arch loadable."""
    hopper = gencode_shared_object(("compute_90a,code=sm_90a",)).read_bytes()
    blackwell = gencode_shared_object(("compute_100a,code=sm_100a",)).read_bytes()
    wheel = build_wheel(tmp_path, {"pkg/a.so": hopper, "pkg/b.so": blackwell}, name="pkg")
    report = check_wheels([wheel], require_archs="9.0a;10.0a", use_cuobjdump=False)
    assert [p.split(": ")[1] for p in report.problems] == ["pkg/a.so", "pkg/b.so"]
    assert all("missing required CUDA arch(es)" in p for p in report.problems)


# --- cuobjdump names a family cubin by its base --------------------------------------------------


@pytest.mark.network
@needs_nvcc
def test_cuobjdump_loses_the_family_flag_which_the_scan_restores(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    wheel_file = cached_wheel("nvidia-cuda-cuobjdump", "13.2.51")
    tools = tmp_path / "tools"
    with zipfile.ZipFile(wheel_file) as zf:
        zf.extract("nvidia/cu13/bin/cuobjdump", tools)
    cuobjdump = tools / "nvidia/cu13/bin/cuobjdump"
    cuobjdump.chmod(0o755)
    so = gencode_shared_object(("compute_120f,code=sm_120f",))
    listed = subprocess.run([str(cuobjdump), "--list-elf", str(so)], capture_output=True, text=True, check=True).stdout
    assert listed.strip().endswith(".sm_120.cubin")  # the family target's f is gone
    monkeypatch.setenv("PATH", f"{cuobjdump.parent}:/usr/bin:/bin")
    wheel = build_wheel(tmp_path, {"pkg/libkernels.so": so.read_bytes()}, name="pkg")
    (member,) = scan_wheel_archs(wheel).members
    assert member.method == "cuobjdump" and member.cubins == (CudaArch(12, 0, "f"),)
    assert check_wheels([wheel], require_archs="12.0f").ok
