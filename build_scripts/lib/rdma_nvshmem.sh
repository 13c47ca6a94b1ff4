#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# RDMA development headers and NVSHMEM for DeepEP's internode kernels.

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# install_rdma_devel: ibverbs/rdmacm headers that NVSHMEM's IBGDA path needs.
install_rdma_devel() {
    apt_get update
    apt_get install -y --no-install-recommends libibverbs-dev librdmacm-dev ibverbs-providers
}

# nvshmem_site_dir: where the nvidia-nvshmem wheel is unpacked.
#
# Default: /usr/local/lib/python<X.Y>/dist-packages, outside the build venv, on
# purpose. DeepEP's setup.py links with -Wl,-rpath,$NVSHMEM_DIR/lib, so the
# wheel we publish carries that absolute directory. It is where a system
# Python on Debian/Ubuntu (verl's images) installs nvidia-nvshmem-cu<major>, so
# the rpath resolves on users' machines; a venv path would point at a runner
# directory that exists nowhere else.
#
# NVSHMEM_INSTALL_TARGET=venv installs into the row venv instead (no root
# needed; the rpath then points into that venv). NVSHMEM_SITE_DIR overrides
# both with an explicit directory.
nvshmem_site_dir() {
    if [[ -n "${NVSHMEM_SITE_DIR:-}" ]]; then
        printf '%s\n' "$NVSHMEM_SITE_DIR"
    elif [[ "${NVSHMEM_INSTALL_TARGET:-system}" == "venv" ]]; then
        row_python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
    else
        require_env PYTHON_VERSION
        printf '/usr/local/lib/python%s/dist-packages\n' "$PYTHON_VERSION"
    fi
}

# link_nvshmem_host_lib DIR: DeepEP links "-l:libnvshmem_host.so" when
# NVSHMEM_DIR is given, but the wheel ships only the versioned soname
# (libnvshmem_host.so.3); add the unversioned link.
link_nvshmem_host_lib() {
    local lib="$1/lib" soname
    soname="$(find "$lib" -maxdepth 1 -name 'libnvshmem_host.so.*' -printf '%f\n' 2>/dev/null | sort | head -n 1 || true)"
    [[ -n "$soname" ]] || die "no libnvshmem_host.so.* in $lib; the nvidia-nvshmem wheel layout changed"
    if [[ ! -e "$lib/libnvshmem_host.so" ]]; then
        maybe_sudo ln -s "$soname" "$lib/libnvshmem_host.so"
    fi
    log_info "NVSHMEM host library: $lib/libnvshmem_host.so -> $soname"
}

# install_nvshmem: nvidia-nvshmem-cu<major>==$NVSHMEM_VERSION, then
# NVSHMEM_DIR exported for DeepEP's setup.py.
install_nvshmem() {
    require_env NVSHMEM_VERSION CUDA_VERSION
    local major site pkg py
    major="$(cuda_major "$CUDA_VERSION")"
    site="$(nvshmem_site_dir)"
    pkg="nvidia-nvshmem-cu${major}==${NVSHMEM_VERSION}"
    # sudo resets PATH, so name the venv's interpreter explicitly.
    py="$(command -v python)"
    log_info "installing $pkg into $site"
    if [[ "${NVSHMEM_INSTALL_TARGET:-system}" == "venv" && -z "${NVSHMEM_SITE_DIR:-}" ]]; then
        "$py" -m pip install -q --disable-pip-version-check --upgrade "$pkg"
    else
        maybe_sudo mkdir -p "$site"
        maybe_sudo "$py" -m pip install -q --disable-pip-version-check --upgrade --target "$site" "$pkg"
    fi
    export NVSHMEM_DIR="$site/nvidia/nvshmem"
    [[ -d "$NVSHMEM_DIR" ]] || die "$pkg installed but $NVSHMEM_DIR does not exist"
    link_nvshmem_host_lib "$NVSHMEM_DIR"
    log_info "NVSHMEM_DIR=$NVSHMEM_DIR"
}
