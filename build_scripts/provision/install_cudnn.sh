#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# cuDNN for components that need it at build time (TransformerEngine), from
# NVIDIA's CUDA apt repository. Source it and call install_cudnn, or run it.
#
#   CUDA_VERSION   required, e.g. 13.0.2 (selects cudnn9-cuda-13)
#   TARGET_ARCH    x86_64 | aarch64 (default: uname -m); aarch64 uses the sbsa repo
#   CUDNN_VERSION  optional pin, a version prefix such as 9.14.0 or 9.14.0.64-1;
#                  without it apt installs the newest cuDNN 9 for that CUDA major
#   CUDA_REPO_DISTRO  optional, default ubuntu2404 (the runners' distribution)
set -euo pipefail

# shellcheck source=../lib/env.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib/env.sh"

# cuda_repo_arch: NVIDIA's repository directory for this machine.
cuda_repo_arch() {
    local arch="${TARGET_ARCH:-$(uname -m)}"
    case "$arch" in
        x86_64) printf 'x86_64\n' ;;
        aarch64 | arm64) printf 'sbsa\n' ;;
        *) die "unsupported TARGET_ARCH '$arch' for cuDNN (expected x86_64 or aarch64)" ;;
    esac
}

# fetch URL DEST: with whichever downloader the runner has.
fetch() {
    if command -v curl >/dev/null 2>&1; then
        curl -fsSL --retry 5 -o "$2" "$1"
    elif command -v wget >/dev/null 2>&1; then
        wget -q --tries=5 -O "$2" "$1"
    else
        die "neither curl nor wget is installed; cannot fetch $1"
    fi
}

# cudnn_pick_version PREFIX < `apt-cache madison` output: the first (newest)
# version starting with PREFIX.
cudnn_pick_version() {
    awk -F'|' -v prefix="$1" '{ v = $2; gsub(/[ \t]/, "", v); if (index(v, prefix) == 1) { print v; exit } }'
}

install_cudnn() {
    require_env CUDA_VERSION
    local major repo_arch distro keyring meta version
    # shellcheck disable=SC2153 # CUDA_VERSION comes from the environment
    major="$(cuda_major "$CUDA_VERSION")"
    repo_arch="$(cuda_repo_arch)"
    distro="${CUDA_REPO_DISTRO:-ubuntu2404}"
    keyring="$(mktemp --suffix=.deb)"
    fetch "https://developer.download.nvidia.com/compute/cuda/repos/${distro}/${repo_arch}/cuda-keyring_1.1-1_all.deb" "$keyring"
    maybe_sudo dpkg -i "$keyring"
    rm -f "$keyring"
    apt_get update
    meta="cudnn9-cuda-${major}"
    if [[ -n "${CUDNN_VERSION:-}" ]]; then
        version="$(apt-cache madison "$meta" | cudnn_pick_version "$CUDNN_VERSION")"
        [[ -n "$version" ]] || die "no $meta version starting with '$CUDNN_VERSION' in NVIDIA's $distro/$repo_arch repository"
        log_info "installing cuDNN $version (pinned by CUDNN_VERSION=$CUDNN_VERSION)"
        # Pin the libraries too: the meta package alone would let them float.
        apt_get install -y --allow-downgrades --allow-change-held-packages \
            "$meta=$version" "libcudnn9-cuda-${major}=$version" "libcudnn9-dev-cuda-${major}=$version"
    else
        log_info "installing the newest $meta (set CUDNN_VERSION to pin)"
        apt_get install -y --allow-downgrades --allow-change-held-packages "$meta"
    fi
}

# Run when executed, not when sourced.
if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
    install_cudnn
fi
