#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# flashinfer: two of its three wheels are rehosted from flashinfer's own index
# rather than compiled here (the jit-cache one is ~1.2 GB of prebuilt cubins).

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# flashinfer_jit_cache_cu_index 13.0.2 -> cu130 (the index path segment).
flashinfer_jit_cache_cu_index() {
    local mm
    mm="$(cuda_major_minor "$1")" || exit 1
    printf 'cu%s\n' "${mm//./}"
}

# flashinfer_checkout_version [DIR]: the version in the checkout's
# version.txt, which the prebuilt wheels must match.
flashinfer_checkout_version() {
    local file="${1:-.}/version.txt" version
    [[ -f "$file" ]] || die "no version.txt in $(cd "${1:-.}" && pwd); is this a flashinfer checkout?"
    version="$(tr -d '[:space:]' <"$file")"
    [[ -n "$version" ]] || die "$file is empty"
    printf '%s\n' "$version"
}

# download_prebuilt_wheel PKG VERSION INDEX_URL DEST [ATTEMPTS]: pip download
# one binary wheel, retrying transient failures (ATTEMPTS, default 5, with
# WHEELHOUSE_RETRY_SLEEP seconds between them, default 10).
download_prebuilt_wheel() {
    local pkg="$1" version="$2" index="$3" dest="$4" attempts="${5:-5}"
    local pause="${WHEELHOUSE_RETRY_SLEEP:-10}" attempt
    mkdir -p "$dest"
    for ((attempt = 1; attempt <= attempts; attempt++)); do
        log_info "downloading $pkg==$version from $index (attempt $attempt/$attempts)"
        if row_python -m pip download -q --disable-pip-version-check "$pkg==$version" \
            --index-url "$index" --no-deps --only-binary=:all: -d "$dest"; then
            return 0
        fi
        if ((attempt < attempts)); then
            sleep "$pause"
        fi
    done
    die "could not download $pkg==$version from $index after $attempts attempts"
}
