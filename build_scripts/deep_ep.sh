#!/usr/bin/env bash
# DeepEP with NVSHMEM (internode and low-latency kernels). Its extensions find
# NVSHMEM beside them ($ORIGIN/nvidia/nvshmem/lib, patches/deep_ep_relative_nvshmem_rpath.py),
# not in the build machine's site-packages. When the arch list includes a
# pre-Hopper arch (A100), patches/enable_deep_ep_sm80.py first makes one fat
# binary carry sm_80 next to sm_90/sm_100.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/arch.sh
source "$LIB/arch.sh"
# shellcheck source=lib/cuda_paths.sh
source "$LIB/cuda_paths.sh"
# shellcheck source=lib/rdma_nvshmem.sh
source "$LIB/rdma_nvshmem.sh"
# shellcheck source=lib/wheel_pack.sh
source "$LIB/wheel_pack.sh"

require_env CUDA_VERSION PYTHON_VERSION TORCH_CUDA_ARCH_LIST WHEELHOUSE_ARCHS_PRE_HOPPER MAX_JOBS DIST_DIR WHEELHOUSE_ROOT
ensure_dist_dir
export_extra_env
require_env NVSHMEM_VERSION

pip_install_build_deps ninja packaging wheel setuptools
print_torch

ensure_cuda_cccl_include_path
ensure_torch_cuda_headers
ensure_cuda_stub_library_path
ensure_rdma_headers
provide_nvshmem
# DeepEP's setup.py insists on this for any arch list other than exactly 9.0
# (the .L1::no_allocate loads are not accepted by every toolkit).
export DISABLE_AGGRESSIVE_PTX_INSTRS=1
activate_arch_filter

row_python "$WHEELHOUSE_ROOT/patches/deep_ep_relative_nvshmem_rpath.py" .
if [[ "$WHEELHOUSE_ARCHS_PRE_HOPPER" == 1 ]]; then
    log_info "arch list $TORCH_CUDA_ARCH_LIST includes a pre-Hopper arch: applying the sm_80 fat-binary patch"
    row_python "$WHEELHOUSE_ROOT/patches/enable_deep_ep_sm80.py" .
else
    log_info "arch list $TORCH_CUDA_ARCH_LIST is Hopper or newer: no sm_80 patch"
fi

print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION TORCH_VERSION TORCH_CUDA_ARCH_LIST MAX_JOBS NVSHMEM_VERSION \
    NVSHMEM_DIR LDFLAGS DISABLE_AGGRESSIVE_PTX_INSTRS CPATH LIBRARY_PATH CXX11_ABI DIST_DIR

MAX_JOBS="$MAX_JOBS" row_python -m pip wheel -v --no-build-isolation --no-deps -w "$DIST_DIR" \
    --disable-pip-version-check .
# setup.py appends "+<git sha>" to the version.
strip_local_version "$DIST_DIR"
list_dist_wheels
