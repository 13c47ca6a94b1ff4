#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# RDMA development headers and NVSHMEM for DeepEP's internode kernels.

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# install_rdma_devel: the ibverbs headers (mlx5dv.h) from apt. DeepEP links no
# RDMA library and includes no rdmacm header; NVSHMEM opens libibverbs at run time.
install_rdma_devel() {
    apt_get update
    apt_get install -y --no-install-recommends libibverbs-dev
}

# rdma_header_found: whether the C++ compiler (CXX, CPATH honoured) finds
# infiniband/mlx5dv.h, which DeepEP's kernels include when built with NVSHMEM.
rdma_header_found() {
    printf '#include <infiniband/mlx5dv.h>\n' | "${CXX:-c++}" -E -x c++ - >/dev/null 2>&1
}

# ensure_rdma_headers: nothing to do where the headers are already there (an
# offline machine, a provisioned image); otherwise libibverbs-dev from apt.
ensure_rdma_headers() {
    if rdma_header_found; then
        log_info "RDMA headers: infiniband/mlx5dv.h found by ${CXX:-c++}"
        return 0
    fi
    log_info "infiniband/mlx5dv.h not found by ${CXX:-c++}: installing libibverbs-dev"
    install_rdma_devel || true
    rdma_header_found || die "infiniband/mlx5dv.h not found (DeepEP's NVSHMEM kernels include it) and apt could not install it: install libibverbs-dev, or put a directory holding infiniband/mlx5dv.h on CPATH"
}

# nvshmem_site_dir: where install_nvshmem unpacks the nvidia-nvshmem wheel when
# the row venv lacks the wanted version.
#
# Default: /usr/local/lib/python<X.Y>/dist-packages, outside the build venv,
# where a system Python on Debian/Ubuntu (verl's images) installs
# nvidia-nvshmem-cu<major>. Where it lives does not reach the wheel: DeepEP's
# extensions find NVSHMEM through $ORIGIN/nvidia/nvshmem/lib
# (patches/deep_ep_relative_nvshmem_rpath.py), beside them on users' machines.
#
# NVSHMEM_INSTALL_TARGET=venv installs into the row venv instead (no root
# needed). NVSHMEM_SITE_DIR overrides both with an explicit directory.
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

# row_venv_nvshmem: "DIR VERSION" of the nvidia.nvshmem package the row python
# imports (its own site-packages, --system-site-packages or a .pth file: where
# DeepEP's setup.py looks too), when the nvidia-nvshmem-cu<major> distribution
# installed it; nothing otherwise.
row_venv_nvshmem() {
    require_env CUDA_VERSION
    row_python - "nvidia-nvshmem-cu$(cuda_major "$CUDA_VERSION")" <<'PY'
import importlib.metadata, importlib.util, pathlib, sys
try:
    spec = importlib.util.find_spec("nvidia.nvshmem")
    found = pathlib.Path(list(spec.submodule_search_locations)[0]).resolve()
    dist = importlib.metadata.distribution(sys.argv[1])
except (ImportError, AttributeError, IndexError, TypeError):
    sys.exit(0)
if pathlib.Path(dist.locate_file("nvidia/nvshmem")).resolve() == found:
    print(found, dist.version)
PY
}

# check_nvshmem_layout DIR: what DeepEP's setup.py compiles and links against.
check_nvshmem_layout() {
    local dir="$1" part
    for part in include/nvshmem.h include/nvshmemx.h lib/libnvshmem_device.a; do
        [[ -e "$dir/$part" ]] || die "NVSHMEM at $dir has no $part; the nvidia-nvshmem wheel layout changed"
    done
    compgen -G "$dir/lib/libnvshmem_host.so.*" >/dev/null \
        || die "NVSHMEM at $dir has no lib/libnvshmem_host.so.*; the nvidia-nvshmem wheel layout changed"
}

# provide_nvshmem: NVSHMEM $NVSHMEM_VERSION for DeepEP's setup.py without the
# network where the row venv already has it (torch pins nvidia-nvshmem-cu<major>):
# NVSHMEM_DIR is then left unset, so setup.py finds that package itself and links
# its versioned libnvshmem_host.so.<N>, and nothing is written into a directory
# that may belong to the machine's Python. Another version, or NVSHMEM_SITE_DIR
# given: install_nvshmem. Either way the wheel names no NVSHMEM directory of the
# build machine (see nvshmem_site_dir).
provide_nvshmem() {
    require_env NVSHMEM_VERSION CUDA_VERSION
    local found dir version
    if [[ -z "${NVSHMEM_SITE_DIR:-}" ]]; then
        found="$(row_venv_nvshmem)"
        dir="${found% *}" version="${found##* }"
        if [[ -n "$found" && "$version" == "$NVSHMEM_VERSION" ]]; then
            check_nvshmem_layout "$dir"
            unset NVSHMEM_DIR
            log_info "NVSHMEM $version from the row venv: $dir (NVSHMEM_DIR unset: DeepEP's setup.py finds it)"
            return 0
        fi
        if [[ -n "$found" ]]; then
            log_info "the row venv has NVSHMEM $version at $dir, not NVSHMEM_VERSION=$NVSHMEM_VERSION: installing"
        else
            log_info "the row venv has no nvidia-nvshmem-cu$(cuda_major "$CUDA_VERSION"): installing"
        fi
    fi
    install_nvshmem
}
