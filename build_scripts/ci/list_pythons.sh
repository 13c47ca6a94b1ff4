#!/usr/bin/env bash
# _build.yml "List the Pythons to install": the step output `versions`, one per line, the build's
# Python last (setup-python makes the last one the default). A bundle row needs every Python it bundles.
# Env: PYTHON (the build's), BUNDLE (space-separated bundled Pythons, empty for other rows), GITHUB_OUTPUT.
set -euo pipefail
: "${PYTHON:?PYTHON must name the build Python}" "${GITHUB_OUTPUT:?GITHUB_OUTPUT must name the step output file}"

{
    echo 'versions<<EOF'
    for version in ${BUNDLE:-}; do
        if [[ "$version" != "$PYTHON" ]]; then
            echo "$version"
        fi
    done
    echo "$PYTHON"
    echo 'EOF'
} >>"$GITHUB_OUTPUT"
