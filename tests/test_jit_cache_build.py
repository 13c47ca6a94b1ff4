"""flashinfer-jit-cache from the sources, end to end: real modules through flashinfer's own AOT entry point.

Two real modules of flashinfer 0.6.13's sm_90a list (the float16 decode kernel with head_dim 128 and
``silu_and_mul``) are compiled with nvcc here (no GPU needed) through the builder's shard path, as
two shards (``nox -s build-flashinfer-3.12 -- --shard I/2``); the assembly refuses to start while a
shard is missing, then builds flashinfer-python and makes the jit-cache wheels from both shards (the
flashinfer-jit-cache shim and the flashinfer-jit-cache-sm90a provider), checks them, and leaves them in
dist/ with their .metadata and build record (per-module compile seconds included). The three wheels are
installed into a directory, and flashinfer's own loader takes the decode module from the provider the shim
selects, with its JIT off and no nvcc anywhere; a module the provider lacks is refused.

Needs (else skipped):
- ``WHEELHOUSE_TEST_CUDA_TORCH_PYTHON``: an interpreter with a CUDA build of torch (the row is made
  from its Python, torch and CUDA versions; the builds run in it with --reuse-env);
- ``WHEELHOUSE_TEST_FLASHINFER_SOURCES``: flashinfer v0.6.13's sources with 3rdparty/cutlass, cccl and
  spdlog checked out (``git archive`` of the tag and of the three submodule commits);
- nvcc in /usr/local/cuda/bin. flashinfer's AOT imports (apache-tvm-ffi, nvidia-ml-py, requests...)
  that the interpreter lacks are installed by the builder from pip's configured index.
About four minutes on two cores.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from ci.checks.check import check_wheels
from ci.model.build_record import BuildRecord

REPO = Path(__file__).resolve().parent.parent
PYTHON = os.environ.get("WHEELHOUSE_TEST_CUDA_TORCH_PYTHON", "")
SOURCES = os.environ.get("WHEELHOUSE_TEST_FLASHINFER_SOURCES", "")
CUDA_BIN = Path("/usr/local/cuda/bin")
DECODE = ("single_decode_with_kv_cache_dtype_q_f16_dtype_kv_f16_dtype_o_f16_head_dim_qk_128_head_dim_vo_128_posenc_0"
          "_use_swa_False_use_logits_cap_False")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (PYTHON and SOURCES and (CUDA_BIN / "nvcc").is_file()),
                       reason="needs WHEELHOUSE_TEST_CUDA_TORCH_PYTHON, WHEELHOUSE_TEST_FLASHINFER_SOURCES and nvcc"),
]


def _row_of(python: str) -> dict:
    probe = "import json, sys, torch; print(json.dumps([f'{sys.version_info[0]}.{sys.version_info[1]}', " \
            "torch.__version__.split('+')[0], torch.version.cuda]))"
    py, torch, cuda = json.loads(subprocess.run([python, "-c", probe], capture_output=True, text=True,
                                                check=True).stdout)
    return {"python": py, "torch": torch, "cuda": cuda}


def _versions(tmp_path: Path, row: dict) -> Path:
    path = tmp_path / "versions.yaml"
    path.write_text(f"""\
build_matrix:
  - {{arch: x86_64, cuda: "{row['cuda']}", python: "{row['python']}", torch: "{row['torch']}", cxx11_abi: "TRUE", torch_index: default}}
components:
  flashinfer:
    source: {{git: "https://github.com/flashinfer-ai/flashinfer.git", submodules: [3rdparty/cutlass, 3rdparty/cccl, 3rdparty/spdlog]}}
    ref: v0.6.13
    builder: flashinfer
    wheel_packages: [flashinfer-python, flashinfer-jit-cache, flashinfer-jit-cache-sm90a]
    torch_cuda_arch_list: "9.0a"
    verify_wheel_archs: false
    runs_on: ubuntu-24.04
    max_jobs: 2
    shards: 2
    extra_env: {{WHEELHOUSE_JIT_CACHE_MODULES: "silu_and_mul {DECODE}"}}
""")
    return path


def test_two_real_modules_by_shards_make_a_jit_cache_flashinfer_loads_without_compiling(tmp_path):
    row = _row_of(PYTHON)
    env = {**os.environ, "WHEELHOUSE_VERSIONS": str(_versions(tmp_path, row)), "WHEELHOUSE_CACHE": str(tmp_path / "cache"),
           "PATH": f"{CUDA_BIN}:{os.environ['PATH']}"}
    dist = tmp_path / "dist"
    session = f"build-flashinfer-{row['python']}"
    common = ["--reuse-env", "--source", SOURCES, "--dist", str(dist)]

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([PYTHON, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=1800)

    started = time.monotonic()
    first = run("-m", "nox", "-s", session, "--", *common, "--shard", "1/2")
    assert first.returncode == 0, first.stderr[-3000:]
    world = f"cu{row['cuda'].replace('.', '')}/torch{'.'.join(row['torch'].split('.')[:2])}"
    tag = f"flashinfer-v0.6.13-{world.split('/')[0]}-py{row['python']}-torch{row['torch']}-x86_64"
    shards_dir = dist / world / "shards" / tag
    manifest = json.loads((shards_dir / "shard-1-of-2" / "shard.json").read_text())
    assert list(manifest["modules"]) == [f"sm90a/{DECODE}"] and manifest["modules"][f"sm90a/{DECODE}"]["seconds"] > 0
    assert manifest["cache"]["hits"] == 0  # a fresh compiler cache: its seconds are compile times

    assemble = ["-m", "invoke", "assemble-shards", "--component", "flashinfer", "--reuse-env", "--source", SOURCES,
                "--dist", str(dist)]
    early = run(*assemble)
    assert early.returncode == 2
    assert early.stderr.strip().splitlines()[-1] == (
        f"error: shard 2/2 is missing from {shards_dir}: its job failed or its files were not brought here; "
        f"build it: nox -s {session} -- --arch x86_64 --torch {row['torch']} --shard 2/2")
    assert not list((dist / world).glob("*.whl"))

    second = run("-m", "nox", "-s", session, "--", *common, "--shard", "2/2")
    assert second.returncode == 0, second.stderr[-3000:]
    done = run(*assemble)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"two shards and the assembly: {time.monotonic() - started:.0f} s")

    shim = dist / world / "flashinfer_jit_cache-0.6.13-cp39-abi3-linux_x86_64.whl"
    wheel = dist / world / "flashinfer_jit_cache_sm90a-0.6.13-cp39-abi3-linux_x86_64.whl"
    assert (dist / world / f"{wheel.name}.metadata").is_file() and (dist / world / f"{shim.name}.metadata").is_file()
    record = BuildRecord.read(dist / world / f"{tag}.build.json")
    assert record.checks_passed and sorted(w.name for w in record.wheels) == [
        shim.name, wheel.name, "flashinfer_python-0.6.13-py3-none-any.whl"]
    timed = {m["name"]: m["seconds"] for m in record.modules["modules"] if m["seconds"] is not None}
    assert sorted(timed) == sorted([f"sm90a/{DECODE}", "sm90a/silu_and_mul"]) and len(record.modules["modules"]) == 793
    print("compile seconds:", json.dumps(timed))
    report = check_wheels([shim, wheel], pythons=row["python"], use_cuobjdump=False)
    assert report.ok, report.problems
    assert [str(a) for a in report.wheels[1].archs.cubin_archs] == ["9.0a"]
    with zipfile.ZipFile(wheel) as zf:
        assert f"flashinfer_jit_cache/providers/sm90a/jit_cache/{DECODE}/{DECODE}.so" in zf.namelist()

    # the three wheels installed, and flashinfer's own loader: the sm90a provider serves the module, nothing compiles
    target = tmp_path / "installed"
    python_wheel = dist / world / "flashinfer_python-0.6.13-py3-none-any.whl"
    subprocess.run([PYTHON, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(shim), str(wheel),
                    str(python_wheel)], check=True, capture_output=True)
    probe = f"""
import shutil, torch, flashinfer
from flashinfer.jit import MissingJITCacheError, gen_single_decode_module
assert shutil.which("nvcc") is None
spec = gen_single_decode_module(torch.float16, torch.float16, torch.float16, 128, 128, 0, False, False)
assert spec.name == {DECODE!r} and spec.is_aot and str(spec.aot_path).startswith({str(target)!r}), spec.aot_path
print("loaded", spec.build_and_load().run)
other = gen_single_decode_module(torch.float16, torch.float16, torch.float16, 64, 64, 0, False, False)
try:
    other.build_and_load()
except MissingJITCacheError:
    print("refused", other.name)
"""
    loader_env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "CUDA_HOME": str(tmp_path / "no-toolkit"),
                  "FLASHINFER_DISABLE_JIT": "1", "FLASHINFER_CUDA_ARCH_LIST": "9.0a",  # no GPU here to ask
                  "FLASHINFER_WORKSPACE_BASE": str(tmp_path / "workspace"),
                  "PYTHONPATH": os.pathsep.join([str(target), *_aot_imports(PYTHON, tmp_path)])}
    loaded = subprocess.run([PYTHON, "-c", probe], env=loader_env, capture_output=True, text=True, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert "loaded" in loaded.stdout and "refused single_decode_with_kv_cache_dtype_q_f16" in loaded.stdout
    assert not list((tmp_path / "workspace").rglob("*.so"))


def _aot_imports(python: str, tmp_path: Path) -> list[str]:
    """flashinfer's own imports (tvm-ffi and the rest) where the interpreter lacks them, as the builder installs them."""
    probe = subprocess.run([python, "-c", "import tvm_ffi, pynvml, requests"], capture_output=True)
    if probe.returncode == 0:
        return []
    target = tmp_path / "imports"
    subprocess.run([python, "-m", "pip", "install", "-q", "--target", str(target), "apache-tvm-ffi<0.2", "nvidia-ml-py",
                    "requests"], check=True, capture_output=True)
    return [str(target)]
