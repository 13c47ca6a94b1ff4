#!/usr/bin/env bash
# The wheelhouse's own test extension (tests/fixtures/fixture_ext): a real
# torch extension that exercises the whole build path in minutes. It builds
# its CUDA kernel only when torch has CUDA and a toolkit is present, so it
# also serves CPU-only rows (CUDA_VERSION=cpu).
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"
# shellcheck source=lib/arch.sh
source "$LIB/arch.sh"

require_env MAX_JOBS DIST_DIR
ensure_dist_dir
export_extra_env
activate_arch_filter

print_settings COMPONENT REF TARGET_ARCH CUDA_VERSION PYTHON_VERSION TORCH_VERSION TORCH_CUDA_ARCH_LIST MAX_JOBS CXX11_ABI \
    WHEELHOUSE_BUNDLE_PYTHONS DIST_DIR
print_torch

MAX_JOBS="$MAX_JOBS" row_python -m pip wheel --no-build-isolation --no-deps -w "$DIST_DIR" \
    --disable-pip-version-check .

# bundle_pythons: one wheel for several CPythons. The build step names their
# interpreters; bundle_pythons.py re-runs `setup.py build_ext` for each under
# this venv's python (the row's torch) and packs the modules into the wheel.
if [[ -n "${WHEELHOUSE_BUNDLE_INTERPRETERS:-}" ]]; then
    read -r -a interpreters <<<"$WHEELHOUSE_BUNDLE_INTERPRETERS"
    log_info "bundling the extension for Pythons ${WHEELHOUSE_BUNDLE_PYTHONS:-?}: ${interpreters[*]}"
    row_python "$LIB/bundle_pythons.py" "$DIST_DIR" . "${interpreters[@]}" >/dev/null
fi
list_dist_wheels
