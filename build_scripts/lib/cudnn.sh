#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# cuDNN for builds that compile against it (TransformerEngine). CUDA torch
# depends on nvidia-cudnn-cu<major>, so the row venv normally has the very
# cuDNN torch loads at run time; CI's provisioning step
# (provision/install_cudnn.sh) puts one under /usr as well.

# shellcheck source=cuda_paths.sh
source "$(dirname "${BASH_SOURCE[0]}")/cuda_paths.sh"

# ensure_cudnn: CUDNN_PATH names a cuDNN with include/cudnn.h, in this order:
# the caller's CUDNN_PATH, the row venv's cuDNN wheel, a system cuDNN (which
# CMake finds by itself, so CUDNN_PATH stays unset). Dies naming both fixes
# when there is none.
ensure_cudnn() {
    local dir
    if [[ -n "${CUDNN_PATH:-}" ]]; then
        [[ -f "$CUDNN_PATH/include/cudnn.h" ]] \
            || die "CUDNN_PATH=$CUDNN_PATH has no include/cudnn.h; point it at a cuDNN install or unset it"
        log_info "cuDNN: CUDNN_PATH=$CUDNN_PATH (from the environment)"
        return 0
    fi
    dir="$(python_package_dir nvidia.cudnn)"
    if [[ -n "$dir" && -f "$dir/include/cudnn.h" ]]; then
        export CUDNN_PATH="$dir"
        log_info "cuDNN: from the row venv's cuDNN wheel (CUDNN_PATH=$dir)"
        return 0
    fi
    for dir in /usr/include "$(cuda_root)/include"; do
        if [[ -f "$dir/cudnn.h" ]]; then
            log_info "cuDNN: the system's ($dir/cudnn.h)"
            return 0
        fi
    done
    die "no cudnn.h in the row venv (nvidia.cudnn) nor under /usr/include or the toolkit; pip install nvidia-cudnn-cu${CUDA_VERSION%%.*} into the row venv or run build_scripts/provision/install_cudnn.sh"
}
