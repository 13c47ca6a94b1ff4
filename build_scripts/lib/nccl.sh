#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# NCCL for builds that include nccl.h (TransformerEngine, whose every
# translation unit does, though it links libnccl only with cuBLASMp): from the
# row venv's nvidia-nccl-cu<major> (a dependency of CUDA torch, so the NCCL
# torch runs with), else from NVIDIA's apt repository. The toolkit ships none.

# shellcheck source=cuda_paths.sh
source "$(dirname "${BASH_SOURCE[0]}")/cuda_paths.sh"

# nccl_pick_version CUDA_MM [PREFIX] < `apt-cache madison libnccl-dev` output:
# the first (newest) version built for CUDA_MM ("2.28.3-1+cuda13.0"), or the
# first one that also starts with PREFIX when NCCL_VERSION pins one.
nccl_pick_version() {
    local cuda_mm="$1" prefix="${2:-}"
    awk -F'|' -v want="+cuda${cuda_mm}" -v prefix="$prefix" '
        {
            v = $2
            gsub(/[ \t]/, "", v)
            if (index(v, want) && (prefix == "" || index(v, prefix) == 1)) { print v; exit }
        }'
}

# install_nccl: libnccl-dev and libnccl2 at the same version, matched to the
# row's CUDA major.minor. NCCL_VERSION (optional) pins a version prefix, e.g.
# "2.28.3" or "2.28.3-1+cuda13.0"; without it the newest matching build is used.
install_nccl() {
    require_env CUDA_VERSION
    local cuda_mm version
    cuda_mm="$(cuda_major_minor "$CUDA_VERSION")"
    apt_get update
    version="$(apt-cache madison libnccl-dev | nccl_pick_version "$cuda_mm" "${NCCL_VERSION:-}")"
    [[ -n "$version" ]] \
        || die "no libnccl-dev${NCCL_VERSION:+ $NCCL_VERSION} built for CUDA $cuda_mm in the apt sources (is NVIDIA's CUDA repository configured?)"
    log_info "installing NCCL $version"
    apt_get install -y --no-install-recommends --allow-change-held-packages \
        "libnccl-dev=$version" "libnccl2=$version"
}

# ensure_nccl_header: nccl.h on CPATH from the row venv's NCCL wheel when it
# has one (no network needed); otherwise install_nccl.
ensure_nccl_header() {
    local dir
    dir="$(python_package_dir nvidia.nccl)"
    if [[ -n "$dir" && -f "$dir/include/nccl.h" ]]; then
        append_path CPATH "$dir/include"
        log_info "nccl.h: from the row venv's NCCL wheel ($dir/include)"
        return 0
    fi
    log_info "no NCCL wheel in the row venv: installing libnccl-dev from apt"
    install_nccl
}
