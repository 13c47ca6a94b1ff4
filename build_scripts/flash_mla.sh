#!/usr/bin/env bash
# FlashMLA. Its setup.py chooses its own gencodes (sm_90a and sm_100f), so
# TORCH_CUDA_ARCH_LIST is not used.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/arch.sh
source "$LIB/arch.sh"
# shellcheck source=lib/cuda_paths.sh
source "$LIB/cuda_paths.sh"
# shellcheck source=lib/wheel_pack.sh
source "$LIB/wheel_pack.sh"

require_env MAX_JOBS DIST_DIR WHEELHOUSE_ROOT
ensure_dist_dir
export_extra_env

pip_install_build_deps ninja packaging wheel setuptools
ensure_cuda_cccl_include_path
# setup.py defaults to 32 nvcc threads per job, far beyond a hosted runner.
export NVCC_THREADS="${NVCC_THREADS:-2}"
activate_arch_filter

print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION TORCH_VERSION MAX_JOBS NVCC_THREADS CPATH CXX11_ABI DIST_DIR
print_torch

MAX_JOBS="$MAX_JOBS" row_python -m pip wheel -v --no-build-isolation --no-deps -w "$DIST_DIR" \
    --disable-pip-version-check .
# setup.py appends "+<git sha>" to the version.
strip_local_version "$DIST_DIR"
list_dist_wheels
