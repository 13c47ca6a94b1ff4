"""TransformerEngine's modules, installed from our own index, against the same math in PyTorch.

Run by ``tests/gpu/run_on_device.sh upstream`` after it has built, released,
indexed and installed transformer-engine; elsewhere these tests skip (no GPU,
or the package is not installed). Every module is compared with a float32
reference computed from the very bfloat16 parameters and inputs the module saw,
so a difference is the module's own rounding. Comparisons use the relative
Frobenius error ||out - ref|| / ||ref||: each rounding of an intermediate to a
format of unit roundoff u adds at most u to it, so k roundings on a path bound
it by about k·u; a wrong kernel (transposed weight, missing bias, wrong
normalisation) gives an error of order 1.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

BF16_U = 2.0**-8  # unit roundoff of bfloat16 (8 significant bits)
E4M3_U = 2.0**-4  # unit roundoff of FP8 E4M3 (4 significant bits)
TOKENS, IN_FEATURES, OUT_FEATURES = 256, 1024, 512  # multiples of 16, as FP8 GEMMs need


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref).norm() / ref.norm()).item()


def report(what: str, out: torch.Tensor, ref: torch.Tensor, tolerance: float) -> float:
    error = relative_error(out, ref)
    diff = (out.float() - ref).abs().max().item()
    print(f"{what}: relative error {error:.3e} (tolerance {tolerance:.3e}), max |diff| {diff:.3e}")
    return error


def _inputs(seed: int):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(TOKENS, IN_FEATURES, device="cuda", generator=gen).to(torch.bfloat16)
    grad_out = torch.randn(TOKENS, OUT_FEATURES, device="cuda", generator=gen).to(torch.bfloat16)
    return gen, x, grad_out


def _float32_leaf(t: torch.Tensor) -> torch.Tensor:
    return t.detach().float().requires_grad_(True)


def test_te_linear_forward_and_backward_match_pytorch_in_bf16():
    te = pytest.importorskip("transformer_engine.pytorch")
    gen, x, grad_out = _inputs(1)
    layer = te.Linear(IN_FEATURES, OUT_FEATURES, bias=True, params_dtype=torch.bfloat16)
    with torch.no_grad():
        layer.bias.copy_(torch.randn(OUT_FEATURES, device="cuda", generator=gen))
    x.requires_grad_(True)
    out = layer(x)
    out.backward(grad_out)

    xr, wr, br = _float32_leaf(x), _float32_leaf(layer.weight), _float32_leaf(layer.bias)
    ref = torch.nn.functional.linear(xr, wr, br)
    ref.backward(grad_out.float())
    # forward: the GEMM's output and the bias add each round to bf16 once;
    # backward: each gradient is one GEMM (or sum) rounded once
    tolerance = 2 * BF16_U
    assert out.dtype == torch.bfloat16 and out.shape == (TOKENS, OUT_FEATURES)
    assert report("te.Linear bf16 forward", out, ref.detach(), tolerance) <= tolerance
    assert report("te.Linear bf16 grad input", x.grad, xr.grad, tolerance) <= tolerance
    assert report("te.Linear bf16 grad weight", layer.weight.grad, wr.grad, tolerance) <= tolerance
    assert report("te.Linear bf16 grad bias", layer.bias.grad, br.grad, tolerance) <= tolerance


def test_te_layernorm_linear_forward_and_backward_match_pytorch_in_bf16():
    te = pytest.importorskip("transformer_engine.pytorch")
    gen, x, grad_out = _inputs(2)
    eps = 1e-5
    layer = te.LayerNormLinear(IN_FEATURES, OUT_FEATURES, eps=eps, bias=True, params_dtype=torch.bfloat16)
    with torch.no_grad():
        layer.layer_norm_weight.copy_(1 + 0.1 * torch.randn(IN_FEATURES, device="cuda", generator=gen))
        layer.layer_norm_bias.copy_(0.1 * torch.randn(IN_FEATURES, device="cuda", generator=gen))
        layer.bias.copy_(torch.randn(OUT_FEATURES, device="cuda", generator=gen))
    x.requires_grad_(True)
    out = layer(x)
    out.backward(grad_out)

    leaves = [_float32_leaf(t) for t in (x, layer.layer_norm_weight, layer.layer_norm_bias, layer.weight, layer.bias)]
    xr, gamma, beta, wr, br = leaves
    normed = torch.nn.functional.layer_norm(xr, (IN_FEATURES,), gamma, beta, eps)
    ref = torch.nn.functional.linear(normed, wr, br)
    ref.backward(grad_out.float())
    # the normalised activations are rounded to bf16 before the GEMM (one more
    # rounding than te.Linear on every path), and backward also rounds the
    # gradient of the normalised activations
    tolerance = 3 * BF16_U
    assert report("te.LayerNormLinear bf16 forward", out, ref.detach(), tolerance) <= tolerance
    grads = [("grad input", x.grad, xr.grad), ("grad ln weight", layer.layer_norm_weight.grad, gamma.grad),
             ("grad ln bias", layer.layer_norm_bias.grad, beta.grad), ("grad weight", layer.weight.grad, wr.grad),
             ("grad bias", layer.bias.grad, br.grad)]
    for name, got, want in grads:
        assert report(f"te.LayerNormLinear bf16 {name}", got, want, tolerance) <= tolerance


def test_te_linear_fp8_forward_is_close_to_bf16_on_hopper():
    te = pytest.importorskip("transformer_engine.pytorch")
    recipe = pytest.importorskip("transformer_engine.common.recipe")
    available, reason = te.is_fp8_available(return_reason=True)
    print(f"te.is_fp8_available: {available} {reason or ''}".rstrip())
    assert available, f"FP8 should be available on sm_90: {reason}"
    gen, x, _ = _inputs(3)
    layer = te.Linear(IN_FEATURES, OUT_FEATURES, bias=True, params_dtype=torch.bfloat16)
    with torch.no_grad():
        layer.bias.copy_(torch.randn(OUT_FEATURES, device="cuda", generator=gen))
        bf16 = layer(x).float()
    fp8_recipe = recipe.DelayedScaling(fp8_format=recipe.Format.HYBRID, amax_history_len=16, amax_compute_algo="max")
    with torch.no_grad():
        for _ in range(2):  # the first pass records the amaxes the second one scales by
            with te.fp8_autocast(enabled=True, fp8_recipe=fp8_recipe):
                fp8 = layer(x)
    # the input and the weight are each rounded to E4M3 (u = 2^-4 relative per
    # element), so each product carries at most 2u; bias and output add bf16 roundings
    tolerance = 2 * E4M3_U + 2 * BF16_U
    error = report("te.Linear fp8 (E4M3, delayed scaling) forward vs bf16", fp8, bf16, tolerance)
    assert error <= tolerance
    assert error > 0, "an FP8 forward identical to bf16 did not quantise"
