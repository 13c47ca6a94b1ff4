#!/usr/bin/env bash
# flashinfer's wheels, as many of the three as wheel_packages lists:
#   flashinfer-python     py3-none-any JIT core, built here (no compiled code:
#                         its kernels compile at run time from the headers it carries)
#   flashinfer-cubin      py3-none-any, NVIDIA's prebuilt kernels; rehosted from
#                         pip's configured index (upstream builds it by downloading
#                         them from its artifact server)
#   flashinfer-jit-cache  platform wheel of every kernel compiled ahead of time;
#                         rehosted from flashinfer's own index for the row's CUDA
#                         (for sm_90 alone its compile is 793 modules, 3962 CUDA
#                         translation units: hours on a 16-core machine)
# The two py3-none-any wheels come only from the x86_64 row: they are the same
# bytes on every arch. The wheel checks refuse a flashinfer-python without its
# headers and a flashinfer-cubin that lacks a kernel its manifests list.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/flashinfer.sh
source "$LIB/flashinfer.sh"

require_env COMPONENT TARGET_ARCH CUDA_VERSION DIST_DIR WHEEL_PACKAGES SOURCE_REVISION
ensure_dist_dir
export_extra_env

FLASHINFER_VERSION="$(flashinfer_checkout_version .)"
JIT_CACHE_INDEX=""
if wheel_package_wanted flashinfer-jit-cache; then
    JIT_CACHE_INDEX="https://flashinfer.ai/whl/$(flashinfer_jit_cache_cu_index "$CUDA_VERSION")"
fi
if [[ "$TARGET_ARCH" == "x86_64" ]]; then
    BUILD_ANY_ARCH_WHEELS=true
else
    BUILD_ANY_ARCH_WHEELS=false
fi
print_settings COMPONENT REF SOURCE_REVISION TARGET_ARCH CUDA_VERSION TORCH_VERSION WHEEL_PACKAGES \
    FLASHINFER_VERSION BUILD_ANY_ARCH_WHEELS JIT_CACHE_INDEX DIST_DIR

if [[ "$BUILD_ANY_ARCH_WHEELS" == true ]] && wheel_package_wanted flashinfer-python; then
    flashinfer_require_headers .
    flashinfer_write_build_meta . "$FLASHINFER_VERSION" "$SOURCE_REVISION"
    # Its backend needs only setuptools and packaging and imports neither torch
    # nor apache-tvm-ffi, so the row venv builds it as it is: no isolated
    # environment to download, and none offline.
    pip_install_build_deps "setuptools>=77" "packaging>=24" wheel
    row_python -m pip wheel --no-build-isolation --no-deps --disable-pip-version-check -w "$DIST_DIR" .
fi
if [[ "$BUILD_ANY_ARCH_WHEELS" == true ]] && wheel_package_wanted flashinfer-cubin; then
    download_prebuilt_wheel flashinfer-cubin "$FLASHINFER_VERSION" default "$DIST_DIR" \
        "NVIDIA's prebuilt kernels (upstream downloads them from its artifact server)"
fi
if [[ "$BUILD_ANY_ARCH_WHEELS" != true ]]; then
    log_info "TARGET_ARCH=$TARGET_ARCH: flashinfer-python and flashinfer-cubin come from the x86_64 row"
fi
if wheel_package_wanted flashinfer-jit-cache; then
    download_prebuilt_wheel flashinfer-jit-cache "$FLASHINFER_VERSION" "$JIT_CACHE_INDEX" "$DIST_DIR" \
        "flashinfer's ahead-of-time compile of every kernel (793 modules for sm_90 alone)"
fi
list_dist_wheels
