#!/usr/bin/env bash
# apex with its C++ and CUDA extensions, for the dotted TORCH_CUDA_ARCH_LIST
# as given (apex's setup.py reads it through torch).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/arch.sh
source "$LIB/arch.sh"

require_env TORCH_CUDA_ARCH_LIST MAX_JOBS DIST_DIR
ensure_dist_dir
export_extra_env

# Older apex reads --cpp_ext/--cuda_ext build options, newer apex (25.09+)
# reads APEX_CPP_EXT/APEX_CUDA_EXT; give both so either builds the extensions.
export APEX_CPP_EXT=1 APEX_CUDA_EXT=1
activate_arch_filter
print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION TORCH_VERSION TORCH_CUDA_ARCH_LIST MAX_JOBS NVCC_THREADS CXX11_ABI APEX_CPP_EXT APEX_CUDA_EXT DIST_DIR
print_torch

MAX_JOBS="$MAX_JOBS" row_python -m pip wheel -v --no-build-isolation --no-deps -w "$DIST_DIR" \
    --disable-pip-version-check \
    --config-settings "--build-option=--cpp_ext" \
    --config-settings "--build-option=--cuda_ext" \
    .
list_dist_wheels
