#!/usr/bin/env bash
# _build.yml's build-directory cache, around the build step:
#   build_cache.sh mark   after the restores: create both cache folders, stamp the time
#   build_cache.sh prune  after the build: keep only the directory worth resuming, and say in the
#                         step outputs `save` / `save_compiler_cache` which caches hold anything
# Env: BUILD_DIRS, COMPILER_CACHE (the cached folders), RUNNER_TEMP (where the stamp lives),
# OUTCOME (prune: the build step's outcome), GITHUB_OUTPUT (prune).
set -euo pipefail
: "${BUILD_DIRS:?}" "${COMPILER_CACHE:?}" "${RUNNER_TEMP:?}"
stamp="$RUNNER_TEMP/wheelhouse-cache-restored"

holds_anything() {
    [[ -n "$(find "$1" -mindepth 1 -print -quit)" ]]
}

case "${1:-}" in
    mark)
        mkdir -p "$BUILD_DIRS" "$COMPILER_CACHE"
        touch "$stamp"
        ;;
    prune)
        : "${OUTCOME:?}" "${GITHUB_OUTPUT:?}"
        if [[ "$OUTCOME" == success ]]; then
            # the finished build removed its directory; the rest are other build inputs
            find "$BUILD_DIRS" -mindepth 1 -maxdepth 1 -exec rm -rf {} +
        elif [[ -n "$(find "$BUILD_DIRS" -mindepth 1 -maxdepth 1 -newer "$stamp" -print -quit)" ]]; then
            # this job's directory is the one to resume; the untouched ones are other build inputs
            find "$BUILD_DIRS" -mindepth 1 -maxdepth 1 ! -newer "$stamp" -exec rm -rf {} +
        fi
        if holds_anything "$BUILD_DIRS"; then
            echo "save=true" >>"$GITHUB_OUTPUT"
        fi
        if holds_anything "$COMPILER_CACHE"; then
            echo "save_compiler_cache=true" >>"$GITHUB_OUTPUT"
        fi
        ;;
    *)
        echo "usage: build_cache.sh mark|prune" >&2
        exit 2
        ;;
esac
