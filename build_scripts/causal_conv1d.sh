#!/usr/bin/env bash
# causal-conv1d (1.7.0, from its sdist). Its setup.py hard-codes its gencodes
# (sm_75/80/87/90/100/120, plus sm_110/121 on CUDA 13; never sm_103, which
# nvcc 13.2 miscompiles), so TORCH_CUDA_ARCH_LIST is not used; the nvcc arch
# filter narrows them when the build step enables it.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/arch.sh
source "$LIB/arch.sh"
# shellcheck source=lib/cuda_paths.sh
source "$LIB/cuda_paths.sh"

require_env MAX_JOBS CXX11_ABI DIST_DIR
ensure_dist_dir
export_extra_env
# Its sources include torch's CUDA headers, which include cuSPARSE, cuBLAS and cuSOLVER: a minimal toolkit
# (nvcc and the runtime) takes them from the row venv's CUDA wheels.
ensure_torch_cuda_headers

pip_install_build_deps ninja packaging wheel setuptools
export CAUSAL_CONV1D_FORCE_BUILD=TRUE
export CAUSAL_CONV1D_FORCE_CXX11_ABI="$CXX11_ABI"
# Keep the version plain: a local segment would not survive a release asset.
unset CAUSAL_CONV1D_LOCAL_VERSION CAUSAL_CONV1D_SKIP_CUDA_BUILD
activate_arch_filter

print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION TORCH_VERSION MAX_JOBS CXX11_ABI \
    CAUSAL_CONV1D_FORCE_BUILD CAUSAL_CONV1D_FORCE_CXX11_ABI WHEELHOUSE_NVCC_ARCHS DIST_DIR
print_torch

MAX_JOBS="$MAX_JOBS" row_python -m pip wheel -v --no-build-isolation --no-deps -w "$DIST_DIR" \
    --disable-pip-version-check .
list_dist_wheels
