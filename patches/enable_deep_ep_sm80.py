#!/usr/bin/env python3
"""Let one DeepEP build carry sm_80 (A100) next to sm_90/sm_100.

Upstream DeepEP builds either for Ampere (DISABLE_SM90_FEATURES=1: no TMA, no
cluster launch, no NVSHMEM) or for Hopper+, because that switch is one global
preprocessor define. The wheelhouse publishes a single wheel per row, so this
patch makes the choice per compilation pass and per device instead:

1. csrc/kernels/configs.cuh: DISABLE_SM90_FEATURES is defined only while nvcc
   compiles for __CUDA_ARCH__ < 900, and <cuda_fp8.h> is always included.
   Upstream's Ampere fallback re-declares the FP8 types with int typedefs, which
   collide with the real header that torch and NVSHMEM headers pull in during
   the sm_80 pass; no sm_80 code uses FP8, so the real header is harmless.
2. csrc/kernels/intranode.cu: the two `smem_size` constants are declared in
   every pass, because the launch macros of edit 3 reference them everywhere.
3. csrc/kernels/launch.cuh: the launch macros pick, at run time from the
   current device's compute capability, cudaLaunchKernelEx with cooperative and
   cluster attributes (major >= 9) or a classic <<<>>> launch (Ampere).
4. csrc/deep_ep.cpp: is_sm90_compiled() reports whether the *current device*
   is Hopper or newer, so callers skip FP8 and internode paths on A100.
5. csrc/kernels/internode.cu, internode_ll.cu, pcie.cu have no Ampere code:
   their sm_80 pass compiles only a placeholder kernel (kept so -rdc device
   linking still sees the translation unit). Launching them on A100 fails with
   "no kernel image", matching upstream's "A100: intranode only".

Usage: enable_deep_ep_sm80.py [DEEPEP_DIR]  (default: the current directory)

Idempotent: files carrying the marker DEEP_EP_SM80_FATBIN are left alone. All
anchors are checked before anything is written, so a source that moved on
fails with one line naming the file and the missing text, and no file changes.
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

MARKER = "DEEP_EP_SM80_FATBIN"
PROG = "enable_deep_ep_sm80"


class AnchorMissing(Exception):
    """An anchor text is absent (or present a wrong number of times)."""

    def __init__(self, path: str, what: str) -> None:
        super().__init__(f"{path}: {what}")


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0]


def _replace_exactly(path: str, text: str, old: str, new: str, count: int = 1, label: str = "") -> str:
    """Replace ``old`` (which must occur exactly ``count`` times) by ``new``."""
    found = text.count(old)
    label = label or _first_line(old)
    if not found:
        raise AnchorMissing(path, f"anchor not found: {label!r}")
    if found != count:
        raise AnchorMissing(path, f"anchor {label!r} found {found} time(s), expected {count}")
    return text.replace(old, new)


# --- 1. configs.cuh -------------------------------------------------------------

CONFIGS_PRAGMA = "#pragma once\n"

CONFIGS_ARCH_GUARD = f"""
// {MARKER}: Ampere fallbacks per compilation pass. Only the device pass for
// an arch below sm_90 takes the DISABLE_SM90_FEATURES code paths; the host
// pass and the sm_90/sm_100 passes keep TMA, clusters and NVSHMEM.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900) && !defined(DISABLE_SM90_FEATURES)
#define DISABLE_SM90_FEATURES
#endif
"""

CONFIGS_FP8_FALLBACK = """\
#ifndef DISABLE_SM90_FEATURES
#include <cuda_fp8.h>
#else
// Ampere does not support FP8 features
#define __NV_E4M3 0
#define __NV_E5M2 1
typedef int __nv_fp8_interpretation_t;
typedef int __nv_fp8x4_e4m3;
typedef uint8_t __nv_fp8_storage_t;
#endif
"""

CONFIGS_FP8_ALWAYS = f"""\
// {MARKER}: the toolkit's FP8 header in every pass. Upstream's int typedefs
// for Ampere clash with <cuda_fp8.h> pulled in by torch/NVSHMEM headers during
// the sm_80 pass; no sm_80 code uses FP8 types.
#include <cuda_fp8.h>
"""


def edit_configs(path: str, text: str) -> str:
    if not text.startswith(CONFIGS_PRAGMA):
        raise AnchorMissing(path, f"anchor not found: {CONFIGS_PRAGMA.strip()!r} as the first line")
    text = _replace_exactly(
        path, text, CONFIGS_FP8_FALLBACK, CONFIGS_FP8_ALWAYS,
        label="#ifndef DISABLE_SM90_FEATURES / #include <cuda_fp8.h> / #else (FP8 fallback typedefs)",
    )
    return CONFIGS_PRAGMA + CONFIGS_ARCH_GUARD + text[len(CONFIGS_PRAGMA):]


# --- 2. intranode.cu ------------------------------------------------------------

INTRANODE_GUARDED_SMEM = """\
#ifndef DISABLE_SM90_FEATURES
    constexpr int smem_size = kNumTMABytesPerWarp * (kNumThreads / 32);
#endif
"""

INTRANODE_SMEM = f"""\
    // {MARKER}: needed in every pass by SET_SHARED_MEMORY_FOR_TMA.
    constexpr int smem_size = kNumTMABytesPerWarp * (kNumThreads / 32);
"""


def edit_intranode(path: str, text: str) -> str:
    # Two launch wrappers (dispatch and combine) declare it.
    return _replace_exactly(
        path, text, INTRANODE_GUARDED_SMEM, INTRANODE_SMEM, count=2,
        label="#ifndef DISABLE_SM90_FEATURES / constexpr int smem_size = ... / #endif",
    )


# --- 3. launch.cuh --------------------------------------------------------------

LAUNCH_BLOCK_START = "#ifndef SETUP_LAUNCH_CONFIG"
LAUNCH_BLOCK_END = "#define SWITCH_RANKS"

LAUNCH_MACROS = f"""\
// {MARKER}: one host object launches either cubin. The device's compute
// capability decides at run time: Hopper+ gets cudaLaunchKernelEx with the
// cooperative and cluster attributes, Ampere the classic <<<>>> launch.
#ifndef SETUP_LAUNCH_CONFIG
#define SETUP_LAUNCH_CONFIG(num_sms, num_threads, stream) \\
    cudaLaunchConfig_t cfg = {{(num_sms), (num_threads), 0, stream, nullptr, 0}}; \\
    cudaLaunchAttribute attr[2]; \\
    const int __num_sms = (num_sms); \\
    const int __num_threads = (num_threads); \\
    const auto __stream = (stream); \\
    int __launch_device = 0, __launch_cc_major = 0; \\
    CUDA_CHECK(cudaGetDevice(&__launch_device)); \\
    CUDA_CHECK(cudaDeviceGetAttribute(&__launch_cc_major, cudaDevAttrComputeCapabilityMajor, __launch_device)); \\
    const bool __launch_sm90 = __launch_cc_major >= 9; \\
    if (__launch_sm90) {{ \\
        attr[0].id = cudaLaunchAttributeCooperative; \\
        attr[0].val.cooperative = 1; \\
        attr[1].id = cudaLaunchAttributeClusterDimension; \\
        attr[1].val.clusterDim.x = (__num_sms % 2 == 0 ? 2 : 1); \\
        attr[1].val.clusterDim.y = 1; \\
        attr[1].val.clusterDim.z = 1; \\
        cfg.attrs = attr; \\
        cfg.numAttrs = 2; \\
    }}
#endif

#ifndef LAUNCH_KERNEL
#define LAUNCH_KERNEL(config, kernel, ...) \\
    do {{ \\
        if (__launch_sm90) {{ \\
            CUDA_CHECK(cudaLaunchKernelEx(config, kernel, ##__VA_ARGS__)); \\
        }} else {{ \\
            kernel<<<__num_sms, __num_threads, 0, __stream>>>(__VA_ARGS__); \\
            const cudaError_t __launch_error = cudaGetLastError(); \\
            if (__launch_error != cudaSuccess) {{ \\
                EPException cuda_exception("CUDA", __FILE__, __LINE__, cudaGetErrorString(__launch_error)); \\
                fprintf(stderr, "%s\\n", cuda_exception.what()); \\
                throw cuda_exception; \\
            }} \\
        }} \\
    }} while (0)
#endif

#ifndef SET_SHARED_MEMORY_FOR_TMA
#define SET_SHARED_MEMORY_FOR_TMA(kernel) \\
    do {{ \\
        if (__launch_sm90) {{ \\
            EP_HOST_ASSERT(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_size) == cudaSuccess); \\
            cfg.dynamicSmemBytes = smem_size; \\
        }} \\
    }} while (0)
#endif

"""


def edit_launch(path: str, text: str) -> str:
    start = text.find(LAUNCH_BLOCK_START)
    if start < 0:
        raise AnchorMissing(path, f"anchor not found: {LAUNCH_BLOCK_START!r}")
    end = text.find(LAUNCH_BLOCK_END, start)
    if end < 0:
        raise AnchorMissing(path, f"anchor not found: {LAUNCH_BLOCK_END!r} after {LAUNCH_BLOCK_START!r}")
    block = text[start:end]
    for macro in ("SETUP_LAUNCH_CONFIG", "LAUNCH_KERNEL", "SET_SHARED_MEMORY_FOR_TMA"):
        if f"#define {macro}(" not in block:
            raise AnchorMissing(path, f"anchor not found: '#define {macro}(' in the launch-macro block")
    return text[:start] + LAUNCH_MACROS + text[end:]


# --- 4. deep_ep.cpp --------------------------------------------------------------

IS_SM90_COMPILED = """\
bool is_sm90_compiled() {
#ifndef DISABLE_SM90_FEATURES
    return true;
#else
    return false;
#endif
}
"""

IS_SM90_DEVICE = f"""\
bool is_sm90_compiled() {{
#ifndef DISABLE_SM90_FEATURES
    // {MARKER}: the wheel holds Ampere and Hopper+ code; answer for the
    // current device so callers avoid FP8/internode paths on A100.
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess or
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
        return true;
    return major >= 9;
#else
    return false;
#endif
}}
"""


def edit_deep_ep_cpp(path: str, text: str) -> str:
    return _replace_exactly(path, text, IS_SM90_COMPILED, IS_SM90_DEVICE, label="bool is_sm90_compiled() { ... }")


# --- 5. Hopper-only sources ------------------------------------------------------


def edit_hopper_only(path: str, text: str) -> str:
    if "__global__" not in text:
        raise AnchorMissing(path, "anchor not found: '__global__' (expected CUDA kernels to wrap)")
    stem = Path(path).name.split(".")[0]
    header = (
        "#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)\n"
        f"// {MARKER}: no Ampere implementation here; the sm_80 pass compiles a\n"
        "// placeholder so -rdc device linking still sees this translation unit.\n"
        f"__global__ void deep_ep_sm80_placeholder_{stem}() {{}}\n"
        "#else\n"
    )
    footer = "" if text.endswith("\n") else "\n"
    return header + text + footer + f"#endif  // {MARKER}: sm_80 placeholder\n"


EDITS: tuple[tuple[str, Callable[[str, str], str]], ...] = (
    ("csrc/kernels/configs.cuh", edit_configs),
    ("csrc/kernels/intranode.cu", edit_intranode),
    ("csrc/kernels/launch.cuh", edit_launch),
    ("csrc/deep_ep.cpp", edit_deep_ep_cpp),
    ("csrc/kernels/internode.cu", edit_hopper_only),
    ("csrc/kernels/internode_ll.cu", edit_hopper_only),
    ("csrc/kernels/pcie.cu", edit_hopper_only),
)


@dataclass(frozen=True)
class Plan:
    changes: dict[Path, str]  # file -> new text
    already: list[str]  # files that carry the marker


def plan(root: Path) -> Plan:
    """Compute every new file text; raise AnchorMissing before anything is written."""
    if not (root / "setup.py").is_file() or not (root / "csrc" / "kernels").is_dir():
        raise AnchorMissing(str(root), "not a DeepEP checkout (no setup.py and csrc/kernels/)")
    changes: dict[Path, str] = {}
    already: list[str] = []
    for rel, edit in EDITS:
        path = root / rel
        if not path.is_file():
            raise AnchorMissing(rel, "file not found")
        text = path.read_text(encoding="utf-8")
        if MARKER in text:
            already.append(rel)
            continue
        changes[path] = edit(rel, text)
    return Plan(changes=changes, already=already)


def _write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
        os.chmod(tmp, path.stat().st_mode & 0o7777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str]) -> int:
    if len(argv) > 1 or (argv and argv[0] in ("-h", "--help")):
        print(f"usage: {PROG}.py [DEEPEP_DIR]", file=sys.stderr)
        return 2
    root = Path(argv[0] if argv else ".").resolve()
    try:
        result = plan(root)
    except AnchorMissing as exc:
        print(f"{PROG}: {exc}; nothing was changed", file=sys.stderr)
        return 1
    for path, text in result.changes.items():
        _write_atomically(path, text)
        print(f"{PROG}: patched {path.relative_to(root)}")
    if result.changes:
        print(f"{PROG}: sm_80 fat-binary edits applied to {len(result.changes)} file(s) in {root}")
    else:
        print(f"{PROG}: already applied in {root}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
