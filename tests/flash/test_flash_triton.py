"""The Triton forward kernel (``mha_tutorial.modern.flash_triton``) against the PyTorch tiles and PyTorch's SDPA.

Runs on a CUDA GPU, or on the CPU under Triton's interpreter (``TRITON_INTERPRET=1`` set before Python starts;
Triton 3.6's interpreter needs NumPy < 2.4). Skipped where neither is available, as in CI, which installs no Triton.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.nn import functional as F

triton = pytest.importorskip("triton")
if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs a CUDA GPU or TRITON_INTERPRET=1", allow_module_level=True)

from mha_tutorial.modern.flash import Tiling, flash_attention, flash_forward  # noqa: E402
from mha_tutorial.modern.flash_triton import triton_flash_attention, triton_forward  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(("Q", "K"), [(40, 40), (20, 50), (50, 20), (1, 33), (33, 1)])
@pytest.mark.parametrize("d", [16, 32])
def test_forward_and_log_sum_exp_equal_the_pytorch_tiles(Q, K, d, is_causal):
    g = torch.Generator().manual_seed(Q * 100 + K)
    q, k, v = (torch.randn(2, 3, n, d, generator=g) for n in (Q, K, K))
    out, lse = triton_forward(*(x.to(DEVICE) for x in (q, k, v)), is_causal, dict(block_q=16, block_k=16))
    ref_out, ref_lse = flash_forward(q.double(), k.double(), v.double(), Tiling(is_causal=is_causal))
    torch.testing.assert_close(out.cpu().double(), ref_out, atol=2e-5, rtol=0)  # float32 kernel, float64 reference
    torch.testing.assert_close(lse.cpu().double(), ref_lse, atol=2e-5, rtol=0)  # -inf rows (Q > K, causal) included


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(("Q", "K"), [(24, 24), (16, 40), (40, 16)])
def test_gradients_of_the_backward_kernels_equal_the_pytorch_tiles(Q, K, is_causal):
    g = torch.Generator().manual_seed(Q + K)
    q, k, v, d_out = (torch.randn(1, 2, n, 16, generator=g) for n in (Q, K, K, Q))
    inputs = [x.to(DEVICE).requires_grad_() for x in (q, k, v)]
    out = triton_flash_attention(*inputs, is_causal, dict(block_q=16, block_k=16))
    ours = torch.autograd.grad(out, inputs, d_out.to(DEVICE))
    ref_inputs = [x.double().requires_grad_() for x in (q, k, v)]
    ref = flash_attention(*ref_inputs, is_causal=is_causal, block_k=8)
    theirs = torch.autograd.grad(ref, ref_inputs, d_out.double())
    for name, a, b in zip("qkv", ours, theirs, strict=True):  # rows with no visible key (Q > K, causal): zeros
        torch.testing.assert_close(a.cpu().double(), b, atol=5e-5, rtol=1e-4, msg=f"d{name}")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="autotuning runs on a GPU")
def test_autotuned_launch_agrees_with_pytorch_sdpa_forward_and_backward():
    q, k, v = (torch.randn(2, 3, 300, 64, device="cuda", requires_grad=True) for _ in range(3))
    ours = triton_flash_attention(q, k, v, is_causal=True)
    theirs = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)
    for a, b in zip(
        torch.autograd.grad(ours.sum(), (q, k, v)), torch.autograd.grad(theirs.sum(), (q, k, v)), strict=True
    ):
        torch.testing.assert_close(a, b, atol=1e-3, rtol=1e-3)


def test_head_sizes_the_kernel_cannot_take_are_refused():
    q = torch.randn(1, 1, 8, 24, device=DEVICE)
    with pytest.raises(ValueError, match="power of two from 16 to 256.*24"):
        triton_flash_attention(q, q, q)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bfloat16 tensor cores: GPU only")
@pytest.mark.parametrize("T", [1000, 2048])
def test_bfloat16_on_the_gpu_matches_sdpa(T):
    q, k, v = (torch.randn(2, 4, T, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    out = triton_flash_attention(q, k, v, is_causal=True)  # the GPU launch configuration
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert (out.float() - ref).abs().max().item() < 2e-2
