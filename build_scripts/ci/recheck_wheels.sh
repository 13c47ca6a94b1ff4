#!/usr/bin/env bash
# _publish.yml "Check the wheels again": the artifact's wheels pass the wheel checks on a fresh runner,
# the torch ABI check included: against the row's torch wheel, downloaded (not installed) and read in place.
# Env: WORLD, COMPONENT, PYTHON, BUNDLE (space-separated, empty unless a bundle row), TORCH, ARCH, CUDA,
# ARCH_LIST (torch_cuda_arch_list, may be empty), VERIFY_ARCHS (true/false), EXTRA_CUBINS (extra_cubins, as
# 10.3a;..., may be empty: the cubins beyond the list that the build adds on purpose, as the build's own check took them).
set -euo pipefail
: "${WORLD:?}" "${COMPONENT:?}" "${PYTHON:?}" "${TORCH:?}" "${ARCH:?}" "${CUDA:?}"

pythons="${BUNDLE:-$PYTHON}"
archs=()
if [[ "${VERIFY_ARCHS:-false}" == true && -n "${ARCH_LIST:-}" && "$CUDA" != cpu ]]; then
    archs=(--require-archs "$ARCH_LIST")
    [[ -z "${EXTRA_CUBINS:-}" ]] || archs+=(--extra-cubins "$EXTRA_CUBINS")
fi
torch_dir="$(mktemp -d "${RUNNER_TEMP:-/tmp}/row-torch.XXXXXX")"
torch_wheel="$(python -m ci torch-wheel --component "$COMPONENT" --python "$PYTHON" --torch "$TORCH" \
    --arch "$ARCH" --cuda "$CUDA" --dest "$torch_dir")"
invoke check-wheel --wheel "dist/$WORLD/*.whl" --pythons "${pythons// /,}" --torch "$torch_wheel" "${archs[@]}"
