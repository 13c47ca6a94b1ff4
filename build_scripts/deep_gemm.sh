#!/usr/bin/env bash
# DeepGEMM. Its extension deep_gemm._C is host C++ only (python_api.cpp; the
# CUDA kernels are compiled at run time by its JIT), so no GPU arch list
# applies, but it links against torch and must be built against the row's
# torch: a _C built for another torch fails to import (undefined c10 symbols).
# Needs the toolkit (CUDA_HOME: headers, cudart, nvrtc) and the checkout's
# third-party submodules (cutlass, fmt). With WHEELHOUSE_BUNDLE_INTERPRETERS
# (versions.yaml bundle_pythons) the one wheel carries a _C per CPython, each
# compiled against this row's torch (lib/bundle_pythons.py).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/wheel_pack.sh
source "$LIB/wheel_pack.sh"
# shellcheck source=lib/cuda_paths.sh
source "$LIB/cuda_paths.sh"

require_env MAX_JOBS DIST_DIR WHEELHOUSE_ROOT CUDA_VERSION
ensure_dist_dir
export_extra_env

for sub in third-party/cutlass/include third-party/fmt/include; do
    [[ -d "$sub" ]] || die "DeepGEMM checkout lacks $sub; check out its submodules (git submodule update --init --recursive)"
done

pip_install_build_deps ninja packaging wheel setuptools
# _C includes NVRTC and cuBLASLt (and torch's CUDA headers include cuBLAS,
# cuSPARSE and cuSOLVER) and links cudart and nvrtc. A toolkit installed
# without them (an nvcc-only CPU build machine) takes them from the CUDA wheels
# torch brought into the row venv.
ensure_torch_cuda_headers
ensure_cuda_headers cuda_runtime.h nvrtc.h
ensure_cuda_libraries cudart nvrtc
# DG_FORCE_BUILD=1: compile instead of trying upstream's prebuilt wheel.
# DG_USE_LOCAL_VERSION=0: no "+<sha>" (or "+local" when the tree is dirty).
# DG_SKIP_CUDA_BUILD=0: the extension is the point of this wheel.
export DG_FORCE_BUILD=1 DG_USE_LOCAL_VERSION=0 DG_SKIP_CUDA_BUILD=0
print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION CUDA_HOME CPATH LIBRARY_PATH TORCH_VERSION MAX_JOBS CXX11_ABI \
    DG_FORCE_BUILD DG_USE_LOCAL_VERSION DG_SKIP_CUDA_BUILD DG_JIT_USE_RUNTIME_API WHEELHOUSE_BUNDLE_PYTHONS DIST_DIR
print_torch

MAX_JOBS="$MAX_JOBS" row_python -m pip wheel -v --no-build-isolation --no-deps -w "$DIST_DIR" \
    --disable-pip-version-check .
# Belt and braces: other revisions append a local version unconditionally.
strip_local_version "$DIST_DIR"

# bundle_pythons: one wheel for several CPythons. The build step names their
# interpreters; bundle_pythons.py re-runs this checkout's `setup.py build_ext`
# for each of them under this venv's python (the row's torch), then packs the
# modules into the one wheel and retags it (the same step as every builder).
if [[ -n "${WHEELHOUSE_BUNDLE_INTERPRETERS:-}" ]]; then
    read -r -a interpreters <<<"$WHEELHOUSE_BUNDLE_INTERPRETERS"
    log_info "bundling the extension for Pythons ${WHEELHOUSE_BUNDLE_PYTHONS:-?}: ${interpreters[*]}"
    row_python "$LIB/bundle_pythons.py" "$DIST_DIR" . "${interpreters[@]}" >/dev/null
fi
list_dist_wheels
