#!/usr/bin/env bash
# _build.yml "Verify the runner architecture": the runner must be the row's arch.
# Env: WANT_ARCH (x86_64 or aarch64).
set -euo pipefail
: "${WANT_ARCH:?WANT_ARCH must name the row arch}"

have="$(uname -m)"
if [[ "$have" != "$WANT_ARCH" ]]; then
    echo "::error::this row builds $WANT_ARCH but the runner is $have; fix runs_on in versions.yaml"
    exit 1
fi
