#!/usr/bin/env bash
# TransformerEngine with its PyTorch extension. Compiles against nccl.h and
# cuDNN, both found in the row venv (CUDA torch depends on their wheels) before
# the system's (lib/nccl.sh, lib/cudnn.sh), so it builds without network.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/arch.sh
source "$LIB/arch.sh"
# shellcheck source=lib/nccl.sh
source "$LIB/nccl.sh"
# shellcheck source=lib/cudnn.sh
source "$LIB/cudnn.sh"

require_env CUDA_VERSION TORCH_CUDA_ARCH_LIST WHEELHOUSE_ARCHS_SM MAX_JOBS DIST_DIR
ensure_dist_dir
export_extra_env

ensure_nccl_header
ensure_cudnn
# (nvidia-mathdx, which TE's own CI installs, is not read by these sources:
# they carry the cuRANDDx header they use.)
pip_install_build_deps pybind11 ninja wheel packaging

export NVTE_FRAMEWORK=pytorch
# No "+<sha>" local version, while keeping the torch extension (which
# NVTE_RELEASE_BUILD would drop).
export NVTE_NO_LOCAL_VERSION=1
NVTE_CUDA_ARCHS="$WHEELHOUSE_ARCHS_SM"
export NVTE_CUDA_ARCHS
# The checkout already has its submodules; setup.py's own `git submodule update`
# would act on whatever repository encloses the build directory (ours).
export NVTE_SKIP_SUBMODULE_CHECKS_DURING_BUILD=1
# NVTE_BUILD_THREADS_PER_JOB comes from extra_env (nvcc threads per ninja job).
# CMake gives nvcc no host compiler unless told, so nvcc would take the first
# g++ on PATH; the kernels' host code is compiled by the build's own CXX.
if [[ -n "${CXX:-}" ]]; then
    export CUDAHOSTCXX="${CUDAHOSTCXX:-$CXX}"
fi

print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION TORCH_VERSION TORCH_CUDA_ARCH_LIST NVTE_CUDA_ARCHS \
    NVTE_FRAMEWORK NVTE_NO_LOCAL_VERSION NVTE_SKIP_SUBMODULE_CHECKS_DURING_BUILD NVTE_BUILD_THREADS_PER_JOB \
    MAX_JOBS CUDNN_PATH CPATH CXX CUDAHOSTCXX CXX11_ABI DIST_DIR
print_torch

# --resume-retries (pip >= 25.1) resumes interrupted downloads of build
# inputs; older pips reject the option, so pass it only where it exists.
resume=()
if row_python -m pip wheel --help 2>/dev/null | grep -q -- '--resume-retries'; then
    resume=(--resume-retries 999)
fi
MAX_JOBS="$MAX_JOBS" row_python -m pip wheel -v --no-build-isolation --no-deps -w "$DIST_DIR" \
    --disable-pip-version-check "${resume[@]}" .
list_dist_wheels
