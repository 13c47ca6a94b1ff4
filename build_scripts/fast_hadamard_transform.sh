#!/usr/bin/env bash
# fast-hadamard-transform. Its setup.py hard-codes one gencode per arch the
# toolkit knows (nine on CUDA 13); the build step narrows them with the nvcc
# arch filter (arch_filter: true) when versions.yaml asks for fewer.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/arch.sh
source "$LIB/arch.sh"

require_env MAX_JOBS CXX11_ABI DIST_DIR
# the gencodes its setup.py lists for CUDA 13 (sm_75 to sm_121)
FAST_HADAMARD_TRANSFORM_GENCODES=9
ensure_dist_dir
export_extra_env

pip_install_build_deps ninja packaging wheel setuptools
export FAST_HADAMARD_TRANSFORM_FORCE_BUILD=TRUE
export FAST_HADAMARD_TRANSFORM_FORCE_CXX11_ABI="$CXX11_ABI"
# A local version ("+cu130torch2.13...") is upstream's release naming; ours
# stays plain so the filename matches the metadata.
unset FAST_HADAMARD_TRANSFORM_LOCAL_VERSION
activate_arch_filter
# Its one CUDA unit carries every gencode (nine on CUDA 13, or what the arch
# filter keeps) and its setup.py gives nvcc no --threads: without them nvcc
# compiles the gencodes one after another.
if [[ -n "${WHEELHOUSE_NVCC_ARCHS:-}" ]]; then
    append_nvcc_threads "$WHEELHOUSE_ARCHS_COUNT"  # the filter keeps the arch list's, which the contract counts
else
    append_nvcc_threads "$FAST_HADAMARD_TRANSFORM_GENCODES"
fi

print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION TORCH_VERSION MAX_JOBS CXX11_ABI \
    FAST_HADAMARD_TRANSFORM_FORCE_BUILD FAST_HADAMARD_TRANSFORM_FORCE_CXX11_ABI WHEELHOUSE_NVCC_ARCHS NVCC_APPEND_FLAGS DIST_DIR
print_torch

MAX_JOBS="$MAX_JOBS" row_python setup.py bdist_wheel --dist-dir="$DIST_DIR"
list_dist_wheels
