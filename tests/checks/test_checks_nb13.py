"""The exercise checks of notebook 13 (grouped-query attention) pass right answers and name typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import mha_tutorial as mt
from mha_tutorial import checks
from mha_tutorial.checks import nb13
from mha_tutorial.modern import gqa

from testkit import fails_with

# Exercise 1: pool the K/V heads.


def pool_loop(weight, bias, num_heads, num_kv_heads):
    """Group by group, head by head: a running sum of each group's blocks, divided by G."""
    G, d = num_heads // num_kv_heads, weight.shape[0] // num_heads
    weights, biases = [], []
    for j in range(num_kv_heads):
        w, b = torch.zeros_like(weight[:d]), torch.zeros_like(bias[:d])
        for h in range(j * G, (j + 1) * G):
            w, b = w + weight[h * d : (h + 1) * d], b + bias[h * d : (h + 1) * d]
        weights.append(w / G)
        biases.append(b / G)
    return torch.cat(weights), torch.cat(biases)


def pool_vectorised(weight, bias, num_heads, num_kv_heads, *, order="groups", how="mean"):
    """``order`` and ``how`` switch on the slips the check names; the defaults are right."""
    G, d = num_heads // num_kv_heads, weight.shape[0] // num_heads

    def one(x):
        if order == "interleaved":  # group j = heads j, j + H_kv, ...: member g, group j at [g, j]
            groups = x.unflatten(0, (G, num_kv_heads, d)).transpose(0, 1)
        elif order == "neighbours":
            return x.unflatten(0, (num_kv_heads, d, G)).mean(2).flatten(0, 1)
        else:
            groups = x.unflatten(0, (num_kv_heads, G, d))  # (H_kv, G, d, ...)
        pooled = {"mean": groups.mean(1), "sum": groups.sum(1), "first": groups[:, 0]}[how]
        return pooled.flatten(0, 1)

    return one(weight), one(bias)


@pytest.mark.parametrize("fn", [pool_loop, pool_vectorised], ids=["loop", "vectorised"])
def test_pool_right_answers_pass(fn, capsys):
    checks.check_pool_kv_heads(fn)
    assert "✓ check_pool_kv_heads: passed on 4 cases" in capsys.readouterr().out


def all_heads(weight, bias, H, H_kv):
    return tuple(torch.cat([x.unflatten(0, (H, -1)).mean(0)] * H_kv) for x in (weight, bias))


def per_head_rows(weight, bias, H, H_kv):  # averages over d inside each head: (H, D_in)
    return tuple(x.unflatten(0, (H, -1)).mean(1) for x in (weight, bias))


def per_group_rows(weight, bias, H, H_kv):  # averages over the heads and over d: (H_kv, D_in)
    return tuple(x.unflatten(0, (H_kv, -1)).mean(1) for x in (weight, bias))


def expanded_back(weight, bias, H, H_kv):
    return tuple(x.unflatten(0, (H_kv, -1)).repeat_interleave(H // H_kv, 0).flatten(0, 1)
                 for x in pool_loop(weight, bias, H, H_kv))  # fmt: skip


def in_place(weight, bias, H, H_kv):
    new = pool_loop(weight, bias, H, H_kv)
    weight.mul_(2)
    return new


@pytest.mark.parametrize(
    "fn, fragments",
    [
        (lambda w, b, H, H_kv: pool_vectorised(w, b, H, H_kv, order="interleaved"), ["weight's groups are interleaved",
                                                                                    "h % H_kv"]),
        (lambda w, b, H, H_kv: pool_vectorised(w, b, H, H_kv, how="sum"), ["weight's heads are summed"]),
        (lambda w, b, H, H_kv: pool_vectorised(w, b, H, H_kv, how="first"), ["each group's first head"]),
        (all_heads, ["the mean of all H heads"]),
        (lambda w, b, H, H_kv: pool_vectorised(w, b, H, H_kv, order="neighbours"), ["G neighbouring rows"]),
        (per_head_rows, ["the d rows inside each head"]),
        (per_group_rows, ["over the d rows of each head as well as over the heads"]),
        (expanded_back, ["expanded the pooled heads back to H heads"]),
        (lambda w, b, H, H_kv: (w, b), ["the weight came back unpooled"]),
        (lambda w, b, H, H_kv: (pool_loop(w, b, H, H_kv)[0], b), ["(bias)", "the bias came back unpooled"]),
        (lambda w, b, H, H_kv: (pool_loop(w, b, H, H_kv)[0], pool_vectorised(w, b, H, H_kv, how="sum")[1]),
         ["(bias)", "the bias's heads are summed"]),
        (lambda w, b, H, H_kv: (pool_loop(w, b, H, H_kv)[0], b[: b.shape[0] * H_kv // H + 1]), ["the bias has shape"]),
        (in_place, ["changed its inputs in place"]),
        (lambda w, b, H, H_kv: pool_loop(w, b, H, H_kv)[0], ["return two tensors"]),
        (lambda w, b, H, H_kv: tuple(t.float() for t in pool_loop(w, b, H, H_kv)), ["torch.float32", "dtype"]),
        (lambda w, b, H, H_kv: (pool_loop(w, b, H, H_kv)[0][:, :-1], pool_loop(w, b, H, H_kv)[1]),
         ["the weight has shape", "the columns, D_in, stay"]),
        (lambda w, b, H, H_kv: tuple(t * 1.001 for t in pool_loop(w, b, H, H_kv)), ["wrong values"]),
    ],
    ids=["interleaved", "sum", "first", "all-heads", "neighbours", "per-head", "per-group", "expanded", "unpooled",
         "bias-unpooled", "bias-sum", "bias-shape", "in-place", "one-tensor", "dtype", "shape", "other"],
)  # fmt: skip
def test_pool_mistakes_are_named(fn, fragments):
    fails_with(checks.check_pool_kv_heads, fn, *fragments)


def via_mha_to_gqa(weight, bias, H, H_kv):
    D_in = weight.shape[1]
    layer = mt.MultiHeadAttention(weight.shape[0], H, bias=True, key_size=D_in).to(weight.dtype)
    with torch.no_grad():
        layer.W_k.weight.copy_(weight)
        layer.W_k.bias.copy_(bias)
    new = gqa.mha_to_gqa(layer, H_kv)
    return new.W_k.weight.detach().clone(), new.W_k.bias.detach().clone()


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (via_mha_to_gqa, "gqa.mha_to_gqa"),
        (lambda w, b, H, H_kv: tuple(gqa._grouped_rows(x, H_kv, w.shape[0] // H, "mean") for x in (w, b)),
         "gqa._grouped_rows"),
    ],
    ids=["mha_to_gqa", "_grouped_rows"],
)  # fmt: skip
def test_pool_refuses_the_package(fn, fragment):
    fails_with(checks.check_pool_kv_heads, fn, fragment, "write that step yourself")


def test_the_checks_pooling_reference_agrees_with_the_package():
    """The loop reference of the check (independent code) and gqa.mha_to_gqa give the same K/V rows."""
    torch.manual_seed(0)
    layer = mt.MultiHeadAttention(24, 6, bias=True).double()
    new = gqa.mha_to_gqa(layer, 2)
    for name in ("W_k", "W_v"):
        old, converted = getattr(layer, name), getattr(new, name)
        torch.testing.assert_close(converted.weight, nb13._pool(old.weight.detach(), 6, 2), rtol=0, atol=1e-15)
        torch.testing.assert_close(converted.bias, nb13._pool(old.bias.detach(), 6, 2), rtol=0, atol=1e-15)


# Exercise 2: the spread of each group around its mean.


def spread_loop(weight, num_heads, num_kv_heads):
    G, d = num_heads // num_kv_heads, weight.shape[0] // num_heads
    out = []
    for j in range(num_kv_heads):
        heads = [weight[h * d : (h + 1) * d] for h in range(j * G, (j + 1) * G)]
        mean = sum(heads) / G
        out.append(sum(((w - mean) ** 2).sum().sqrt() / (w**2).sum().sqrt() for w in heads) / G)
    return torch.stack(out)


def spread_vectorised(weight, num_heads, num_kv_heads, *, order="groups", scale="own", reduce="mean",
                      centre="group", power=1):  # fmt: skip
    """The keywords switch on the slips the check names; the defaults are right."""
    G, d = num_heads // num_kv_heads, weight.shape[0] // num_heads
    if order == "interleaved":
        heads = weight.unflatten(0, (G, num_kv_heads, d)).transpose(0, 1)  # (H_kv, G, d, D_in)
    else:
        heads = weight.unflatten(0, (num_kv_heads, G, d))
    means = heads.mean(1, keepdim=True)  # (H_kv, 1, d, D_in)
    centres = means if centre == "group" else heads.mean((0, 1), keepdim=True)
    size = {"own": torch.linalg.matrix_norm(heads), "mean": torch.linalg.matrix_norm(means), "none": 1.0}[scale]
    ratios = (torch.linalg.matrix_norm(heads - centres) / size) ** power  # (H_kv, G)
    return {"mean": ratios.mean(1), "max": ratios.amax(1), "head": ratios.flatten()}[reduce]


@pytest.mark.parametrize("fn", [spread_loop, spread_vectorised, lambda *a: spread_vectorised(*a).float()],
                         ids=["loop", "vectorised", "float32"])  # fmt: skip
def test_spread_right_answers_pass(fn, capsys):
    checks.check_group_spread(fn)
    assert "✓ check_group_spread: passed on 7 cases" in capsys.readouterr().out


@pytest.mark.parametrize(
    "kwargs, fragment",
    [
        (dict(order="interleaved"), "groups are interleaved"),
        (dict(scale="none"), "not normalised"),
        (dict(scale="mean"), "divided by ||M_j||_F"),
        (dict(reduce="max"), "the largest ratio"),
        (dict(centre="all"), "the mean of all H heads"),
        (dict(power=2), "ratios are squared"),
        (dict(reduce="head"), "one number per head"),
    ],
    ids=["interleaved", "unnormalised", "by-mean", "max", "all-heads", "squared", "per-head"],
)
def test_spread_mistakes_are_named(kwargs, fragment):
    fails_with(checks.check_group_spread, lambda *a: spread_vectorised(*a, **kwargs), fragment)


def in_place_spread(weight, H, H_kv):
    result = spread_loop(weight, H, H_kv)
    weight.zero_()
    return result


def row_norms(weight, H, H_kv):  # torch.linalg.norm(dim=-1): one norm per row of each head, (H_kv, d)
    heads = weight.unflatten(0, (H_kv, H // H_kv, -1))  # (H_kv, G, d, D_in)
    means = heads.mean(1, keepdim=True)
    return (torch.linalg.norm(heads - means, dim=-1) / torch.linalg.norm(heads, dim=-1)).mean(1)


@pytest.mark.parametrize(
    "fn, fragments",
    [
        (in_place_spread, ["changed the weight in place"]),
        (lambda *a: spread_vectorised(*a).tolist(), ["expected a tensor, got list"]),
        (lambda *a: (spread_vectorised(*a) * 100).long(), ["torch.int64", "float tensor"]),
        (lambda *a: spread_vectorised(*a)[None], ["has shape (1, 2), expected (2,): one number per group"]),
        (row_norms, ["has shape (2, 4)", "a norm per row"]),
        (lambda *a: spread_vectorised(*a) + 1e-3, ["wrong values"]),
    ],
    ids=["in-place", "list", "int", "shape", "row-norms", "other"],
)
def test_spread_other_slips_are_named(fn, fragments):
    fails_with(checks.check_group_spread, fn, *fragments)


def test_spread_refuses_the_packages_grouping():
    def via_grouped_rows(weight, H, H_kv):
        gqa._grouped_rows(weight, H_kv, weight.shape[0] // H, "mean")
        return spread_loop(weight, H, H_kv)

    fails_with(checks.check_group_spread, via_grouped_rows, "gqa._grouped_rows", "write that step yourself")


@given(
    st.sampled_from([(2, 1), (4, 2), (6, 3), (6, 2)]),
    st.integers(1, 3),
    st.floats(0.1, 10.0),
    st.integers(0, 2**16),
)
def test_the_checks_spread_reference_has_the_properties_of_a_spread(heads, d, scale, seed):
    """Independent of the loop's arithmetic: scale-free, blind to the order inside a group, and for G = 2 the closed
    form ||A - B|| / 2 * (1/||A|| + 1/||B||) / 2."""
    H, H_kv = heads
    weight = torch.randn(H * d, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    spread = nb13._spread(weight, H, H_kv)
    assert spread.shape == (H_kv,)
    assert bool((spread >= 0).all())
    torch.testing.assert_close(nb13._spread(scale * weight, H, H_kv), spread)
    G = H // H_kv
    swapped = torch.cat([weight[(j * G + (g + 1) % G) * d :][:d] for j in range(H_kv) for g in range(G)])
    torch.testing.assert_close(nb13._spread(swapped, H, H_kv), spread)
    if G == 2:
        for j in range(H_kv):
            A, B = weight[2 * j * d : (2 * j + 1) * d], weight[(2 * j + 1) * d : (2 * j + 2) * d]
            closed = torch.linalg.norm(A - B) / 2 * (1 / torch.linalg.norm(A) + 1 / torch.linalg.norm(B)) / 2
            assert math.isclose(float(spread[j]), float(closed), rel_tol=1e-12)


def test_the_spread_cases_with_known_answers_have_them():
    """The cases named by their answer: G = 1 and identical heads give 0, W and -W give 1, two orthogonal heads of
    equal norm give 1/sqrt(2)."""
    known = {"G = 1": 0.0, "identical": 0.0, "-head 0": 1.0, "orthogonal": 1 / math.sqrt(2)}
    cases = nb13._spread_cases(torch.Generator().manual_seed(0))
    found = 0
    for case, weight, H, H_kv in cases:
        for words, answer in known.items():
            if words in case:
                torch.testing.assert_close(
                    spread_loop(weight, H, H_kv), torch.full((H_kv,), answer, dtype=torch.float64)
                )
                found += 1
    assert found == len(known)


def test_unattempted_exercises_are_reported_or_fail_in_strict_mode(monkeypatch, capsys):
    def stub(*args):
        raise NotImplementedError("Exercise 1: not written yet")

    checks.check_pool_kv_heads(stub)
    checks.check_group_spread(stub)
    assert capsys.readouterr().out.count("not attempted yet") == 2
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "1")
    fails_with(checks.check_pool_kv_heads, stub, "not attempted")
    fails_with(checks.check_group_spread, stub, "not attempted")
