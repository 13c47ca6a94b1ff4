#!/usr/bin/env bash
# Environment helpers shared by every builder: logging, required variables,
# privilege escalation, the build-dependency pip call and CUDA version parsing.
# Sourced, never executed; the sourcing builder sets `set -euo pipefail`.

# Guard against double sourcing (lib files source each other).
if [[ -n "${_WHEELHOUSE_ENV_SH:-}" ]]; then
    return 0
fi
_WHEELHOUSE_ENV_SH=1

# --- logging ---------------------------------------------------------------
# Everything goes to stderr so functions can print their result on stdout.

log_info() {
    printf '[wheelhouse] %s\n' "$*" >&2
}

log_warn() {
    printf '[wheelhouse] warning: %s\n' "$*" >&2
}

# One clear line, then exit 1. `exit` inside a function ends the whole script,
# also when the function runs as an `if` condition.
die() {
    printf '[wheelhouse] error: %s\n' "$*" >&2
    exit 1
}

# --- required variables ----------------------------------------------------

# require_env VAR...: fail with one line naming every variable that is unset
# or empty, so a half-configured environment never reaches a multi-hour build.
require_env() {
    local name missing=()
    for name in "$@"; do
        if [[ -z "${!name:-}" ]]; then
            missing+=("$name")
        fi
    done
    if ((${#missing[@]})); then
        die "${BASH_SOURCE[-1]##*/}: missing required environment variable(s): ${missing[*]} (the wheelhouse build step exports them; set them by hand to run this script alone)"
    fi
}

# wheelhouse_ci COMMAND ARGS...: `python -m ci COMMAND ARGS` under the
# wheelhouse's own interpreter (WHEELHOUSE_TOOLS_PYTHON, the one running the
# build: the row's venv lacks the wheelhouse's requirements), from the
# wheelhouse root: `python -m` puts the working directory first on sys.path,
# and a component checkout may have a `ci` package of its own. Paths in ARGS
# must be absolute.
wheelhouse_ci() {
    require_env WHEELHOUSE_ROOT WHEELHOUSE_TOOLS_PYTHON
    (
        cd "$WHEELHOUSE_ROOT" || exit 1
        PYTHONPATH="$WHEELHOUSE_ROOT${PYTHONPATH:+:$PYTHONPATH}" "$WHEELHOUSE_TOOLS_PYTHON" -m ci "$@"
    )
}

# print_settings VAR...: echo the effective value of each variable, one per
# line, so the build log records exactly what the build saw.
print_settings() {
    local name
    log_info "effective settings:"
    for name in "$@"; do
        if [[ -n "${!name+x}" ]]; then
            printf '[wheelhouse]   %s=%s\n' "$name" "${!name}" >&2
        else
            printf '[wheelhouse]   %s is unset\n' "$name" >&2
        fi
    done
}

# --- privileges --------------------------------------------------------------

# maybe_sudo CMD...: run directly as root or where no sudo exists (root
# containers on self-hosted machines have none); otherwise through sudo.
maybe_sudo() {
    if [[ "$(id -u)" -eq 0 ]] || ! command -v sudo >/dev/null 2>&1; then
        "$@"
    else
        sudo "$@"
    fi
}

# apt_get ARGS...: non-interactive apt-get with the right privileges.
apt_get() {
    maybe_sudo env DEBIAN_FRONTEND=noninteractive apt-get "$@"
}

# --- python ------------------------------------------------------------------

# The row's interpreter: `python` on PATH is the row venv by contract.
row_python() {
    command -v python >/dev/null 2>&1 || die "no 'python' on PATH (the row's venv must be first on PATH)"
    python "$@"
}

# python_package_dir MODULE: the directory of an installed package as the
# row's Python imports it (so also one reached through --system-site-packages
# or a .pth file), e.g. nvidia.cudnn for the nvidia-cudnn-cu13 wheel; empty
# when the row's Python does not have it.
python_package_dir() {
    row_python - "$1" <<'PY'
import importlib.util, sys
try:
    spec = importlib.util.find_spec(sys.argv[1])
except ImportError:  # a parent package that is not installed
    spec = None
if spec is not None and spec.submodule_search_locations:
    print(next(iter(spec.submodule_search_locations)))
PY
}

# pip_install_build_deps PKG...: the build tools a component expects in the
# venv. Quiet, and honours PIP_CONSTRAINT / PIP_INDEX_URL from the environment
# so the caller can pin these without editing builders.
pip_install_build_deps() {
    log_info "installing build dependencies: $*"
    row_python -m pip install -q --disable-pip-version-check "$@"
}

# print_torch: record the torch the build compiles against.
print_torch() {
    row_python -c 'import torch; print("[wheelhouse] torch", torch.__version__, "cuda", torch.version.cuda, "cxx11abi", torch.compiled_with_cxx11_abi())' >&2
}

# --- extra_env -----------------------------------------------------------------

# export_extra_env: export every key of the EXTRA_ENV JSON object. The build
# step already exports each key on its own; this keeps a builder usable when
# only EXTRA_ENV is given (a hand-run reproduction). No jq needed.
export_extra_env() {
    local raw="${EXTRA_ENV:-}" key value
    if [[ -z "$raw" || "$raw" == "{}" ]]; then
        return 0
    fi
    local py
    py="$(command -v python3 || command -v python || true)"
    [[ -n "$py" ]] || die "export_extra_env: no python3 to parse EXTRA_ENV"
    local pairs
    # NUL-separated key/value pairs; a non-object or a bad key fails here.
    pairs="$(mktemp)"
    if ! "$py" - "$raw" >"$pairs" <<'PY'; then
import json, re, sys
try:
    data = json.loads(sys.argv[1])
except ValueError as exc:
    sys.exit(f"[wheelhouse] error: EXTRA_ENV is not valid JSON ({exc})")
if not isinstance(data, dict):
    sys.exit("[wheelhouse] error: EXTRA_ENV must be a JSON object of NAME: value")
for key, value in data.items():
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        sys.exit(f"[wheelhouse] error: EXTRA_ENV key {key!r} is not a valid environment variable name")
    if isinstance(value, bool):
        value = "1" if value else "0"
    elif value is None:
        value = ""
    sys.stdout.write(f"{key}\0{value}\0")
PY
        rm -f "$pairs"
        exit 1
    fi
    while IFS= read -r -d '' key && IFS= read -r -d '' value; do
        export "$key=$value"
        log_info "extra_env: $key=$value"
    done <"$pairs"
    rm -f "$pairs"
}

# --- CUDA versions -------------------------------------------------------------

# cuda_major_minor 13.0.2 -> 13.0
cuda_major_minor() {
    local v="${1:?cuda_major_minor needs a version}"
    [[ "$v" =~ ^([0-9]+)\.([0-9]+) ]] || die "CUDA version '$v' is not MAJOR.MINOR[.PATCH]"
    printf '%s.%s\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
}

# cuda_major 13.0.2 -> 13
cuda_major() {
    local mm
    mm="$(cuda_major_minor "$1")"
    printf '%s\n' "${mm%%.*}"
}

# --- output ------------------------------------------------------------------------

# ensure_dist_dir: DIST_DIR must be absolute (a relative one would land in the
# checkout, which the build step throws away).
ensure_dist_dir() {
    require_env DIST_DIR
    [[ "$DIST_DIR" == /* ]] || die "DIST_DIR must be an absolute path, got '$DIST_DIR'"
    mkdir -p "$DIST_DIR"
}

# list_dist_wheels: print the wheels in DIST_DIR; fail when there are none.
list_dist_wheels() {
    local found=0 whl
    for whl in "$DIST_DIR"/*.whl; do
        [[ -e "$whl" ]] || continue
        found=1
        log_info "wheel: ${whl##*/}"
    done
    ((found)) || die "the build finished but wrote no wheel to $DIST_DIR"
}
