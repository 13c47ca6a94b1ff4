#!/usr/bin/env bash
# flashinfer's three wheels: flashinfer-python (py3-none-any JIT core, built
# here), flashinfer-cubin (py3-none-any, rehosted) and flashinfer-jit-cache
# (platform wheel of prebuilt kernels, rehosted from flashinfer's index for
# the row's CUDA). The two py3-none-any wheels come only from the x86_64 row:
# they are the same bytes on every arch.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/flashinfer.sh
source "$LIB/flashinfer.sh"

require_env TARGET_ARCH CUDA_VERSION DIST_DIR
ensure_dist_dir
export_extra_env

FLASHINFER_VERSION="$(flashinfer_checkout_version .)"
JIT_CACHE_INDEX="https://flashinfer.ai/whl/$(flashinfer_jit_cache_cu_index "$CUDA_VERSION")"
CUBIN_INDEX="https://flashinfer.ai/whl"
if [[ "$TARGET_ARCH" == "x86_64" ]]; then
    BUILD_ANY_ARCH_WHEELS=true
else
    BUILD_ANY_ARCH_WHEELS=false
fi
print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION TORCH_VERSION TORCH_CUDA_ARCH_LIST MAX_JOBS \
    FLASHINFER_VERSION BUILD_ANY_ARCH_WHEELS CUBIN_INDEX JIT_CACHE_INDEX DIST_DIR

pip_install_build_deps build wheel ninja numpy

if [[ "$BUILD_ANY_ARCH_WHEELS" == true ]]; then
    # Built in an isolated environment, as upstream does: the JIT core has no
    # compiled code and must not pick up the row's torch as a build input.
    row_python -m build --wheel --outdir "$DIST_DIR" .
    download_prebuilt_wheel flashinfer-cubin "$FLASHINFER_VERSION" "$CUBIN_INDEX" "$DIST_DIR"
else
    log_info "TARGET_ARCH=$TARGET_ARCH: flashinfer-python and flashinfer-cubin come from the x86_64 row"
fi
download_prebuilt_wheel flashinfer-jit-cache "$FLASHINFER_VERSION" "$JIT_CACHE_INDEX" "$DIST_DIR"
list_dist_wheels
