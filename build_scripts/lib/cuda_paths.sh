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

# append_path VAR DIR: DIR last in the colon list VAR, unless it is there
# already (what VAR held first keeps its precedence).
append_path() {
    local var="$1" dir="$2"
    case ":${!var:-}:" in *":$dir:"*) ;; *) export "$var=${!var:+${!var}:}$dir" ;; esac
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

# cuda_wheels_dir: nvidia/cu<major> in the row venv, where the CUDA wheels that
# torch depends on (cuda-toolkit, nvidia-cublas, nvidia-cuda-nvrtc...) put their
# headers and libraries; empty when that venv has none.
cuda_wheels_dir() {
    local purelib dir
    purelib="$(row_python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
    dir="$purelib/nvidia/cu${CUDA_VERSION%%.*}"
    [[ -d "$dir" ]] && printf '%s\n' "$dir"
    return 0
}

# ensure_cuda_headers HEADER...: a toolkit installed without some of its parts
# (no cuBLAS or NVRTC headers, say) gets them from the row venv's CUDA wheels,
# of the CUDA version torch was built for. Appended to CPATH, so a complete
# toolkit's own headers still come first; dies naming what is found nowhere.
ensure_cuda_headers() {
    local root wheels header
    root="$(cuda_root)"
    wheels="$(cuda_wheels_dir)"
    for header in "$@"; do
        [[ -f "$root/include/$header" || -f "$root/targets/$(cuda_target_dir)/include/$header" ]] && continue
        [[ -n "$wheels" && -f "$wheels/include/$header" ]] \
            || die "$header is neither in $root/include nor in the row venv's CUDA wheels; install the toolkit's development headers for it"
        append_path CPATH "$wheels/include"
        log_info "$header: from the CUDA wheels ($wheels/include)"
    done
}

# The toolkit headers torch's ATen/cuda/CUDAContextLight.h includes in a CUDA
# build: every extension that includes ATen/cuda/CUDAContext.h compiles them.
TORCH_CUDA_CONTEXT_HEADERS=(cuda_runtime_api.h cusparse.h cublas_v2.h cublasLt.h cusolverDn.h)

# ensure_torch_cuda_headers: TORCH_CUDA_CONTEXT_HEADERS from the toolkit, or from
# the row venv's CUDA wheels where the toolkit lacks them (a minimal toolkit of
# nvcc and the runtime, as on machines that only compile).
ensure_torch_cuda_headers() {
    ensure_cuda_headers "${TORCH_CUDA_CONTEXT_HEADERS[@]}"
}

# ensure_cuda_libraries NAME...: link-time lib<NAME>.so for libraries the
# toolkit lacks, from the row venv's CUDA wheels, which ship only
# lib<NAME>.so.<major>: a lib<NAME>.so link to it in the build directory
# (beside DIST_DIR) goes on LIBRARY_PATH. At run time torch loads the same
# wheels' libraries.
ensure_cuda_libraries() {
    local root wheels name found link_dir
    root="$(cuda_root)"
    wheels="$(cuda_wheels_dir)"
    link_dir="$(dirname "$DIST_DIR")/cuda-wheel-libs"
    for name in "$@"; do
        [[ -e "$root/lib64/lib$name.so" || -e "$root/targets/$(cuda_target_dir)/lib/lib$name.so" ]] && continue
        found="$(compgen -G "${wheels:-/nonexistent}/lib/lib$name.so.[0-9]*" | sort | head -1 || true)"
        [[ -n "$found" ]] || die "lib$name.so is neither in $root/lib64 nor in the row venv's CUDA wheels; install the toolkit's lib$name"
        mkdir -p "$link_dir"
        ln -sfn "$found" "$link_dir/lib$name.so"
        prepend_path LIBRARY_PATH "$link_dir"
        log_info "lib$name.so: from the CUDA wheels ($found)"
    done
}
