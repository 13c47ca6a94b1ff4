#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# flashinfer: flashinfer-python and flashinfer-jit-cache (flashinfer's
# ahead-of-time compile of its kernels, by shards) are built here;
# flashinfer-cubin (NVIDIA's prebuilt kernels, which only flashinfer's artifact
# server holds) and, where versions.yaml's rehost says so, the jit-cache are
# rehosted from the indexes that publish them.

# shellcheck source=env.sh
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
# shellcheck source=arch.sh
source "$(dirname "${BASH_SOURCE[0]}")/arch.sh"
# shellcheck source=cuda_paths.sh
source "$(dirname "${BASH_SOURCE[0]}")/cuda_paths.sh"

# flashinfer_jit_cache_cu_index 13.0.2 -> cu130 (the index path segment).
flashinfer_jit_cache_cu_index() {
    local mm
    mm="$(cuda_major_minor "$1")" || exit 1
    printf 'cu%s\n' "${mm//./}"
}

# flashinfer_checkout_version [DIR]: the version of the sources, which the
# rehosted wheels must match: version.txt of a git checkout, or the Version of
# an sdist's PKG-INFO (upstream's sdist has no version.txt).
flashinfer_checkout_version() {
    local dir="${1:-.}" version=""
    if [[ -f "$dir/version.txt" ]]; then
        version="$(tr -d '[:space:]' <"$dir/version.txt")"
        [[ -n "$version" ]] || die "$dir/version.txt is empty"
    elif [[ -f "$dir/PKG-INFO" ]]; then
        version="$(sed -n 's/^Version:[[:space:]]*//p' "$dir/PKG-INFO" | head -1 | tr -d '[:space:]')"
        [[ -n "$version" ]] || die "$dir/PKG-INFO has no Version line"
    else
        die "no version.txt (git checkout) or PKG-INFO (sdist) in $(cd "$dir" && pwd); is this a flashinfer source tree?"
    fi
    printf '%s\n' "$version"
}

# flashinfer_require_headers [DIR]: the submodule trees flashinfer-python
# packages as headers for its JIT. Upstream's backend copies each only if it
# exists, so a checkout without one would build a wheel whose kernels cannot
# compile; refuse that here, naming the tree.
flashinfer_require_headers() {
    local dir="${1:-.}" header
    for header in 3rdparty/cutlass/include/cutlass/cutlass.h 3rdparty/spdlog/include/spdlog/spdlog.h \
        3rdparty/cccl/libcudacxx/include/cuda/std/version 3rdparty/cccl/cub/cub/cub.cuh \
        3rdparty/cccl/thrust/thrust/version.h; do
        [[ -f "$dir/$header" ]] || die "flashinfer sources lack $header: the ${header%%/include*} submodule is not checked out; list it in components.flashinfer.source.submodules (or build from the sdist)"
    done
}

# flashinfer_write_build_meta DIR VERSION COMMIT: flashinfer/_build_meta.py
# as upstream's backend writes it, with the commit of the sources. The backend
# asks `git rev-parse HEAD` itself, which in a build directory without .git
# answers with whatever repository lies around it; it keeps a file that exists.
# An sdist already carries the file upstream wrote: it is left as it is.
flashinfer_write_build_meta() {
    local dir="$1" version="$2" commit="$3" meta="$1/flashinfer/_build_meta.py"
    if [[ -f "$dir/PKG-INFO" && -f "$meta" ]]; then
        return 0
    fi
    [[ -d "$dir/flashinfer" ]] || die "no flashinfer/ package in $(cd "$dir" && pwd)"
    if [[ -n "${FLASHINFER_DEV_RELEASE_SUFFIX:-}" ]]; then
        version="$version.dev$FLASHINFER_DEV_RELEASE_SUFFIX"
    fi
    if [[ -n "${FLASHINFER_LOCAL_VERSION:-}" ]]; then
        version="$version+$FLASHINFER_LOCAL_VERSION"
    fi
    printf '"""Build metadata for flashinfer package."""\n__version__ = "%s"\n__git_version__ = "%s"\n' \
        "$version" "$commit" >"$meta"
}

# wheel_package_wanted NAME: whether WHEEL_PACKAGES (the component's
# wheel_packages, space-separated) lists NAME.
wheel_package_wanted() {
    [[ " ${WHEEL_PACKAGES:-} " == *" $1 "* ]]
}

# download_prebuilt_wheel PKG VERSION INDEX_URL DEST WHAT [ATTEMPTS]: pip
# download one binary wheel, retrying transient failures (ATTEMPTS, default 5,
# with WHEELHOUSE_RETRY_SLEEP seconds between them, default 10). INDEX_URL
# "default" is pip's own configuration. WHAT says what the wheel holds, for
# the one line that ends a build which could not get it.
download_prebuilt_wheel() {
    local pkg="$1" version="$2" index="$3" dest="$4" what="$5" attempts="${6:-5}"
    local pause="${WHEELHOUSE_RETRY_SLEEP:-10}" attempt where="pip's configured index" index_args=()
    if [[ "$index" != default ]]; then
        index_args=(--index-url "$index")
        where="$index"
    fi
    mkdir -p "$dest"
    for ((attempt = 1; attempt <= attempts; attempt++)); do
        log_info "downloading $pkg==$version from $where (attempt $attempt/$attempts)"
        if row_python -m pip download -q --disable-pip-version-check "$pkg==$version" \
            "${index_args[@]}" --no-deps --only-binary=:all: -d "$dest"; then
            return 0
        fi
        if ((attempt < attempts)); then
            sleep "$pause"
        fi
    done
    die "could not download $pkg==$version from $where after $attempts attempts; it holds $what, which cannot be built here: reach that index, or drop $pkg from components.$COMPONENT.wheel_packages"
}

# wheel_rehosted NAME: whether REHOST_PACKAGES (the component's rehost,
# space-separated) lists NAME: downloaded from upstream, not built.
wheel_rehosted() {
    [[ " ${REHOST_PACKAGES:-} " == *" $1 "* ]]
}

# flashinfer_arch_list: the row's archs as flashinfer's FLASHINFER_CUDA_ARCH_LIST
# takes them, space-separated major.minor with suffixes ("8.0 9.0a 10.0a 12.0f"):
# the contract's WHEELHOUSE_ARCHS, which ci/building/job.py parsed from
# TORCH_CUDA_ARCH_LIST. Its AOT compiles cubins only, so +PTX is refused.
flashinfer_arch_list() {
    [[ -n "${WHEELHOUSE_ARCHS:-}" ]] || die "TORCH_CUDA_ARCH_LIST is empty: flashinfer-jit-cache needs the archs to compile for; set components.$COMPONENT.torch_cuda_arch_list"
    [[ "${WHEELHOUSE_ARCHS_PTX:-0}" != 1 ]] || die "TORCH_CUDA_ARCH_LIST '${TORCH_CUDA_ARCH_LIST:-}': flashinfer's ahead-of-time compile writes cubins only, no PTX; drop +PTX from components.$COMPONENT.torch_cuda_arch_list"
    printf '%s\n' "${WHEELHOUSE_ARCHS//;/ }"
}

# The modules flashinfer's AOT imports beyond torch, with the requirement that
# provides each (flashinfer-jit-cache/pyproject.toml's build requirements;
# apache-tvm-ffi's pin is read from the sources' requirements.txt).
FLASHINFER_AOT_IMPORTS=(tvm_ffi:apache-tvm-ffi pynvml:nvidia-ml-py requests:requests tqdm:tqdm numpy:numpy)

# flashinfer_aot_deps DIR [MODULE:REQUIREMENT...]: install what the row's
# interpreter cannot import of FLASHINFER_AOT_IMPORTS (and the pairs given)
# into DIR (pip --target), and print DIR for PYTHONPATH. Into a directory
# inside the sources, not the row's venv: a build must leave its interpreter's
# site-packages as they are, and the sources' path is mapped out of what the
# compiled modules record. flashinfer-cubin comes without its requirements
# (flashinfer's own).
flashinfer_aot_deps() {
    local dir="$1" pair module requirement pin
    local -a missing=() data=()
    shift
    for pair in "${FLASHINFER_AOT_IMPORTS[@]}" "$@"; do
        module="${pair%%:*}" requirement="${pair#*:}"
        if PYTHONPATH="$dir" row_python -c "import $module" 2>/dev/null; then
            continue
        fi
        if [[ "$requirement" == apache-tvm-ffi && -f requirements.txt ]]; then
            pin="$(grep -E '^apache-tvm-ffi' requirements.txt | head -1 | tr -d '[:space:]' || true)"
            requirement="${pin:-$requirement}"
        fi
        if [[ "$requirement" == flashinfer-cubin* ]]; then
            data+=("$requirement")
        else
            missing+=("$requirement")
        fi
    done
    if ((${#missing[@]} + ${#data[@]})); then
        log_info "flashinfer's AOT needs ${missing[*]} ${data[*]}: installing into $dir (not the row's venv)"
    fi
    if ((${#missing[@]})); then
        row_python -m pip install -q --disable-pip-version-check --target "$dir" "${missing[@]}" >&2 \
            || die "could not install ${missing[*]} for flashinfer's ahead-of-time compile; make them installable (PIP_FIND_LINKS, an index) or install them into the row's interpreter"
    fi
    if ((${#data[@]})); then
        row_python -m pip install -q --disable-pip-version-check --no-deps --target "$dir" "${data[@]}" >&2 \
            || die "could not install ${data[*]}: flashinfer's AOT reads NVIDIA's kernels and headers from it for Blackwell archs; make it installable (pip's index, PIP_FIND_LINKS)"
    fi
    printf '%s\n' "$dir"
}

# wheelhouse_jit_cache ARGS...: python -m ci jit-cache ARGS (wheelhouse_ci,
# env.sh); paths in ARGS must be absolute.
wheelhouse_jit_cache() {
    wheelhouse_ci jit-cache "$@"
}

# flashinfer_provider_tag TARGET: the provider of one arch target as upstream
# names it ("9.0a" -> sm90a, "12.0f" -> sm120f, "8.0" -> sm80).
flashinfer_provider_tag() {
    local target="$1"
    [[ "$target" =~ ^([0-9]+)\.([0-9])([af]?)$ ]] || die "cannot name the provider of arch target '$target'"
    printf 'sm%s%s%s\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "${BASH_REMATCH[3]}"
}

# flashinfer_jit_cache_build VERSION: flashinfer-jit-cache from the sources
# (the current directory) through flashinfer's own AOT entry point
# (lib/flashinfer_aot.py), as upstream's layout has it: one provider wheel per
# arch target of TORCH_CUDA_ARCH_LIST (its module list made and compiled with
# FLASHINFER_CUDA_ARCH_LIST set to that target alone, in build/aot/<provider>)
# and the shim (ci/model/jit_cache.py). Shards live in WHEELHOUSE_SHARDS_DIR
# (default: shards/ beside DIST_DIR). Three modes:
#   WHEELHOUSE_SHARD=I/N     compile shard I of N into its directory there; no wheel
#   WHEELHOUSE_ASSEMBLE=1    compile nothing: the wheels from the shards there
#   neither                  every module as shard 1/1, then the wheels
# WHEELHOUSE_JIT_CACHE_MODULES (globs of module names, from extra_env)
# narrows every provider's list to a subset.
# flashinfer_link_flags: LDFLAGS as flashinfer's JIT link rules take them. They link each module with
# flashinfer's own ldflags and FLASHINFER_EXTRA_LDFLAGS, never LDFLAGS, through `c++ ... $ldflags` or
# `nvcc -shared ... $ldflags`; nvcc refuses -Wl,a,b, so each becomes -Xlinker a -Xlinker b, which both take.
# The build's LDFLAGS discard local symbols: without that, each module's .symtab names nvcc's host
# temporary file, pid-named (tmpxft_<pid>_...) when nvcc runs alone, x_0 when sccache runs its steps
# (ci/building/reproducible.py).
flashinfer_link_flags() {
    local word part
    local -a words parts flags=()
    read -r -a words <<<"${LDFLAGS:-}"
    for word in "${words[@]}"; do
        if [[ "$word" == -Wl,* ]]; then
            IFS=, read -r -a parts <<<"${word#-Wl,}"
            for part in "${parts[@]}"; do flags+=(-Xlinker "$part"); done
        else
            flags+=("$word")
        fi
    done
    echo "${flags[*]}"
}

# flashinfer_jit_environment: what flashinfer's JIT compiles and links read from the environment, exported
flashinfer_jit_environment() {
    export FLASHINFER_NVCC_THREADS="${NVCC_THREADS:-1}"
    if [[ -n "${SCCACHE_DIR:-}" ]] && command -v sccache >/dev/null 2>&1; then
        export FLASHINFER_NVCC_LAUNCHER=sccache FLASHINFER_CXX_LAUNCHER=sccache
    fi
    # the sources' .cc files compile with flashinfer's own flags: give them the build's prefix maps too
    export FLASHINFER_EXTRA_CFLAGS="${FLASHINFER_EXTRA_CFLAGS:-${CXXFLAGS:-}}"
    # and its links the build's linker flags, after any of the row's own
    FLASHINFER_EXTRA_LDFLAGS="${FLASHINFER_EXTRA_LDFLAGS:-} $(flashinfer_link_flags)"
    export FLASHINFER_EXTRA_LDFLAGS="${FLASHINFER_EXTRA_LDFLAGS# }"
    # NVIDIA's artifacts (trtllm-gen kernels and their headers) come from the flashinfer-cubin wheel,
    # never downloaded; Blackwell's modules (10.x, 11.x) read them while the module list is made
    export FLASHINFER_NO_DOWNLOAD=1
}

flashinfer_jit_cache_build() {
    local version="$1" aot deps shards_dir spec shard_dir lib target tag
    local -a common lists=() logs=() targets
    lib="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    aot="$PWD/build/aot"
    shards_dir="${WHEELHOUSE_SHARDS_DIR:-$(dirname "$DIST_DIR")/shards}"
    mkdir -p "$aot" "$shards_dir"
    FLASHINFER_CUDA_ARCH_LIST="$(flashinfer_arch_list)" || exit 1
    read -r -a targets <<<"$FLASHINFER_CUDA_ARCH_LIST"
    flashinfer_jit_environment
    local -a extra=()
    if [[ " $FLASHINFER_CUDA_ARCH_LIST" =~ \ 1[01]\. ]]; then
        extra=("flashinfer_cubin:flashinfer-cubin==$version")
    fi
    # headers and libraries some modules use (cublasLt.h, -lcublas, -lnvrtc; the sm_120 fmha generator
    # compiles a host program with nvcc from PATH), from the row venv's CUDA wheels where the toolkit lacks them
    ensure_torch_cuda_headers
    ensure_cuda_libraries cublas cublasLt nvrtc
    [[ -n "${CUDA_HOME:-}" ]] && append_path PATH "$CUDA_HOME/bin"
    deps="$(flashinfer_aot_deps "$PWD/build/aot-deps" "${extra[@]}")" || exit 1
    log_info "flashinfer-jit-cache: one provider per target of $FLASHINFER_CUDA_ARCH_LIST, modules ${WHEELHOUSE_JIT_CACHE_MODULES:-all}"
    for target in "${targets[@]}"; do
        tag="$(flashinfer_provider_tag "$target")" || exit 1
        mkdir -p "$aot/$tag"
        FLASHINFER_CUDA_ARCH_LIST="$target" PYTHONPATH="$deps" row_python "$lib/flashinfer_aot.py" list --project . \
            --build-dir "$aot/$tag" --out "$aot/$tag/modules.json"
        lists+=("$aot/$tag/modules.json")
        logs+=(--ninja-log "$tag=$aot/$tag/cached_ops/.ninja_log")
    done
    wheelhouse_jit_cache merge --lists "${lists[@]}" --out "$aot/modules.json"
    common=(--modules "$aot/modules.json" --patterns "${WHEELHOUSE_JIT_CACHE_MODULES:-}")
    if [[ "${WHEELHOUSE_ASSEMBLE:-}" != 1 ]]; then
        if [[ -z "${WHEELHOUSE_SHARD:-}" ]]; then
            rm -rf "$shards_dir" && mkdir -p "$shards_dir"  # one shard of all: no shard of an earlier split stays
        fi
        spec="${WHEELHOUSE_SHARD:-1/1}"
        shard_dir="$(wheelhouse_jit_cache select "${common[@]}" --shard "$spec" --shards-dir "$shards_dir" \
            --out "$aot/shard-modules.txt")" || exit 1
        for target in "${targets[@]}"; do
            tag="$(flashinfer_provider_tag "$target")" || exit 1
            # this provider's share of the shard, by module name (the list's keys are <provider>/<name>)
            sed -n "s|^$tag/||p" "$aot/shard-modules.txt" >"$aot/$tag/shard-modules.txt"
            [[ -s "$aot/$tag/shard-modules.txt" ]] || continue
            FLASHINFER_CUDA_ARCH_LIST="$target" PYTHONPATH="$deps" row_python "$lib/flashinfer_aot.py" compile \
                --project . --build-dir "$aot/$tag" --modules "$aot/$tag/shard-modules.txt" \
                --out "$shard_dir/jit_cache/$tag"
        done
        wheelhouse_jit_cache finish-shard "${common[@]}" --shard "$spec" --dir "$shard_dir" "${logs[@]}"
        if [[ -n "${WHEELHOUSE_SHARD:-}" ]]; then
            return 0
        fi
    fi
    wheelhouse_jit_cache pack "${common[@]}" --shards "$shards_dir" --version "$version" \
        --git-version "${SOURCE_REVISION:-unknown}" --arch "$TARGET_ARCH" --dist "$DIST_DIR" \
        --wheel-packages "${WHEEL_PACKAGES:-}" \
        --how-to-build "nox -s build-$COMPONENT-${PYTHON_VERSION:-3} -- --shard {shard}"
}
