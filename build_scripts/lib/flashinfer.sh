#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# flashinfer: flashinfer-python is built here; flashinfer-cubin (NVIDIA's
# prebuilt kernels, which only flashinfer's artifact server holds) and
# flashinfer-jit-cache (flashinfer's ahead-of-time compile of every kernel)
# are rehosted from the indexes that publish them.

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# flashinfer_jit_cache_cu_index 13.0.2 -> cu130 (the index path segment).
flashinfer_jit_cache_cu_index() {
    local mm
    mm="$(cuda_major_minor "$1")" || exit 1
    printf 'cu%s\n' "${mm//./}"
}

# flashinfer_checkout_version [DIR]: the version of the sources, which the
# rehosted wheels must match: version.txt of a git checkout, or the Version of
# an sdist's PKG-INFO (upstream's sdist has no version.txt).
flashinfer_checkout_version() {
    local dir="${1:-.}" version=""
    if [[ -f "$dir/version.txt" ]]; then
        version="$(tr -d '[:space:]' <"$dir/version.txt")"
        [[ -n "$version" ]] || die "$dir/version.txt is empty"
    elif [[ -f "$dir/PKG-INFO" ]]; then
        version="$(sed -n 's/^Version:[[:space:]]*//p' "$dir/PKG-INFO" | head -1 | tr -d '[:space:]')"
        [[ -n "$version" ]] || die "$dir/PKG-INFO has no Version line"
    else
        die "no version.txt (git checkout) or PKG-INFO (sdist) in $(cd "$dir" && pwd); is this a flashinfer source tree?"
    fi
    printf '%s\n' "$version"
}

# flashinfer_require_headers [DIR]: the submodule trees flashinfer-python
# packages as headers for its JIT. Upstream's backend copies each only if it
# exists, so a checkout without one would build a wheel whose kernels cannot
# compile; refuse that here, naming the tree.
flashinfer_require_headers() {
    local dir="${1:-.}" header
    for header in 3rdparty/cutlass/include/cutlass/cutlass.h 3rdparty/spdlog/include/spdlog/spdlog.h \
        3rdparty/cccl/libcudacxx/include/cuda/std/version 3rdparty/cccl/cub/cub/cub.cuh \
        3rdparty/cccl/thrust/thrust/version.h; do
        [[ -f "$dir/$header" ]] || die "flashinfer sources lack $header: the ${header%%/include*} submodule is not checked out; list it in components.flashinfer.source.submodules (or build from the sdist)"
    done
}

# flashinfer_write_build_meta DIR VERSION COMMIT: flashinfer/_build_meta.py
# as upstream's backend writes it, with the commit of the sources. The backend
# asks `git rev-parse HEAD` itself, which in a build directory without .git
# answers with whatever repository lies around it; it keeps a file that exists.
# An sdist already carries the file upstream wrote: it is left as it is.
flashinfer_write_build_meta() {
    local dir="$1" version="$2" commit="$3" meta="$1/flashinfer/_build_meta.py"
    if [[ -f "$dir/PKG-INFO" && -f "$meta" ]]; then
        return 0
    fi
    [[ -d "$dir/flashinfer" ]] || die "no flashinfer/ package in $(cd "$dir" && pwd)"
    if [[ -n "${FLASHINFER_DEV_RELEASE_SUFFIX:-}" ]]; then
        version="$version.dev$FLASHINFER_DEV_RELEASE_SUFFIX"
    fi
    if [[ -n "${FLASHINFER_LOCAL_VERSION:-}" ]]; then
        version="$version+$FLASHINFER_LOCAL_VERSION"
    fi
    printf '"""Build metadata for flashinfer package."""\n__version__ = "%s"\n__git_version__ = "%s"\n' \
        "$version" "$commit" >"$meta"
}

# wheel_package_wanted NAME: whether WHEEL_PACKAGES (the component's
# wheel_packages, space-separated) lists NAME.
wheel_package_wanted() {
    [[ " ${WHEEL_PACKAGES:-} " == *" $1 "* ]]
}

# download_prebuilt_wheel PKG VERSION INDEX_URL DEST WHAT [ATTEMPTS]: pip
# download one binary wheel, retrying transient failures (ATTEMPTS, default 5,
# with WHEELHOUSE_RETRY_SLEEP seconds between them, default 10). INDEX_URL
# "default" is pip's own configuration. WHAT says what the wheel holds, for
# the one line that ends a build which could not get it.
download_prebuilt_wheel() {
    local pkg="$1" version="$2" index="$3" dest="$4" what="$5" attempts="${6:-5}"
    local pause="${WHEELHOUSE_RETRY_SLEEP:-10}" attempt where="pip's configured index" index_args=()
    if [[ "$index" != default ]]; then
        index_args=(--index-url "$index")
        where="$index"
    fi
    mkdir -p "$dest"
    for ((attempt = 1; attempt <= attempts; attempt++)); do
        log_info "downloading $pkg==$version from $where (attempt $attempt/$attempts)"
        if row_python -m pip download -q --disable-pip-version-check "$pkg==$version" \
            "${index_args[@]}" --no-deps --only-binary=:all: -d "$dest"; then
            return 0
        fi
        if ((attempt < attempts)); then
            sleep "$pause"
        fi
    done
    die "could not download $pkg==$version from $where after $attempts attempts; it holds $what, which cannot be built here: reach that index, or drop $pkg from components.$COMPONENT.wheel_packages"
}
