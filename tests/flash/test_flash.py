"""FlashAttention from scratch (``mha_tutorial.modern.flash``) against independent references.

References: PyTorch's ``F.scaled_dot_product_attention`` with an explicit bool mask (its own kernels), the
package's materialising ``scaled_dot_product_attention``, a plain loop over queries, and ``gradcheck`` in float64.
Hypothesis draws shapes, tile sizes (dividing the lengths or not), padding (zero lengths included) and causal
masks with Q < K, Q = K and Q > K (the last leaves whole rows with no visible key).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.nn import functional as F

from mha_tutorial import causal_mask, scaled_dot_product_attention
from mha_tutorial.modern.flash import Tiling, flash_attention, flash_forward

from testkit import TOL64

DT = torch.float64


def _keep(B, Q, K, valid_lens, is_causal):
    """The (B, 1, Q, K) keep-mask that flash_attention applies, built the materialising way."""
    keep = torch.ones(B, 1, Q, K, dtype=torch.bool)
    if valid_lens is not None:
        lens = valid_lens[:, None] if valid_lens.dim() == 1 else valid_lens  # (B, 1 or Q)
        keep &= (torch.arange(K) < lens[..., None])[:, None]
    if is_causal:
        keep &= causal_mask(Q, K)
    return keep


@st.composite
def problems(draw):
    B, H = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    Q, K = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    d, dv = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    q, k, v = (torch.randn(B, H, n, f, generator=g, dtype=DT) for n, f in ((Q, d), (K, d), (K, dv)))
    padding = draw(st.sampled_from([None, "rows", "queries"]))
    valid_lens = None
    if padding == "rows":
        valid_lens = torch.randint(0, K + 1, (B,), generator=g)
    elif padding == "queries":
        valid_lens = torch.randint(0, K + 1, (B, Q), generator=g)
    tiling = Tiling(
        valid_lens=valid_lens,
        is_causal=draw(st.booleans()),
        block_q=draw(st.one_of(st.none(), st.integers(1, 13))),
        block_k=draw(st.integers(1, 13)),
    )
    return q, k, v, tiling


def _reference(q, k, v, tiling):
    """PyTorch's SDPA with the explicit mask; rows with no visible key set to 0 (the package's convention)."""
    keep = _keep(q.shape[0], q.shape[-2], k.shape[-2], tiling.valid_lens, tiling.is_causal)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # (B, H, Q, dv)
    return torch.where(keep.any(-1, keepdim=True), out, 0.0), keep


def _call(q, k, v, tiling):
    return flash_attention(q, k, v, tiling.valid_lens, tiling.is_causal, tiling.block_q, tiling.block_k)


@given(problems())
def test_forward_equals_pytorch_sdpa_and_the_package(problem):
    q, k, v, tiling = problem
    out = _call(q, k, v, tiling)
    reference, keep = _reference(q, k, v, tiling)
    torch.testing.assert_close(out, reference, **TOL64)
    packaged, _ = scaled_dot_product_attention(q, k, v, mask=keep)  # the materialising path, same mask
    torch.testing.assert_close(out, packaged, **TOL64)
    assert torch.isfinite(out).all()


@given(problems())
def test_log_sum_exp_is_that_of_the_visible_scores(problem):
    q, k, v, tiling = problem
    _, lse = flash_forward(q, k, v, tiling)  # (B, H, Q)
    keep = _keep(q.shape[0], q.shape[-2], k.shape[-2], tiling.valid_lens, tiling.is_causal)
    scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~keep, -math.inf)  # (B, H, Q, K)
    torch.testing.assert_close(lse, torch.logsumexp(scores, -1), **TOL64)  # -inf where no key is visible


@given(problems())
def test_gradients_equal_autograd_through_pytorch_sdpa(problem):
    q, k, v, tiling = problem
    inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    out = _call(*inputs, tiling)
    grad = torch.randn_like(out)
    ours = torch.autograd.grad(out, inputs, grad)
    ref_inputs = [x.clone().requires_grad_() for x in (q, k, v)]
    theirs = torch.autograd.grad(_reference(*ref_inputs, tiling)[0], ref_inputs, grad, allow_unused=True)
    for name, a, b in zip("qkv", ours, theirs, strict=True):
        torch.testing.assert_close(a, torch.zeros_like(a) if b is None else b, **TOL64, msg=f"d{name}")


@pytest.mark.parametrize("is_causal", [False, True])
@pytest.mark.parametrize(("Q", "K"), [(5, 5), (3, 7), (7, 3)])
def test_gradcheck_in_float64(Q, K, is_causal):
    g = torch.Generator().manual_seed(Q * 10 + K)
    q, k, v = (torch.randn(2, 2, n, 3, generator=g, dtype=DT, requires_grad=True) for n in (Q, K, K))
    lens = torch.tensor([K, max(K - 2, 0)])
    assert torch.autograd.gradcheck(lambda q, k, v: flash_attention(q, k, v, lens, is_causal, 2, 2), (q, k, v))


def test_a_plain_loop_over_queries_agrees():
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(1, 1, 6, 4, generator=g, dtype=DT), *(torch.randn(1, 1, 9, 4, generator=g, dtype=DT),) * 2
    out = flash_attention(q, k, v, is_causal=True, block_q=4, block_k=4)
    for i in range(6):  # query i is the (i + 3)-th position: keys 0..i+3
        scores = [float(q[0, 0, i] @ k[0, 0, j]) / 2.0 for j in range(i + 4)]
        top = max(scores)
        weights = [math.exp(s - top) for s in scores]
        row = sum(w * v[0, 0, j] for j, w in enumerate(weights)) / sum(weights)
        torch.testing.assert_close(out[0, 0, i], row, **TOL64)


def test_the_online_rescaling_step_matches_one_softmax():
    """Two blocks merged with e^(m - m') equal the softmax over both: the step the forward repeats."""
    scores = torch.tensor([2.0, -1.0, 5.0, 0.5], dtype=DT)
    values = torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=DT)
    m1 = scores[:2].max()
    ell1, a1 = torch.exp(scores[:2] - m1).sum(), torch.exp(scores[:2] - m1) @ values[:2]
    m2 = torch.maximum(m1, scores[2:].max())
    ell = ell1 * torch.exp(m1 - m2) + torch.exp(scores[2:] - m2).sum()
    a = a1 * torch.exp(m1 - m2) + torch.exp(scores[2:] - m2) @ values[2:]
    torch.testing.assert_close(a / ell, torch.softmax(scores, 0) @ values, **TOL64)
    _, lse = flash_forward(*(x.view(1, 1, -1, 1) for x in (scores[:1] * 0 + 1, scores, values)), Tiling(block_k=2))
    torch.testing.assert_close(lse.view(()), torch.logsumexp(scores, 0), **TOL64)


def test_fully_masked_rows_give_zeros_and_zero_gradients_not_nan():
    q, k, v = (torch.randn(2, 1, 4, 3, requires_grad=True) for _ in range(3))
    out = flash_attention(q, k, v, valid_lens=torch.tensor([0, 4]))
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    out.sum().backward()
    for x in (q, k, v):
        assert torch.isfinite(x.grad).all()
        assert torch.equal(x.grad[0], torch.zeros_like(x.grad[0]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_stays_close_to_float64(dtype):
    q, k, v = (torch.randn(2, 2, 40, 16) for _ in range(3))
    exact, _ = _reference(q.double(), k.double(), v.double(), Tiling(is_causal=True))
    out = flash_attention(q.to(dtype), k.to(dtype), v.to(dtype), is_causal=True, block_q=16, block_k=16)
    assert out.dtype == dtype
    torch.testing.assert_close(out.double(), exact, atol=2e-2 if dtype == torch.bfloat16 else 1e-5, rtol=0)


def test_three_d_inputs_and_a_custom_scale():
    q, k, v = torch.randn(2, 5, 4), torch.randn(2, 6, 4), torch.randn(2, 6, 3)
    out = flash_attention(q, k, v, scale=0.3, block_k=4)  # (B, Q, dv)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, scale=0.3))


def test_tiles_skip_what_the_causal_mask_hides():
    """Keys outside, queries inside: a causal call visits about half of the tiles of a full one."""
    from mha_tutorial.modern.flash import _tiles

    full = list(_tiles(64, 64, Tiling(block_q=8, block_k=8)))
    causal = list(_tiles(64, 64, Tiling(is_causal=True, block_q=8, block_k=8)))
    assert len(full) == 64 and len(causal) == 36  # 8 * 9 / 2 tiles on or below the diagonal
    assert all(q1 - 1 + 0 >= k0 for q0, q1, k0, k1 in causal)  # each visited tile holds a visible pair


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu_with_lengths_on_the_cpu():
    q, k, v = (torch.randn(2, 3, 70, 16) for _ in range(3))
    lens = torch.tensor([70, 33])
    cpu = flash_attention(q, k, v, lens, True, 32, 32)
    gpu = flash_attention(q.cuda(), k.cuda(), v.cuda(), lens, True, 32, 32)
    torch.testing.assert_close(gpu.cpu(), cpu, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        (dict(block_k=0), ValueError, "block_k must be a positive int"),
        (dict(block_q=2.5), ValueError, "block_q must be a positive int or None"),
        (dict(is_causal=1), TypeError, "is_causal must be True or False"),
        (dict(scale=-1.0), ValueError, "scale must be a positive finite number"),
        (dict(valid_lens=torch.tensor([7, 1])), ValueError, r"valid_lens values must lie in \[0, 6\]"),
        (dict(valid_lens=torch.tensor([1.0, 2.0])), TypeError, "valid_lens must be an integer tensor"),
        (dict(valid_lens=torch.tensor([1, 2, 3])), ValueError, r"valid_lens has shape \(3,\)"),
    ],
)
def test_bad_options_raise_before_any_arithmetic(kwargs, error, words):
    q, k = torch.randn(2, 3, 5, 4), torch.randn(2, 3, 6, 4)
    with pytest.raises(error, match=words):
        flash_attention(q, k, k, **kwargs)


def test_bad_tensors_name_their_shapes():
    q = torch.randn(2, 3, 5, 4)
    with pytest.raises(ValueError, match=r"same feature size.*\(2, 3, 6, 5\)"):
        flash_attention(q, torch.randn(2, 3, 6, 5), torch.randn(2, 3, 6, 5))
    with pytest.raises(TypeError, match="one dtype"):
        flash_attention(q, q.double(), q)
    with pytest.raises(ValueError, match=r"3-D \(B, T, d\) or 4-D"):
        flash_attention(q[0, 0], q[0, 0], q[0, 0])
