"""Checks for the exercises of notebook 14 (a real language model's heads: SmolLM2-135M).

Exercise 3: each head's induction score on a sequence that repeats every ``period`` tokens: the mean over the
queries i = period .. T-1 of the weight on key i - period + 1 (the token that followed the query's token last time).
The reference is a plain loop; with SmolLM2 passed in, the check also runs the model on 64 random tokens repeated and
prints its top heads. A duplicate-token or previous-token key, queries of the first copy, a skipped query, transposed
weights, a sum, a wrong shape and the period taken as T // 2 are named.

Exercise 2: find the bug in a removal of one K/V group (it removes the strided query heads h % H_kv, not the group's
G consecutive heads). The reference is the intact layer with the group's query heads off by ``head_mask``; the
package's removals are refused. Strided heads, h // H_kv, a neighbouring group, K/V rows kept, W_o's rows cut instead
of its columns and ``num_heads`` not updated are named.

Exercise 1: perplexity from a causal LM's logits, a formula given only in prose. The reference is a loop with
``math.log`` and ``math.exp`` in float64; ``smollm_study``'s perplexities are refused. No shift, the wrong shift, the
last position scored, averaged probabilities, mixed log bases, no exp, per-sequence perplexities averaged, a sum, the
wrong sign, an overflowing exp and the log of an underflowed 0 are named.
"""

from __future__ import annotations

import copy
import math

import torch
from torch import nn

from ..core import mha
from ..core.mha import MultiHeadAttention
from ..modern import gqa
from ..pretrained import smollm_study
from ._common import CheckFailed, call, diagnose, friendly, passed, refusing
from ._nb14_induction import expect_scores, induction_cases, induction_loop, induction_mistakes, on_smollm

__all__ = ["check_drop_group", "check_induction_heads", "check_perplexity"]

_DT = torch.float64
_TOL64 = dict(atol=1e-12, rtol=1e-10)
_TOL32 = dict(atol=1e-6, rtol=1e-5)  # a float32 answer is fine, to its precision


# =====================================================================================================
# Exercise 3: induction heads on a repeated random sequence
# =====================================================================================================
@friendly
@torch.no_grad()
def check_induction_heads(induction_score, model=None) -> None:
    """``induction_score(weights (L, H, T, T), period)`` -> (L, H); with ``model``, also on SmolLM2's heads."""
    cases = induction_cases(torch.Generator().manual_seed(141))
    for case, weights, period in cases:
        given = weights.clone()
        got = expect_scores(call(induction_score, given, period, case=case), weights, case)
        if not torch.equal(given, weights):
            raise CheckFailed(f"{case}: your function changed the weights in place; work on a copy")
        w = weights.double()
        tol = _TOL64 if weights.dtype == _DT else _TOL32
        diagnose(got.double(), induction_loop(w, period), induction_mistakes(w, period), case, **tol)
    found = on_smollm(induction_score, model) if model is not None else None
    passed("check_induction_heads", len(cases) + (model is not None))
    if found:
        print(found)


# =====================================================================================================
# Exercise 2: find the bug in drop_group
# =====================================================================================================
_GROUPS = "which query heads read K/V head j? Write out, for one group, the heads repeat_interleave pairs with it"
_D_HEAD = 4  # d, even for the rotary positions
_DROP_SHAPES = [(6, 2), (8, 4), (8, 2), (9, 3)]  # (H, H_kv); every group of each in turn
_DROP_REFUSED = {
    gqa.prune_kv_groups: "the package's gqa.prune_kv_groups",
    mha.prune_attention_heads: "the package's prune_attention_heads",
    MultiHeadAttention.prune_heads: "the package's MultiHeadAttention.prune_heads",
    mha._select: "the package's _select (use the notebook's keep_rows and keep_columns)",
}


_KV_KEPT = ("W_k and W_v still hold all {} K/V heads: K/V head {} is read by no query head any more, so remove its "
            "rows too (kv_rows), and num_kv_heads becomes H_kv - 1")  # fmt: skip


def _drop_rules(H, H_kv, group):
    """(what is wrong, query heads removed, K/V heads removed) for the slips, the right removal left out."""
    G = H // H_kv
    right = list(range(group * G, (group + 1) * G))
    strided = [h for h in range(H) if h % H_kv == group]
    by_kv = [h for h in range(H) if h // H_kv == group]
    other = group + 1 if group + 1 < H_kv else group - 1
    neighbour = list(range(other * G, (other + 1) * G))
    rules = [
        (f"you removed query heads {strided}, those with h % H_kv == {group} (the strided rule, the bug): {_GROUPS}; "
         f"group {group} is heads {right}", strided, [group]),
        (f"you removed query heads {by_kv}, those with h // H_kv == {group}: divide by G = H // H_kv = {G}, the "
         f"size of a group, not by H_kv = {H_kv}; group {group} is heads {right}", by_kv, [group]),
        (f"off by one: you removed the query heads of the neighbouring group {other}, {neighbour}, with K/V head "
         f"{group}: {_GROUPS}; group {group} is heads {right}", neighbour, [group]),
        (f"off by one: you removed the neighbouring group {other} (query heads {neighbour}, K/V head {other}) "
         f"instead of group {group}: groups are numbered from 0", neighbour, [other]),
        (f"you removed query heads {right} but K/V head {other}: remove K/V head {group}, the one they read",
         right, [other]),
        (_KV_KEPT.format(H_kv, group), right, []),
    ]  # fmt: skip
    seen = {(tuple(right), (group,))}
    for why, q, kv in rules:
        if (tuple(q), tuple(kv)) not in seen:
            seen.add((tuple(q), tuple(kv)))
            yield why, q, kv


def _keep(linear, index, dim):
    """A new Linear with only the output rows (dim=0) or input columns (dim=1) ``index`` of ``linear``."""
    weight = linear.weight.index_select(dim, index)  # (out', in) or (out, in')
    new = nn.Linear(weight.shape[1], weight.shape[0], bias=linear.bias is not None, dtype=weight.dtype)
    new.weight.copy_(weight)
    if linear.bias is not None:
        new.bias.copy_(linear.bias.index_select(0, index) if dim == 0 else linear.bias)
    return new


def _removed_output(layer, q_gone, kv_gone, x):
    """The output on x of a copy of ``layer`` without the query heads ``q_gone`` and the K/V heads ``kv_gone``; None
    where that leaves a layer that cannot run (it then cannot be the learner's answer)."""
    d, H, H_kv = layer.head_size, layer.num_heads, layer.num_kv_heads
    q_rows, kv_rows = (torch.tensor([h * d + i for h in range(n) if h not in gone for i in range(d)], dtype=torch.long)
                       for gone, n in ((q_gone, H), (kv_gone, H_kv)))  # fmt: skip
    new = copy.deepcopy(layer)
    new.W_q, new.W_o = _keep(layer.W_q, q_rows, 0), _keep(layer.W_o, q_rows, 1)
    new.W_k, new.W_v = _keep(layer.W_k, kv_rows, 0), _keep(layer.W_v, kv_rows, 0)
    new.num_heads = H - len(q_gone)
    try:
        return new(x, x, x, is_causal=True)  # (B, T, D)
    except (RuntimeError, ValueError):
        return None


def _sizes(layer, result, group, case):
    """The slips that leave sizes the layer cannot run with, named before it runs."""
    H, H_kv, d, D = layer.num_heads, layer.num_kv_heads, layer.head_size, layer.num_hiddens
    W_q, W_k, W_o = result.W_q, result.W_k, result.W_o
    if W_o.out_features != D and W_o.in_features == H * d:
        raise CheckFailed(f"{case}: W_o lost rows (output features: it now gives {W_o.out_features}, not D = {D}): W_o "
                          "reads the heads through its input features, its columns: keep_columns(layer.W_o, q_rows)")  # fmt: skip
    if W_o.in_features != W_q.out_features or W_o.out_features != D:
        raise CheckFailed(f"{case}: W_o is Linear({W_o.in_features}, {W_o.out_features}), expected "
                          f"Linear({W_q.out_features}, {D}): keep W_o's columns of the query heads kept")  # fmt: skip
    if W_k.out_features == H_kv * d:
        raise CheckFailed(f"{case}: " + _KV_KEPT.format(H_kv, group))
    if result.num_heads * d != W_q.out_features:
        why = "it is still H: set layer.num_heads" if result.num_heads == H else "set it"
        raise CheckFailed(f"{case}: num_heads is {result.num_heads} but W_q holds {W_q.out_features // d} heads of d = "
                          f"{d} ({why} to the number of query heads kept; the layer splits W_q's output into "
                          "num_heads heads)")  # fmt: skip


def _drop_case(fn, layer, group, x, case):
    """Run ``fn`` on a copy of ``layer`` and compare the result with ``layer`` under ``head_mask``."""
    H, G = layer.num_heads, layer.num_heads // layer.num_kv_heads
    work = copy.deepcopy(layer)
    with refusing(_DROP_REFUSED):
        got = call(fn, work, group, case=case)
    if got is not None and not isinstance(got, MultiHeadAttention):
        raise CheckFailed(f"{case}: drop_group works in place: return None (or the layer), got {type(got).__name__}")
    result = work if got is None else got
    _sizes(layer, result, group, case)
    off = torch.ones(H, dtype=_DT)
    off[group * G : (group + 1) * G] = 0.0  # (H,): the group's query heads switched off
    expected = layer(x, x, x, is_causal=True, head_mask=off)  # (B, T, D)
    try:
        actual = result(x, x, x, is_causal=True)
    except Exception as e:  # noqa: BLE001 -- any crash of the layer left behind is reported, with its case
        raise CheckFailed(f"{case}: the layer your drop_group left fails when it runs: {type(e).__name__}: {e}") from None  # fmt: skip
    mistakes = ((why, _removed_output(layer, q, kv, x)) for why, q, kv in _drop_rules(H, layer.num_kv_heads, group))
    where = f"{case} (its output against the intact layer with query heads {group * G} .. {group * G + G - 1} off)"
    diagnose(actual, expected, mistakes, where, **_TOL64)
    if (result.num_heads, result.num_kv_heads) != (H - G, layer.num_kv_heads - 1):
        raise CheckFailed(f"{case}: num_heads = {result.num_heads}, num_kv_heads = {result.num_kv_heads}, expected "
                          f"{H - G} and {layer.num_kv_heads - 1}")  # fmt: skip


@friendly
@torch.no_grad()
def check_drop_group(fn) -> None:
    """``fn(layer, group)``: remove K/V head ``group`` of a grouped-query layer and its query heads, in place."""
    g = torch.Generator().manual_seed(142)
    count = 0
    with torch.random.fork_rng(devices=[]):  # new Linear layers draw weights: leave the notebook's generator alone
        for H, H_kv in _DROP_SHAPES:
            torch.manual_seed(1420 + H * 10 + H_kv)
            D = H * _D_HEAD
            layer = MultiHeadAttention(D, H, num_kv_heads=H_kv, bias=True, rope_base=10000.0).to(_DT).eval()
            x = torch.randn(2, 5, D, generator=g, dtype=_DT)  # (B, T, D)
            for group in range(H_kv):
                case = f"MultiHeadAttention(D={D}, H={H}, num_kv_heads={H_kv}), drop_group(layer, {group})"
                _drop_case(fn, layer, group, x, case)
                count += 1
    passed("check_drop_group", count)


# =====================================================================================================
# Exercise 1: perplexity from logits
# =====================================================================================================
def _as_number(got, case, what):
    """A Python int/float or a 0-d tensor as a float; anything else is a plain-words failure."""
    if isinstance(got, torch.Tensor) and got.dim() == 0 and got.is_floating_point():
        return float(got)
    if isinstance(got, bool) or not isinstance(got, int | float):
        raise CheckFailed(f"{case}: {what} must return one number (a Python float), got {type(got).__name__}")
    return float(got)


def _diagnose_number(got, expected, mistakes, case, rel, what):
    """Return if ``got`` is within ``rel`` of ``expected``; else raise naming the first (why, value) it matches."""
    if not math.isclose(got, expected, rel_tol=rel, abs_tol=1e-12):
        close = (why for why, value in mistakes if math.isclose(got, value, rel_tol=rel, abs_tol=1e-12))
        raise CheckFailed(f"{case}: got {got:.6g}, expected {expected:.6g}: {next(close, what)}")


def _log_probs(logits, triples):
    """log softmax(logits[b, t])[token] for each (b, t, token), by loops with math.exp and math.log."""
    rows, out = logits.double().tolist(), []
    for b, t, token in triples:
        top = max(rows[b][t])
        out.append(rows[b][t][token] - top - math.log(math.fsum(math.exp(v - top) for v in rows[b][t])))
    return out


def _ppl(log_probs, base=math.e, scale=1.0):
    """base ** (scale * the mean of -log p), inf where that overflows a float."""
    power = -scale * math.fsum(log_probs) / len(log_probs)
    return base**power if power * math.log(base) < 700 else math.inf


def _perplexity_mistakes(logits, ids):
    """(what is wrong, the number it gives) for the slips of Exercise 1."""
    B, T = ids.shape

    def scored(pairs):  # (position, position of the token it is scored against), in every sequence
        return _log_probs(logits, [(b, t, int(ids[b, s])) for b in range(B) for t, s in pairs])

    right = scored([(t, t + 1) for t in range(T - 1)])
    p = [math.exp(v) for v in right]
    shift = "; position t predicts token t+1: score logits[:, :-1] against ids[:, 1:]"
    last = "the last position is scored too, but it predicts nothing here (there is no token T)"
    return [
        *[("no shift: each position scored its own token" + shift, _ppl(scored([(t, t) for t in range(n)])))
          for n in (T, T - 1)],
        ("shifted the wrong way, logits[:, 1:] against ids[:, :-1]" + shift,
         _ppl(scored([(t + 1, t) for t in range(T - 1)]))),
        (f"{last}: you wrapped around to token 0{shift}", _ppl(scored([(t, (t + 1) % T) for t in range(T)]))),
        (f"{last}: you scored it against a padding id 0{shift}",
         _ppl(right + _log_probs(logits, [(b, T - 1, 0) for b in range(B)]))),
        ("you inverted the mean probability: perplexity is exp of the mean of -log p (a geometric mean)",
         len(p) / math.fsum(p)),
        ("you averaged 1/p over the predictions: perplexity is exp of the mean of -log p",
         math.fsum(1 / q for q in p) / len(p)),
        ("you mixed log bases, exp of a mean of -log2 p: use one base (exp with ln, or 2 ** with log2)",
         _ppl(right, scale=1 / math.log(2.0))),
        ("you mixed log bases, 2 ** a mean of -ln p: use one base (exp with ln, or 2 ** with log2)",
         _ppl(right, base=2.0)),
        ("that is the mean cross-entropy (in nats): perplexity is its exp", -math.fsum(right) / len(right)),
        ("the sign is flipped: exp of the mean log-probability is 1 / perplexity", 1 / _ppl(right)),
        ("you averaged one perplexity per sequence: take one exp of the mean over all B*(T-1) predictions",
         math.fsum(_ppl(right[b * (T - 1) : (b + 1) * (T - 1)]) for b in range(B)) / B),
        ("you summed the cross-entropies: take their mean over the B*(T-1) predictions",
         _ppl(right, scale=len(right))),
        (f"you divided by B*T = {B * T}: there are B*(T-1) = {B * (T - 1)} predictions",
         _ppl(right, scale=(T - 1) / T)),
    ]  # fmt: skip


def _perplexity_cases(g):
    """(case, logits (B, T, V), ids (B, T), what a non-finite answer means)."""
    overflow = ("a softmax by exp / sum overflows (exp of a logit near 100 is inf in float32, and inf / inf is nan): "
                "use log_softmax or F.cross_entropy, which subtract each row's max first")  # fmt: skip
    cases = []
    for B, T, V, dtype, offset in [(2, 5, 7, _DT, 0.0), (1, 2, 3, torch.float32, 0.0), (3, 9, 11, torch.float32, 0.0),
                                   (2, 6, 5, _DT, 0.0), (2, 8, 10, torch.float32, 100.0)]:  # fmt: skip
        logits = (2 * torch.randn(B, T, V, generator=g, dtype=_DT) + offset).to(dtype)
        ids = torch.randint(0, V, (B, T), generator=g)
        label = f"logits ({B}, {T}, {V}) {str(dtype)[6:]}" + (f" near {offset:g}" if offset else "")
        cases.append((label, logits, ids, overflow))
    logits = 2 * torch.randn(2, 8, 10, generator=g)  # float32
    ids = torch.randint(0, 10, (2, 8), generator=g)
    logits[0, 2, ids[0, 3]] = logits[0, 2].max() - 110.0  # token 3's probability ~e^-110: 0 in float32
    underflow = ("a probability underflowed to 0 (one target is ~e^-110, below float32's range) and log(0) is -inf: "
                 "take log_softmax of the logits (or F.cross_entropy), not the log of softmax")  # fmt: skip
    cases.append(("logits (2, 8, 10) float32, one target 110 below its row's best", logits, ids, underflow))
    return cases


_PPL_REFUSED = {f: f"smollm_study.{f.__name__}" for f in (smollm_study.perplexity, smollm_study.masked_perplexity)}


@friendly
@torch.no_grad()
def check_perplexity(fn) -> None:
    """``fn(logits (B, T, V), ids (B, T))`` -> float: exp of the mean of -log p(ids[b, t+1]) over B*(T-1) predictions."""
    cases = _perplexity_cases(torch.Generator().manual_seed(143))
    for case, logits, ids, non_finite in cases:
        given = logits.clone(), ids.clone()
        with refusing(_PPL_REFUSED):
            got = _as_number(call(fn, *given, case=case), case, "your function")
        if not (torch.equal(given[0], logits) and torch.equal(given[1], ids)):
            raise CheckFailed(f"{case}: your function changed its inputs in place; work on copies")
        B, T = ids.shape
        expected = _ppl(_log_probs(logits, [(b, t, int(ids[b, t + 1])) for b in range(B) for t in range(T - 1)]))
        if not math.isfinite(got):
            raise CheckFailed(f"{case}: got {got}, expected {expected:.6g}: {non_finite}")
        rel = 1e-10 if logits.dtype == _DT else 1e-4
        _diagnose_number(got, expected, _perplexity_mistakes(logits, ids), case, rel, "exp of the mean of -log p")
    passed("check_perplexity", len(cases))
