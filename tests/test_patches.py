"""patches/enable_deep_ep_sm80.py on a miniature DeepEP tree (tests/data/deep_ep_anchor)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import upstream_snapshots

REPO = Path(__file__).resolve().parent.parent
PATCH = REPO / "patches" / "enable_deep_ep_sm80.py"
ANCHOR_TREE = REPO / "tests" / "data" / "deep_ep_anchor"
MARKER = "DEEP_EP_SM80_FATBIN"
PATCHED_FILES = [
    "csrc/kernels/configs.cuh", "csrc/kernels/intranode.cu", "csrc/kernels/launch.cuh", "csrc/deep_ep.cpp",
    "csrc/kernels/internode.cu", "csrc/kernels/internode_ll.cu", "csrc/kernels/pcie.cu",
]


@pytest.fixture()
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "DeepEP"
    shutil.copytree(ANCHOR_TREE, root)
    return root


def snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def run_patch(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(PATCH), *args], cwd=cwd, check=False, capture_output=True, text=True, timeout=60)


def patch_all_files(root: Path) -> tuple[subprocess.CompletedProcess, dict[str, bytes]]:
    """Run the patch on ``root``, which must change exactly PATCHED_FILES; (the run, the tree after it)."""
    before = snapshot(root)
    proc = run_patch(cwd=root)
    assert proc.returncode == 0, proc.stderr
    after = snapshot(root)
    assert sorted(k for k in after if after[k] != before[k]) == sorted(PATCHED_FILES)
    return proc, after


def test_applies_all_five_edits(tree):
    proc, _ = patch_all_files(tree)
    text = {rel: (tree / rel).read_text() for rel in PATCHED_FILES}
    assert all(MARKER in body for body in text.values())
    # 1. per-pass Ampere switch first, FP8 typedefs gone, real header always
    configs = text["csrc/kernels/configs.cuh"]
    assert configs.startswith("#pragma once\n")
    assert configs.index("(__CUDA_ARCH__ < 900)") < configs.index("#include <cuda_runtime.h>")
    assert "typedef int __nv_fp8_interpretation_t;" not in configs and "#include <cuda_fp8.h>" in configs
    # 2. both smem_size constants unconditional
    intranode = text["csrc/kernels/intranode.cu"]
    assert intranode.count("constexpr int smem_size") == 2 and "#ifndef DISABLE_SM90_FEATURES\n    constexpr" not in intranode
    # 3. runtime dispatch, the rest of launch.cuh intact
    launch = text["csrc/kernels/launch.cuh"]
    assert "cudaDevAttrComputeCapabilityMajor" in launch and "cudaLaunchKernelEx" in launch and "<<<" in launch
    assert "#define SWITCH_RANKS(case_macro)" in launch and launch.count("#ifndef DISABLE_SM90_FEATURES") == 0
    # 4. is_sm90_compiled asks the device
    assert "return major >= 9;" in text["csrc/deep_ep.cpp"]
    assert "int get_local_device_id()" in text["csrc/deep_ep.cpp"]
    # 5. Hopper-only sources: placeholder for sm_80, original code otherwise
    for rel in PATCHED_FILES[4:]:
        body = text[rel]
        assert body.startswith("#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)\n")
        assert (ANCHOR_TREE / rel).read_text() in body and body.rstrip().endswith("sm_80 placeholder")
    assert "patched csrc/kernels/launch.cuh" in proc.stdout


def test_second_run_changes_nothing(tree):
    assert run_patch(cwd=tree).returncode == 0
    once = snapshot(tree)
    proc = run_patch(cwd=tree)
    assert proc.returncode == 0 and "already applied" in proc.stdout
    assert snapshot(tree) == once


def test_directory_argument(tree, tmp_path):
    proc = run_patch(str(tree), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert MARKER in (tree / "csrc/kernels/launch.cuh").read_text()


def test_resumes_a_partly_patched_tree(tree):
    """A tree where some files already carry the marker (an interrupted earlier run) converges."""
    assert run_patch(cwd=tree).returncode == 0
    complete = snapshot(tree)
    for rel in ("csrc/deep_ep.cpp", "csrc/kernels/pcie.cu"):
        shutil.copyfile(ANCHOR_TREE / rel, tree / rel)
    assert run_patch(cwd=tree).returncode == 0
    assert snapshot(tree) == complete


def _drop(text: str, old: str, new: str = "") -> str:
    assert old in text
    return text.replace(old, new, 1)


@pytest.mark.parametrize(
    ("rel", "mutate", "expected"),
    [
        ("csrc/kernels/launch.cuh", lambda t: _drop(t, "#define SWITCH_RANKS", "#define SWITCH_PEERS"),
         "csrc/kernels/launch.cuh: anchor not found: '#define SWITCH_RANKS'"),
        ("csrc/kernels/launch.cuh", lambda t: t.replace("#define LAUNCH_KERNEL(", "#define LAUNCH_KERNEL_EX("),
         "csrc/kernels/launch.cuh: anchor not found: '#define LAUNCH_KERNEL('"),
        ("csrc/kernels/configs.cuh", lambda t: _drop(t, "typedef int __nv_fp8x4_e4m3;\n"),
         "csrc/kernels/configs.cuh: anchor not found: '#ifndef DISABLE_SM90_FEATURES / #include <cuda_fp8.h>"),
        ("csrc/kernels/configs.cuh", lambda t: "// header\n" + t,
         "csrc/kernels/configs.cuh: anchor not found: '#pragma once' as the first line"),
        ("csrc/kernels/intranode.cu",
         lambda t: _drop(t, "#ifndef DISABLE_SM90_FEATURES\n    constexpr int smem_size = kNumTMABytesPerWarp * (kNumThreads / 32);\n#endif\n",
                         "    constexpr int smem_size = 0;\n"),
         ("csrc/kernels/intranode.cu: anchor '#ifndef DISABLE_SM90_FEATURES / constexpr int smem_size = ... / #endif' "
          "found 1 time(s), expected 2")),
        ("csrc/deep_ep.cpp", lambda t: _drop(t, "    return true;\n", "    return false;\n"),
         "csrc/deep_ep.cpp: anchor not found: 'bool is_sm90_compiled() { ... }'"),
        ("csrc/kernels/pcie.cu", None, "csrc/kernels/pcie.cu: file not found"),
    ],
)
def test_missing_anchor_fails_in_one_line_and_changes_nothing(tree, rel, mutate, expected):
    path = tree / rel
    if mutate is None:
        path.unlink()
    else:
        path.write_text(mutate(path.read_text()))
    before = snapshot(tree)
    proc = run_patch(cwd=tree)
    assert proc.returncode == 1
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"enable_deep_ep_sm80: {expected}"), lines[0]
    assert lines[0].endswith("; nothing was changed")
    assert snapshot(tree) == before  # also the files whose anchors were fine


def test_not_a_deepep_checkout(tmp_path):
    proc = run_patch(cwd=tmp_path)
    assert proc.returncode == 1 and len(proc.stderr.splitlines()) == 1
    assert "not a DeepEP checkout" in proc.stderr


# --- the patched tree compiles: one object with sm_80 and sm_90 code ---------------------

NVCC = next((p for p in (Path("/usr/local/cuda/bin/nvcc"), Path(shutil.which("nvcc") or "/nonexistent")) if p.is_file()), None)
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="no CUDA toolkit (nvcc) on this machine")
ARCHS = ["-gencode", "arch=compute_80,code=sm_80", "-gencode", "arch=compute_90,code=sm_90"]


def _fatbin_archs(obj: Path) -> list[int]:
    sys.path.insert(0, str(Path(__file__).parent))
    try:
        from test_nvcc_arch_filter import fatbin_archs
    finally:
        sys.path.pop(0)
    return sorted(sm for _, sm in fatbin_archs(obj))


def _nvcc(source: Path, obj: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(NVCC), "-std=c++17", "-rdc=true", "-c", str(source), "-o", str(obj), *ARCHS],
                          check=False, capture_output=True, text=True, timeout=300, cwd=source.parent)


@needs_nvcc
def test_unpatched_tree_cannot_mix_sm80(tree, tmp_path):
    proc = _nvcc(tree / "csrc/kernels/internode.cu", tmp_path / "internode.o")
    assert proc.returncode != 0 and "must not be compiled for sm_80" in proc.stderr


@needs_nvcc
def test_patched_tree_compiles_for_sm80_and_sm90(tree, tmp_path):
    assert run_patch(cwd=tree).returncode == 0
    for name in ("intranode", "internode", "pcie"):
        obj = tmp_path / f"{name}.o"
        proc = _nvcc(tree / f"csrc/kernels/{name}.cu", obj)
        assert proc.returncode == 0, proc.stderr
        assert _fatbin_archs(obj) == [80, 90]
    # deep_ep.cpp is host code compiled by the host compiler
    gxx = shutil.which("g++")
    if gxx:
        proc = subprocess.run([gxx, "-std=c++17", f"-I{NVCC.parent.parent / 'include'}", "-c",
                               str(tree / "csrc/deep_ep.cpp"), "-o", str(tmp_path / "deep_ep.o")],
                              check=False, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr


# Upstream's kernels reach Hopper-only PTX through a header that does not include configs.cuh
# (csrc/kernels/utils.cuh: elect.sync behind #ifndef DISABLE_SM90_FEATURES), so the per-pass switch
# must already be defined when such a header is read. The anchor tree has no such header; this one
# has that shape.
HOPPER_PTX_HEADER = """\
#pragma once
__device__ __forceinline__ bool first_lane_elected() {
#ifndef DISABLE_SM90_FEATURES
    unsigned elected = 0;
    asm volatile("{\\n .reg .pred p;\\n elect.sync _|p, 0xffffffff;\\n selp.u32 %0, 1, 0, p;\\n}" : "=r"(elected));
    return elected != 0;
#else
    return threadIdx.x % 32 == 0;
#endif
}
"""


@needs_nvcc
def test_hopper_ptx_in_a_header_is_left_out_of_the_sm80_pass(tree, tmp_path):
    (tree / "csrc/kernels/utils.cuh").write_text(HOPPER_PTX_HEADER)
    intranode = tree / "csrc/kernels/intranode.cu"
    text = _drop(intranode.read_text(), '#include "launch.cuh"\n', '#include "launch.cuh"\n#include "utils.cuh"\n')
    intranode.write_text(_drop(text, "if (threadIdx.x == 0) out[blockIdx.x] = value + 90;",
                               "if (first_lane_elected()) out[blockIdx.x] = value + 90;"))
    unpatched = _nvcc(intranode, tmp_path / "unpatched.o")
    assert unpatched.returncode != 0 and "requires .target sm_90" in unpatched.stderr
    assert run_patch(cwd=tree).returncode == 0
    proc = _nvcc(intranode, tmp_path / "intranode.o")
    assert proc.returncode == 0, proc.stderr
    assert _fatbin_archs(tmp_path / "intranode.o") == [80, 90]


# --- the real DeepEP at versions.yaml's pin ------------------------------------------------------
# Needs a bare snapshot of deepseek-ai/DeepEP (tests/upstream_snapshots.py).


def _deep_ep_pin() -> str:
    sys.path.insert(0, str(REPO))
    try:
        from ci.model.versions import load
    finally:
        sys.path.pop(0)
    return load(REPO / "versions.yaml").component("deep-ep").ref


@pytest.fixture()
def real_tree(tmp_path: Path) -> Path:
    snapshot_dir = upstream_snapshots.find("deepseek-ai/DeepEP")
    if snapshot_dir is None:
        pytest.skip(upstream_snapshots.skip_reason("deepseek-ai/DeepEP") + " (the anchor tree tests cover the patch)")
    root = tmp_path / "DeepEP"
    root.mkdir()
    archive = subprocess.run(["git", f"--git-dir={snapshot_dir}", "archive", _deep_ep_pin()], check=True,
                             capture_output=True, timeout=120).stdout
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive, check=True, timeout=120)
    return root


def test_real_deep_ep_at_the_pin_patches_cleanly_once(real_tree):
    _, after = patch_all_files(real_tree)
    launch = (real_tree / "csrc/kernels/launch.cuh").read_text()
    # the whole launch-macro block is replaced, the rank switches after it are kept
    assert launch.count("#ifndef DISABLE_SM90_FEATURES") == 0 and "cudaLaunchAttributeCooperative" in launch
    assert "#define SWITCH_RDMA_RANKS(case_macro)" in launch and "#define SWITCH_TYPES(case_macro)" in launch
    configs = (real_tree / "csrc/kernels/configs.cuh").read_text()
    assert configs.index("(__CUDA_ARCH__ < 900)") < configs.index("#include <nvshmem.h>")
    again = run_patch(cwd=real_tree)
    assert again.returncode == 0 and "already applied" in again.stdout
    assert snapshot(real_tree) == after


@needs_nvcc
def test_real_deep_ep_intranode_compiles_for_sm80_and_sm90_once_patched(real_tree, tmp_path):
    """The intranode kernels (what A100 runs) of the real source, without NVSHMEM (no headers here): upstream's
    Hopper PTX fails ptxas in the sm_80 pass; patched, one object holds both cubins."""
    def compile_intranode(obj: Path) -> subprocess.CompletedProcess:
        return subprocess.run([str(NVCC), "-std=c++17", "-O3", "-rdc=true", "--expt-relaxed-constexpr",
                               "-DDISABLE_NVSHMEM", "-DDISABLE_AGGRESSIVE_PTX_INSTRS", "-I..", "-c", "intranode.cu",
                               "-o", str(obj), *ARCHS], check=False, capture_output=True, text=True, timeout=900,
                              cwd=real_tree / "csrc/kernels")
    unpatched = compile_intranode(tmp_path / "unpatched.o")
    assert unpatched.returncode != 0 and "requires .target sm_90" in unpatched.stderr
    assert run_patch(cwd=real_tree).returncode == 0
    proc = compile_intranode(tmp_path / "intranode.o")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _fatbin_archs(tmp_path / "intranode.o") == [80, 90]
