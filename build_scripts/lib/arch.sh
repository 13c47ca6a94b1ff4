#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# CUDA architecture lists. TORCH_CUDA_ARCH_LIST arrives dotted ("8.0;9.0;10.0",
# or space separated with suffixes as flashinfer writes it: "9.0a 10.0a").
# Decisions about the list (e.g. whether DeepEP needs its sm_80 patch) are made
# here in shell, so builders do not import the wheelhouse's Python library.

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# arch_list_strip_dots "8.0;9.0;10.0" -> "80;90;100". Separators and suffixes
# are kept ("9.0a 10.0a" -> "90a 100a"); flash-attention and TransformerEngine
# want this spelling.
arch_list_strip_dots() {
    printf '%s\n' "${1//./}"
}

# arch_number TOKEN -> integer major*10+minor ("9.0a" -> 90, "10.0" -> 100,
# "12.1" -> 121, "8.0+PTX" -> 80, "90a" -> 90). Dies on a token it cannot read:
# a typo must not silently change which code paths a build takes.
arch_number() {
    local token="$1"
    token="${token%+[Pp][Tt][Xx]}"
    if [[ "$token" =~ ^([0-9]+)\.([0-9])[a-z]?$ ]]; then
        printf '%d\n' "$((10#${BASH_REMATCH[1]} * 10 + 10#${BASH_REMATCH[2]}))"
    elif [[ "$token" =~ ^([0-9]+)([0-9])[a-z]?$ ]]; then
        printf '%d\n' "$((10#${BASH_REMATCH[1]} * 10 + 10#${BASH_REMATCH[2]}))"
    else
        die "cannot read CUDA arch '$1' (expected e.g. 8.0, 9.0a, 12.0f or 90)"
    fi
}

# arch_list_tokens LIST: one token per line; ';', ',' and whitespace separate.
arch_list_tokens() {
    local token parts=()
    IFS=$' \t\n;,' read -r -a parts <<<"$1"
    for token in "${parts[@]}"; do
        printf '%s\n' "$token"
    done
}

# arch_list_has_below LIST THRESHOLD: succeed when any arch in LIST is older
# than THRESHOLD (e.g. "8.0;9.0;10.0" 9.0 -> yes). An empty LIST has none.
arch_list_has_below() {
    local list="$1" limit token number
    # `|| exit 1`: arch_number dies in a subshell, and callers use this
    # function as an `if` condition, where set -e does not apply.
    limit="$(arch_number "$2")" || exit 1
    while IFS= read -r token; do
        [[ -n "$token" ]] || continue
        number="$(arch_number "$token")" || exit 1
        if ((number < limit)); then
            return 0
        fi
    done < <(arch_list_tokens "$list")
    return 1
}

# arch_list_has_pre_hopper LIST: any arch below 9.0 (A100 and older).
arch_list_has_pre_hopper() {
    arch_list_has_below "$1" 9.0
}

# activate_arch_filter: when the build step asked for nvcc argument filtering
# (WHEELHOUSE_NVCC_ARCHS set and the filter first on PATH as `nvcc`), make
# torch's extension builder use it too. torch calls "$CUDA_HOME/bin/nvcc" by
# absolute path, which PATH cannot intercept; under ninja it honours
# PYTORCH_NVCC instead, so that must end in the filter. A launcher prefix
# already there (e.g. "sccache <nvcc>") is kept.
activate_arch_filter() {
    if [[ -z "${WHEELHOUSE_NVCC_ARCHS:-}" ]]; then
        return 0
    fi
    require_env WHEELHOUSE_REAL_NVCC
    local shim target
    shim="$(command -v nvcc || true)"
    [[ -n "$shim" ]] || die "WHEELHOUSE_NVCC_ARCHS is set but no nvcc is on PATH (expected the nvcc-arch-filter link)"
    target="$(readlink -f "$shim")"
    [[ "${target##*/}" == "nvcc-arch-filter" ]] \
        || die "WHEELHOUSE_NVCC_ARCHS is set but nvcc on PATH is $shim -> $target, not nvcc-arch-filter"
    local current="${PYTORCH_NVCC:-}" prefix=""
    if [[ -n "$current" && "$(readlink -f "${current##* }" 2>/dev/null || true)" == "$target" ]]; then
        : # the build step already routes torch through the filter
    else
        if [[ "$current" == *" "* ]]; then
            prefix="${current% *} "
        fi
        export PYTORCH_NVCC="$prefix$shim"
    fi
    row_python -c 'import ninja' 2>/dev/null \
        || log_warn "ninja is not importable: torch's non-ninja build calls \$CUDA_HOME/bin/nvcc directly and bypasses the arch filter"
    log_info "nvcc arch filter active: keeping ${WHEELHOUSE_NVCC_ARCHS} (PYTORCH_NVCC=$PYTORCH_NVCC, real nvcc $WHEELHOUSE_REAL_NVCC)"
}

# nvcc_threads_for GENCODES: the nvcc --threads for a unit with GENCODES archs:
# NVCC_THREADS (nvcc_threads in versions.yaml), at most one per gencode (more
# would idle). Dies on a NVCC_THREADS that is not a positive integer.
nvcc_threads_for() {
    local threads="${NVCC_THREADS:-1}" gencodes="$1"
    [[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "NVCC_THREADS must be a positive integer, got '$threads' (nvcc_threads in versions.yaml)"
    printf '%s\n' "$((threads < gencodes ? threads : gencodes))"
}

# append_nvcc_threads GENCODES: for a setup.py that passes no --threads to
# nvcc, hand it nvcc_threads_for GENCODES through NVCC_APPEND_FLAGS (which
# nvcc reads itself, under sccache and the arch filter alike), so one unit's
# gencodes compile side by side; nothing when that is one thread.
append_nvcc_threads() {
    local threads
    threads="$(nvcc_threads_for "$1")" || exit 1
    if ((threads > 1)); then
        export NVCC_APPEND_FLAGS="${NVCC_APPEND_FLAGS:+$NVCC_APPEND_FLAGS }--threads $threads"
    fi
}
