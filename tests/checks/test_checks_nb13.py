"""The exercise checks of notebook 13 (grouped-query attention) pass right answers and name typical wrong ones."""

from __future__ import annotations

import copy
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


def qk_rows(layer, h):
    """Head h's rows of W_q and of W_k, each with its bias as a last column, side by side: (d, 2 (D + 1))."""
    r = slice(h * layer.head_size, (h + 1) * layer.head_size)
    return torch.cat([torch.cat([lin.weight[r], lin.bias[r, None]], 1) for lin in (layer.W_q, layer.W_k)], 1)


def turn_heads(model, onto_first):
    """A copy whose odd heads' queries and keys are turned: onto their pair's first head (orthogonal Procrustes,
    written here from the SVD), or by a random orthogonal matrix. Scores stay the same either way."""
    new, g = copy.deepcopy(model), torch.Generator().manual_seed(5)
    with torch.no_grad():
        for _, layer in new.attention_layers():
            for h in range(1, layer.num_heads, 2):
                if onto_first:
                    U, _, Vh = torch.linalg.svd(qk_rows(layer, h - 1) @ qk_rows(layer, h).T)
                    R = U @ Vh
                else:
                    R = torch.linalg.qr(torch.randn(layer.head_size, layer.head_size, generator=g)).Q
                r = slice(h * layer.head_size, (h + 1) * layer.head_size)
                for lin in (layer.W_q, layer.W_k):
                    lin.weight[r], lin.bias[r] = R @ lin.weight[r], R @ lin.bias[r]
    return new


@pytest.fixture(scope="module")
def induction_models():
    model = mt.load_pretrained("induction").eval()
    return model, turn_heads(model, onto_first=True)


def test_the_measurement_prints_the_induction_models_spreads(induction_models, capsys):
    """With the models the check measures with the learner's function: its numbers are the loop's, per layer."""
    trained, aligned = induction_models
    checks.check_group_spread(spread_vectorised, trained, aligned)
    out = capsys.readouterr().out
    assert "✓ check_group_spread: passed on 7 cases" in out
    for (name, before), (_, after) in zip(trained.attention_layers(), aligned.attention_layers(), strict=True):
        two = [[f"{x:.2f}" for x in spread_loop(layer.W_k.weight.detach().double(), 4, 2).tolist()]
               for layer in (before, after)]  # fmt: skip
        assert f"{name}: as trained [{', '.join(two[0])}], aligned [{', '.join(two[1])}]" in out, out
    assert "1/sqrt(2) = 0.707" in out and "lower in every group: True" in out, out
    forms = [qk_rows(m.attention_layers()[0][1], 1).detach().tensor_split(2, dim=1) for m in induction_models]
    torch.testing.assert_close(*(q.T @ k for q, k in forms), atol=1e-5, rtol=1e-4)  # the helper's turn keeps scores


def test_the_measurement_of_the_trained_model_alone(induction_models, capsys):
    """Without aligned heads (the lesson's main line), the check measures and prints the trained model only."""
    trained = induction_models[0]
    checks.check_group_spread(spread_vectorised, trained)
    out = capsys.readouterr().out
    for name, layer in trained.attention_layers():
        two = ", ".join(f"{x:.2f}" for x in spread_loop(layer.W_k.weight.detach().double(), 4, 2).tolist())
        assert f"{name}: as trained [{two}]\n" in out, out
    assert "identical heads give 0" in out and "1/sqrt(2) = 0.707" in out and "aligned" not in out, out


@pytest.mark.parametrize("onto_first", [None, False], ids=["the-same-model", "random-turns"])
def test_the_measurement_refuses_a_second_model_not_aligned_in_pairs(induction_models, onto_first):
    trained = induction_models[0]
    second = trained if onto_first is None else turn_heads(trained, onto_first)
    fails_with(lambda fn: checks.check_group_spread(fn, trained, second), spread_loop, "dec.0.self", "head 1 is not "
               "turned onto head 0", 'aligned in pairs')  # fmt: skip


def test_the_measurement_compares_the_learners_numbers_with_the_loops(induction_models):
    """A function right on the small cases (D_in <= 8) but off on the model's D = 64 is caught, naming the layer."""

    def off_on_wide(weight, H, H_kv):
        return spread_loop(weight, H, H_kv) * (1.01 if weight.shape[1] > 8 else 1.0)

    fails_with(lambda fn: checks.check_group_spread(fn, *induction_models), off_on_wide,
               "dec.0.self's W_k as trained", "wrong values")  # fmt: skip


def test_unattempted_exercises_are_reported_or_fail_in_strict_mode(monkeypatch, capsys):
    def stub(*args):
        raise NotImplementedError("Exercise 1: not written yet")

    checks.check_pool_kv_heads(stub)
    checks.check_group_spread(stub)
    assert capsys.readouterr().out.count("not attempted yet") == 2
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "1")
    fails_with(checks.check_pool_kv_heads, stub, "not attempted")
    fails_with(checks.check_group_spread, stub, "not attempted")


# Exercise 3: grouped-query attention without copying the K/V heads.


def grouped_loop(q, k, v, dim=-1):
    """Query head by query head: head h reads K/V head h // G, with its own softmax (over ``dim``)."""
    G = q.shape[1] // k.shape[1]
    heads = []
    for h in range(q.shape[1]):
        w = torch.softmax(q[:, h] @ k[:, h // G].transpose(-1, -2) / math.sqrt(q.shape[-1]), dim=dim)  # (B, T, S)
        heads.append(w @ v[:, h // G])  # (B, T, d)
    return torch.stack(heads, 1)


def grouped_rows(q, k, v, *, order="groups", scale="sqrt", dim=-1, merge=True):
    """The queries of a group laid end to end: (B, H_kv, G*T, d) against (B, H_kv, S, d); no K/V copy."""
    B, H, T, d = q.shape
    H_kv = k.shape[1]
    if order == "tiled":  # query head h = g*H_kv + j in group j: the slip of `repeat`
        grouped = q.unflatten(1, (-1, H_kv)).transpose(1, 2)  # (B, H_kv, G, T, d)
    else:
        grouped = q.unflatten(1, (H_kv, -1))  # (B, H_kv, G, T, d)
    rows = grouped.flatten(2, 3)  # (B, H_kv, G*T, d)
    scores = rows @ k.transpose(-1, -2) / {"sqrt": math.sqrt(d), "none": 1.0}[scale]  # (B, H_kv, G*T, S)
    out = (scores.softmax(dim) @ v).unflatten(2, (-1, T))  # (B, H_kv, G, T, d)
    if order == "tiled":
        out = out.transpose(1, 2)
    elif order == "swapped":
        out = out.transpose(1, 2)  # (B, G, H_kv, T, d): merged back in the wrong order
    return out.flatten(1, 2) if merge else out


def grouped_einsum(q, k, v):
    """(B, H_kv, G, T, d) queries against (B, H_kv, S, d) keys through einsum, which folds G into the rows: no copy."""
    qg = q.unflatten(1, (k.shape[1], -1))  # (B, H_kv, G, T, d)
    w = (torch.einsum("bjgtd,bjsd->bjgts", qg, k) / math.sqrt(q.shape[-1])).softmax(-1)  # (B, H_kv, G, T, S)
    return torch.einsum("bjgts,bjsd->bjgtd", w, v).flatten(1, 2)


@pytest.mark.parametrize("fn", [grouped_loop, grouped_rows, grouped_einsum], ids=["loop", "rows", "einsum"])
def test_grouped_right_answers_pass(fn, capsys):
    checks.nb13.check_grouped_attention(fn)
    assert "✓ check_grouped_attention: passed on 5 cases" in capsys.readouterr().out


def tiled_by_repeat_free_indexing(q, k, v):  # the `repeat` mapping written head by head: h -> h % H_kv, no copy
    heads = []
    for h in range(q.shape[1]):
        k_h, v_h = k[:, h % k.shape[1]], v[:, h % k.shape[1]]  # (B, S, d)
        heads.append(torch.softmax(q[:, h] @ k_h.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v_h)
    return torch.stack(heads, 1)  # (B, H, T, d)


def in_place_grouped(q, k, v):
    q.mul_(1.0)
    k.add_(1.0)
    return grouped_loop(q, k - 1.0, v)


@pytest.mark.parametrize(
    "fn, fragments",
    [
        (lambda q, k, v: grouped_rows(q, k, v, order="tiled"), ["h % H_kv", "repeat", "(H_kv, G)"]),
        (tiled_by_repeat_free_indexing, ["h % H_kv"]),
        (lambda q, k, v: grouped_rows(q, k, v, order="swapped"), ["wrong order", "j*G + g"]),
        (lambda q, k, v: grouped_rows(q, k, v, scale="none"), ["not scaled", "sqrt(d)"]),
        (lambda q, k, v: grouped_rows(q / math.sqrt(q.shape[-1]), k, v), ["divided by d"]),
        (lambda q, k, v: grouped_loop(q, k, v, dim=-2), ["over the queries", "dim=-1"]),
        (lambda q, k, v: grouped_rows(q, k, v, merge=False), ["(H_kv, G) back into H"]),
        (lambda q, k, v: grouped_rows(q, k, v, merge=False).flatten(2, 3), ["unflatten G*T"]),
        (lambda q, k, v: grouped_loop(q, k, v).transpose(1, 2), ["heads on axis 1"]),
        (lambda q, k, v: grouped_loop(q, k, v).float(), ["torch.float32", "dtype"]),
        (in_place_grouped, ["in place"]),
        (lambda q, k, v: grouped_loop(q, k, v) * 1.001, ["wrong values"]),
        (lambda q, k, v: (grouped_loop(q, k, v),), ["expected a tensor"]),
    ],
    ids=["tiled", "tiled-index", "swapped", "unscaled", "over-d", "softmax-queries", "unmerged", "rows-unmerged",
         "transposed", "dtype", "in-place", "other", "tuple"],
)  # fmt: skip
def test_grouped_mistakes_are_named(fn, fragments):
    fails_with(checks.nb13.check_grouped_attention, fn, *fragments)


def via_torch_sdpa(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)


def via_package_sdpa(q, k, v):
    G = q.shape[1] // k.shape[1]
    k, v = (t[:, :, None].expand(-1, -1, G, -1, -1).flatten(1, 2) for t in (k, v))  # (B, H, S, d), a copy
    return mt.scaled_dot_product_attention(q, k, v)[0]


def via_repeat_interleave(q, k, v):
    G = q.shape[1] // k.shape[1]
    return grouped_loop(q, k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1))


def via_repeat(q, k, v):  # repeat, then reordered into the right grouping: still a copy
    B, H_kv, S, d = k.shape
    G = q.shape[1] // H_kv
    k, v = (t.repeat(1, 1, G, 1).view(B, H_kv * G, S, d) for t in (k, v))
    return grouped_loop(q, k, v)


def via_expand_reshape(q, k, v):  # expand is a view, but reshape materialises it: a G-fold copy
    B, H_kv, S, d = k.shape
    G = q.shape[1] // H_kv
    return grouped_loop(q, *(t[:, :, None].expand(B, H_kv, G, S, d).reshape(B, -1, S, d) for t in (k, v)))


def via_cat(q, k, v):
    G = q.shape[1] // k.shape[1]
    return grouped_loop(q, *(torch.cat([t[:, :, None]] * G, dim=2).flatten(1, 2) for t in (k, v)))


def via_stack(q, k, v):
    G = q.shape[1] // k.shape[1]
    return grouped_loop(q, *(torch.stack([t] * G, dim=2).flatten(1, 2) for t in (k, v)))


def via_transposed_copy(q, k, v):  # only k^T copied, (B, H, d, S): still a G-fold copy
    G = q.shape[1] // k.shape[1]
    kt = k.transpose(-1, -2)[:, :, None].expand(-1, -1, G, -1, -1).reshape(q.shape[0], q.shape[1], *kt_shape(k))
    w = (q @ kt / math.sqrt(q.shape[-1])).softmax(-1)  # (B, H, T, S)
    return (w.unflatten(1, (k.shape[1], G)) @ v.unsqueeze(2)).flatten(1, 2)


def kt_shape(k):
    return k.shape[-1], k.shape[-2]


def via_5d_copy(q, k, v):  # an explicit (B, H_kv, G, S, d) copy, never reshaped to H heads: still G-fold
    G = q.shape[1] // k.shape[1]
    ke, ve = (t[:, :, None].expand(-1, -1, G, -1, -1).contiguous() for t in (k, v))  # (B, H_kv, G, S, d)
    w = torch.einsum("bjgtd,bjgsd->bjgts", q.unflatten(1, (k.shape[1], G)), ke) / math.sqrt(q.shape[-1])
    return torch.einsum("bjgts,bjgsd->bjgtd", w.softmax(-1), ve).flatten(1, 2)


def via_5d_transposed_copy(q, k, v):  # k^T copied as (B, H_kv, G, d, S)
    G = q.shape[1] // k.shape[1]
    kt = k.transpose(-1, -2)[:, :, None].expand(-1, -1, G, -1, -1).clone()  # (B, H_kv, G, d, S)
    w = (torch.einsum("bjgtd,bjgds->bjgts", q.unflatten(1, (k.shape[1], G)), kt) / math.sqrt(q.shape[-1])).softmax(-1)
    return torch.einsum("bjgts,bjsd->bjgtd", w, v).flatten(1, 2)


def via_broadcast_matmul(q, k, v):  # `@` broadcasting a size-1 axis of k: matmul materialises the G-fold copy
    qg = q.unflatten(1, (k.shape[1], -1))  # (B, H_kv, G, T, d)
    w = (qg @ k.unsqueeze(2).transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)  # (B, H_kv, G, T, S)
    return (w @ v.unsqueeze(2)).flatten(1, 2)


def via_expanded_matmul(q, k, v):  # an expand is a view, but `@` against it materialises it
    B, H_kv, S, d = k.shape
    G = q.shape[1] // H_kv
    ke, ve = (t[:, :, None].expand(B, H_kv, G, S, d) for t in (k, v))  # (B, H_kv, G, S, d): views
    w = (q.unflatten(1, (H_kv, G)) @ ke.transpose(-1, -2) / math.sqrt(d)).softmax(-1)  # (B, H_kv, G, T, S)
    return (w @ ve).flatten(1, 2)


def via_flat_copy(q, k, v):  # the copy made as one flat vector of G times K's numbers (rank 1)
    G = q.shape[1] // k.shape[1]
    k[:, :, None].expand(-1, -1, G, -1, -1).flatten()  # (B * H * S * d,): a G-fold copy, even if unused
    return grouped_loop(q, k, v)


@pytest.mark.parametrize(
    "fn",
    [via_expand_reshape, via_cat, via_stack, via_transposed_copy, via_5d_copy, via_5d_transposed_copy,
     via_broadcast_matmul, via_expanded_matmul, via_flat_copy],
    ids=["expand-reshape", "cat", "stack", "transposed", "5d", "5d-transposed", "broadcast-matmul", "expanded-matmul",
         "flat"],
)  # fmt: skip
def test_grouped_refuses_materialised_copies(fn):
    fails_with(checks.nb13.check_grouped_attention, fn, "G-fold copy")


def grouped_rows_noncontiguous(q, k, v):  # reshaping a non-contiguous q copies q, not K/V: allowed
    return grouped_rows(q.transpose(2, 3).contiguous().transpose(2, 3), k, v)


def grouped_expand_unused(q, k, v):  # expanding k is a view (no copy) and fine as long as nothing materialises it
    k[:, :, None].expand(-1, -1, q.shape[1] // k.shape[1], -1, -1)
    return grouped_rows(q, k, v)


@pytest.mark.parametrize("fn", [grouped_rows_noncontiguous, grouped_expand_unused], ids=["noncontiguous-q", "expand"])
def test_grouped_views_pass(fn, capsys):
    checks.nb13.check_grouped_attention(fn)
    assert "✓ check_grouped_attention: passed on 5 cases" in capsys.readouterr().out


def via_layer_repeat(q, k, v):
    layer = mt.MultiHeadAttention(q.shape[1] * q.shape[-1], q.shape[1], num_kv_heads=k.shape[1])
    return grouped_loop(q, layer._repeat_kv_heads(k), layer._repeat_kv_heads(v))


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (via_torch_sdpa, "PyTorch's scaled_dot_product_attention"),
        (via_package_sdpa, "the package's scaled_dot_product_attention"),
        (via_repeat_interleave, "repeat_interleave, which copies"),
        (via_repeat, "repeat, which copies"),
        (via_layer_repeat, "_repeat_kv_heads"),
    ],
    ids=["torch-sdpa", "package-sdpa", "repeat_interleave", "repeat", "layer"],
)
def test_grouped_refuses_copies_and_the_package(fn, fragment):
    fails_with(checks.nb13.check_grouped_attention, fn, fragment, "write that step yourself")


@given(
    batch=st.integers(1, 2),
    kv_heads=st.integers(1, 3),
    group=st.integers(1, 3),
    queries=st.integers(1, 3),
    keys=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_the_checks_grouped_reference_agrees_with_pytorch_and_the_package(batch, kv_heads, group, queries, keys, seed):
    """The check's loop reference, PyTorch's SDPA(enable_gqa=True) and the package's layer agree in float64."""
    g = torch.Generator().manual_seed(seed)
    H, d = kv_heads * group, 4
    q = torch.randn(batch, H, queries, d, generator=g, dtype=torch.float64)
    k, v = (torch.randn(batch, kv_heads, keys, d, generator=g, dtype=torch.float64) for _ in range(2))
    ours = nb13._grouped(q, k, v)
    torch.testing.assert_close(ours, via_torch_sdpa(q, k, v), atol=1e-12, rtol=1e-10)
    layer = mt.MultiHeadAttention(H * d, H, num_kv_heads=kv_heads).double()
    x = torch.randn(batch, queries, H * d, generator=g, dtype=torch.float64)
    mem = torch.randn(batch, keys, H * d, generator=g, dtype=torch.float64)
    with torch.no_grad():
        qp = layer.W_q(x).unflatten(-1, (H, d)).transpose(1, 2)
        kp, vp = (w(mem).unflatten(-1, (kv_heads, d)).transpose(1, 2) for w in (layer.W_k, layer.W_v))
        expected = layer(x, mem, mem)
        torch.testing.assert_close(layer.W_o(nb13._grouped(qp, kp, vp).transpose(1, 2).flatten(2)), expected)


def test_unattempted_grouped_attention_is_reported(monkeypatch, capsys):
    def stub(*args):
        raise NotImplementedError("Exercise 3: not written yet")

    checks.nb13.check_grouped_attention(stub)
    assert "not attempted yet" in capsys.readouterr().out
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "1")
    fails_with(checks.nb13.check_grouped_attention, stub, "not attempted")
