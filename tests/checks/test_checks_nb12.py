"""The exercise checks of notebook 12 (rotary positions) pass right answers and name typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

import mha_tutorial as mt
from mha_tutorial import checks
from mha_tutorial.core import kv_cache, rope

from testkit import fails_with

# Exercise 1: RoPE by hand in the half layout.


def rope_loop(x, positions, base=10000.0):
    """Pair by pair with math.cos / math.sin: pair i is (x[..., i], x[..., i + d/2])."""
    d, out = x.shape[-1], x.clone()
    for t, m in enumerate(positions.tolist()):
        for i in range(d // 2):
            angle = m * base ** (-2 * i / d)
            a, b = x[..., t, i], x[..., t, i + d // 2]
            out[..., t, i] = a * math.cos(angle) - b * math.sin(angle)
            out[..., t, i + d // 2] = a * math.sin(angle) + b * math.cos(angle)
    return out


def rope_vectorised(x, positions, base=10000.0, *, pairs="half", sign=1, exponent=2, angle_dtype=torch.float64):
    """The whole tensor at once; the keywords switch on the slips the check names (the defaults are right)."""
    d = x.shape[-1]
    theta = base ** (-exponent * torch.arange(d // 2, dtype=angle_dtype) / d)  # (d/2,)
    angles = sign * positions.to(angle_dtype)[:, None] * theta  # (T, d/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    if pairs == "half":
        a, b = x[..., : d // 2], x[..., d // 2 :]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], dim=-1).flatten(-2)


@pytest.mark.parametrize("fn", [rope_loop, rope_vectorised], ids=["loop", "vectorised"])
def test_rope_half_right_answers_pass(fn, capsys):
    checks.check_rope_half(fn)
    assert "✓ check_rope_half: passed on 4 cases" in capsys.readouterr().out


def repeat_interleave_spread(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    angles = (positions.double()[:, None] * theta).repeat_interleave(2, dim=-1)  # (T, d): wrong for half pairs
    a, b = x.chunk(2, dim=-1)
    return x * angles.cos().to(x.dtype) + torch.cat([-b, a], dim=-1) * angles.sin().to(x.dtype)


def float32_frequencies(x, positions, base=10000.0):
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2) / d)  # float32: torch.arange gives int64, / d gives float32
    angles = positions.to(x.dtype)[:, None] * theta  # float64 angles, from float32 frequencies
    a, b = x.chunk(2, dim=-1)
    return torch.cat([a * angles.cos() - b * angles.sin(), a * angles.sin() + b * angles.cos()], dim=-1)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda x, p, base: rope_vectorised(x, p, base, pairs="interleaved"), "interleaved layout"),
        (lambda x, p, base: rope_vectorised(x, p, base, sign=-1), "turned the wrong way"),
        (lambda x, p, base: rope_vectorised(x, p, base, exponent=1), "frequencies are base^(-i/d)"),
        (lambda x, p, base: rope_vectorised(x, torch.arange(x.shape[-2]), base), "positions are ignored"),
        (repeat_interleave_spread, "must share one angle"),
        (lambda x, p, base: rope_vectorised(x, p, base, angle_dtype=torch.float32), "right only to about 1e-7"),
        (float32_frequencies, "computed in float32"),
        (lambda x, p, base: rope_vectorised(x, p, base).float(), "expected torch.float64"),
        (lambda x, p, base: rope_vectorised(x, p, base)[..., : x.shape[-1] // 2], "wrong shape"),
        (lambda x, p, base: rope_vectorised(x, p, base) * 1.001, "wrong values"),
    ],
    ids=[
        "interleaved",
        "sign",
        "exponent",
        "positions",
        "spread",
        "float32-angles",
        "float32-theta",
        "dtype",
        "shape",
        "other",
    ],  # fmt: skip
)
def test_rope_half_mistakes_are_named(fn, fragment):
    fails_with(checks.check_rope_half, fn, fragment)


def test_rope_half_in_place_is_named():
    def in_place(x, positions, base=10000.0):
        return x.copy_(rope_vectorised(x, positions, base))

    fails_with(checks.check_rope_half, in_place, "changed x in place")


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda x, p, base: mt.apply_rope(x, p, base), "apply_rope"),
        (lambda x, p, base: rope_vectorised(x, p, base) + 0 * rope._rotate(x, "half"), "_rotate"),
        (lambda x, p, base: rope_vectorised(x, p, base) + 0 * rope._per_feature(x, "half")[..., : x.shape[-1]],
         "_per_feature"),
    ],
    ids=["apply_rope", "_rotate", "_per_feature"],
)  # fmt: skip
def test_rope_half_refuses_the_package(fn, fragment):
    fails_with(checks.check_rope_half, fn, fragment, "write that step yourself")


# Exercise 2: the cached rotary attention step.


def _heads(t, H, d):
    return t.unflatten(-1, (H, d)).transpose(1, 2)  # (B, T, H * d) -> (B, H, T, d)


def step_vectorised(mha, x_new, k_cache, v_cache, **slips):
    """The right step without ``slips``; q_at, k_at, v_at ((P, T) -> positions), k_at="none", rotate_cache,
    mask ("top-left", "none", "is_causal") switch on the mistakes the check names."""
    H, d, base = mha.num_heads, mha.head_size, mha.rope_base
    P, T = k_cache.shape[2], x_new.shape[1]
    right = lambda P, T: torch.arange(P, P + T)
    q, k, v = (_heads(W(x_new), H, d) for W in (mha.W_q, mha.W_k, mha.W_v))  # (B, H, T, d) each
    q = mt.apply_rope(q, slips.get("q_at", right)(P, T), base)
    if slips.get("rotate_cache"):  # the notebook's buggy line
        k_all = mt.apply_rope(torch.cat([k_cache, k], dim=2), torch.arange(P + T), base)
    elif slips.get("k_at") == "none":
        k_all = torch.cat([k_cache, k], dim=2)
    else:
        k_all = torch.cat([k_cache, mt.apply_rope(k, slips.get("k_at", right)(P, T), base)], dim=2)
    v_all = torch.cat([v_cache, mt.apply_rope(v, slips["v_at"](P, T), base) if "v_at" in slips else v], dim=2)
    mask = slips.get("mask")
    if mask == "is_causal":
        out = F.scaled_dot_product_attention(q, k_all, v_all, is_causal=True)
    else:
        keep = torch.ones(T, P + T, dtype=torch.bool).tril(diagonal=0 if mask == "top-left" else P)
        out = F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=None if mask == "none" else keep)
    return mha.W_o(out.transpose(1, 2).flatten(2)), k_all, v_all


def step_loop(mha, x_new, k_cache, v_cache):
    """Token by token and head by head, with an explicit softmax over the keys each query may see."""
    H, d, base = mha.num_heads, mha.head_size, mha.rope_base
    P, T = k_cache.shape[2], x_new.shape[1]
    q, k, v = (_heads(W(x_new), H, d) for W in (mha.W_q, mha.W_k, mha.W_v))
    k_all = torch.cat([k_cache, mt.apply_rope(k, torch.arange(P, P + T), base)], dim=2)
    v_all = torch.cat([v_cache, v], dim=2)
    heads = torch.zeros_like(q)  # (B, H, T, d)
    for i in range(T):
        qi = mt.apply_rope(q[:, :, i : i + 1], torch.tensor([P + i]), base)  # (B, H, 1, d)
        for h in range(H):
            scores = (qi[:, h] @ k_all[:, h, : P + i + 1].transpose(-2, -1)).squeeze(1) / math.sqrt(d)  # (B, P+i+1)
            weights = scores.exp() / scores.exp().sum(-1, keepdim=True)
            heads[:, h, i] = (weights[:, :, None] * v_all[:, h, : P + i + 1]).sum(1)  # (B, d)
    return mha.W_o(heads.transpose(1, 2).flatten(2)), k_all, v_all


def the_notebook_buggy_step(mha, x_new, k_cache, v_cache):
    return step_vectorised(mha, x_new, k_cache, v_cache, q_at=lambda P, T: torch.arange(T), rotate_cache=True)


@pytest.mark.parametrize("fn", [step_loop, step_vectorised], ids=["loop", "vectorised"])
def test_rotary_step_right_answers_pass(fn, capsys):
    checks.check_rotary_step(fn)
    assert "✓ check_rotary_step: passed on 2 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(q_at=lambda P, T: torch.arange(T)), "new queries are rotated at 0..T-1"),
        (dict(rotate_cache=True), "cached keys are rotated again"),
        (dict(k_at="none"), "new keys are appended unrotated"),
        (dict(k_at=lambda P, T: torch.arange(T)), "new keys are rotated at 0..T-1"),
        (dict(v_at=lambda P, T: torch.arange(P, P + T)), "values are rotated too"),
        (dict(mask="top-left"), "aligned top-left"),
        (dict(mask="is_causal"), "aligned top-left"),
        (dict(mask="none"), "no causal mask"),
    ],
    ids=["queries-restart", "rerotate", "unrotated-keys", "keys-restart", "values", "tril", "is_causal", "no-mask"],
)
def test_rotary_step_mistakes_are_named(kwargs, fragment):
    fails_with(checks.check_rotary_step, lambda *a: step_vectorised(*a, **kwargs), fragment)


def test_the_notebook_buggy_step_is_told_both_bugs_remain_without_naming_them():
    message = fails_with(checks.check_rotary_step, the_notebook_buggy_step, "both bugs", "still there", "hint")
    for answer in ("0..T-1", "rotated again", "P..P+T-1"):  # neither bug is given away
        assert answer not in message, message


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(rotate_cache=True), "cached keys are rotated again"),  # the queries fixed: the keys' bug is named
        (dict(q_at=lambda P, T: torch.arange(T)), "new queries are rotated at 0..T-1"),  # the keys fixed
    ],
    ids=["queries-fixed", "keys-fixed"],
)
def test_with_one_bug_fixed_the_other_is_named(kwargs, fragment):
    message = fails_with(checks.check_rotary_step, lambda *a: step_vectorised(*a, **kwargs), fragment)
    assert "both bugs" not in message, message


def test_queries_at_0_pass_the_first_chunk_and_the_message_points_at_positions():
    def queries_restart(mha, x_new, k_cache, v_cache):
        return step_vectorised(mha, x_new, k_cache, v_cache, q_at=lambda P, T: torch.arange(T))

    first = torch.randn(2, 4, 32, dtype=torch.float64)
    empty = torch.zeros(2, 4, 0, 8, dtype=torch.float64)
    mha = mt.MultiHeadAttention(32, 4, rope_base=10000.0).double()
    with torch.no_grad():  # alone, the first chunk (P = 0) is right
        torch.testing.assert_close(
            queries_restart(mha, first, empty, empty)[0], mha(first, first, first, is_causal=True)
        )
    fails_with(checks.check_rotary_step, queries_restart, "P..P+T-1", "right only for the first chunk")


def test_an_unnamed_slip_after_the_first_chunk_points_at_positions():
    def doubled(mha, x_new, k_cache, v_cache):  # right at P = 0, wrong later: no named mistake does that
        return step_vectorised(mha, x_new, k_cache, v_cache, q_at=lambda P, T: torch.arange(2 * P, 2 * P + T))

    fails_with(checks.check_rotary_step, doubled, "the first chunk (empty cache, P = 0) is right", "P = 4, T = 1",
               "positions")  # fmt: skip


def test_rotary_step_cache_slips_are_named():
    def new_keys_only(mha, x_new, k_cache, v_cache):
        out, k_all, v_all = step_vectorised(mha, x_new, k_cache, v_cache)
        return out, k_all[:, :, k_cache.shape[2] :], v_all[:, :, k_cache.shape[2] :]

    fails_with(checks.check_rotary_step, new_keys_only, "the returned k_cache has shape", "P + T")

    def stores_unrotated(mha, x_new, k_cache, v_cache):  # right outputs, rotating the whole cache at each step
        H, d, base = mha.num_heads, mha.head_size, mha.rope_base
        P = k_cache.shape[2]
        k_raw = torch.cat([k_cache, _heads(mha.W_k(x_new), H, d)], dim=2)
        out, _, v_all = step_vectorised(mha, x_new, mt.apply_rope(k_cache, torch.arange(P), base), v_cache)
        return out, k_raw, v_all

    fails_with(checks.check_rotary_step, stores_unrotated, "k_cache holds the keys unrotated")


def test_rotary_step_refuses_the_package_layer():
    def via_layer(mha, x_new, k_cache, v_cache):
        cache = kv_cache.LayerCache()
        if k_cache.shape[2]:
            cache.keys, cache.values = k_cache, v_cache
        return mha(x_new, x_new, x_new, is_causal=True, kv_cache=cache), cache.keys, cache.values

    fails_with(checks.check_rotary_step, via_layer, "MultiHeadAttention forward", "write that step yourself")


def test_unattempted_exercises_are_reported_or_fail_in_strict_mode(monkeypatch, capsys):
    def stub(*args):
        raise NotImplementedError("Exercise 1: not written yet")

    checks.check_rope_half(stub)
    checks.check_rotary_step(stub)
    checks.check_half_layout_weights(stub)
    assert capsys.readouterr().out.count("not attempted yet") == 3
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "1")
    fails_with(checks.check_rope_half, stub, "not attempted")
    fails_with(checks.check_rotary_step, stub, "not attempted")
    fails_with(checks.check_half_layout_weights, stub, "not attempted")


# ---------------------------------------------------------------- Exercise 3: interleaved weights, half layer
def per_head_rows(H, d):
    return torch.cat([h * d + mt.interleaved_to_half(d) for h in range(H)])  # (H*d,)


def layout_vectorised(weight, bias, num_heads):
    rows = per_head_rows(num_heads, weight.shape[0] // num_heads)
    return weight[rows], bias[rows]


def layout_loop(weight, bias, num_heads):
    d = weight.shape[0] // num_heads
    P = mt.interleaved_to_half(d)
    weight, bias = weight.clone(), bias.clone()
    for h in range(num_heads):
        block = slice(h * d, (h + 1) * d)
        weight[block], bias[block] = weight[block][P], bias[block][P]
    return weight, bias


@pytest.mark.parametrize("fn", [layout_loop, layout_vectorised], ids=["loop", "vectorised"])
def test_half_layout_right_answers_pass(fn, capsys):
    checks.check_half_layout_weights(fn)
    assert "passed on 2 cases" in capsys.readouterr().out


def across_heads(weight, bias, num_heads):
    P = mt.interleaved_to_half(weight.shape[0])
    return weight[P], bias[P]


def inverse(weight, bias, num_heads):
    rows = per_head_rows(num_heads, weight.shape[0] // num_heads).argsort()
    return weight[rows], bias[rows]


def bias_kept(weight, bias, num_heads):
    return layout_vectorised(weight, bias, num_heads)[0], bias


def columns(weight, bias, num_heads):
    return weight[:, per_head_rows(num_heads, weight.shape[0] // num_heads)], bias


def in_place(weight, bias, num_heads):
    new = layout_vectorised(weight, bias, num_heads)
    weight.copy_(new[0])
    return new


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda w, b, h: (w, b), "came back unchanged"),
        (across_heads, "mixing the heads"),
        (inverse, "inverse permutation"),
        (bias_kept, "the bias kept its old order"),
        (columns, "permuted the columns"),
        (in_place, "in place"),
        (lambda w, b, h: layout_vectorised(w, b, h)[0], "return two tensors"),
        (lambda w, b, h: (w[:-1], b), "weight"),
    ],
    ids=["unchanged", "across heads", "inverse", "bias kept", "columns", "in place", "one tensor", "shape"],
)
def test_half_layout_mistakes_are_named(fn, fragment):
    fails_with(checks.check_half_layout_weights, fn, fragment)
