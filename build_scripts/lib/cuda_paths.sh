#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Toolkit paths that some components do not find on their own.

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# cuda_root: the toolkit the build uses.
cuda_root() {
    printf '%s\n' "${CUDA_HOME:-${CUDA_PATH:-/usr/local/cuda}}"
}

# cuda_target_dir: the toolkit's per-target subdirectory. NVIDIA names arm64
# server toolkits "sbsa-linux".
cuda_target_dir() {
    local arch="${TARGET_ARCH:-$(uname -m)}"
    case "$arch" in
        x86_64) printf 'x86_64-linux\n' ;;
        aarch64 | arm64) printf 'sbsa-linux\n' ;;
        *) die "unsupported TARGET_ARCH '$arch' (expected x86_64 or aarch64)" ;;
    esac
}

# prepend_path VAR DIR: DIR first in the colon list VAR, without an empty
# element when VAR was unset (an empty element means "current directory").
prepend_path() {
    local var="$1" dir="$2"
    export "$var=$dir${!var:+:${!var}}"
}

# ensure_cuda_cccl_include_path: CUDA 13 moved CCCL (cub, thrust,
# libcu++) under include/cccl; sources that include <cub/...> directly need it
# on CPATH. Only warns when absent: older toolkits keep CCCL in include/.
ensure_cuda_cccl_include_path() {
    local root target dir
    root="$(cuda_root)"
    target="$(cuda_target_dir)"
    for dir in "$root/targets/$target/include/cccl" "$root/include/cccl"; do
        if [[ -d "$dir" ]]; then
            prepend_path CPATH "$dir"
            log_info "CCCL include path: $dir"
            return 0
        fi
    done
    log_warn "no include/cccl under $root; relying on the compiler's default include path"
}

# ensure_cuda_stub_library_path: link-time libcuda.so for machines without a
# driver (build runners). The stub comes with the toolkit's driver-dev package.
ensure_cuda_stub_library_path() {
    local root target dir
    root="$(cuda_root)"
    target="$(cuda_target_dir)"
    for dir in "$root/lib64/stubs" "$root/targets/$target/lib/stubs"; do
        if [[ -e "$dir/libcuda.so" ]]; then
            prepend_path LIBRARY_PATH "$dir"
            log_info "libcuda stub: $dir/libcuda.so"
            return 0
        fi
    done
    die "no libcuda.so stub under $root/lib64/stubs or $root/targets/$target/lib/stubs; install the toolkit's driver-dev package (cuda-driver-dev-<major>-<minor>)"
}
