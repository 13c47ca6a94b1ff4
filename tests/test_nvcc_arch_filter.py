"""build_scripts/nvcc-arch-filter: argument filtering as a function, the script as a process, and the real nvcc."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import shutil
import stat
import struct
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FILTER = REPO / "build_scripts" / "nvcc-arch-filter"

# fast-hadamard-transform's gencodes on a CUDA 13 toolkit.
NINE = ["75", "80", "87", "90", "100", "103", "110", "120", "121"]
NINE_GENCODES = [arg for a in NINE for arg in ("-gencode", f"arch=compute_{a},code=sm_{a}")]


def _load_filter():
    loader = importlib.machinery.SourceFileLoader("nvcc_arch_filter", str(FILTER))
    spec = importlib.util.spec_from_loader(loader.name, loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[loader.name] = module  # dataclasses look their module up here
    loader.exec_module(module)
    return module


naf = _load_filter()


def _filter(args: list[str], allowed: str):
    return naf.filter_args(args, naf.parse_allowed(allowed))


# --- pure functions ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "base"),
    [
        ("sm_90", "9.0"), ("sm_90a", "9.0"), ("compute_90a", "9.0"), ("sm_100f", "10.0"),
        ("compute_121", "12.1"), ("sm_75", "7.5"), ("lto_90", "9.0"), ("sm_103a", "10.3"),
        ("native", None), ("all", None), ("all-major", None), ("bogus", None),
    ],
)
def test_base_arch(target, base):
    assert naf.base_arch(target) == base


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("9.0", {"9.0"}),
        ("9.0;10.0", {"9.0", "10.0"}),
        ("9.0a 10.0a", {"9.0", "10.0"}),
        ("8.0+PTX, 12.0f", {"8.0", "12.0"}),
        ("90;100", {"9.0", "10.0"}),
        ("sm_90", {"9.0"}),
        (" 12.1 ", {"12.1"}),
    ],
)
def test_parse_allowed(raw, expected):
    assert naf.parse_allowed(raw) == frozenset(expected)


@pytest.mark.parametrize("raw", ["", " ; ", "nine", "9.x", "9.0.1"])
def test_parse_allowed_rejects(raw):
    with pytest.raises(naf.FilterError):
        naf.parse_allowed(raw)


def test_nine_gencodes_down_to_one():
    args = ["-c", "k.cu", "-o", "k.o", "--threads", "4", "-O3", *NINE_GENCODES, "--use_fast_math"]
    result = _filter(args, "9.0")
    assert result.args == ["-c", "k.cu", "-o", "k.o", "--threads", "4", "-O3",
                           "-gencode", "arch=compute_90,code=sm_90", "--use_fast_math"]
    assert len(result.dropped) == 8
    assert (result.named_targets, result.kept_targets) == (9, 1)


def test_two_archs_kept_in_order():
    result = _filter(NINE_GENCODES, "10.0;9.0")
    assert result.args == ["-gencode", "arch=compute_90,code=sm_90", "-gencode", "arch=compute_100,code=sm_100"]


@pytest.mark.parametrize(
    ("args", "allowed", "kept"),
    [
        # torch's own spelling, cubin and PTX
        (["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90",
          "-gencode=arch=compute_80,code=sm_80"], "9.0",
         ["-gencode=arch=compute_90,code=sm_90", "-gencode=arch=compute_90,code=compute_90"]),
        # long option, both spellings, bracketed code lists
        (["--generate-code", "arch=compute_100,code=[sm_100,compute_100]",
          "--generate-code=arch=compute_120,code=[compute_120,sm_120]"], "10.0",
         ["--generate-code", "arch=compute_100,code=[sm_100,compute_100]"]),
        # suffixed archs keep their suffix (FlashMLA's sm_90a / sm_100f)
        (["-gencode", "arch=compute_90a,code=sm_90a", "-gencode", "arch=compute_100f,code=sm_100f"], "9.0",
         ["-gencode", "arch=compute_90a,code=sm_90a"]),
        # quoted value as a shell would pass it through verbatim
        (["-gencode", '"arch=compute_90,code=sm_90"', "-gencode", '"arch=compute_80,code=sm_80"'], "9.0",
         ["-gencode", '"arch=compute_90,code=sm_90"']),
        # -arch in every spelling
        (["-arch=sm_80", "-arch", "sm_90"], "9.0", ["-arch", "sm_90"]),
        (["--gpu-architecture=compute_90", "--gpu-architecture", "sm_75"], "9.0", ["--gpu-architecture=compute_90"]),
        # non-specific archs are left to nvcc
        (["-arch=native"], "9.0", ["-arch=native"]),
        (["-arch=all-major", "-gencode", "arch=compute_75,code=sm_75"], "9.0", ["-arch=all-major"]),
        # -code lists lose the entries outside the list
        (["-arch=compute_90", "-code=sm_90,sm_100"], "9.0", ["-arch=compute_90", "-code=sm_90"]),
        (["-arch", "compute_90", "--gpu-code", "sm_90,compute_90,sm_120"], "9.0",
         ["-arch", "compute_90", "--gpu-code", "sm_90,compute_90"]),
        # a -code whose -arch was dropped goes with it
        (["-arch=compute_80", "-code=sm_80,sm_90", "-gencode", "arch=compute_90,code=sm_90"], "9.0",
         ["-gencode", "arch=compute_90,code=sm_90"]),
        # values of other tools' options are never read as nvcc targets
        (["-Xptxas", "-arch=sm_75", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_90,code=sm_90"], "9.0",
         ["-Xptxas", "-arch=sm_75", "-Xcompiler", "-fPIC", "-gencode", "arch=compute_90,code=sm_90"]),
        # lto targets
        (["-gencode", "arch=compute_90,code=lto_90", "-gencode", "arch=compute_80,code=lto_80"], "9.0",
         ["-gencode", "arch=compute_90,code=lto_90"]),
        # an unreadable gencode is nvcc's business
        (["-gencode", "code=sm_90"], "8.0", ["-gencode", "code=sm_90"]),
    ],
)
def test_argument_shapes(args, allowed, kept):
    assert _filter(args, allowed).args == kept


def test_everything_else_passes_verbatim():
    args = ["-c", "/abs/a b.cu", "-o", "x.o", "-DFOO=\"1 2\"", "-I/inc", "--expt-relaxed-constexpr",
            "-std=c++17", "--compiler-options", "'-fPIC'", "-U__CUDA_NO_HALF_OPERATORS__", "-lineinfo"]
    result = _filter(args, "9.0")
    assert result.args == args
    assert (result.named_targets, result.dropped) == (0, [])


def test_all_dropped_is_reported():
    result = _filter(["-c", "k.cu", "-gencode", "arch=compute_80,code=sm_80", "-arch=sm_75"], "9.0")
    assert result.named_targets == 2 and result.kept_targets == 0


def test_dangling_flag_is_left_to_nvcc():
    assert _filter(["-c", "k.cu", "-gencode"], "9.0").args == ["-c", "k.cu", "-gencode"]


# --- the script as nvcc -----------------------------------------------------------


@pytest.fixture()
def fake_nvcc(tmp_path: Path) -> Path:
    """An 'nvcc' that prints its argv as JSON."""
    path = tmp_path / "real" / "nvcc"
    path.parent.mkdir()
    path.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv))\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture()
def shim_dir(tmp_path: Path) -> Path:
    """The layout the build step creates: a directory with an `nvcc` link to the filter."""
    directory = tmp_path / "filter-bin"
    directory.mkdir()
    (directory / "nvcc").symlink_to(FILTER)
    return directory


def _run_shim(shim_dir: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("WHEELHOUSE_")}
    environ["PATH"] = f"{shim_dir}{os.pathsep}{environ.get('PATH', '')}"
    environ.update(env)
    return subprocess.run(["nvcc", *args], env=environ, check=False, capture_output=True, text=True, timeout=60)


def test_script_is_executable_stdlib_python():
    assert os.access(FILTER, os.X_OK)
    assert FILTER.read_text().startswith("#!/usr/bin/env python3\n")


def test_execs_real_nvcc_with_filtered_args(shim_dir, fake_nvcc):
    proc = _run_shim(shim_dir, ["-c", "k.cu", *NINE_GENCODES],
                     WHEELHOUSE_REAL_NVCC=str(fake_nvcc), WHEELHOUSE_NVCC_ARCHS="9.0;10.0")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [str(fake_nvcc), "-c", "k.cu", "-gencode", "arch=compute_90,code=sm_90",
                                       "-gencode", "arch=compute_100,code=sm_100"]
    assert proc.stderr == ""  # quiet unless asked


def test_verbose_logs_once(shim_dir, fake_nvcc):
    proc = _run_shim(shim_dir, ["-c", "k.cu", *NINE_GENCODES], WHEELHOUSE_REAL_NVCC=str(fake_nvcc),
                     WHEELHOUSE_NVCC_ARCHS="9.0", WHEELHOUSE_NVCC_FILTER_VERBOSE="1")
    assert proc.returncode == 0
    lines = proc.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("nvcc-arch-filter: keeping 9.0; dropped: -gencode arch=compute_75,code=sm_75")
    assert "compute_90," not in lines[0]


def test_no_targets_at_all_passes_through(shim_dir, fake_nvcc):
    proc = _run_shim(shim_dir, ["--version"], WHEELHOUSE_REAL_NVCC=str(fake_nvcc), WHEELHOUSE_NVCC_ARCHS="9.0")
    assert json.loads(proc.stdout) == [str(fake_nvcc), "--version"]


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["-c", "k.cu", "-gencode", "arch=compute_80,code=sm_80"], {"WHEELHOUSE_NVCC_ARCHS": "9.0"},
         "no GPU target of this nvcc call is in WHEELHOUSE_NVCC_ARCHS=9.0"),
        (["-c", "k.cu"], {"WHEELHOUSE_NVCC_ARCHS": ""}, "WHEELHOUSE_NVCC_ARCHS is empty"),
        (["-c", "k.cu"], {"WHEELHOUSE_NVCC_ARCHS": "9.x"}, "unreadable arch '9.x'"),
    ],
)
def test_refusals_are_one_line(shim_dir, fake_nvcc, args, env, message):
    proc = _run_shim(shim_dir, args, WHEELHOUSE_REAL_NVCC=str(fake_nvcc), **env)
    assert proc.returncode == 1
    assert proc.stdout == ""  # the real nvcc never ran
    assert len(proc.stderr.splitlines()) == 1
    assert proc.stderr.startswith("nvcc-arch-filter: error: ") and message in proc.stderr


def test_missing_or_recursive_real_nvcc(shim_dir, tmp_path):
    proc = _run_shim(shim_dir, ["-c", "k.cu"], WHEELHOUSE_NVCC_ARCHS="9.0")
    assert proc.returncode == 1 and "WHEELHOUSE_REAL_NVCC is not set" in proc.stderr
    proc = _run_shim(shim_dir, ["-c", "k.cu"], WHEELHOUSE_NVCC_ARCHS="9.0", WHEELHOUSE_REAL_NVCC=str(shim_dir / "nvcc"))
    assert proc.returncode == 1 and "is this filter itself" in proc.stderr
    proc = _run_shim(shim_dir, ["-c", "k.cu"], WHEELHOUSE_NVCC_ARCHS="9.0", WHEELHOUSE_REAL_NVCC=str(tmp_path / "nope"))
    assert proc.returncode == 1 and "is not an executable file" in proc.stderr


# --- the real nvcc ------------------------------------------------------------------


def _real_nvcc() -> Path | None:
    for candidate in (os.environ.get("CUDA_HOME"), "/usr/local/cuda"):
        if candidate and (Path(candidate) / "bin" / "nvcc").is_file():
            return Path(candidate) / "bin" / "nvcc"
    found = shutil.which("nvcc")
    return Path(found) if found else None


REAL_NVCC = _real_nvcc()
needs_nvcc = pytest.mark.skipif(REAL_NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")

KERNEL = "__global__ void scale(float* x, float a, int n) { int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) x[i] *= a; }\n"


def _elf_section(data: bytes, *wanted: str) -> bytes:
    """Bytes of the first section named in ``wanted`` of a 64-bit little-endian ELF file."""
    assert data[:4] == b"\x7fELF" and data[4] == 2 and data[5] == 1
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab = headers[shstrndx][4]
    for name_off, _type, _flags, _addr, offset, size, *_ in headers:
        name = data[strtab + name_off : data.index(b"\0", strtab + name_off)].decode()
        if name in wanted:
            return data[offset : offset + size]
    raise AssertionError(f"none of the sections {wanted}")


def fatbin_archs(obj: Path) -> list[tuple[str, int]]:
    """(kind, sm) of every entry of the object's fat binary: kind 'elf' (cubin) or 'ptx'.

    Whole-program objects keep it in .nv_fatbin, -rdc=true objects in __nv_relfatbin.

    A fatbin is a 16-byte header (magic 0xBA55ED50, version, header size, payload size) followed by
    entries whose headers hold kind (1 PTX, 2 ELF) at 0, header size at 4, payload size at 8 and the
    SM number at 28.
    """
    blob = _elf_section(obj.read_bytes(), ".nv_fatbin", "__nv_relfatbin")
    entries, offset = [], 0
    while offset + 16 <= len(blob):
        magic, _version, header_size, size = struct.unpack_from("<IHHQ", blob, offset)
        if magic != 0xBA55ED50:
            offset += 8  # fatbins are 8-byte aligned inside the section
            continue
        entry, end = offset + header_size, offset + header_size + size
        while entry < end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", blob, entry)
            (sm,) = struct.unpack_from("<I", blob, entry + 28)
            entries.append(({1: "ptx", 2: "elf"}.get(kind, str(kind)), sm))
            entry += entry_header + payload
        offset = end
    return entries


@pytest.fixture()
def kernel_source(tmp_path: Path) -> Path:
    source = tmp_path / "k.cu"
    source.write_text(KERNEL)
    return source


def _dryrun_tools(stderr: str, tool: str) -> list[str]:
    """The `#$ <tool> ...` lines of `nvcc --dryrun` for one tool (ptxas, cicc)."""
    lines = []
    for line in stderr.splitlines():
        words = line.removeprefix("#$ ").split()
        if words and words[0].strip('"').endswith(tool):
            lines.append(line)
    return lines


@needs_nvcc
def test_real_nvcc_dryrun_runs_one_ptxas(shim_dir, kernel_source):
    common = ["--dryrun", "-c", str(kernel_source), "-o", str(kernel_source.with_suffix(".o")), "--threads", "4"]
    unfiltered = subprocess.run([str(REAL_NVCC), *common, *NINE_GENCODES], check=False, capture_output=True, text=True, timeout=60)
    assert unfiltered.returncode == 0, unfiltered.stderr
    ptxas = _dryrun_tools(unfiltered.stderr, "ptxas")
    assert sorted(line.split("-arch=")[1].split()[0] for line in ptxas) == sorted(f"sm_{a}" for a in NINE)
    assert len(_dryrun_tools(unfiltered.stderr, "cicc")) == 9

    filtered = _run_shim(shim_dir, [*common, *NINE_GENCODES], WHEELHOUSE_REAL_NVCC=str(REAL_NVCC),
                         WHEELHOUSE_NVCC_ARCHS="9.0")
    assert filtered.returncode == 0, filtered.stderr
    ptxas = _dryrun_tools(filtered.stderr, "ptxas")
    assert len(ptxas) == 1 and "-arch=sm_90 " in ptxas[0]
    assert len(_dryrun_tools(filtered.stderr, "cicc")) == 1
    assert "sm=90," in filtered.stderr and "sm=75," not in filtered.stderr  # the fatbinary line


@needs_nvcc
def test_real_compile_keeps_only_sm90(shim_dir, kernel_source):
    """fast-hadamard-transform's nine gencodes through the filter set to 9.0: the object holds sm_90 only."""
    obj = kernel_source.with_suffix(".o")
    proc = _run_shim(shim_dir, ["-c", str(kernel_source), "-o", str(obj), "--threads", "4", *NINE_GENCODES],
                     WHEELHOUSE_REAL_NVCC=str(REAL_NVCC), WHEELHOUSE_NVCC_ARCHS="9.0")
    assert proc.returncode == 0, proc.stderr
    assert fatbin_archs(obj) == [("elf", 90)]


@needs_nvcc
def test_real_compile_two_archs_and_the_parser_sees_all(shim_dir, kernel_source, tmp_path):
    filtered = tmp_path / "two.o"
    proc = _run_shim(shim_dir, ["-c", str(kernel_source), "-o", str(filtered), *NINE_GENCODES],
                     WHEELHOUSE_REAL_NVCC=str(REAL_NVCC), WHEELHOUSE_NVCC_ARCHS="9.0a;10.0")
    assert proc.returncode == 0, proc.stderr
    assert sorted(fatbin_archs(filtered)) == [("elf", 90), ("elf", 100)]

    # Control: without the filter the same command yields all nine cubins, so the
    # parser above is not just blind to the others.
    unfiltered = tmp_path / "nine.o"
    subprocess.run([str(REAL_NVCC), "-c", str(kernel_source), "-o", str(unfiltered), *NINE_GENCODES],
                   check=True, timeout=300)
    assert sorted(sm for _, sm in fatbin_archs(unfiltered)) == sorted(int(a) for a in NINE)


@needs_nvcc
def test_real_compile_refuses_no_arch(shim_dir, kernel_source):
    obj = kernel_source.with_suffix(".o")
    proc = _run_shim(shim_dir, ["-c", str(kernel_source), "-o", str(obj), "-gencode", "arch=compute_80,code=sm_80"],
                     WHEELHOUSE_REAL_NVCC=str(REAL_NVCC), WHEELHOUSE_NVCC_ARCHS="9.0")
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert not obj.exists()
