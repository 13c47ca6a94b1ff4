#!/usr/bin/env bash
# flashinfer-jit-cache built here, on the GPU machine: `tests/gpu/run_on_device.sh jit-cache` sources
# this after its setup (PY, WORK, DIST, RESULTS, WORLD, the git mirror in .device/mirror; see there).
#
#   1. shard 1/2 of the device versions file's flashinfer-aot subset (sm_90a: the decode module the
#      kernel test loads and one module of each large family, 52 CUDA sources), through the builder's
#      shard path and flashinfer's own ahead-of-time entry point; the assembly, tried then, refuses
#      in one line naming shard 2/2; then shard 2/2, and the assembly: flashinfer-python, and the
#      jit-cache as upstream's provider layout has it (the flashinfer-jit-cache shim and the
#      flashinfer-jit-cache-sm90a provider) from both shards, checked
#   2. per-module compile seconds from the build record, and the time model's extrapolation to the
#      whole sm_90a list (793 modules) on these 16 cores and on a hosted runner (4 cores, 16 GB, 6 h),
#      with the shard count each needs; the wheel's size against upstream's
#   3. release the wheels, index them, pip install the three from the index into a clean target
#   4. flashinfer's decode kernel from the installed jit-cache against the attention formula, with the
#      JIT off, an empty JIT workspace and no nvcc on PATH or under CUDA_HOME: the shim chose the sm90a
#      provider for this GPU (tests/gpu/test_flashinfer_jit_cache.py)
# The bundle for it: `invoke device-bundle --snapshots DIR --components flashinfer-aot` (the mirror,
# 3rdparty/spdlog's tree from upstream's 0.6.13 sdist, and .device/build-deps: apache-tvm-ffi and what it
# needs, which the AOT and flashinfer's run-time import ask for; tests/gpu/device_bundle.py).
# WHEELHOUSE_UPSTREAM_JIT_CACHE_BYTES: the size of upstream's flashinfer_jit_cache-0.6.13+cu130 x86_64
# wheel, where known (its index is not reachable from here).
# shellcheck shell=bash

JC_COMPONENT=flashinfer-aot
JC_SESSION="build-$JC_COMPONENT-3.12"
JC_ROW=(--python 3.12 --torch 2.11.0 --arch x86_64)

jc_timed() {  # jc_timed <label> <command...>: run it, append its seconds to timings.txt
    local label="$1" start=$SECONDS status=0
    shift
    "$@" || status=$?
    echo "$label: $((SECONDS - start)) s (exit $status)" | tee -a "$RESULTS/timings.txt"
    return "$status"
}

step "flashinfer-jit-cache: what flashinfer's AOT imports here (the builder installs what is missing)"
"$PY" -c 'import tvm_ffi, pynvml, requests, tqdm, numpy; print("tvm_ffi", tvm_ffi.__version__)' \
    || echo "missing above: carry their wheels in .device/build-deps (PIP_FIND_LINKS)"

step "1. shard 1/2, the assembly without shard 2, shard 2/2, the assembly"
jc_timed "jit-cache shard 1/2 (sm_90a subset)" "$PY" -m nox -s "$JC_SESSION" -- --reuse-env --dist "$DIST" --shard 1/2
status=0
"$PY" -m invoke assemble-shards --component "$JC_COMPONENT" "${JC_ROW[@]}" --reuse-env --dist "$DIST" \
    2>&1 | tee "$RESULTS/jit-cache-incomplete.txt" || status=$?
echo "the assembly with shard 2/2 missing: exit $status" | tee -a "$RESULTS/jit-cache-incomplete.txt"
jc_timed "jit-cache shard 2/2 (sm_90a subset)" "$PY" -m nox -s "$JC_SESSION" -- --reuse-env --dist "$DIST" --shard 2/2
jc_timed "jit-cache assembly (flashinfer-python + the jit-cache from 2 shards)" \
    "$PY" -m invoke assemble-shards --component "$JC_COMPONENT" "${JC_ROW[@]}" --reuse-env --dist "$DIST"
JC_WHEEL="$(ls "$DIST/$WORLD"/flashinfer_jit_cache_sm90a-*.whl)"  # the provider: the modules are there
JC_SHIM="$(ls "$DIST/$WORLD"/flashinfer_jit_cache-*.whl)"
JC_RECORD="$(ls "$DIST/$WORLD/$JC_COMPONENT"-*-x86_64.build.json)"
"$PY" -m invoke check-wheel --wheel "$JC_SHIM" --wheel "$JC_WHEEL" --torch "$PY" --pythons 3.12 \
    | tee "$RESULTS/jit-cache-check.txt"
cp "$JC_RECORD" "$RESULTS/"

step "2. per-module compile seconds, the extrapolation, the wheel's size"
"$PY" - "$JC_RECORD" <<'PY' | tee "$RESULTS/jit-cache-modules.txt"
import json, sys
modules = json.load(open(sys.argv[1]))["modules"]
timed = sorted((m for m in modules["modules"] if m["seconds"] is not None), key=lambda m: -m["seconds"])
print(f"{len(timed)} of {len(modules['modules'])} modules compiled ({modules['cuda_arch_list']}), in "
      f"{modules['shards']} shards; compiler-cache hits in any: {any(m['cached'] for m in timed)}")
for m in timed:
    print(f"  {m['seconds']:7.1f} s  {m['cuda_sources']:3d} CUDA sources  shard {m['shard']}  {m['name']}")
print("shard builds:", json.dumps(modules["durations"]))
PY
{
    echo "--- the whole sm_90a list on this machine (16 cores, 16 jobs):"
    "$PY" -m ci shard-model --record "$JC_RECORD" --cores 16 --jobs 16 --job-minutes 100000 --overhead-minutes 0 \
        --label "this machine (16 jobs)"
    echo "--- on a hosted runner, 4 cores, 16 GB, 6 h jobs, 2 jobs:"
    "$PY" -m ci shard-model --record "$JC_RECORD" --cores 4 --jobs 2 --job-minutes 360 \
        --label "a hosted runner (2 jobs)"
    echo "--- the same runner with 4 jobs (versions.yaml's max_jobs for flashinfer; if 16 GB hold four nvcc):"
    "$PY" -m ci shard-model --record "$JC_RECORD" --cores 4 --jobs 4 --job-minutes 360 \
        --label "a hosted runner (4 jobs)"
} | tee "$RESULTS/jit-cache-model.txt"
"$PY" - "$JC_WHEEL" "$JC_RECORD" "${WHEELHOUSE_UPSTREAM_JIT_CACHE_BYTES:-}" <<'PY' | tee -a "$RESULTS/jit-cache-model.txt"
import json, os, sys, zipfile
wheel, record, upstream = sys.argv[1], json.load(open(sys.argv[2]))["modules"]["modules"], sys.argv[3]
sources = {m["name"]: max(1, m["cuda_sources"]) for m in record}
root = "flashinfer_jit_cache/providers/sm90a/jit_cache/"
with zipfile.ZipFile(wheel) as zf:
    built = {"sm90a/" + i.filename[len(root):].split("/")[0]: i.compress_size for i in zf.infolist()
             if i.filename.startswith(root) and i.filename.endswith(".so")}
size = os.path.getsize(wheel)
per_source = sum(built.values()) / sum(sources[n] for n in built)
print(f"this provider wheel: {size} bytes, {len(built)} modules; by CUDA source, the whole list would be "
      f"~{per_source * sum(sources.values()) / 2**20:.0f} MiB")
print(f"upstream's flashinfer-jit-cache 0.6.13 (cu130, x86_64): "
      + (f"{int(upstream)} bytes" if upstream else "size unknown (its index, flashinfer.ai, is not reachable here)"))
PY

step "3. release, index, install the three from the index"
"$PY" -m invoke release --component "$JC_COMPONENT" "${JC_ROW[@]}" --dist "$DIST"
"$PY" -m invoke publish-index
INDEX="file://$WORK/store/site/$WORLD/simple/"
env -u PIP_NO_INDEX -u PIP_FIND_LINKS "$PY" -m pip install --no-deps --target "$WORK/clean-jit-cache" \
    --index-url "$INDEX" flashinfer-python flashinfer-jit-cache flashinfer-jit-cache-sm90a 2>&1 \
    | tee "$RESULTS/jit-cache-pip-install.txt"
# flashinfer imports tvm_ffi at run time: the machine's image lacks it, and --no-deps took none of the
# requirements, so the wheel the build installed it from (.device/build-deps) goes into the target too
"$PY" -m pip install -q --no-deps --target "$WORK/clean-jit-cache" "$ROOT"/.device/build-deps/apache_tvm_ffi-*.whl \
    "$ROOT"/.device/build-deps/typing_extensions-*.whl 2>&1 | tee -a "$RESULTS/jit-cache-pip-install.txt"
grep -o 'data-wheelhouse-[a-z]*="[^"]*"' "$WORK/store/site/$WORLD/simple/flashinfer-jit-cache/index.html" | sort -u || true

step "4. the decode kernel from the jit-cache: JIT off, an empty workspace, no nvcc"
NO_NVCC_PATH=""
IFS=: read -r -a path_dirs <<<"$PATH"
for dir in "${path_dirs[@]}"; do
    [[ -x "$dir/nvcc" ]] || NO_NVCC_PATH="${NO_NVCC_PATH:+$NO_NVCC_PATH:}$dir"
done
mkdir -p "$WORK/jit-workspace"
(cd "$WORK" && env PATH="$NO_NVCC_PATH" CUDA_HOME="$WORK/no-toolkit" CUDA_PATH="$WORK/no-toolkit" \
    FLASHINFER_DISABLE_JIT=1 FLASHINFER_WORKSPACE_BASE="$WORK/jit-workspace" \
    PYTHONPATH="$WORK/clean-jit-cache${PYTHONPATH:+:$PYTHONPATH}" \
    "$PY" -m pytest "$ROOT/tests/gpu/test_flashinfer_jit_cache.py" -o addopts="" -p no:cacheprovider -s -q -rs \
    --rootdir "$ROOT" 2>&1) | tee "$RESULTS/jit-cache-kernels.txt"
echo "shared objects in the JIT workspace after the kernels: $(find "$WORK/jit-workspace" -name '*.so' | wc -l)" \
    | tee -a "$RESULTS/jit-cache-kernels.txt"
# a skip here (flashinfer not importable, no GPU) proves nothing: the run fails
if grep -q "skipped" "$RESULTS/jit-cache-kernels.txt" || ! grep -q " passed" "$RESULTS/jit-cache-kernels.txt"; then
    echo "error: the jit-cache kernel tests did not all run and pass (see $RESULTS/jit-cache-kernels.txt)" >&2
    exit 1
fi

step "done"
cat "$RESULTS/timings.txt"
