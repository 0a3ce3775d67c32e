"""The exercise checks of notebook 14 (SmolLM2's heads) pass right answers and name typical wrong ones."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn
from torch.nn import functional as F

import mha_tutorial as mt
from mha_tutorial import checks
from mha_tutorial.checks import nb14
from mha_tutorial.core import mha
from mha_tutorial.modern import gqa
from mha_tutorial.pretrained import smollm_study
from mha_tutorial.pretrained.llama import LlamaConfig, LlamaDecoder

from testkit import fails_with

# Exercise 1: induction scores on a sequence that repeats every `period` tokens.


def induction_loop(weights, period):
    L, H, T = weights.shape[0], weights.shape[1], weights.shape[-1]
    out = torch.zeros(L, H, dtype=weights.dtype)
    for layer in range(L):
        for h in range(H):
            for i in range(period, T):
                out[layer, h] += weights[layer, h, i, i - period + 1] / (T - period)
    return out


def induction_vectorised(weights, period):
    i = torch.arange(period, weights.shape[-1])
    return weights[..., i, i - period + 1].mean(-1)


def induction_diagonal(weights, period):
    """The offset diagonal of every map, then its second-copy part."""
    return weights.diagonal(offset=-(period - 1), dim1=-2, dim2=-1)[..., 1:].mean(-1)


@pytest.mark.parametrize("fn", [induction_loop, induction_vectorised, induction_diagonal], ids=["loops", "vec", "diag"])
def test_induction_right_answers_pass(fn, capsys):
    checks.check_induction_heads(fn)
    assert "✓ check_induction_heads: passed on 6 cases" in capsys.readouterr().out


def offset(key, first):
    """A slip: the weight on key i - key, averaged over queries first .. T-1 (a negative key wraps)."""

    def fn(w, period):
        i = torch.arange(first(period), w.shape[-1])
        return w[..., i, i - key(period)].mean(-1)

    return fn


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (offset(lambda p: p, lambda p: p), "duplicate-token head"),
        (offset(lambda p: p - 1, lambda p: p - 1), "first copy's last token"),
        (offset(lambda p: p - 1, lambda p: p + 1), "you skipped query period"),
        (offset(lambda p: p - 1, lambda p: 0), "queries before position period"),
        (offset(lambda p: 1, lambda p: p), "previous-token head"),
        (lambda w, p: w[..., torch.arange(p, w.shape[-1]) - p + 1, torch.arange(p, w.shape[-1])].mean(-1),
         "weights[..., key, query]"),
        (lambda w, p: w[..., torch.arange(p, w.shape[-1]), torch.arange(p, w.shape[-1]) - p + 1].sum(-1), "summed"),
        (lambda w, p: induction_vectorised(w, w.shape[-1] // 2), "period as T // 2"),
        (lambda w, p: induction_vectorised(w, p).mean(0), "one score per head"),
        (lambda w, p: induction_vectorised(w, p).double(), "keep the weights' dtype"),
        (lambda w, p: induction_vectorised(w.mul_(1.0).add_(1.0), p), "changed the weights in place"),
        (lambda w, p: induction_vectorised(w, p).tolist(), "expected a tensor"),
    ],
    ids=["duplicate", "from-p-1", "from-p+1", "all-queries", "previous", "transposed", "sum", "half-T", "over-layers",
         "dtype", "in-place", "list"],
)  # fmt: skip
def test_induction_mistakes_are_named(fn, fragment):
    fails_with(checks.check_induction_heads, fn, fragment)


def test_the_induction_references_know_their_answers():
    known = nb14.induction_cases(torch.Generator().manual_seed(0))[-1][1]  # (1, 3, 8, 8): induction, duplicate, prev
    torch.testing.assert_close(nb14.induction_loop(known, 4), torch.tensor([[1.0, 0.0, 0.0]], dtype=torch.float64))
    for _, weights, period in nb14.induction_cases(torch.Generator().manual_seed(0)):
        torch.testing.assert_close(nb14.induction_loop(weights, period), induction_loop(weights.double(), period))


def test_the_real_case_runs_a_decoder_and_reports_its_heads(capsys):
    """On a small random decoder of the same class (the companion notebook runs SmolLM2 itself)."""
    config = LlamaConfig(vocab_size=50, num_hiddens=24, num_heads=6, num_kv_heads=2, num_layers=3, ffn_num_hiddens=40)
    torch.manual_seed(0)
    model = LlamaDecoder(config).eval()
    checks.check_induction_heads(induction_vectorised, model)
    out = capsys.readouterr().out
    assert "✓ check_induction_heads: passed on 7 cases" in out
    assert "SmolLM2 on 64 random tokens repeated: the top induction scores are layer" in out
    assert "(an even spread: 0.011)" in out and "a uniform guess: ln 50 = 3.9" in out
    fails_with(lambda fn: checks.check_induction_heads(fn, model), offset(lambda p: p, lambda p: p), "duplicate-token")


# Exercise 2: find the bug in drop_group (the notebook's helpers and its buggy function, then fixes).


def keep_rows(linear, rows):
    new = nn.Linear(linear.in_features, len(rows), bias=linear.bias is not None, dtype=linear.weight.dtype)
    new.weight.copy_(linear.weight[rows])
    if linear.bias is not None:
        new.bias.copy_(linear.bias[rows])
    return new


def keep_columns(linear, columns):
    new = nn.Linear(len(columns), linear.out_features, bias=linear.bias is not None, dtype=linear.weight.dtype)
    new.weight.copy_(linear.weight[:, columns])
    if linear.bias is not None:
        new.bias.copy_(linear.bias)
    return new


@torch.no_grad()
def drop_group(layer, group, *, rule="groups", kv_shift=0, o_rows=False, kv_removed=True, update=True):
    """The notebook's function; ``rule="strided"`` is its bug, the other keywords switch on other slips."""
    H, H_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_size
    G = H // H_kv
    gone = {"groups": lambda h: h // G, "strided": lambda h: h % H_kv, "by_kv": lambda h: h // H_kv,
            "next": lambda h: h // G - 1}[rule]  # fmt: skip
    q_heads = [h for h in range(H) if gone(h) != group]
    kv_heads = [j for j in range(H_kv) if j != group + kv_shift]
    q_rows = torch.cat([torch.arange(h * d, (h + 1) * d) for h in q_heads])
    kv_rows = torch.cat([torch.arange(j * d, (j + 1) * d) for j in kv_heads])
    layer.W_q, layer.W_o = keep_rows(layer.W_q, q_rows), (keep_rows if o_rows else keep_columns)(layer.W_o, q_rows)
    if kv_removed:
        layer.W_k, layer.W_v = keep_rows(layer.W_k, kv_rows), keep_rows(layer.W_v, kv_rows)
    if update:
        layer.num_heads = len(q_heads)


def drop_and_return(layer, group):
    drop_group(layer, group)
    return layer


@pytest.mark.parametrize("fn", [drop_group, drop_and_return], ids=["in-place", "returns-layer"])
def test_drop_right_answers_pass(fn, capsys):
    checks.check_drop_group(fn)
    assert "✓ check_drop_group: passed on 11 cases" in capsys.readouterr().out


def zero_output_bias(layer, group):
    drop_group(layer, group)
    layer.W_o.bias.zero_()


def neighbour_both(layer, group):  # the whole neighbouring group removed
    drop_group(layer, group + 1 if group + 1 < layer.num_kv_heads else group - 1)


@pytest.mark.parametrize(
    "fn, fragments",
    [
        (lambda layer, g: drop_group(layer, g, rule="strided"), ["h % H_kv == 0", "the strided rule",
                                                                "group 0 is heads [0, 1, 2]"]),
        (lambda layer, g: drop_group(layer, g, rule="by_kv"), ["h // H_kv == 0", "divide by G = H // H_kv = 3"]),
        (lambda layer, g: drop_group(layer, g, rule="next"), ["off by one", "query heads of the neighbouring group"]),
        (neighbour_both, ["off by one", "removed the neighbouring group 1", "instead of group 0"]),
        (lambda layer, g: drop_group(layer, g, kv_shift=1 if g == 0 else -1), ["but K/V head 1",
                                                                               "remove K/V head 0"]),
        (lambda layer, g: drop_group(layer, g, kv_removed=False), ["W_k and W_v still hold all 2 K/V heads"]),
        (lambda layer, g: drop_group(layer, g, o_rows=True), ["W_o lost rows", "keep_columns(layer.W_o, q_rows)"]),
        (lambda layer, g: drop_group(layer, g, update=False), ["num_heads is 6 but W_q holds 3 heads",
                                                               "it is still H"]),
        (lambda layer, g: True, ["return None (or the layer), got bool"]),
        (zero_output_bias, ["query heads 0 .. 2 off", "wrong values"]),
    ],
    ids=["strided", "by-kv", "next-q", "next-group", "kv-neighbour", "kv-kept", "o-rows", "num-heads", "returns-bool",
         "bias"],
)  # fmt: skip
def test_drop_mistakes_are_named(fn, fragments):
    message = fails_with(checks.check_drop_group, fn, "MultiHeadAttention(D=24, H=6, num_kv_heads=2)", *fragments)
    assert "drop_group(layer, 0)" in message  # the first case names the mistake


def test_drop_names_a_crash_of_the_layer_left_behind():
    def narrow_values(layer, group):  # W_v loses an input feature: the layer cannot read its values any more
        drop_group(layer, group)
        layer.W_v = keep_columns(layer.W_v, torch.arange(layer.W_v.in_features - 1))

    fails_with(checks.check_drop_group, narrow_values, "the layer your drop_group left fails when it runs",
               "ValueError")  # fmt: skip


def via_prune_heads(layer, group):
    try:
        layer.prune_heads([group])
    except (ValueError, NotImplementedError):  # a grouped layer refuses: the learner falls back to the right answer
        drop_group(layer, group)


def via_prune_attention_heads(layer, group):
    try:
        mha.prune_attention_heads(layer, [group])
    except (ValueError, NotImplementedError):
        drop_group(layer, group)


def via_select(layer, group):
    mha._select(layer.W_o, torch.arange(2), dim=0)
    drop_group(layer, group)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda layer, g: gqa.prune_kv_groups(layer, [g]), "gqa.prune_kv_groups"),
        (via_prune_heads, "MultiHeadAttention.prune_heads"),
        (via_prune_attention_heads, "prune_attention_heads"),
        (via_select, "_select"),
    ],
    ids=["prune_kv_groups", "prune_heads", "prune_attention_heads", "_select"],
)
def test_drop_refuses_the_package(fn, fragment):
    fails_with(checks.check_drop_group, fn, fragment, "write that step yourself")


@pytest.mark.parametrize("heads", [(6, 2), (9, 3), (8, 4)])
def test_the_drop_references_agree(heads):
    """Three ways to the same output: head_mask on the intact layer (the check's reference), the check's own removal
    and the package's prune_kv_groups, in float64."""
    H, H_kv = heads
    torch.manual_seed(H)
    layer = mt.MultiHeadAttention(4 * H, H, num_kv_heads=H_kv, bias=True, rope_base=10000.0).double().eval()
    x = torch.randn(2, 5, 4 * H, dtype=torch.float64)
    G = H // H_kv
    for group in range(H_kv):
        off = torch.ones(H, dtype=torch.float64)
        off[group * G : (group + 1) * G] = 0.0
        with torch.no_grad():
            expected = layer(x, x, x, is_causal=True, head_mask=off)
            ours = nb14._removed_output(layer, list(range(group * G, (group + 1) * G)), [group], x)
            pruned = mt.MultiHeadAttention(4 * H, H, num_kv_heads=H_kv, bias=True, rope_base=10000.0).double()
            pruned.load_state_dict(layer.state_dict())
            gqa.prune_kv_groups(pruned, [group])
            torch.testing.assert_close(ours, expected, rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(pruned(x, x, x, is_causal=True), expected, rtol=1e-10, atol=1e-12)


# Exercise 3: perplexity from logits.


def perplexity_ce(logits, ids):
    return float(F.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten()).exp())


def perplexity_loop(logits, ids):
    B, T = ids.shape
    log_p = logits.double().log_softmax(-1)
    total = sum(-float(log_p[b, t, ids[b, t + 1]]) for b in range(B) for t in range(T - 1))
    return math.exp(total / (B * (T - 1)))


@pytest.mark.parametrize(
    "fn",
    [perplexity_ce, perplexity_loop, lambda lo, ids: F.cross_entropy(lo[:, :-1].transpose(1, 2), ids[:, 1:]).exp()],
    ids=["cross_entropy", "loop", "0d-tensor"],
)
def test_perplexity_right_answers_pass(fn, capsys):
    checks.check_perplexity(fn)
    assert "✓ check_perplexity: passed on 6 cases" in capsys.readouterr().out


def nll(logits, ids, *, shift="right"):
    """(B, T') cross-entropies of each scored position, with the shift as the learner wrote it."""
    log_p = logits.double().log_softmax(-1)
    if shift == "none":
        pairs = log_p, ids
    elif shift == "none-short":
        pairs = log_p[:, :-1], ids[:, :-1]
    elif shift == "wrong-way":
        pairs = log_p[:, 1:], ids[:, :-1]
    elif shift == "wrap":
        pairs = log_p, ids.roll(-1, dims=1)
    elif shift == "pad":
        pairs = log_p, torch.cat([ids[:, 1:], torch.zeros_like(ids[:, :1])], dim=1)
    else:
        pairs = log_p[:, :-1], ids[:, 1:]
    return -pairs[0].gather(-1, pairs[1][..., None])[..., 0]


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda lo, ids: float(nll(lo, ids, shift="none").mean().exp()), "no shift"),
        (lambda lo, ids: float(nll(lo, ids, shift="none-short").mean().exp()), "no shift"),
        (lambda lo, ids: float(nll(lo, ids, shift="wrong-way").mean().exp()), "shifted the wrong way"),
        (lambda lo, ids: float(nll(lo, ids, shift="wrap").mean().exp()), "wrapped around to token 0"),
        (lambda lo, ids: float(nll(lo, ids, shift="pad").mean().exp()), "against a padding id 0"),
        (lambda lo, ids: float(1 / (-nll(lo, ids)).exp().mean()), "inverted the mean probability"),
        (lambda lo, ids: float(nll(lo, ids).exp().mean()), "averaged 1/p"),
        (lambda lo, ids: float((nll(lo, ids) / math.log(2)).mean().exp()), "exp of a mean of -log2 p"),
        (lambda lo, ids: float(2 ** nll(lo, ids).mean()), "2 ** a mean of -ln p"),
        (lambda lo, ids: float(nll(lo, ids).mean()), "the mean cross-entropy (in nats)"),
        (lambda lo, ids: float((-nll(lo, ids)).mean().exp()), "the sign is flipped"),
        (lambda lo, ids: float(nll(lo, ids).mean(1).exp().mean()), "one perplexity per sequence"),
        (lambda lo, ids: float(nll(lo, ids).sum().exp()), "summed the cross-entropies"),
        (lambda lo, ids: float((nll(lo, ids).sum() / ids.numel()).exp()), "you divided by B*T"),
        (lambda lo, ids: perplexity_ce(lo, ids) * 1.01, "exp of the mean of -log p"),
        (lambda lo, ids: [perplexity_ce(lo, ids)], "got list"),
        (lambda lo, ids: perplexity_ce(lo.mul_(1.0).add_(1.0), ids), "changed its inputs in place"),
    ],
    ids=["no-shift", "no-shift-short", "wrong-way", "wrap", "pad", "inverse-mean-p", "mean-inverse-p", "exp-log2",
         "2-ln", "no-exp", "sign", "per-sequence", "sum", "b-times-t", "other", "list", "in-place"],
)  # fmt: skip
def test_perplexity_mistakes_are_named(fn, fragment):
    fails_with(checks.check_perplexity, fn, fragment)


def naive_softmax(logits, ids):
    e = logits.exp()
    p = e / e.sum(-1, keepdim=True)  # (B, T, V): inf / inf for large logits
    return float((-p[:, :-1].gather(-1, ids[:, 1:, None]).log()).mean().exp())


def log_of_softmax(logits, ids):
    log_p = logits.softmax(-1).log()  # a probability below float32's range becomes log(0) = -inf
    return float((-log_p[:, :-1].gather(-1, ids[:, 1:, None])).mean().exp())


@pytest.mark.parametrize(
    "fn, fragments",
    [
        (naive_softmax, ["near 100", "a softmax by exp / sum overflows", "log_softmax"]),
        (log_of_softmax, ["110 below", "underflowed to 0", "not the log of softmax"]),
    ],
    ids=["overflow", "underflow"],
)
def test_perplexity_names_overflow_and_underflow(fn, fragments):
    fails_with(checks.check_perplexity, fn, *fragments)


def test_perplexity_log_base_2_is_the_same_number(capsys):
    """2 ** (mean of -log2 p) is exp(mean of -ln p): a right answer, not a slip."""
    checks.check_perplexity(lambda lo, ids: float(2 ** (nll(lo, ids) / math.log(2)).mean()))
    assert "✓ check_perplexity" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda lo, ids: smollm_study.perplexity(lambda x, head_mask=None, mask=None: lo, ids), "smollm_study.perplexity"),
        (lambda lo, ids: smollm_study.masked_perplexity(
            SimpleNamespace(layers=[], head=lambda x: x, norm=lambda x: x), ids, [lo], torch.ones(0, 1)),
         "smollm_study.masked_perplexity"),
    ],
    ids=["perplexity", "masked_perplexity"],
)  # fmt: skip
def test_perplexity_refuses_the_package(fn, fragment):
    fails_with(checks.check_perplexity, fn, fragment, "write that step yourself")


@given(st.integers(1, 3), st.integers(2, 6), st.integers(2, 9), st.integers(0, 2**16))
def test_the_perplexity_reference_agrees_with_cross_entropy(B, T, V, seed):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(B, T, V, generator=g, dtype=torch.float64)
    ids = torch.randint(0, V, (B, T), generator=g)
    pairs = [(b, t, int(ids[b, t + 1])) for b in range(B) for t in range(T - 1)]
    assert math.isclose(nb14._ppl(nb14._log_probs(logits, pairs)), perplexity_ce(logits, ids), rel_tol=1e-12)
    flat = torch.zeros(B, T, V, dtype=torch.float64)  # every token equally likely: perplexity V
    assert math.isclose(nb14._ppl(nb14._log_probs(flat, pairs)), V, rel_tol=1e-12)


def test_unattempted_exercises_are_reported_or_fail_in_strict_mode(monkeypatch, capsys):
    def stub(*args):
        raise NotImplementedError("not written yet")

    checks.check_induction_heads(stub)
    checks.check_drop_group(stub)
    checks.check_perplexity(stub)
    assert capsys.readouterr().out.count("not attempted yet") == 3
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "1")
    for check in (checks.check_drop_group, checks.check_perplexity, checks.check_induction_heads):
        fails_with(check, stub, "not attempted")
