#!/usr/bin/env bash
# apex with its C++ and CUDA extensions (--cpp_ext --cuda_ext: apex_C and the
# eleven core CUDA extensions), for the dotted TORCH_CUDA_ARCH_LIST as given
# (apex's setup.py reads it through torch). Offline: the row venv's setuptools
# and torch, no isolated build, nothing installed.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/arch.sh
source "$LIB/arch.sh"

require_env TORCH_CUDA_ARCH_LIST WHEELHOUSE_ARCHS_COUNT MAX_JOBS DIST_DIR
ensure_dist_dir
export_extra_env
[[ "$MAX_JOBS" =~ ^[1-9][0-9]*$ ]] || die "MAX_JOBS must be a positive integer, got '$MAX_JOBS' (max_jobs in versions.yaml)"

# Older apex reads --cpp_ext/--cuda_ext build options, newer apex (25.09+)
# reads APEX_CPP_EXT/APEX_CUDA_EXT; give both so either builds the extensions.
export APEX_CPP_EXT=1 APEX_CUDA_EXT=1

# apex passes no --threads to nvcc, so NVCC_THREADS reaches it only through
# NVCC_APPEND_FLAGS; more threads than gencodes would idle.
arch_count="$WHEELHOUSE_ARCHS_COUNT"
nvcc_threads="$(nvcc_threads_for "$arch_count")"
append_nvcc_threads "$arch_count"
# setuptools builds apex's twelve extensions one after another unless
# APEX_PARALLEL_BUILD names a thread count, and all but amp_C have one or two
# sources: MAX_JOBS alone leaves most cores idle. Two sources per extension
# at a time, each nvcc with its threads, keeps the total near MAX_JOBS; each
# extension's ninja still takes up to MAX_JOBS (amp_C's fourteen kernels).
parallel=$((MAX_JOBS / (2 * nvcc_threads)))
export APEX_PARALLEL_BUILD=$((parallel > 0 ? parallel : 1))

activate_arch_filter
print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION TORCH_VERSION TORCH_CUDA_ARCH_LIST MAX_JOBS NVCC_THREADS \
    NVCC_APPEND_FLAGS APEX_PARALLEL_BUILD CXX11_ABI APEX_CPP_EXT APEX_CUDA_EXT DIST_DIR
print_torch

MAX_JOBS="$MAX_JOBS" row_python -m pip wheel -v --no-build-isolation --no-deps -w "$DIST_DIR" \
    --disable-pip-version-check \
    --config-settings "--build-option=--cpp_ext" \
    --config-settings "--build-option=--cuda_ext" \
    .
list_dist_wheels
