#!/usr/bin/env bash
# Megatron-Bridge: a pure-Python (py3-none-any) wheel.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail

LIB="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/lib"
# shellcheck source=lib/env.sh
source "$LIB/env.sh"

require_env DIST_DIR
ensure_dist_dir
export_extra_env

# No "+<sha>" local version from the checkout's git metadata.
export NO_VCS_VERSION=1
print_settings COMPONENT REF TARGET_ARCH PYTHON_VERSION TORCH_VERSION NO_VCS_VERSION DIST_DIR

# Its pyproject asks for setuptools<80 (and pybind11, torch) in an isolated build, which is not
# made here: r0.5.0 builds the same members with setuptools 79 and 84 (only WHEEL's generator
# line differs), so the venv's setuptools serves and nothing is downgraded or downloaded.
pip_install_build_deps "setuptools>=77" wheel
row_python -m pip wheel -v --no-build-isolation --no-deps -w "$DIST_DIR" --disable-pip-version-check .
list_dist_wheels
