#!/usr/bin/env bash
# patches/enable_deep_ep_sm80.py on the real DeepEP sources, on the GPU machine:
#   1. a copy of the sources (a git repository of its own), patched: git diff --stat
#   2. patched again: nothing changes
#   3. built through our build session with TORCH_CUDA_ARCH_LIST "8.0;9.0" (compile
#      only; the builder sees a pre-Hopper arch and runs the patch itself, a no-op
#      by then), the wheel checked as every build's wheels are
#   4. cuobjdump --list-elf of the wheel's extensions: sm_80 and sm_90 cubins
#
#   WHEELHOUSE_DEVICE_WORK=DIR tests/gpu/deep_ep_sm80.sh [DEEPEP_SOURCES]
#
# Run after `run_on_device.sh upstream` has built deep-ep in the work directory DIR:
# without DEEPEP_SOURCES the sources are that build's (its build directory when the
# build did not finish, else the checkout our git path cached for the ref of the
# device versions file). The build uses the same cache, tools (.whl/), offline pip
# and compilers as run_on_device.sh. Everything printed also goes to
# $OUT/deep-ep-sm80.txt (or DIR/out/).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
SOURCES="${1:-}"
if [[ -z "${WHEELHOUSE_DEVICE_WORK:-}" && -z "$SOURCES" ]]; then
    echo "deep_ep_sm80.sh: set WHEELHOUSE_DEVICE_WORK to the work directory of 'run_on_device.sh upstream', or pass the DeepEP sources" >&2
    exit 2
fi
WORK="${WHEELHOUSE_DEVICE_WORK:-$(mktemp -d /tmp/wheelhouse-sm80.XXXXXX)}"
RESULTS="${OUT:-$WORK/out}"
mkdir -p "$RESULTS"
PY="${PYTHON:-python3}"
DEVICE_VERSIONS=tests/fixtures/versions-device.yaml
SM80="$WORK/sm80"
ARCHS="8.0;9.0"

step() { printf '\n=== %s ===\n' "$*"; }
fail() { echo "deep_ep_sm80.sh: $*" >&2; exit 1; }

# The same environment as run_on_device.sh: carried tools, offline pip, the system compilers.
if [[ ! -d "$WORK/tools" ]] && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --target "$WORK/tools" .whl/*.whl
fi
if [[ -d "$WORK/tools" ]]; then
    export PYTHONPATH="$WORK/tools${PYTHONPATH:+:$PYTHONPATH}" PATH="$WORK/tools/bin:$PATH"
fi
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$ROOT/.whl $ROOT/.device/build-deps"
export CC="${WHEELHOUSE_DEVICE_CC:-/usr/bin/gcc}" CXX="${WHEELHOUSE_DEVICE_CXX:-/usr/bin/g++}"
export WHEELHOUSE_CACHE="$WORK/cache"

# deep_ep_sources: the sources deep-ep was built from in WORK.
deep_ep_sources() {
    local ref dir
    ref="$("$PY" -c 'import sys; from ci.model.versions import load; print(load(sys.argv[1]).component("deep-ep").ref)' "$DEVICE_VERSIONS")"
    for dir in "$WORK"/cache/builds/*/src "$WORK"/cache/sources/git/*-"$ref"; do
        if [[ -f "$dir/csrc/kernels/launch.cuh" && -f "$dir/csrc/deep_ep.cpp" && -f "$dir/setup.py" ]]; then
            printf '%s\n' "$dir"
            return 0
        fi
    done
    fail "no DeepEP sources under $WORK/cache (builds/*/src or sources/git/*-$ref): run 'run_on_device.sh upstream' with deep-ep there first, or pass the sources"
}

main() {
    local sources="$SOURCES" copy="$SM80/DeepEP" first second start so archs
    [[ -n "$sources" ]] || sources="$(deep_ep_sources)"
    [[ -f "$sources/csrc/kernels/launch.cuh" ]] || fail "$sources is not a DeepEP source tree (no csrc/kernels/launch.cuh)"

    step "1. sources $sources, copied to $copy and patched"
    rm -rf "$SM80" && mkdir -p "$SM80"
    cp -a "$sources" "$copy"
    rm -rf "$copy/.git" "$copy/build" "$copy/dist" "$copy"/*.egg-info
    git -C "$copy" init -q
    git -C "$copy" add -A
    git -C "$copy" -c user.name=wheelhouse -c user.email=wheelhouse@localhost commit -q -m "DeepEP as built"
    "$PY" patches/enable_deep_ep_sm80.py "$copy"
    git -C "$copy" diff --stat
    first="$(git -C "$copy" diff | sha256sum)"

    step "2. the patch applied a second time"
    "$PY" patches/enable_deep_ep_sm80.py "$copy"
    second="$(git -C "$copy" diff | sha256sum)"
    git -C "$copy" diff --stat
    [[ "$first" == "$second" ]] || fail "the second application changed the tree"
    [[ -z "$(git -C "$copy" status --porcelain --untracked-files=all | grep -v '^ M ' || true)" ]] \
        || fail "the patch left files other than its edits: $(git -C "$copy" status --porcelain --untracked-files=all)"
    echo "second application: nothing changed (diff sha256 ${first%% *})"

    step "3. build-deep-ep-3.12 for $ARCHS from the patched copy"
    # the device versions file with deep-ep alone, for sm_80 and sm_90
    "$PY" - "$DEVICE_VERSIONS" "$SM80/versions.yaml" "$ARCHS" <<'PY'
import sys, yaml
data = yaml.safe_load(open(sys.argv[1]))
component = data["components"]["deep-ep"]
component["torch_cuda_arch_list"] = sys.argv[3]
data["components"] = {"deep-ep": component}
with open(sys.argv[2], "w") as out:
    yaml.safe_dump(data, out, sort_keys=False)
PY
    start=$SECONDS
    WHEELHOUSE_VERSIONS="$SM80/versions.yaml" "$PY" -m nox -s build-deep-ep-3.12 -- \
        --reuse-env --source "$copy" --dist "$SM80/dist"
    echo "deep-ep build for $ARCHS (patched): $((SECONDS - start)) s"

    step "4. cubins of the wheel's extensions"
    local wheels=("$SM80"/dist/*/*/deep_ep-*.whl)
    [[ -f "${wheels[0]}" ]] || fail "the build wrote no deep_ep wheel under $SM80/dist"
    echo "${wheels[0]##*/}: $(stat -c %s "${wheels[0]}") bytes"
    mkdir -p "$SM80/so" && (cd "$SM80/so" && "$PY" -m zipfile -e "${wheels[0]}" .)
    for so in "$SM80"/so/*.so; do
        echo "--- cuobjdump --list-elf ${so##*/}"
        cuobjdump --list-elf "$so"
        archs="$(cuobjdump --list-elf "$so" | grep -o 'sm_[0-9]*[af]*' | sort -u | paste -sd' ' -)"
        echo "${so##*/}: cubins $archs"
        if [[ "${so##*/}" == deep_ep_cpp* ]]; then
            [[ " $archs " == *" sm_80 "* && " $archs " == *" sm_90 "* ]] || fail "${so##*/} lacks sm_80 or sm_90 cubins: $archs"
        fi
    done
    echo "PASS: the sm80 patch on the real DeepEP applies once, is idempotent, and the build carries sm_80 and sm_90"
}

main 2>&1 | tee "$RESULTS/deep-ep-sm80.txt"
