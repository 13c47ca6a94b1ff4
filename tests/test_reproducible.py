"""Byte-identical rebuilds: real builds twice in fresh directories, the wheel normalization, the sources'
time, nvcc's device code from the canonical directory, and what the comparison names when bytes differ."""

from __future__ import annotations

import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile
from fixture_versions import without_smoke_test

from ci.base.digest import sha256_file
from ci.building import job, rebuild, reproducible
from ci.building.sources import Checkout
from ci.formats.archive import open_wheel
from ci.formats.record import check_record
from ci.formats.rewrite import add_members, normalize_wheel
from ci.model import matrix
from ci.model.versions import load
from tests.wheel_factory import NVCC, build_wheel, host_shared_object

REPO = Path(__file__).resolve().parent.parent
FIXTURE_VERSIONS = REPO / "tests" / "fixtures" / "versions.yaml"
DEVICE_VERSIONS = REPO / "tests" / "fixtures" / "versions-device.yaml"
EPOCH = 1_700_000_000  # 2023-11-14T22:13:20Z


def _rebuild(tmp_path: Path, versions_file: Path, component: str, *, source: Path | None = None,
             environ: dict | None = None) -> rebuild.RebuildReport:
    versions = load(versions_file)
    row = next(r for r in matrix.expand(versions) if r.component == component)
    options = job.BuildOptions(cache_dir=tmp_path / "cache", reuse_env=True, source=source,
                                 environ=environ or dict(os.environ))
    return rebuild.rebuild_check(versions, row, options, tmp_path / "work")


# --- real builds, twice --------------------------------------------------------------------------


def test_the_fixture_extension_rebuilt_in_another_directory_is_the_same_bytes(tmp_path):
    """The demo's torch extension, built in two fresh cache directories one after the other (another
    build directory, another time, another compiler cache): one sha256."""
    report = _rebuild(tmp_path, FIXTURE_VERSIONS, "wheelhouse-fixture")
    print(report.render())
    (wheel,) = report.wheels
    assert report.identical and wheel.sha256[0] == wheel.sha256[1] and not wheel.differences
    built = sorted((tmp_path / "work").glob("*/dist/*/*/*.whl"))
    assert len(built) == 2 and built[0].parent.parent.parent.parent != built[1].parent.parent.parent.parent
    # what made it so: every member dated from the sources' own time (their last commit, or 1980 when the
    # checkout changed them), fixed modes, RECORD valid
    newest = reproducible.directory_epoch(REPO / "tests" / "fixtures" / "fixture_ext")
    with zipfile.ZipFile(built[0]) as zf:
        infos = zf.infolist()
        assert {info.date_time for info in infos} == {_zip_date(newest)}
        assert {info.external_attr >> 16 for info in infos} <= {0o100644, 0o100755}
        assert any(info.filename.endswith(".so") and info.external_attr >> 16 == 0o100755 for info in infos)
        assert infos[-1].filename.endswith(".dist-info/RECORD")
        text = b"".join(zf.read(info) for info in infos if info.filename.endswith(".so"))
    assert str(tmp_path).encode() not in text and b"/srv/wheelhouse-src" not in text  # no build path embedded
    with open_wheel(built[0]) as archive:
        assert check_record(archive) == []


def _tinypkg(project: Path) -> None:
    (project / "tinypkg").mkdir(parents=True)
    (project / "tinypkg" / "__init__.py").write_text('VERSION = "0.3.0"\n')
    (project / "tinypkg" / "data.txt").write_text("payload\n")
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "tinypkg"\nversion = "0.3.0"\n[tool.setuptools.package-data]\ntinypkg = ["*.txt"]\n')


def _component_versions(tmp_path: Path, name: str, builder: str) -> Path:
    versions_file = tmp_path / f"versions-{name}.yaml"
    versions_file.write_text(
        without_smoke_test()  # the fixture's smoke test imports the fixture's package
        .replace("wheelhouse-fixture:", f"{name}:")
        .replace("builder: fixture", f"builder: {builder}")
        .replace("wheel_packages: [wheelhouse-fixture]", f"wheel_packages: [{name}]"))
    return versions_file


def test_a_pure_python_component_rebuilt_is_the_same_bytes(tmp_path):
    """A small local pure-Python project through the Megatron-Bridge builder (pip wheel, setuptools)."""
    project = tmp_path / "project"
    _tinypkg(project)
    report = _rebuild(tmp_path, _component_versions(tmp_path, "tinypkg", "megatron_bridge"), "tinypkg", source=project)
    print(report.render())
    assert [w.name for w in report.wheels] == ["tinypkg-0.3.0-py3-none-any.whl"]
    assert report.identical, report.render()


def _build_from(tmp_path: Path, versions_file: Path, source: Path, name: str) -> job.BuildResult:
    versions = load(versions_file)
    (row,) = matrix.expand(versions)
    options = job.BuildOptions(cache_dir=tmp_path / f"cache-{name}", dist_root=tmp_path / f"dist-{name}",
                                 reuse_env=True, source=source)
    return job.run(versions, row, options)


def test_two_clones_of_a_directory_source_made_apart_build_the_same_bytes(tmp_path):
    """R14: a directory source's SOURCE_DATE_EPOCH was its newest file's mtime, which a checkout sets, so two
    clones of one commit gave two wheels. It is the last commit's time now, from the contents alone."""
    upstream = tmp_path / "upstream"
    _tinypkg(upstream)
    committed = {"GIT_AUTHOR_DATE": "2024-05-01T12:00:00Z", "GIT_COMMITTER_DATE": "2024-05-01T12:00:00Z"}
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q", str(upstream)], check=True)
    subprocess.run([*git, "-C", str(upstream), "add", "."], check=True)
    subprocess.run([*git, "-C", str(upstream), "commit", "-qm", "tinypkg"], check=True, env={**os.environ, **committed})
    clones = [tmp_path / "clone-1", tmp_path / "clone-2"]
    for clone in clones:
        subprocess.run(["git", "clone", "-q", str(upstream), str(clone)], check=True)
    later = time.time() + 3600  # the second clone made an hour after the first
    for path in clones[1].rglob("*"):
        os.utime(path, (later, later), follow_symlinks=False)
    assert reproducible.directory_epoch(clones[0]) == reproducible.directory_epoch(clones[1]) == 1714564800
    versions_file = _component_versions(tmp_path, "tinypkg", "megatron_bridge")
    wheels = [_build_from(tmp_path, versions_file, clone, clone.name).wheels[0] for clone in clones]
    assert sha256_file(wheels[0]) == sha256_file(wheels[1])
    with zipfile.ZipFile(wheels[0]) as zf:
        assert {info.date_time for info in zf.infolist()} == {(2024, 5, 1, 12, 0, 0)}
    # a clone with a change git does not hold has no commit time of its own: 1980, the same for every copy
    (clones[1] / "tinypkg" / "data.txt").write_text("changed\n")
    assert reproducible.directory_epoch(clones[1]) == reproducible.UNCOMMITTED_EPOCH
    # build outputs a build never copies (build/, *.egg-info) do not make a checkout changed
    (clones[0] / "build").mkdir()
    (clones[0] / "tinypkg.egg-info").mkdir()
    (clones[0] / "tinypkg.egg-info" / "PKG-INFO").write_text("x\n")
    assert reproducible.directory_epoch(clones[0]) == 1714564800
    assert reproducible.directory_epoch(tmp_path / "upstream" / "tinypkg") == 1714564800  # a directory in a repo


def test_a_setup_py_that_lists_its_requirements_from_a_set_builds_the_same_bytes_under_any_hash_seed(tmp_path):
    """TransformerEngine's setup.py gathers its requirements in a set, so their order in METADATA followed the
    build's random string hashing: two builds on the GPU machine differed in METADATA and RECORD alone. The build
    fixes PYTHONHASHSEED, whatever the caller's."""
    project = tmp_path / "project"
    _tinypkg(project)
    (project / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=77"]\nbuild-backend = "setuptools.build_meta"\n')
    requirements = [f"dependency-{letter}" for letter in "abcdefghij"]
    (project / "setup.py").write_text(
        "from setuptools import setup\n"
        f"setup(name='tinypkg', version='0.3.0', packages=['tinypkg'], install_requires=list(set({requirements!r})))\n")
    versions_file = _component_versions(tmp_path, "tinypkg", "megatron_bridge")
    versions = load(versions_file)
    (row,) = matrix.expand(versions)
    wheels = []
    for seed in ("1", "2"):
        options = job.BuildOptions(cache_dir=tmp_path / f"cache-{seed}", dist_root=tmp_path / f"dist-{seed}",
                                   reuse_env=True, source=project, environ={**os.environ, "PYTHONHASHSEED": seed})
        wheels.append(job.run(versions, row, options).wheels[0])
    with zipfile.ZipFile(wheels[0]) as zf:
        listed = [line.split(": ", 1)[1] for line in zf.read("tinypkg-0.3.0.dist-info/METADATA").decode().splitlines()
                  if line.startswith("Requires-Dist: ")]
    assert sorted(listed) == requirements
    assert sha256_file(wheels[0]) == sha256_file(wheels[1]), reproducible.compare_wheels(*wheels)


@pytest.mark.skipif(shutil.which("cmake") is None or shutil.which("g++") is None, reason="needs cmake and g++")
def test_a_cmake_build_that_sets_its_own_flags_gets_the_prefix_maps_too(tmp_path):
    """TransformerEngine's common library: its CMakeLists.txt sets CMAKE_CXX_FLAGS before project(), which hides
    CXXFLAGS, and its __FILE__ strings named the build machine's directory in .rodata, so our own path check
    refused its wheel. The build's compilers are wrappers that put the prefix maps first whatever flags a
    build sets."""
    versions_file = _component_versions(tmp_path, "cmake-demo", "megatron_bridge")
    result = _build_from(tmp_path, versions_file, REPO / "tests" / "fixtures" / "cmake_ext", "cmake")
    (wheel,) = result.wheels
    with zipfile.ZipFile(wheel) as zf:
        library = zf.read("cmake_demo/libcmake_demo.so")
    assert b"./where.cpp" in library  # __FILE__, mapped
    for build_path in (b"/srv/wheelhouse-src", str(tmp_path).encode(), str(REPO).encode()):
        assert build_path not in library


@pytest.mark.slow
@pytest.mark.skipif(not NVCC.exists(), reason="needs nvcc 13.0")
def test_causal_conv1d_rebuilt_with_nvcc_is_the_same_bytes(tmp_path):
    """causal-conv1d 1.7.0 from its sdist, device code for sm_90 from real nvcc (no GPU needed). Needs a CUDA
    build of torch in this interpreter and the sdist in WHEELHOUSE_CACHE's sources/sdist (or the index)."""
    torch = pytest.importorskip("torch")
    if torch.version.cuda is None:
        pytest.skip(f"torch {torch.__version__} is a CPU build: causal-conv1d needs torch's CUDA headers")
    cache = Path(os.environ.get("WHEELHOUSE_CACHE", REPO / ".cache"))
    versions = load(DEVICE_VERSIONS)
    row = next(r for r in matrix.expand(versions) if r.component == "causal-conv1d")
    options = job.BuildOptions(cache_dir=cache, reuse_env=True)
    started = time.monotonic()
    report = rebuild.rebuild_check(versions, row, options, tmp_path / "work")
    print(report.render(), f"\nboth builds: {time.monotonic() - started:.0f} s")
    assert report.identical, report.render()


# --- nvcc: what the canonical directory and the pinned times are for ------------------------------

KERNEL = '#include <cstdio>\n__global__ void k(float* x) { x[threadIdx.x] *= 2.f; }\n' \
         'void launch(float* x) { k<<<1, 32>>>(x); printf("%s\\n", __FILE__); }\n'


def _nvcc_object(src_dir: Path, out: Path, epoch: int | None) -> bytes:
    """``k.cu`` written into ``src_dir`` now (a fresh mtime, as a copy gives), compiled with -lineinfo."""
    shutil.rmtree(src_dir, ignore_errors=True)
    src_dir.mkdir(parents=True)
    (src_dir / "k.cu").write_text(KERNEL)
    if epoch is not None:
        reproducible.pin_source_times(src_dir, epoch)
    variables = reproducible.build_variables({}, epoch=epoch or EPOCH, source_dir=src_dir, site_packages="/nowhere")
    subprocess.run([str(NVCC), "-c", "-lineinfo", "-gencode", "arch=compute_90,code=sm_90", "-Xcompiler", "-fPIC",
                    str(src_dir / "k.cu"), "-o", str(out)], cwd=src_dir, check=True,
                   env={**os.environ, "NVCC_APPEND_FLAGS": variables["NVCC_APPEND_FLAGS"]})
    return out.read_bytes()


def _section(data: bytes, name: str) -> bytes:
    return ELFFile(io.BytesIO(data)).get_section_by_name(name).data()


@pytest.mark.skipif(not NVCC.exists(), reason="needs nvcc 13.0")
def test_nvcc_device_code_names_the_source_path_and_its_mtime(tmp_path):
    """nvcc 13.0 with -lineinfo writes the source's directory and its mtime into the device line table in
    ``.nv_fatbin``; -ffile-prefix-map reaches only the host part. From one directory with the times
    pinned, the device code is the same bytes; from two directories it is not, whatever flags."""
    first = _nvcc_object(tmp_path / "one" / "src", tmp_path / "a.o", None)
    elsewhere = _nvcc_object(tmp_path / "two" / "deeper" / "src", tmp_path / "b.o", None)
    assert str(tmp_path / "one" / "src").encode() in _section(first, ".nv_fatbin")
    assert _section(first, ".nv_fatbin") != _section(elsewhere, ".nv_fatbin")
    assert str(tmp_path).encode() not in _section(first, ".rodata")  # the host part is mapped
    time.sleep(1.1)  # a later copy: another mtime unless pinned
    unpinned = _nvcc_object(tmp_path / "one" / "src", tmp_path / "c.o", None)
    assert _section(first, ".nv_fatbin") != _section(unpinned, ".nv_fatbin")
    pinned = [_nvcc_object(tmp_path / "one" / "src", tmp_path / f"p{i}.o", EPOCH) for i in range(2)]
    assert _section(pinned[0], ".nv_fatbin") == _section(pinned[1], ".nv_fatbin")
    # the host object names nvcc's pid-named temporary file; a link that discards local symbols does not
    assert b"tmpxft_" in pinned[0]
    libraries = []
    for i in range(2):
        obj = tmp_path / f"p{i}.o"
        subprocess.run(["g++", "-shared", reproducible.DISCARD_LOCAL_SYMBOLS, str(obj), "-o", str(tmp_path / f"p{i}.so")],
                       check=True)
        libraries.append((tmp_path / f"p{i}.so").read_bytes())
    assert b"tmpxft_" not in libraries[0] and libraries[0] == libraries[1]


# flashinfer 0.6.13's JIT link rules (flashinfer/jit/cpp_ext.py): its own ldflags, then FLASHINFER_EXTRA_LDFLAGS;
# LDFLAGS is never read
FLASHINFER_LDFLAGS = ["-shared", "-L$cuda_home/lib64", "-lcudart"]
FLASHINFER_LINKS = {"link": ["c++", "$in", "$ldflags", "-o", "$out"],
                    "nvcc_link": [str(NVCC), "-shared", "$in", "$ldflags", "-o", "$out"]}


def _flashinfer_link(rule: str, obj: Path, out: Path, extra_ldflags: str) -> bytes:
    ldflags = [f.replace("$cuda_home", str(NVCC.parent.parent)) for f in FLASHINFER_LDFLAGS] + shlex.split(extra_ldflags)
    command = []
    for word in FLASHINFER_LINKS[rule]:
        command += {"$in": [str(obj)], "$ldflags": ldflags, "$out": [str(out)]}.get(word, [word])
    subprocess.run(command, check=True, capture_output=True)
    return out.read_bytes()


@pytest.mark.skipif(not NVCC.exists(), reason="needs nvcc 13.0")
def test_flashinfers_jit_links_get_the_builds_linker_flags_in_a_form_nvcc_takes(tmp_path):
    """flashinfer links each jit-cache module itself, with c++ or ``nvcc -shared`` and FLASHINFER_EXTRA_LDFLAGS, not
    LDFLAGS: the discard of local symbols never reached them, so a module compiled by nvcc alone kept its pid-named
    temporary file in .symtab. The builder's JIT environment puts the build's LDFLAGS there, -Wl, rewritten to
    -Xlinker, which nvcc takes; two compiles then link to the same bytes by either rule, and without it they do
    not."""
    build_ldflags = reproducible.build_variables({}, epoch=EPOCH, source_dir=tmp_path, site_packages="/nowhere")["LDFLAGS"]
    shell = subprocess.run(["bash", "-c", f'set -euo pipefail; source "{REPO}/build_scripts/lib/env.sh"; '
                            f'source "{REPO}/build_scripts/lib/flashinfer.sh"; flashinfer_jit_environment; '
                            'echo "$FLASHINFER_EXTRA_LDFLAGS"'],
                           env={"PATH": os.environ["PATH"], "LDFLAGS": build_ldflags, "FLASHINFER_EXTRA_LDFLAGS": "-lm"},
                           capture_output=True, text=True, check=True)
    extra = shell.stdout.strip()
    assert extra == "-lm -Xlinker --discard-all"  # the row's own first, then the build's
    objects = [tmp_path / f"m{i}.o" for i in range(2)]
    for obj in objects:  # two nvcc processes: two pids
        _nvcc_object(tmp_path / "src", obj, EPOCH)
    for rule in FLASHINFER_LINKS:
        plain = [_flashinfer_link(rule, obj, tmp_path / f"{rule}-plain-{obj.stem}.so", "-lm") for obj in objects]
        assert plain[0] != plain[1] and b"tmpxft_" in plain[0], rule
        given = [_flashinfer_link(rule, obj, tmp_path / f"{rule}-{obj.stem}.so", extra) for obj in objects]
        assert given[0] == given[1] and b"tmpxft_" not in given[0], rule
    failed = subprocess.run([str(NVCC), "-shared", str(objects[0]), build_ldflags, "-o", str(tmp_path / "x.so")],
                            capture_output=True, text=True)
    assert failed.returncode != 0 and "Unknown option '-Wl,--discard-all'" in failed.stderr  # why the rewrite


# --- nvcc: the module id in internal-linkage names -----------------------------------------------

# No plain external definition (only templates), like many kernel files: cudafe++ then makes the module id
# from a hash and its own pid (cudafe++ runs as nvcc's child), and writes it into every internal-linkage name
INTERNAL_KERNEL = ("namespace { __device__ float twice(float v) { return 2.f * v; } }\n"
                   "static __device__ float thrice(float v) { return 3.f * v; }\n"
                   "template <int N> __global__ void scale(float* x) { x[threadIdx.x] = N * thrice(twice(x[threadIdx.x])); }\n"
                   "template <int N> void launch(float* x) { scale<N><<<1, 32>>>(x); }\n"
                   "template void launch<3>(float*);\n")
CALLER = ("template <int N> void launch(float*);\nextern template void launch<3>(float*);\n"
          "int main(int argc, char**) { if (argc > 1) launch<3>(nullptr); return 0; }\n")


def _internal_names(data: bytes) -> list[tuple[bytes, bytes]]:
    """(path hash, module id) of each ``_ZN<length>_INTERNAL_<path hash>_8_scale_cu_<module id>`` in ``data``,
    cut by the mangled length (the module id's digits run into the next name's length)."""
    found = []
    for match in re.finditer(rb"_ZN(\d+)(_INTERNAL_)", data):
        identifier = data[match.start(2):match.start(2) + int(match.group(1))]
        parts = re.fullmatch(rb"_INTERNAL_([0-9a-f]{8})_8_scale_cu_(.+)", identifier)
        assert parts, identifier
        found.append((parts.group(1), parts.group(2)))
    return found


def _nvcc_compile(src_dir: Path, out: Path, nvcc_flags: str, *extra: str) -> bytes:
    """``scale.cu`` in ``src_dir`` (times pinned) compiled by a fresh nvcc process with ``nvcc_flags`` in
    NVCC_APPEND_FLAGS, as torch and CMake builds pass them."""
    subprocess.run([str(NVCC), "-c", "-lineinfo", "-gencode", "arch=compute_90,code=sm_90", "-Xcompiler", "-fPIC",
                    *extra, "scale.cu", "-o", str(out)], cwd=src_dir, check=True,
                   env={**os.environ, "NVCC_APPEND_FLAGS": nvcc_flags})
    return out.read_bytes()


def _device_functions(shared_object: bytes) -> set[tuple[str, str]]:
    """The functions (name, binding) of the sm_90 cubin inside the shared object's ``.nv_fatbin``."""
    fatbin = _section(shared_object, ".nv_fatbin")
    cubin = ELFFile(io.BytesIO(fatbin[fatbin.index(b"\x7fELF"):]))
    assert cubin["e_machine"] == "EM_CUDA"
    return {(sym.name, sym["st_info"]["bind"]) for sym in cubin.get_section_by_name(".symtab").iter_symbols()
            if sym["st_info"]["type"] == "STT_FUNC"}


@pytest.mark.skipif(not NVCC.exists(), reason="needs nvcc 13.0")
def test_nvcc_internal_names_carry_the_seed_instead_of_the_pid(tmp_path):
    """Two compiles of one file from one directory with pinned times, in two nvcc processes a second apart:
    without a seed the internal-linkage names differ in the module id (cudafe++'s pid), and so do the objects'
    device code and the linked libraries; with the build's NVCC_APPEND_FLAGS the libraries are the same bytes,
    the kernel is still in the cubin, and a program calling it links and starts."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "scale.cu").write_text(INTERNAL_KERNEL)
    reproducible.pin_source_times(src, EPOCH)
    variables = reproducible.build_variables({}, epoch=EPOCH, source_dir=src, site_packages="/nowhere")
    seed = reproducible.nvcc_random_seed(src)
    assert seed in variables["NVCC_APPEND_FLAGS"].split()
    unseeded = variables["NVCC_APPEND_FLAGS"].replace(seed, "")

    def build_twice(flags: str, name: str) -> tuple[list[bytes], list[bytes]]:
        objects, libraries = [], []
        for i in range(2):
            time.sleep(1.1 * i)
            objects.append(_nvcc_compile(src, tmp_path / f"{name}{i}.o", flags))
            library = tmp_path / f"lib{name}{i}.so"
            subprocess.run(["g++", "-shared", reproducible.DISCARD_LOCAL_SYMBOLS, str(tmp_path / f"{name}{i}.o"),
                            "-o", str(library)], check=True)
            libraries.append(library.read_bytes())
        return objects, libraries

    objects, libraries = build_twice(unseeded, "unseeded")
    names = [_internal_names(lib) for lib in libraries]
    assert names[0] and names[1] and len(names[0]) == len(names[1])
    assert {path_hash for path_hash, _ in names[0] + names[1]} == {names[0][0][0]}  # the file's part: one
    ids = [{module_id for _, module_id in found} for found in names]
    assert len(ids[0]) == len(ids[1]) == 1 and ids[0] != ids[1]  # the module id: one per compile, not the same
    assert all(re.fullmatch(rb"[0-9a-f]{8}_\d+", module_id) for module_id in ids[0] | ids[1])  # hash_pid
    assert _section(objects[0], ".nv_fatbin") != _section(objects[1], ".nv_fatbin")
    assert libraries[0] != libraries[1]

    objects, libraries = build_twice(variables["NVCC_APPEND_FLAGS"], "seeded")
    assert _section(objects[0], ".nv_fatbin") == _section(objects[1], ".nv_fatbin")
    # what still differs between the objects is the pid-named temporary file, which the link drops
    assert objects[0] != objects[1]
    masked = [re.sub(rb"tmpxft_[0-9a-f]{8}_", b"tmpxft_", o) for o in objects]
    assert masked[0] == masked[1]
    assert libraries[0] == libraries[1]
    names = _internal_names(libraries[0])
    assert names and {module_id for _, module_id in names} == {f"{int(seed.split('=')[1], 16):08x}".encode()}
    assert _device_functions(libraries[0]) == {("_Z5scaleILi3EEvPf", "STB_GLOBAL")}

    (tmp_path / "caller.cpp").write_text(CALLER)
    cuda_lib = NVCC.parent.parent / "lib64"
    subprocess.run(["g++", str(tmp_path / "caller.cpp"), str(tmp_path / "libseeded0.so"), f"-L{cuda_lib}", "-lcudart",
                    f"-Wl,-rpath,{tmp_path}:{cuda_lib}", "-o", str(tmp_path / "caller")], check=True)
    subprocess.run([str(tmp_path / "caller")], check=True)  # loads; launching would need a GPU


PART = ("namespace { __device__ float factor(float v) { return FACTOR * v; } }\n"
        "template <int N> __global__ void part(float* x) { x[threadIdx.x] = factor(x[threadIdx.x]) + N; }\n"
        "template __global__ void part<FACTOR>(float*);\n")


@pytest.mark.skipif(not NVCC.exists(), reason="needs nvcc 13.0")
def test_one_seed_keeps_two_source_files_apart_at_the_device_link(tmp_path):
    """The seed is one for the whole build: two files of the same name in two directories, compiled for a
    device link (-rdc), still get two module ids (the path hash differs) and link. One file compiled twice
    with other defines gets the same id twice and the device link fails, loudly (nvcc asks for a seed per
    file); without a seed it links. If a later nvcc mixes more into the id, this test says so."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "part.cu").write_text(PART)
    flags = reproducible.build_variables({}, epoch=EPOCH, source_dir=tmp_path, site_packages="/nowhere")[
        "NVCC_APPEND_FLAGS"]

    def compile_part(folder: str, factor: int, nvcc_flags: str) -> Path:
        out = tmp_path / f"{folder}{factor}{'s' if nvcc_flags else ''}.o"
        subprocess.run([str(NVCC), "-rdc=true", "-c", "-gencode", "arch=compute_90,code=sm_90", "-Xcompiler", "-fPIC",
                        f"-DFACTOR={factor}", "part.cu", "-o", str(out)], cwd=tmp_path / folder, check=True,
                       env={**os.environ, "NVCC_APPEND_FLAGS": nvcc_flags})
        return out

    def device_link(*objects: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(NVCC), "-dlink", "-gencode", "arch=compute_90,code=sm_90", "-Xcompiler", "-fPIC",
                               *map(str, objects), "-o", str(tmp_path / "dlink.o")], capture_output=True, text=True,
                              env={**os.environ, "NVCC_APPEND_FLAGS": ""})

    apart = device_link(compile_part("a", 2, flags), compile_part("b", 5, flags))
    assert apart.returncode == 0, apart.stderr
    twice = device_link(tmp_path / "a2s.o", compile_part("a", 5, flags))
    assert twice.returncode != 0 and "redefinition" in twice.stderr and "__cudaRegisterLinkedBinary_" in twice.stderr
    unseeded = device_link(compile_part("a", 2, ""), compile_part("a", 5, ""))
    assert unseeded.returncode == 0, unseeded.stderr


# --- the sources' time ---------------------------------------------------------------------------


def test_source_date_epoch_of_a_git_commit_an_sdist_and_a_directory(tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "a.txt").write_text("a\n")
    env = {**os.environ, "GIT_COMMITTER_DATE": f"@{EPOCH} +0000", "GIT_AUTHOR_DATE": f"@{EPOCH - 99} +0000"}
    for args in (["init", "-q"], ["add", "a.txt"],
                 ["-c", "user.name=t", "-c", "user.email=t@example.invalid", "commit", "-q", "-m", "one"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    assert reproducible.source_date_epoch(Checkout(repo, "git", str(repo), "main", "0" * 40), tmp_path) == EPOCH

    downloads = tmp_path / "cache" / "sources" / "sdist"
    downloads.mkdir(parents=True)
    archive = downloads / "pkg-1.0.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        for name, mtime in (("pkg-1.0/setup.py", EPOCH - 5), ("pkg-1.0/PKG-INFO", EPOCH + 7)):
            info = tarfile.TarInfo(name)
            info.size, info.mtime = 2, mtime
            tf.addfile(info, io.BytesIO(b"x\n"))
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    (unpacked / "setup.py").write_text("x\n")  # extracted now: its mtime is not the sdist's date
    sdist = Checkout(unpacked, "sdist", "pkg", "1.0", sha256_file(archive))
    assert reproducible.source_date_epoch(sdist, tmp_path / "cache") == EPOCH + 7

    # a directory: its last commit's time, whatever its files' mtimes say (a checkout sets them)
    folder = tmp_path / "folder"
    (folder / "build").mkdir(parents=True)
    (folder / "x.py").write_text("x\n")
    os.utime(folder / "x.py", (EPOCH, EPOCH))
    assert reproducible.source_date_epoch(Checkout(folder, "path", str(folder), "local", "d"), tmp_path) == (
        reproducible.UNCOMMITTED_EPOCH)  # not in git: nothing but its contents, which carry no time
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "add", "x.py"], check=True)
    subprocess.run(["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "x"],
                   check=True, env={**os.environ, "GIT_COMMITTER_DATE": f"@{EPOCH - 50} +0000"})
    (folder / "build" / "left.o").write_text("build output\n")  # not a source (never copied): not a change
    assert reproducible.source_date_epoch(Checkout(folder, "path", str(folder), "local", "d"), tmp_path) == EPOCH - 50


def test_the_build_environment_passes_source_date_epoch_and_the_prefix_maps(tmp_path):
    from ci.model import credentials

    variables = reproducible.build_variables({"CFLAGS": "-O2", "NVCC_APPEND_FLAGS": "--threads 2"}, epoch=EPOCH,
                                             source_dir=Path("/tmp/wheelhouse-src/x-x86_64"), site_packages="/v/sp")
    assert variables["SOURCE_DATE_EPOCH"] == str(EPOCH)
    assert variables["CFLAGS"] == ("-O2 -ffile-prefix-map=/v/sp=/site-packages "
                                   "-ffile-prefix-map=/tmp/wheelhouse-src/x-x86_64=.")
    assert variables["NVCC_APPEND_FLAGS"].startswith("--threads 2 -Xcompiler -ffile-prefix-map=/v/sp=/site-packages")
    assert variables["LDFLAGS"] == "-Wl,--discard-all"
    # nvcc's seed: one per source directory, last; a caller's own seed is kept and not given twice
    assert variables["NVCC_APPEND_FLAGS"].endswith(" -frandom-seed=0x" + hashlib.sha256(
        b"/tmp/wheelhouse-src/x-x86_64").hexdigest()[:8])
    assert reproducible.nvcc_random_seed(Path("/tmp/wheelhouse-src/y-x86_64")) != reproducible.nvcc_random_seed(
        Path("/tmp/wheelhouse-src/x-x86_64"))
    own = reproducible.build_variables({"NVCC_APPEND_FLAGS": "-frandom-seed=7"}, epoch=EPOCH,
                                       source_dir=Path("/tmp/wheelhouse-src/x-x86_64"), site_packages="/v/sp")
    assert own["NVCC_APPEND_FLAGS"].split().count("-frandom-seed=7") == 1 and own["NVCC_APPEND_FLAGS"].count("seed") == 1
    passed = credentials.build_environment({**variables, "CC": "gcc", "CUDAHOSTCXX": "g++", "SECRET_TOKEN": "x"}).environ
    assert set(passed) == {*variables, "CC", "CUDAHOSTCXX"}
    # the compiler wrappers read the same maps
    assert variables["WHEELHOUSE_PREFIX_MAPS"] == ("-ffile-prefix-map=/v/sp=/site-packages "
                                                   "-ffile-prefix-map=/tmp/wheelhouse-src/x-x86_64=.")
    # in place, the seed still comes from the fixed path: the same for every machine's build of the row
    seeded = reproducible.build_variables({}, epoch=EPOCH, source_dir=tmp_path, site_packages="/v/sp",
                                          seed_path=Path("/tmp/wheelhouse-src/x-x86_64"))
    assert seeded["NVCC_APPEND_FLAGS"].endswith(reproducible.nvcc_random_seed(Path("/tmp/wheelhouse-src/x-x86_64")))


# --- normalizing a wheel --------------------------------------------------------------------------


def _zip_date(epoch: int) -> tuple[int, ...]:
    stamp = time.gmtime(epoch)
    return (stamp.tm_year, stamp.tm_mon, stamp.tm_mday, stamp.tm_hour, stamp.tm_min, stamp.tm_sec - stamp.tm_sec % 2)


def _shuffled_copy(wheel: Path, target: Path, date: tuple[int, ...], modes: dict[str, int]) -> Path:
    """``wheel``'s members in reverse order, with ``date``, the given modes and an extended-timestamp field."""
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in reversed(zin.infolist()):
            copy = zipfile.ZipInfo(info.filename, date_time=date)
            copy.external_attr = modes.get(info.filename, 0o100600) << 16
            copy.compress_type = zipfile.ZIP_DEFLATED
            copy.extra = b"UT\x05\x00\x01" + int(time.time()).to_bytes(4, "little")  # a build's wall clock
            zout.writestr(copy, zin.read(info))
    return target


def test_normalize_wheel_makes_order_dates_modes_and_extras_the_sources(tmp_path):
    so = host_shared_object().read_bytes()
    wheel = build_wheel(tmp_path / "in", {"pkg/__init__.py": b"", "pkg/_C.so": so, "pkg/z.txt": b"z\n"}, name="pkg")
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = _shuffled_copy(wheel, tmp_path / "one" / wheel.name, (2025, 3, 1, 10, 11, 12), {"pkg/_C.so": 0o100700})
    two = _shuffled_copy(wheel, tmp_path / "two" / wheel.name, (2026, 12, 2, 6, 0, 0), {"pkg/_C.so": 0o100775})
    assert sha256_file(one) != sha256_file(two)
    assert [d.reason for d in reproducible.compare_wheels(one, two)] == ["date/mode"] * 6
    for path in (one, two):
        normalize_wheel(path, EPOCH)
    assert sha256_file(one) == sha256_file(two)
    assert reproducible.compare_wheels(one, two) == []
    with zipfile.ZipFile(one) as zf:
        infos = zf.infolist()
        assert [i.filename for i in infos] == ["pkg/_C.so", "pkg/__init__.py", "pkg/z.txt", "pkg-1.0.dist-info/METADATA",
                                               "pkg-1.0.dist-info/WHEEL", "pkg-1.0.dist-info/RECORD"]
        assert {i.date_time for i in infos} == {_zip_date(EPOCH)}
        assert [i.external_attr >> 16 for i in infos] == [0o100755] + [0o100644] * 5
        assert all(i.extra == b"" for i in infos)
        record_paths = [line.split(",")[0] for line in zf.read("pkg-1.0.dist-info/RECORD").decode().splitlines()]
        assert record_paths == [i.filename for i in infos]
        assert zf.read("pkg/_C.so") == so and zf.testzip() is None
    with open_wheel(one) as archive:
        assert check_record(archive) == []
    before = sha256_file(one)
    normalize_wheel(one, EPOCH)
    assert sha256_file(one) == before  # idempotent
    normalize_wheel(one, 0)  # an epoch before zip's first date is 1980-01-01
    with zipfile.ZipFile(one) as zf:
        assert {i.date_time for i in zf.infolist()} == {(1980, 1, 1, 0, 0, 0)}


def test_normalize_wheel_refuses_a_wheel_without_record_and_leaves_it_as_it_was(tmp_path):
    from ci.base.errors import CheckFailed

    wheel = build_wheel(tmp_path, name="pkg")
    broken = tmp_path / "broken" / wheel.name
    broken.parent.mkdir()
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(broken, "w") as zout:
        for info in zin.infolist():
            if not info.filename.endswith("RECORD"):
                zout.writestr(info, zin.read(info))
    before = broken.read_bytes()
    with pytest.raises(CheckFailed, match=r"has no pkg-1.0.dist-info/RECORD; rebuild the wheel"):
        normalize_wheel(broken, EPOCH)
    assert broken.read_bytes() == before and sorted(p.name for p in broken.parent.iterdir()) == [wheel.name]


# --- what the comparison names --------------------------------------------------------------------


def test_a_differing_shared_object_is_named_with_its_elf_sections(tmp_path):
    so = host_shared_object().read_bytes()
    wheel = build_wheel(tmp_path / "a", {"pkg/__init__.py": b"", "pkg/_C.so": so}, name="pkg")
    elf = ELFFile(io.BytesIO(so))
    comment = elf.get_section_by_name(".comment")
    changed = bytearray(so)
    changed[comment["sh_offset"]] ^= 0x01  # one byte of the compiler's note, as another compiler would write
    other_so = tmp_path / "_C.so"
    other_so.write_bytes(bytes(changed))
    other = tmp_path / "b" / wheel.name
    other.parent.mkdir()
    add_members(wheel, other, {"pkg/_C.so": other_so}, {})
    for path in (wheel, other):
        normalize_wheel(path, EPOCH)
    differences = reproducible.compare_wheels(wheel, other)
    assert [d.describe() for d in differences] == ["pkg/_C.so: content (ELF sections .comment)",
                                                   "pkg-1.0.dist-info/RECORD: content"]


def test_rebuild_check_refuses_a_work_directory_in_use_in_one_line(tmp_path):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "kept.txt").write_text("mine\n")
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(FIXTURE_VERSIONS)}
    result = subprocess.run([sys.executable, "-m", "nox", "-s", "rebuild-check-wheelhouse-fixture-3.11", "--",
                             "--work", str(tmp_path / "work")], cwd=REPO, env=env, capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: --work {tmp_path / 'work'}: not empty; pass a new directory (the two builds must start fresh)")
    assert (tmp_path / "work" / "kept.txt").read_text() == "mine\n"


# --- the wheel check: no build path where an import reads it --------------------------------------

BAKED_SOURCE = 'extern "C" const char* base_path() { return BASE_PATH; }\n'


def _extension(tmp_path: Path, name: str, flags: list[str]) -> bytes:
    """A real shared object linked with ``flags`` (rpaths, -D definitions)."""
    (tmp_path / "ext.cpp").write_text(BAKED_SOURCE)
    out = tmp_path / f"{name}.so"
    subprocess.run(["g++", "-shared", "-fPIC", '-DBASE_PATH="."', *flags, str(tmp_path / "ext.cpp"), "-o", str(out)],
                   check=True)
    return out.read_bytes()


def test_the_check_refuses_an_rpath_into_site_packages_and_a_baked_build_dir(tmp_path):
    from ci.checks import check

    build_dir = "/srv/wheelhouse-src/deep-ep-x86_64"
    rpath = "/home/runner/.cache/venvs/x/lib/python3.12/site-packages/nvidia/nvshmem/lib"
    members = {
        "deep_ep_cpp.cpython-311-x86_64-linux-gnu.so": _extension(tmp_path, "a", [f"-Wl,-rpath,{rpath}"]),
        "hybrid_ep_cpp.cpython-311-x86_64-linux-gnu.so": _extension(tmp_path, "b", ['-UBASE_PATH',
                                                                                   f'-DBASE_PATH="{build_dir}"']),
        "clean.cpython-311-x86_64-linux-gnu.so": _extension(tmp_path, "c", ["-Wl,-rpath,$ORIGIN/nvidia/nvshmem/lib"]),
    }
    wheel = build_wheel(tmp_path / "w", {**members, "deep_ep/__init__.py": b""}, name="deep_ep")
    report = check.check_wheels([wheel], use_cuobjdump=False)
    assert list(report.problems) == [
        f"{wheel.name}: member 'deep_ep_cpp.cpython-311-x86_64-linux-gnu.so' names the build machine's {rpath!r} in its "
        "RUNPATH, where an import reads it; link with an $ORIGIN-relative rpath and no build path, or name the member "
        "with the reason in this component's build_path_exceptions in versions.yaml",
        f"{wheel.name}: member 'hybrid_ep_cpp.cpython-311-x86_64-linux-gnu.so' names the build machine's "
        f"'/srv/wheelhouse-src' in its .rodata, where an import reads it; link with an $ORIGIN-relative rpath and no "
        "build path, or name the member with the reason in this component's build_path_exceptions in versions.yaml",
    ]
    allowed = check.check_wheels([wheel], use_cuobjdump=False, build_path_exceptions={
        "deep_ep_cpp*.so": "NVSHMEM's rpath, as upstream links it", "hybrid_ep_cpp*.so": "its JIT reads BASE_PATH"})
    assert allowed.ok, allowed.problems
    assert allowed.wheels[0].allowed_build_paths == (
        f"deep_ep_cpp.cpython-311-x86_64-linux-gnu.so: RUNPATH names {rpath!r} (allowed: NVSHMEM's rpath, as upstream "
        "links it)",
        "hybrid_ep_cpp.cpython-311-x86_64-linux-gnu.so: .rodata names '/srv/wheelhouse-src' (allowed: its JIT reads "
        "BASE_PATH)",
    )
    assert "build path allowed: deep_ep_cpp" in allowed.render_text()


def test_the_build_directory_and_site_packages_given_by_the_build_are_searched(tmp_path):
    from ci.checks import check

    site = "/opt/builder/venv/lib/python3.11/site-packages"
    so = _extension(tmp_path, "a", ["-UBASE_PATH", f'-DBASE_PATH="{site}/torch/include"'])
    wheel = build_wheel(tmp_path / "w", {"pkg/_C.so": so}, name="pkg")
    assert check.check_wheels([wheel], use_cuobjdump=False).ok  # an unknown site-packages in a string: not named
    report = check.check_wheels([wheel], use_cuobjdump=False, build_paths=("/tmp/wheelhouse-src", site + "/"))
    assert [p.split(" in its ")[0] for p in report.problems] == [
        f"{wheel.name}: member 'pkg/_C.so' names the build machine's {site!r}"]
