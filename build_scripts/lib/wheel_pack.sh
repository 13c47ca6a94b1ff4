#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Local-version stripping for wheels whose setup.py appends "+<git sha>".
# GitHub release assets turn "+" into ".", which would desynchronise the
# filename from the metadata, and the sha says nothing the release does not.
# The rewrite itself lives in the wheelhouse library (ci/formats/rewrite.py):
# one implementation, tested in Python, instead of an unpack/sed/repack here.

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# strip_local_version [DIR]: rewrite every wheel in DIR (default DIST_DIR)
# whose version carries a local segment, in place, with the wheelhouse's own
# interpreter (wheelhouse_ci, env.sh).
strip_local_version() {
    local dir="${1:-${DIST_DIR:-}}" whl wheels=()
    [[ -n "$dir" ]] || die "strip_local_version: no directory given and DIST_DIR is unset"
    dir="$(cd "$dir" && pwd)"
    for whl in "$dir"/*.whl; do
        [[ -e "$whl" ]] || continue
        if [[ "${whl##*/}" == *+* ]]; then
            wheels+=("$whl")
        fi
    done
    if ((${#wheels[@]} == 0)); then
        log_info "no local version to strip in $dir"
        return 0
    fi
    log_info "stripping local version: ${wheels[*]##*/}"
    wheelhouse_ci strip-local-version "${wheels[@]}"
    # Trust, but verify: the result must be in place and plain.
    for whl in "$dir"/*.whl; do
        [[ -e "$whl" ]] || continue
        [[ "${whl##*/}" != *+* ]] || die "python -m ci strip-local-version left a local version in ${whl##*/}"
    done
}
