#!/usr/bin/env bash
# _build.yml "Allow the build a mount namespace of its own" (GitHub-hosted runners only). The builder sees its
# sources at one fixed path in a private mount namespace (ci/building/build_place.py), which an unprivileged user
# namespace gives; Ubuntu 24.04's AppArmor restricts those until this sysctl lifts it. Builds on this runner
# then require the namespace (WHEELHOUSE_BUILD_PLACE=namespace): a build never falls back to building in
# place without saying so in a failed step.
set -euo pipefail

if [[ -e /proc/sys/kernel/apparmor_restrict_unprivileged_userns ]]; then
    sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0
fi
echo "WHEELHOUSE_BUILD_PLACE=namespace" >>"$GITHUB_ENV"
