#!/usr/bin/env bash
# _build.yml "Free disk space" (GitHub-hosted runners only): remove toolchains no build uses.
set -euo pipefail

sudo rm -rf /usr/share/dotnet /opt/ghc /opt/hostedtoolcache/CodeQL /usr/local/lib/android
df -h /
