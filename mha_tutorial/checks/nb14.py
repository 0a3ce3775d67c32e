"""Checks for the exercises of notebook 14 (a real language model's heads: SmolLM2-135M).

Exercise 1: each head's attention-sink score (the mean weight that queries 1 .. T-1 put on key 0; query 0 sees only
key 0) divided by the score of a head that spreads its weight evenly, (H_T - 1) / (T - 1). The references are plain
loops. Query 0 included, a row or the last key read instead of key 0's column, a sum, means over heads or whole rows,
and for the even head 1/T, H_T / T, the mean of 1/i and a sum are named.

Exercise 2: find the bug in a removal of one K/V group (it removes the strided query heads h % H_kv, not the group's
G consecutive heads). The reference is the intact layer with the group's query heads off by ``head_mask``; the
package's removals are refused. Strided heads, h // H_kv, a neighbouring group, K/V rows kept, W_o's rows cut instead
of its columns and ``num_heads`` not updated are named.

Exercise 3: perplexity from a causal LM's logits, a formula given only in prose. The reference is a loop with
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
from ._common import CheckFailed, call, diagnose, expect_tensor, friendly, passed, refusing

__all__ = ["check_drop_group", "check_perplexity", "check_sink_ratio"]

_DT = torch.float64
_TOL64 = dict(atol=1e-12, rtol=1e-10)
_TOL32 = dict(atol=1e-6, rtol=1e-5)  # a float32 answer is fine, to its precision


# =====================================================================================================
# Exercise 1: the attention-sink score
# =====================================================================================================
def _sink_loop(weights) -> torch.Tensor:
    """(H,) by loops: for each head, the mean over queries i = 1 .. T-1 of the weight on key 0."""
    rows = weights.double().tolist()  # H lists of T rows of T weights
    T = len(rows[0])
    return torch.tensor([sum(head[i][0] for i in range(1, T)) / (T - 1) for head in rows], dtype=_DT)


def _uniform_loop(T: int) -> float:
    """The sink score of a head that gives each of the i + 1 keys query i sees the weight 1 / (i + 1)."""
    return math.fsum(1.0 / (i + 1) for i in range(1, T)) / (T - 1)


def _causal_weights(H, T, g, dtype, spread=3.0):
    """(H, T, T) softmax of random scores under a causal mask; head h's scores scaled differently."""
    scale = spread * torch.rand(H, 1, 1, generator=g, dtype=_DT)  # (H, 1, 1): flat to peaked heads
    scores = torch.randn(H, T, T, generator=g, dtype=_DT) * scale  # (H, T, T)
    scores[:, :, 0] += 2 * torch.randn(H, 1, generator=g, dtype=_DT)  # some heads favour key 0, some avoid it
    future = torch.ones(T, T, dtype=torch.bool).triu(1)  # (T, T): True above the diagonal
    return scores.masked_fill(future, -math.inf).softmax(-1).to(dtype)


def _known_heads(T):
    """(3, T, T): an even head, a perfect sink (all weight on key 0) and a previous-token head."""
    even = torch.ones(T, T, dtype=_DT).tril() / torch.arange(1, T + 1, dtype=_DT)[:, None]  # query i: 1 / (i + 1)
    sink, previous = torch.zeros(T, T, dtype=_DT), torch.diag(torch.ones(T - 1, dtype=_DT), -1)  # query i: key i - 1
    sink[:, 0], previous[0, 0] = 1.0, 1.0
    return torch.stack([even, sink, previous])


def _sink_cases(g):
    """(case, weights (H, T, T)): random heads of several sizes, both dtypes, then heads whose answer is known."""
    cases = [
        (f"weights ({H}, {T}, {T}) {str(dtype)[6:]}", _causal_weights(H, T, g, dtype))
        for H, T, dtype in [(3, 6, _DT), (2, 9, torch.float32), (4, 300, torch.float32), (1, 2, _DT), (5, 3, _DT)]
    ]
    cases.append(("weights (3, 6, 6): an even head, a perfect sink, a previous-token head", _known_heads(6)))
    return cases


def _sink_mistakes(w):
    """(what is wrong, what it computes) for the slips of sink_score on float64 weights w (H, T, T)."""
    T = w.shape[-1]
    yield ("query 0 is included: it sees only key 0, so it puts weight 1 there whatever the head does; average over "
           "queries i = 1 .. T-1 (weights[:, 1:, 0])", w[:, :, 0].mean(-1))  # fmt: skip
    yield ("you read query 0's row, weights[:, 0, i], which is zero above the diagonal: the weight that query i puts "
           "on key 0 is weights[:, i, 0], column 0", w[:, 0, 1:].mean(-1))  # fmt: skip
    yield ("you averaged each query's weights over the keys: a row sums to 1, so that gives 1/T whatever the head "
           "does; take the weight on key 0 only, weights[:, i, 0]", w[:, 1:, :].mean((-2, -1)))  # fmt: skip
    yield ("you took the weight on the last key, weights[:, i, -1]: the sink is the first key, column 0",
           w[:, 1:, -1].mean(-1))  # fmt: skip
    yield ("you took the weight each query puts on itself (the diagonal): the sink is key 0, column 0",
           w.diagonal(dim1=-2, dim2=-1)[:, 1:].mean(-1))  # fmt: skip
    yield (f"you summed the weights on key 0 over the queries: take their mean, dividing by the T - 1 = {T - 1} "
           "queries 1 .. T-1", w[:, 1:, 0].sum(-1))  # fmt: skip
    yield ("you averaged over the heads, not the queries: one number per head, the mean over queries 1 .. T-1 "
           "(dim=-1 of weights[:, 1:, 0])", w[:, 1:, 0].mean(0))  # fmt: skip
    yield ("one number for all heads: average over the queries only, keeping one score per head (H,)",
           w[:, 1:, 0].mean())  # fmt: skip
    for rows in (w, w[:, 1:]):
        yield ("you averaged whole rows over the queries, one number per key (H, T): keep only key 0's column, "
               "weights[:, 1:, 0], then average it", rows.mean(1))  # fmt: skip


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


def _uniform_mistakes(T: int):
    """(what is wrong, the value it gives) for the slips of the even head's score at T."""
    harmonic = math.fsum(1.0 / n for n in range(1, T + 1))  # H_T
    yield ("query 0 is included in the even head's score (the mean of 1 / (i + 1) over i = 0 .. T-1, H_T / T): "
           "leave query 0 out, averaging over i = 1 .. T-1 only", harmonic / T)  # fmt: skip
    yield ("1/T is an even head without a mask; under the causal mask query i sees i + 1 keys, so it gives key 0 "
           "the weight 1 / (i + 1)", 1.0 / T)  # fmt: skip
    yield ("off by one in the even head: query i sees keys 0 .. i, i + 1 of them, so its even weight is 1 / (i + 1), "
           "not 1 / i", (harmonic - 1.0 / T) / (T - 1))  # fmt: skip
    yield ("you summed the even head's 1 / (i + 1) over the queries: take the mean, dividing by the T - 1 queries",
           harmonic - 1.0)  # fmt: skip


@friendly
@torch.no_grad()
def check_sink_ratio(sink_ratio) -> None:
    """``sink_ratio(weights (H, T, T))`` -> (H,): each head's sink score over an evenly spreading head's at that T."""
    g = torch.Generator().manual_seed(141)
    cases = _sink_cases(g)
    for case, weights in cases:
        given = weights.clone()
        got = expect_tensor(call(sink_ratio, given, case=case), case)
        if not torch.equal(given, weights):
            raise CheckFailed(f"{case}: your function changed the weights in place; work on a copy")
        if got.dtype != weights.dtype:
            raise CheckFailed(f"{case}: the result is {got.dtype}, expected {weights.dtype}: keep the weights' dtype")
        tol = _TOL32  # a float32 baseline (or sum) is a fine answer, even for float64 weights
        w = weights.double()
        even, score = _uniform_loop(w.shape[-1]), _sink_loop(w)  # a float; (H,)
        mistakes = [(why, wrong / even) for why, wrong in _sink_mistakes(w)]
        mistakes += [(why, score / wrong) for why, wrong in _uniform_mistakes(w.shape[-1])]
        diagnose(got.double(), score / even, mistakes, case, **tol)
    passed("check_sink_ratio", len(cases))


# =====================================================================================================
# Exercise 2: find the bug in drop_group
# =====================================================================================================
_GROUPS = (
    "query head h reads K/V head h // G, so group j is the G = H // H_kv consecutive query heads jG .. (j+1)G - 1 "
    "(keep the heads with h // G != group)"
)
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
# Exercise 3: perplexity from logits
# =====================================================================================================
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
    """(what is wrong, the number it gives) for the slips of exercise 3."""
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
