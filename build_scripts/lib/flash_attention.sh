#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# flash-attention's parallelism rule, kept apart so it can be tested without
# a toolkit.

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# GiB one nvcc job needs per arch it compiles at once, by toolkit. With nvcc
# 12.9 and later a flash-attention backward unit peaks at 6.3 GB for one arch
# (hdim128, sm_90; measured), so 7 GiB; older toolkits stay with the request.
FLASH_ATTENTION_GIB_PER_ARCH=7

# build_memory_gib: the memory a build may use, in GiB. WHEELHOUSE_BUILD_MEMORY_GIB
# when set (a machine whose MemAvailable reads low at first, or a shared one),
# else MemAvailable from /proc/meminfo.
build_memory_gib() {
    if [[ -n "${WHEELHOUSE_BUILD_MEMORY_GIB:-}" ]]; then
        [[ "$WHEELHOUSE_BUILD_MEMORY_GIB" =~ ^[0-9]+$ ]] ||
            die "WHEELHOUSE_BUILD_MEMORY_GIB=$WHEELHOUSE_BUILD_MEMORY_GIB: expected a whole number of GiB"
        printf '%s\n' "$WHEELHOUSE_BUILD_MEMORY_GIB"
        return 0
    fi
    awk '/^MemAvailable:/ {printf "%d\n", $2 / 1048576; found = 1} END {if (!found) print 0}' /proc/meminfo
}

# flash_attention_max_jobs CUDA_VERSION MAX_JOBS NVCC_THREADS ARCH_COUNT -> the MAX_JOBS to use.
# With nvcc 12.9 and later each job needs FLASH_ATTENTION_GIB_PER_ARCH for every
# arch its nvcc threads compile at once, so MAX_JOBS is capped at what the build's
# memory holds (at least 1): 1 on a 16 GB hosted runner building four archs two
# at a time, 16 on a 128 GiB machine building one. Prints the value on stdout and,
# when it lowers the request, says why on stderr.
flash_attention_max_jobs() {
    local cuda="$1" requested="$2" threads="$3" archs="$4" mm memory parallel per_job fits
    mm="$(cuda_major_minor "$cuda")"
    if [[ "$(printf '%s\n12.9\n' "$mm" | sort -V | head -1)" != "12.9" ]]; then
        printf '%s\n' "$requested"  # before 12.9: the request as it is
        return 0
    fi
    memory="$(build_memory_gib)"
    parallel=$((threads < archs ? threads : archs))
    ((parallel >= 1)) || parallel=1
    per_job=$((FLASH_ATTENTION_GIB_PER_ARCH * parallel))
    fits=$((memory / per_job))
    ((fits >= 1)) || fits=1
    if ((fits < requested)); then
        log_info "MAX_JOBS lowered to $fits (requested $requested): each flash-attention job on CUDA $mm needs ~$per_job GiB ($parallel arch(s) at once) and the build has $memory GiB (WHEELHOUSE_BUILD_MEMORY_GIB, else MemAvailable)"
        printf '%s\n' "$fits"
    else
        printf '%s\n' "$requested"
    fi
}
