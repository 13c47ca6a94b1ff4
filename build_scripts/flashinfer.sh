#!/usr/bin/env bash
# wheelhouse-builder: builds-by-shards
# flashinfer's wheels, as many as wheel_packages lists:
#   flashinfer-python     py3-none-any JIT core, built here (no compiled code:
#                         its kernels compile at run time from the headers it carries)
#   flashinfer-cubin      py3-none-any, NVIDIA's prebuilt kernels; upstream's build
#                         only downloads them from its artifact server, so it must
#                         be in rehost: downloaded from pip's configured index
#   flashinfer-jit-cache  flashinfer's ahead-of-time compile of its kernels, built
#                         here through flashinfer.aot (793 modules, 3962 CUDA
#                         translation units for sm_90 alone) as upstream's provider
#                         layout: one flashinfer-jit-cache-<sm..> wheel per arch of
#                         TORCH_CUDA_ARCH_LIST and the flashinfer-jit-cache shim that
#                         serves the one fitting the GPU, by shards when versions.yaml
#                         splits the row (lib/flashinfer.sh, flashinfer_jit_cache_build);
#                         with rehost, upstream's one wheel from flashinfer's index
# The two py3-none-any wheels come only from the x86_64 row: they are the same
# bytes on every arch. A shard build (WHEELHOUSE_SHARD=I/N) compiles its share of
# the jit-cache modules and nothing else; the assembly (WHEELHOUSE_ASSEMBLE=1)
# builds the rest and packs the jit-cache from every shard. The wheel checks refuse
# a flashinfer-python without its headers, a flashinfer-cubin that lacks a kernel
# its manifests list, and a jit-cache that lacks a module its list names.
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
JIT_CACHE="not wanted"
if wheel_package_wanted flashinfer-jit-cache; then
    if wheel_rehosted flashinfer-jit-cache; then
        JIT_CACHE="rehosted"
        JIT_CACHE_INDEX="https://flashinfer.ai/whl/$(flashinfer_jit_cache_cu_index "$CUDA_VERSION")"
    else
        JIT_CACHE="built here"
    fi
fi
if [[ "$TARGET_ARCH" == "x86_64" && -z "${WHEELHOUSE_SHARD:-}" ]]; then
    BUILD_ANY_ARCH_WHEELS=true
else
    BUILD_ANY_ARCH_WHEELS=false
fi
print_settings COMPONENT REF SOURCE_REVISION TARGET_ARCH CUDA_VERSION TORCH_VERSION WHEEL_PACKAGES \
    REHOST_PACKAGES FLASHINFER_VERSION BUILD_ANY_ARCH_WHEELS JIT_CACHE JIT_CACHE_INDEX WHEELHOUSE_SHARD \
    WHEELHOUSE_ASSEMBLE WHEELHOUSE_JIT_CACHE_MODULES DIST_DIR

if [[ -n "${WHEELHOUSE_SHARD:-}" && "$JIT_CACHE" != "built here" ]]; then
    die "WHEELHOUSE_SHARD=$WHEELHOUSE_SHARD: a shard is a share of flashinfer-jit-cache's modules, which this build does not compile ($JIT_CACHE); build the row without --shard"
fi
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
    wheel_rehosted flashinfer-cubin \
        || die "flashinfer-cubin cannot be built from the sources (upstream's build only downloads NVIDIA's prebuilt kernels from its artifact server); list it in components.$COMPONENT.rehost"
    download_prebuilt_wheel flashinfer-cubin "$FLASHINFER_VERSION" default "$DIST_DIR" \
        "NVIDIA's prebuilt kernels (upstream downloads them from its artifact server)"
fi
if [[ "$TARGET_ARCH" != "x86_64" && -z "${WHEELHOUSE_SHARD:-}" ]]; then
    log_info "TARGET_ARCH=$TARGET_ARCH: flashinfer-python and flashinfer-cubin come from the x86_64 row"
fi
if [[ "$JIT_CACHE" == "rehosted" ]]; then
    download_prebuilt_wheel flashinfer-jit-cache "$FLASHINFER_VERSION" "$JIT_CACHE_INDEX" "$DIST_DIR" \
        "flashinfer's ahead-of-time compile of every kernel (793 modules for sm_90 alone)"
elif [[ "$JIT_CACHE" == "built here" ]]; then
    flashinfer_require_headers .
    flashinfer_write_build_meta . "$FLASHINFER_VERSION" "$SOURCE_REVISION"
    flashinfer_jit_cache_build "$FLASHINFER_VERSION"
fi
if [[ -n "${WHEELHOUSE_SHARD:-}" ]]; then
    log_info "shard $WHEELHOUSE_SHARD compiled; its wheel is assembled from every shard (invoke assemble-shards)"
else
    list_dist_wheels
fi
