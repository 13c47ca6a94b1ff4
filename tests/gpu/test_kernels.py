"""Kernels of wheels installed from our own index, compared with torch references on the GPU.

Run by tests/gpu/run_on_device.sh after it has built, released, indexed and
installed the packages; elsewhere these tests skip (no GPU, or the packages
are not installed).
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU"),
]

# Absolute tolerances for results computed in float and rounded once to the dtype.
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 6e-2, torch.float32: 1e-5}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_fixture_kernel_matches_torch(dtype):
    fixture = pytest.importorskip("wheelhouse_fixture")
    assert fixture.has_cuda_kernel(), "the installed wheel was built without its CUDA kernel"
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(1 << 20, device="cuda", generator=gen).to(dtype)
    y = torch.randn(1 << 20, device="cuda", generator=gen).to(dtype)
    out = fixture.scaled_add(x, y, 0.5)
    reference = (x.float() + 0.5 * y.float()).to(dtype)
    diff = (out.float() - reference.float()).abs().max().item()
    print(f"wheelhouse_fixture.scaled_add {dtype}: max |diff| = {diff:.3e}")
    assert out.dtype == dtype and out.is_cuda
    assert diff <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", [None, "silu"])
def test_causal_conv1d_matches_conv1d(dtype, activation):
    causal_conv1d = pytest.importorskip("causal_conv1d")
    gen = torch.Generator(device="cuda").manual_seed(0)
    batch, dim, length, width = 2, 64, 512, 4
    x = torch.randn(batch, dim, length, device="cuda", generator=gen).to(dtype)
    weight = torch.randn(dim, width, device="cuda", generator=gen).to(dtype)
    bias = torch.randn(dim, device="cuda", generator=gen).to(dtype)
    out = causal_conv1d.causal_conv1d_fn(x, weight, bias, activation=activation)
    # causal = left-pad by width-1, depthwise conv, keep the first `length` outputs
    reference = torch.nn.functional.conv1d(
        torch.nn.functional.pad(x.float(), (width - 1, 0)), weight.float().unsqueeze(1), bias.float(), groups=dim
    )[..., :length]
    if activation == "silu":
        reference = torch.nn.functional.silu(reference)
    diff = (out.float() - reference).abs().max().item()
    print(f"causal_conv1d_fn {dtype} activation={activation}: max |diff| = {diff:.3e}")
    assert diff <= TOLERANCE[dtype] * 4  # a width-4 sum accumulates up to four roundings
