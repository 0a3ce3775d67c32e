"""Rotary position embeddings (``rope.py``) against the paper's complex-number definition, written as plain loops;
properties (relative scores, norms, position 0, the two layouts); KV-cache offsets and left padding; 16-bit input;
bad input rejected before any arithmetic."""

from __future__ import annotations

import cmath

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.overrides import TorchFunctionMode

from mha_tutorial.core.rope import apply_rope, interleaved_to_half, rope_angles, rope_frequencies, rotate_range

from testkit import TOL64

LAYOUTS = ("interleaved", "half")
head_sizes = st.integers(1, 32).map(lambda half: 2 * half)  # d = 2 .. 64, even
seeds = st.integers(0, 2**31 - 1)


def loop_rope(x: torch.Tensor, positions: torch.Tensor, base: float = 10000.0, layout: str = "interleaved"):
    """The paper's definition, by loops in float64: pair i as the complex z = a + i b, times e^{i m θ_i}.

    x (B, H, T, d); positions (T,) or (B, T). ``layout`` only says which features form pair i:
    (2i, 2i+1) when interleaved, (i, i + d/2) when half.
    """
    B, H, T, d = x.shape
    rows = positions.expand(B, T).tolist()
    values = x.detach().double().tolist()
    for b in range(B):
        for h in range(H):
            for t in range(T):
                vec, m = values[b][h][t], rows[b][t]
                for i in range(d // 2):
                    ia, ib = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + d // 2)
                    theta = base ** (-2 * i / d)
                    z = complex(vec[ia], vec[ib]) * cmath.exp(1j * m * theta)
                    vec[ia], vec[ib] = z.real, z.imag
    return torch.tensor(values, dtype=torch.float64)


def randn(*shape, seed=0, dtype=torch.float64):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def random_positions(T, low, high, seed):
    return torch.randint(low, high, (T,), generator=torch.Generator().manual_seed(seed))  # (T,) int64


# --------------------------------------------------------------------------- the definition


POSITIONS = {
    "from 0": lambda B, T: torch.arange(T),
    "offset (a cache)": lambda B, T: torch.arange(37, 37 + T),
    "per row (B, T)": lambda B, T: torch.tensor([[3, 0, 1, 2, 900, 5], [0, 0, 0, 1, 2, 3]])[:, :T],
    "negative": lambda B, T: torch.arange(-T, 0),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("where", list(POSITIONS))
def test_matches_the_complex_definition_in_float64(layout, where):
    x = randn(2, 3, 6, 10)  # (B, H, T, d)
    positions = POSITIONS[where](2, 6)
    out = apply_rope(x, positions, layout=layout)
    torch.testing.assert_close(out, loop_rope(x, positions, layout=layout), **TOL64)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float32_and_other_bases_match_the_definition(layout):
    x, positions = randn(2, 2, 5, 8, dtype=torch.float32), torch.tensor([[0, 1, 2, 3, 4], [7, 8, 9, 10, 11]])
    for base in (10000.0, 500_000, 2.5):
        out = apply_rope(x, positions, base=base, layout=layout)
        assert out.dtype == torch.float32
        expected = loop_rope(x, positions, base=base, layout=layout).float()
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_frequencies_and_angles():
    d = 12
    expected = torch.tensor([10000.0 ** (-2 * i / d) for i in range(d // 2)], dtype=torch.float64)
    torch.testing.assert_close(rope_frequencies(d, dtype=torch.float64), expected, **TOL64)
    assert rope_frequencies(d).dtype == torch.float32 and rope_frequencies(d)[0] == 1.0
    positions = torch.tensor([[0, 5], [2, 3]])  # (B, T)
    angles = rope_angles(positions, d, dtype=torch.float64)  # (B, T, d/2)
    assert angles.shape == (2, 2, d // 2)
    torch.testing.assert_close(angles[1, 0], 2 * expected, **TOL64)


# --------------------------------------------------------------------------- properties


@given(d=head_sizes, T=st.integers(1, 8), seed=seeds)
def test_layouts_are_one_rotation_up_to_the_permutation(d, T, seed):
    x, positions = randn(2, T, d, seed=seed), random_positions(T, 0, 4096, seed)
    perm = interleaved_to_half(d)
    assert perm.dtype == torch.long and sorted(perm.tolist()) == list(range(d))
    half = apply_rope(x[..., perm], positions, layout="half")
    interleaved = apply_rope(x, positions, layout="interleaved")
    torch.testing.assert_close(half, interleaved[..., perm], **TOL64)
    torch.testing.assert_close(half[..., perm.argsort()], interleaved, **TOL64)


@pytest.mark.parametrize("layout", LAYOUTS)
@given(d=head_sizes, m=st.integers(0, 4096), n=st.integers(0, 4096), s=st.integers(-4096, 4096), seed=seeds)
def test_scores_depend_only_on_the_offset(layout, d, m, n, s, seed):
    q, k = randn(2, d, seed=seed).unbind(0)  # (d,) each

    def rotated(v, pos):  # R(pos) v, shape (d,)
        return apply_rope(v[None], torch.tensor([pos]), layout=layout)[0]

    score = torch.dot(rotated(q, m), rotated(k, n))
    tol = dict(rtol=1e-9, atol=1e-9 * float(q.norm() * k.norm()))
    torch.testing.assert_close(torch.dot(rotated(q, m + s), rotated(k, n + s)), score, **tol)
    torch.testing.assert_close(torch.dot(q, rotated(k, n - m)), score, **tol)


@pytest.mark.parametrize("layout", LAYOUTS)
@given(d=head_sizes, T=st.integers(1, 8), seed=seeds)
def test_norms_are_kept_and_position_zero_is_the_identity(layout, d, T, seed):
    x = randn(3, T, d, seed=seed)
    positions = random_positions(T, -5000, 5000, seed)
    torch.testing.assert_close(apply_rope(x, positions, layout=layout).norm(dim=-1), x.norm(dim=-1), **TOL64)
    assert torch.equal(apply_rope(x, torch.zeros(T, dtype=torch.long), layout=layout), x)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_is_the_inverse_rotation(layout):
    x, g = randn(2, 3, 5, 8, seed=1).requires_grad_(), randn(2, 3, 5, 8, seed=2)
    positions = torch.tensor([[4, 0, 9, 2, 7], [1, 1, 30, 5, 6]])
    (apply_rope(x, positions, layout=layout) * g).sum().backward()
    torch.testing.assert_close(x.grad, apply_rope(g, -positions, layout=layout), **TOL64)  # R(m)^T = R(-m)


# --------------------------------------------------------------------------- KV caches and left padding


@pytest.mark.parametrize("layout", LAYOUTS)
def test_cached_positions_continue_the_full_sequence(layout):
    x = randn(2, 3, 9, 8, dtype=torch.float32)  # (B, H, T, d)
    full = apply_rope(x, torch.arange(9), layout=layout)
    for cached in (0, 1, 4, 8):  # the new positions start at the cache length
        tail = apply_rope(x[..., cached:, :], torch.arange(cached, 9), layout=layout)
        torch.testing.assert_close(tail, full[..., cached:, :], rtol=1e-6, atol=1e-6)
    steps = [apply_rope(x[..., t : t + 1, :], torch.tensor([t]), layout=layout) for t in range(9)]  # one at a time
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_left_padded_rows_rotate_as_if_unpadded(layout):
    lengths, T = [5, 3, 1], 5
    x = randn(3, 2, T + 1, 8)  # (B, H, T + 1, d): a left-padded prompt, then one new token
    keep = torch.tensor([[t >= T - n for t in range(T)] for n in lengths])  # (B, T), False = padding
    positions = (keep.cumsum(dim=1) - 1).clamp(min=0)  # (B, T): how model.py counts real tokens
    prompt = apply_rope(x[..., :T, :], positions, layout=layout)
    new = apply_rope(x[..., T:, :], torch.tensor(lengths)[:, None], layout=layout)  # (B, 1): each row's next one
    for b, n in enumerate(lengths):
        alone = apply_rope(x[b : b + 1, :, T - n :, :], torch.arange(n + 1), layout=layout)  # (1, H, n + 1, d)
        torch.testing.assert_close(prompt[b : b + 1, :, T - n :], alone[..., :n, :], **TOL64)
        torch.testing.assert_close(new[b : b + 1], alone[..., n:, :], **TOL64)


# --------------------------------------------------------------------------- 16-bit input


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_half_precision_uses_float32_angles(dtype, layout):
    x = randn(2, 2, 6, 16, dtype=torch.float32).to(dtype)
    positions = torch.tensor([0, 1, 100, 1000, 2047, 4000])  # large positions: a 16-bit angle is off by radians
    out = apply_rope(x, positions, layout=layout)
    assert out.dtype == dtype
    reference = apply_rope(x.float(), positions, layout=layout)  # the same inputs, computed in float32
    torch.testing.assert_close(out.float(), reference, rtol=2**-7, atol=1e-5)  # only the final rounding differs


# --------------------------------------------------------------------------- bad input


class _NoRotation(TorchFunctionMode):
    """Fails on the arithmetic of RoPE (powers, trigonometry, products): errors must come before it."""

    FORBIDDEN = {
        torch.arange, torch.pow, torch.cos, torch.sin, torch.mul, torch.Tensor.__pow__, torch.Tensor.__rpow__,
        torch.Tensor.cos, torch.Tensor.sin, torch.Tensor.__mul__, torch.Tensor.__rmul__, torch.Tensor.to,
    }  # fmt: skip

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.FORBIDDEN:
            raise AssertionError(f"{getattr(func, '__name__', func)} ran before the input was validated")
        return func(*args, **(kwargs or {}))


X = torch.zeros(2, 3, 4, 8)  # (B, H, T, d)
T4, T5 = torch.arange(4), torch.arange(5)
BAD = [
    (lambda: apply_rope(torch.zeros(2, 4, 7), T4), ValueError, "d even and > 0, got shape (2, 4, 7)"),
    (lambda: apply_rope(X, T4.float()), TypeError, "integer"),
    (lambda: apply_rope(X, T4 > 1), TypeError, "integer"),
    (lambda: apply_rope(X, None), TypeError, "positions"),
    (lambda: apply_rope(X, T5), ValueError, "(5,)"),
    (lambda: apply_rope(X, torch.zeros(3, 4, dtype=torch.long)), ValueError, "(3, 4)"),
    (lambda: apply_rope(X, torch.zeros(2, 3, 4, dtype=torch.long)), ValueError, "expected (4,) or (2, 4)"),
    (lambda: apply_rope(torch.zeros(4, 8), torch.zeros(1, 4, dtype=torch.long)), ValueError, "expected (4,) for"),
    (lambda: apply_rope(X, T4, layout="rotate_half"), ValueError, "layout"),
    (lambda: apply_rope(X, T4, base=0.0), ValueError, "> 0"),
    (lambda: apply_rope(X, T4, base=float("nan")), ValueError, "finite"),
    (lambda: apply_rope(X, T4, base="10000"), TypeError, "base"),
    (lambda: apply_rope(X.tolist(), T4), TypeError, "tensor"),
    (lambda: apply_rope(X.long(), T4), TypeError, "floating"),
    (lambda: apply_rope(torch.zeros(8), T4), ValueError, "(..., T, d)"),
    (lambda: rope_frequencies(7), ValueError, "even"),
    (lambda: rope_frequencies(8.0), TypeError, "int"),
    (lambda: rope_frequencies(8, base=-1), ValueError, "> 0"),
    (lambda: rope_angles(torch.ones(3), 8), TypeError, "integer"),
    (lambda: interleaved_to_half(0), ValueError, "even"),
]


@pytest.mark.parametrize("call, error, fragment", BAD, ids=[f"{e.__name__}-{f}" for _, e, f in BAD])
def test_bad_input_is_rejected_before_any_arithmetic(call, error, fragment):
    with _NoRotation(), pytest.raises(error) as info:
        call()
    assert fragment in str(info.value), str(info.value)


def test_lists_of_positions_are_accepted():
    torch.testing.assert_close(apply_rope(X + 1, [0, 1, 2, 3]), apply_rope(X + 1, T4))


# ---- rotate_range: the cached path the attention layer takes for positions start .. start + T - 1 -----------------
@given(
    start=st.integers(0, 5000),
    T=st.integers(1, 6),
    half=st.integers(1, 8),
    layout=st.sampled_from(["half", "interleaved"]),
)
def test_rotate_range_is_apply_rope_on_the_range_bit_for_bit(start, T, half, layout):
    for dtype in (torch.float32, torch.float64, torch.bfloat16):
        x = torch.randn(2, 3, T, 2 * half).to(dtype)
        expected = apply_rope(x, torch.arange(start, start + T), 500.0, layout)
        assert torch.equal(rotate_range(x, start, 500.0, layout), expected)
        assert torch.equal(rotate_range(x, start, 500.0, layout), expected)  # again, from the cache


def test_rotate_range_made_under_inference_mode_still_trains():
    """The cache keys on inference mode: cos/sin made under it would otherwise break a later backward pass."""
    x = torch.randn(1, 2, 3, 4)
    with torch.inference_mode():
        rotate_range(x, 7, 100.0)
    leaf = x.clone().requires_grad_(True)
    rotate_range(leaf, 7, 100.0).sum().backward()
    expected = torch.autograd.functional.vjp(
        lambda t: apply_rope(t, torch.arange(7, 10), 100.0), x, torch.ones_like(x)
    )[1]
    torch.testing.assert_close(leaf.grad, expected)
