#!/usr/bin/env bash
# _publish.yml "Check the wheels again": the artifact's wheels pass the wheel checks on a fresh runner
# (all but the torch ABI check, which needs the row's torch).
# Env: WORLD, PYTHON, BUNDLE (space-separated, empty unless a bundle row), CUDA, ARCH_LIST
# (torch_cuda_arch_list, may be empty), VERIFY_ARCHS (true/false).
set -euo pipefail
: "${WORLD:?}" "${PYTHON:?}" "${CUDA:?}"

pythons="${BUNDLE:-$PYTHON}"
archs=()
if [[ "${VERIFY_ARCHS:-false}" == true && -n "${ARCH_LIST:-}" && "$CUDA" != cpu ]]; then
    archs=(--require-archs "$ARCH_LIST")
fi
invoke check-wheel "dist/$WORLD/*.whl" --pythons "${pythons// /,}" "${archs[@]}"
