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
    out, _lse = flash_mla.flash_mla_with_kvcache(q, k_cache, block_table, cache_seqlens, dv, metadata, None,
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


# --- flash-attention ------------------------------------------------------------------------------
# Upstream's own acceptance rule (tests/test_flash_attn.py at v2.8.3): the kernel may be at most twice
# (forward) or three times (gradients) as far from the float32 result as PyTorch's own computation of
# the same math in the same dtype is. The float32 result here is torch's scaled_dot_product_attention
# (its math backend, on upcast inputs); "PyTorch in the same dtype" scales k instead of q, as upstream
# does, so its error includes a change in the order of operations.

def _sdpa_float32(q, k, v, causal):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        out = torch.nn.functional.scaled_dot_product_attention(
            q.float().transpose(1, 2), k.float().transpose(1, 2), v.float().transpose(1, 2), is_causal=causal)
    return out.transpose(1, 2).to(q.dtype)


def _attention_in_dtype(q, k, v, causal):
    scores = torch.einsum("bthd,bshd->bhts", q, k / math.sqrt(q.shape[-1]))
    if causal:
        above = torch.ones(q.shape[1], k.shape[1], dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(above, float("-inf"))
    return torch.einsum("bhts,bshd->bthd", torch.softmax(scores, dim=-1), v)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_flash_attn_func_matches_scaled_dot_product_attention(dtype, causal, head_dim):
    flash_attn = pytest.importorskip("flash_attn")
    gen = torch.Generator(device="cuda").manual_seed(head_dim + causal)
    batch, seqlen, heads = 2, 1024, 8
    q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen, dtype=dtype).requires_grad_()
               for _ in range(3))
    dout = torch.randn(batch, seqlen, heads, head_dim, device="cuda", generator=gen, dtype=dtype)
    outputs = {
        "flash": flash_attn.flash_attn_func(q, k, v, causal=causal),
        "ref": _sdpa_float32(q, k, v, causal),
        "pt": _attention_in_dtype(q, k, v, causal),
    }
    grads = {name: torch.autograd.grad(out, (q, k, v), dout) for name, out in outputs.items()}
    label = f"flash_attn_func {dtype} {'causal' if causal else 'full'} d={head_dim}"
    checks = [("out", outputs["flash"], outputs["pt"], outputs["ref"], 2)]
    checks += [(name, grads["flash"][i], grads["pt"][i], grads["ref"][i], 3) for i, name in enumerate(("dq", "dk", "dv"))]
    for name, got, pt, ref, factor in checks:
        diff = (got - ref).abs().max().item()
        tolerance = factor * (pt - ref).abs().max().item()
        print(f"{label} {name}: max |diff| = {diff:.3e} (tolerance {tolerance:.3e} = {factor} x PyTorch {dtype}'s)")
        assert diff <= tolerance, f"{label} {name}"


# --- flashinfer (its JIT compiles the kernel here, on first use) ---------------------------------


@pytest.mark.parametrize("kv_len", [1024, 4097])
def test_flashinfer_single_decode_compiled_at_run_time_matches_attention(kv_len):
    """One request's decode step with grouped heads (32 query heads over 8 KV heads), float16, d=128."""
    flashinfer = pytest.importorskip("flashinfer")
    gen = torch.Generator(device="cuda").manual_seed(kv_len)
    qo_heads, kv_heads, head_dim, dtype = 32, 8, 128, torch.float16
    q = torch.randn(qo_heads, head_dim, device="cuda", generator=gen, dtype=dtype)
    k = torch.randn(kv_len, kv_heads, head_dim, device="cuda", generator=gen, dtype=dtype)
    v = torch.randn(kv_len, kv_heads, head_dim, device="cuda", generator=gen, dtype=dtype)
    out = flashinfer.single_decode_with_kv_cache(q, k, v)
    group = qo_heads // kv_heads
    kf, vf = k.float().repeat_interleave(group, dim=1), v.float().repeat_interleave(group, dim=1)
    weights = torch.softmax(torch.einsum("hd,shd->hs", q.float(), kf) / math.sqrt(head_dim), dim=-1)
    reference = torch.einsum("hs,shd->hd", weights, vf)
    diff = (out.float() - reference).abs().max().item()
    tolerance = 4 * UNIT_ROUNDOFF[dtype] * reference.abs().max().item()  # rounding of P and of the output
    print(f"flashinfer.single_decode_with_kv_cache {dtype} kv_len={kv_len}: max |diff| = {diff:.3e} "
          f"(tolerance {tolerance:.3e})")
    assert out.shape == (qo_heads, head_dim) and diff <= tolerance
