#!/usr/bin/env bash
# flash-attention (flash-attn) from source for the row's arch list.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/arch.sh
source "$LIB/arch.sh"
# shellcheck source=lib/flash_attention.sh
source "$LIB/flash_attention.sh"

require_env CUDA_VERSION TORCH_CUDA_ARCH_LIST WHEELHOUSE_ARCHS_SM MAX_JOBS CXX11_ABI DIST_DIR
ensure_dist_dir
export_extra_env

pip_install_build_deps ninja packaging wheel psutil setuptools

# FORCE_BUILD: never fetch upstream's prebuilt wheel; FORCE_CXX11_ABI: match torch.
export FLASH_ATTENTION_FORCE_BUILD=TRUE
export FLASH_ATTENTION_FORCE_CXX11_ABI="$CXX11_ABI"
# flash-attention's setup.py wants undotted archs ("80;90;100;120").
FLASH_ATTN_CUDA_ARCHS="$WHEELHOUSE_ARCHS_SM"
export FLASH_ATTN_CUDA_ARCHS
export NVCC_THREADS="${NVCC_THREADS:-2}"
ARCH_COUNT="$(tr ';' '\n' <<<"$FLASH_ATTN_CUDA_ARCHS" | grep -c .)"
MAX_JOBS="$(flash_attention_max_jobs "$CUDA_VERSION" "$MAX_JOBS" "$NVCC_THREADS" "$ARCH_COUNT")"
export MAX_JOBS
activate_arch_filter

print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION TORCH_VERSION TORCH_CUDA_ARCH_LIST FLASH_ATTN_CUDA_ARCHS \
    MAX_JOBS NVCC_THREADS CXX11_ABI FLASH_ATTENTION_FORCE_BUILD FLASH_ATTENTION_FORCE_CXX11_ABI DIST_DIR
print_torch

row_python setup.py bdist_wheel --dist-dir="$DIST_DIR"
list_dist_wheels
