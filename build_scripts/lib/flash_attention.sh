#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# flash-attention's parallelism rule, kept apart so it can be tested without
# a toolkit.

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"

# flash_attention_max_jobs CUDA_VERSION MAX_JOBS -> the MAX_JOBS to use.
# nvcc 12.9, 13.0 and 13.2 need so much memory per flash-attention translation
# unit that more than one job gets the runner OOM-killed, so those toolkits are
# forced to 1 whatever versions.yaml says. Prints the value on stdout and, when
# it overrides the request, says so on stderr.
flash_attention_max_jobs() {
    local cuda="$1" requested="$2" mm
    mm="$(cuda_major_minor "$cuda")"
    case "$mm" in
        12.9 | 13.0 | 13.2)
            if [[ "$requested" != "1" ]]; then
                log_info "MAX_JOBS forced to 1 for CUDA $mm (requested $requested): flash-attention's nvcc jobs exhaust memory in parallel"
            fi
            printf '1\n'
            ;;
        *)
            printf '%s\n' "$requested"
            ;;
    esac
}
