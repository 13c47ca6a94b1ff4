#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# The nvcc arch filter and nvcc's threads. The arch list itself is parsed once,
# by ci/building/job.py, and arrives in the forms builders use (README, "The build
# environment contract"): WHEELHOUSE_ARCHS (8.0;9.0a), WHEELHOUSE_ARCHS_SM
# (80;90a), WHEELHOUSE_ARCHS_COUNT, WHEELHOUSE_ARCHS_PTX and
# WHEELHOUSE_ARCHS_PRE_HOPPER; no builder parses it again.

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

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
