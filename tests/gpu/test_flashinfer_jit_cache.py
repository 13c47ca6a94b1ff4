"""flashinfer's kernels from the flashinfer-jit-cache wheel we built, installed from our index, nothing compiled.

Run by ``tests/gpu/run_on_device.sh jit-cache`` (tests/gpu/flashinfer_jit_cache.sh) after it built a
subset of the jit-cache for sm_90a by shards, assembled it as upstream's provider layout (the
flashinfer-jit-cache shim and the flashinfer-jit-cache-sm90a provider), released and indexed it with the
flashinfer-python wheel, and installed the three from that index. That script runs this file with
flashinfer's JIT turned off (``FLASHINFER_DISABLE_JIT=1``: a module missing from the cache raises
``MissingJITCacheError`` instead of compiling), an empty JIT workspace, and no nvcc on PATH or under
CUDA_HOME: a kernel that runs here came from the wheel. Elsewhere these tests skip.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

# the same kernel check as the JIT-compiled one (imported under a name pytest does not collect again)
from test_upstream_kernels import (  # noqa: E402
    test_flashinfer_single_decode_compiled_at_run_time_matches_attention as check_decode_against_attention,
)

DECODE = dict(head_dim=128, dtype=torch.float16)  # the module the check uses, which the subset holds


@pytest.fixture(scope="module")
def flashinfer():
    pytest.importorskip("flashinfer_jit_cache")
    module = pytest.importorskip("flashinfer")
    # what makes "nothing compiled" true, checked rather than assumed
    assert os.environ.get("FLASHINFER_DISABLE_JIT") == "1", "run with FLASHINFER_DISABLE_JIT=1"
    assert shutil.which("nvcc") is None, f"nvcc is on PATH ({shutil.which('nvcc')}): a compile could run"
    home = os.environ.get("CUDA_HOME", "")
    assert not (Path(home) / "bin" / "nvcc").exists(), f"CUDA_HOME={home} has an nvcc"
    return module


def _workspace_objects(flashinfer) -> list[Path]:
    """Every object or shared object flashinfer's JIT left in its workspace (none, when nothing compiled)."""
    jit_dir = Path(flashinfer.jit.env.FLASHINFER_JIT_DIR)
    return sorted(p for p in jit_dir.rglob("*") if p.suffix in (".so", ".o")) if jit_dir.exists() else []


def test_the_decode_module_is_served_by_the_installed_jit_cache(flashinfer):
    import flashinfer_jit_cache
    from flashinfer.jit import gen_single_decode_module

    # this GPU (sm_90, which flashinfer compiles for as sm90a) is served by the sm90a provider, exactly
    provider = flashinfer_jit_cache.select_provider()
    assert flashinfer_jit_cache.target_architectures() == {"sm90a"} and provider is not None
    assert provider.provider_id == "sm90a" and provider.distribution == "flashinfer-jit-cache-sm90a"
    spec = gen_single_decode_module(DECODE["dtype"], DECODE["dtype"], DECODE["dtype"], DECODE["head_dim"],
                                    DECODE["head_dim"], 0, False, False)
    cache = Path(flashinfer_jit_cache.get_jit_cache_dir()).resolve()
    print(f"{spec.name}: {spec.aot_path} (provider {provider.distribution})")
    assert cache == provider.jit_cache_dir and spec.is_aot and cache in spec.aot_path.resolve().parents


@pytest.mark.parametrize("kv_len", [1024, 4097])
def test_single_decode_from_the_jit_cache_matches_attention(flashinfer, kv_len):
    """tests/gpu/test_upstream_kernels.py's check of the JIT-compiled kernel (grouped heads, 32 over 8, float16,
    d=128), here with the JIT off: the kernel is the cache's."""
    check_decode_against_attention(kv_len)
    assert _workspace_objects(flashinfer) == []


def test_a_module_the_subset_lacks_is_not_compiled(flashinfer):
    """head_dim 64 is not in the subset: with the JIT off flashinfer refuses it, so the decode above was the
    cache's and no compile could have stood in for it."""
    from flashinfer.jit import MissingJITCacheError

    q = torch.randn(32, 64, device="cuda", dtype=torch.float16)
    k = torch.randn(256, 8, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(MissingJITCacheError):
        flashinfer.single_decode_with_kv_cache(q, k, k.clone())
    assert _workspace_objects(flashinfer) == []
