#!/usr/bin/env bash
# _publish.yml "Write the provenance predicate": the predicate of the row's provenance statement (the release
# it would publish, checked as `invoke release` checks it), for the signing step; the step output `path`.
# Env: COMPONENT, PYTHON, TORCH, ARCH, CUDA, RUNNER_TEMP, GITHUB_OUTPUT.
set -euo pipefail
: "${COMPONENT:?}" "${PYTHON:?}" "${TORCH:?}" "${ARCH:?}" "${CUDA:?}" "${RUNNER_TEMP:?}" "${GITHUB_OUTPUT:?}"

predicate="$RUNNER_TEMP/wheelhouse-provenance-predicate.json"
invoke release --component "$COMPONENT" --python "$PYTHON" --torch "$TORCH" --arch "$ARCH" --cuda "$CUDA" \
    --predicate-out "$predicate"
echo "path=$predicate" >>"$GITHUB_OUTPUT"
