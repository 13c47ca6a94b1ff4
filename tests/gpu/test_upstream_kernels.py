"""Kernels of real upstream components, installed from our own index, against references written from the math.

Run by ``tests/gpu/run_on_device.sh upstream`` after it has built, released,
indexed and installed fast-hadamard-transform, FlashMLA and DeepGEMM; elsewhere
these tests skip (no GPU, or the packages are not installed). References are
computed in float32 (float64 for the Hadamard matrix products) from the inputs
the kernel saw, so every difference is the kernel's rounding.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

# One rounding of the output to the dtype: half an ulp of the largest |value|,
# plus float32 accumulation error in the kernel (far smaller).
UNIT_ROUNDOFF = {torch.float32: 2.0**-24, torch.float16: 2.0**-11, torch.bfloat16: 2.0**-8}


def sylvester_hadamard(n: int, device) -> torch.Tensor:
    """The n x n Hadamard matrix of Sylvester's construction (n a power of two), in float64."""
    h = torch.ones(1, 1, dtype=torch.float64, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dim", [256, 1024, 4096, 200, 1000])
def test_hadamard_transform_matches_sylvester_matrix(dtype, dim):
    fht = pytest.importorskip("fast_hadamard_transform")
    gen = torch.Generator(device="cuda").manual_seed(dim)
    x = torch.randn(8, 3, dim, device="cuda", generator=gen).to(dtype)
    scale = 1 / math.sqrt(dim)
    out = fht.hadamard_transform(x, scale)
    # Upstream's contract: a last dimension that is not a power of two is zero-padded to the next one.
    padded = 1 << (dim - 1).bit_length()
    xp = torch.nn.functional.pad(x.double(), (0, padded - dim))
    reference = (xp @ sylvester_hadamard(padded, "cuda"))[..., :dim] * scale
    diff = (out.double() - reference).abs().max().item()
    # The output is rounded once to the dtype; float32 sums of `padded` terms add log2(padded) roundings.
    tolerance = reference.abs().max().item() * UNIT_ROUNDOFF[dtype] * (2 + math.log2(padded))
    print(f"hadamard_transform {dtype} dim={dim}: max |diff| = {diff:.3e} (tolerance {tolerance:.3e})")
    assert out.shape == x.shape and out.dtype == dtype
    assert diff <= tolerance


def _mla_reference(q, k_cache, block_table, seqlens, dv, scale):
    """softmax(q Kᵀ · scale) V per sequence, V = K[..., :dv], keys gathered through the block table, in float32."""
    batch, s_q, h_q, d = q.shape
    block = k_cache.shape[1]
    out = torch.empty(batch, s_q, h_q, dv, dtype=torch.float32, device=q.device)
    for i in range(batch):
        n = int(seqlens[i])
        blocks = block_table[i, : (n + block - 1) // block].long()
        keys = k_cache[blocks].reshape(-1, d)[:n].float()  # (n, d): one KV head shared by every query head
        scores = torch.einsum("shd,nd->shn", q[i].float(), keys) * scale
        out[i] = torch.einsum("shn,nd->shd", torch.softmax(scores, dim=-1), keys[:, :dv])
    return out


@pytest.mark.parametrize("h_q", [64, 128])
@pytest.mark.parametrize("seqlens", [(256, 200), (1024, 77), (4097, 1)])
def test_flash_mla_decode_with_paged_kv_cache_matches_attention(h_q, seqlens):
    flash_mla = pytest.importorskip("flash_mla")
    gen = torch.Generator(device="cuda").manual_seed(sum(seqlens) + h_q)
    batch, d, dv, block = len(seqlens), 576, 512, 64
    blocks_per_seq = max((n + block - 1) // block for n in seqlens)
    # Pages in a shuffled order, so the kernel must follow the block table.
    block_table = torch.randperm(batch * blocks_per_seq, device="cuda", generator=gen).to(torch.int32)
    block_table = block_table.view(batch, blocks_per_seq)
    k_cache = torch.randn(batch * blocks_per_seq, block, 1, d, device="cuda", generator=gen).to(torch.bfloat16)
    q = torch.randn(batch, 1, h_q, d, device="cuda", generator=gen).to(torch.bfloat16)
    cache_seqlens = torch.tensor(seqlens, dtype=torch.int32, device="cuda")
    scale = d**-0.5

    metadata, _ = flash_mla.get_mla_metadata(cache_seqlens, h_q, 1)
    out, lse = flash_mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, dv, metadata, None,
                                                softmax_scale=scale)
    reference = _mla_reference(q, k_cache, block_table, cache_seqlens, dv, scale)
    diff = (out.float() - reference).abs().max().item()
    # bf16 output: one rounding of values of magnitude <= max|V|, plus bf16 P·V products in the kernel.
    tolerance = 4 * UNIT_ROUNDOFF[torch.bfloat16] * reference.abs().max().item()
    print(f"flash_mla_with_kvcache bf16 h_q={h_q} seqlens={seqlens}: max |diff| = {diff:.3e} "
          f"(tolerance {tolerance:.3e})")
    assert out.shape == (batch, 1, h_q, dv) and torch.isfinite(out).all()
    assert diff <= tolerance


@pytest.mark.parametrize("m,n,k", [(256, 512, 1024), (4096, 2048, 7168)])
def test_deep_gemm_bf16_gemm_matches_matmul(m, n, k):
    deep_gemm = pytest.importorskip("deep_gemm")
    gen = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    deep_gemm.bf16_gemm_nt(a, b, d)  # D = A Bᵀ, compiled by DeepGEMM's JIT on first use
    reference = a.float() @ b.float().T
    diff = (d.float() - reference).abs().max().item()
    tolerance = 2 * UNIT_ROUNDOFF[torch.bfloat16] * reference.abs().max().item()
    print(f"deep_gemm.bf16_gemm_nt {m}x{n}x{k}: max |diff| = {diff:.3e} (tolerance {tolerance:.3e})")
    assert diff <= tolerance


@pytest.mark.parametrize("m,n,k", [(256, 512, 1024), (4096, 2048, 7168)])
def test_deep_gemm_fp8_gemm_matches_matmul_of_dequantized_inputs(m, n, k):
    deep_gemm = pytest.importorskip("deep_gemm")
    from deep_gemm.utils import per_block_cast_to_fp8, per_token_cast_to_fp8

    gen = torch.Generator(device="cuda").manual_seed(m * 3 + n + k)
    a = torch.randn(m, k, device="cuda", generator=gen).to(torch.bfloat16)
    b = torch.randn(n, k, device="cuda", generator=gen).to(torch.bfloat16)
    # DeepGEMM's recipe: A scaled per token and 128-wide K group, B per 128x128 block, fp32 scales.
    a_fp8, a_scale = per_token_cast_to_fp8(a, use_ue8m0=False)
    b_fp8, b_scale = per_block_cast_to_fp8(b, use_ue8m0=False)
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    deep_gemm.fp8_gemm_nt((a_fp8, a_scale), (b_fp8, b_scale), d)
    a_deq = (a_fp8.float().view(m, k // 128, 128) * a_scale.view(m, k // 128, 1)).view(m, k)
    b_deq = (b_fp8.float().view(n // 128, 128, k // 128, 128) * b_scale.view(n // 128, 1, k // 128, 1)).view(n, k)
    reference = a_deq @ b_deq.T
    diff = (d.float() - reference).abs().max().item()
    # The same inputs exactly (dequantized): the kernel's error is the bf16 output rounding plus its fp32
    # accumulation, which Hopper's fp8 tensor cores do with fewer mantissa bits (DeepGEMM promotes per 128).
    tolerance = 4 * UNIT_ROUNDOFF[torch.bfloat16] * reference.abs().max().item()
    print(f"deep_gemm.fp8_gemm_nt {m}x{n}x{k}: max |diff| = {diff:.3e} (tolerance {tolerance:.3e})")
    assert diff <= tolerance
