#!/usr/bin/env bash
# _publish.yml "Publish to the release": the row's wheels to its release with the signed provenance (the bundle
# the signing step made of the predicate), then the step output `published=true` (what tells the caller to
# refresh the index).
# Env: COMPONENT, PYTHON, TORCH, ARCH, CUDA, PROVENANCE_BUNDLE, WHEELHOUSE_STORE, GITHUB_TOKEN, GITHUB_OUTPUT.
set -euo pipefail
: "${COMPONENT:?}" "${PYTHON:?}" "${TORCH:?}" "${ARCH:?}" "${CUDA:?}" "${PROVENANCE_BUNDLE:?}" "${GITHUB_OUTPUT:?}"

invoke release --component "$COMPONENT" --python "$PYTHON" --torch "$TORCH" --arch "$ARCH" --cuda "$CUDA" \
    --provenance-bundle "$PROVENANCE_BUNDLE"
echo "published=true" >>"$GITHUB_OUTPUT"
