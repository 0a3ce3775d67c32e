"""The check of notebook 04's Exercise 1 (re-exported by ``nb04``): a multi-head forward pass that takes per-query
lengths ``valid_lens`` (B, Q) and a bool ``mask`` (Q, K) together and returns the per-head weights (B, H, Q, K).

The learner writes the masking and the softmax: the package's attention, its masked softmax and mask builders, and
PyTorch's fused attention are refused. When the answer differs, the check compares it with deliberately broken
variants (lengths read along the keys, mask ignored or inverted, masks joined with "or", no W_o, ...) to name the
mistake.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch

from ..core import attention, masks
from ..core.attention import DotProductAttention
from ..core.mha import MultiHeadAttention
from ..core.variants import EinsumMultiHeadAttention, HeadLoopMultiHeadAttention, SeqFirstMultiHeadAttention
from ._common import CheckFailed, call, diagnose, expect_tensor, friendly, passed, refusing
from ._nb04_guards import _refusing

__all__ = ["check_mha_forward"]


class _NoForward(MultiHeadAttention):
    """A MultiHeadAttention that refuses to be called: the exercise is to use its four Linear layers."""

    def forward(self, *args, **kwargs):
        raise CheckFailed(
            "your function called net(...) itself; the exercise is to compute the output from "
            "net.W_q, net.W_k, net.W_v and net.W_o"
        )


_PACKAGE_LAYERS = (
    MultiHeadAttention,
    HeadLoopMultiHeadAttention,
    EinsumMultiHeadAttention,
    SeqFirstMultiHeadAttention,
    DotProductAttention,
)
_PACKAGE_STEPS = {  # the steps the exercise asks for, as the package has them
    attention.masked_softmax: "mha_tutorial.masked_softmax",
    attention._softmax_over_keys: "the package's masked softmax",
    attention.scaled_dot_product_attention: "mha_tutorial.scaled_dot_product_attention",
    masks.padding_mask: "mha_tutorial.padding_mask (build the length mask from torch.arange)",
    masks.combine_masks: "the package's combine_masks",
}
_TORCH_STEPS = {"scaled_dot_product_attention": "F.scaled_dot_product_attention"}


@contextlib.contextmanager
def _no_package_attention():
    message = (
        "your function ran the package's attention (a MultiHeadAttention or its inner attention); the "
        "exercise is to compute the output yourself from net.W_q, net.W_k, net.W_v and net.W_o"
    )
    with _refusing(_PACKAGE_LAYERS, "forward", message), refusing(_PACKAGE_STEPS, _TORCH_STEPS):
        yield


@dataclass(frozen=True)
class _Switches:
    """The mistakes ``_variant`` can make; the defaults make none."""

    scale: str | None = "head"  # "head": 1/sqrt(d); "model": 1/sqrt(num_hiddens); None: no scale
    lens_rule: str = "query"  # valid_lens[b, i] limits query i ("query"), wrongly key j ("key"), or is "ignore"d
    mask_rule: str = "and"  # "and" (right), "ignore", "inverted" (True = hide, PyTorch's nn convention), "or"
    empty: str = "zero"  # a row with no visible key: "zero" weights, or "uniform" (finfo.min filled, softmaxed)
    use_wo: bool = True  # the concatenated heads go through W_o
    concat: str = "blocks"  # "blocks" (right), "interleaved" ((d, H)), "reversed", "no_transpose"
    split: bool = True  # False: one head over all num_hiddens features
    softmax_dim: int = -1  # the axis the softmax normalises (-1: the keys)


def _keep(valid_lens, mask, Q, K, m: _Switches):
    """The bool keep-mask (B or 1, 1, Q, K) of ``m``, or None; True = may attend."""
    keep = None
    if valid_lens is not None and m.lens_rule != "ignore":
        where = valid_lens[:, None, :, None] if m.lens_rule == "query" else valid_lens[:, None, None, :]
        keep = torch.arange(K) < where  # (B, 1, Q, K); "key" needs Q == K
    if mask is not None and m.mask_rule != "ignore":
        rule = ~mask if m.mask_rule == "inverted" else mask  # (Q, K)
        if keep is None:
            keep = rule[None, None]
        else:
            keep = keep | rule if m.mask_rule == "or" else keep & rule
    return keep


def _variant(net, queries, keys, values, valid_lens=None, mask=None, **switches):
    """(output (B, Q, D), weights (B, H, Q, K)) with switchable mistakes (``_Switches``); the defaults are right."""
    m = _Switches(**switches)
    H = net.num_heads if m.split else 1
    d = net.num_hiddens // H

    def heads(x):  # (B, T, H*d) -> (B, H, T, d)
        return x.unflatten(-1, (H, d)).transpose(1, 2)

    q, k, v = heads(net.W_q(queries)), heads(net.W_k(keys)), heads(net.W_v(values))
    scores = q @ k.transpose(-2, -1)  # (B, H, Q, K)
    scores = scores / {"head": math.sqrt(d), "model": math.sqrt(H * d), None: 1.0}[m.scale]
    keep = _keep(valid_lens, mask, q.shape[2], k.shape[2], m)
    if keep is not None:
        scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    weights = torch.softmax(scores, dim=m.softmax_dim)
    if keep is not None and m.empty == "zero":
        weights = weights * keep  # hidden keys exactly 0, and a query with no visible key all 0
    out = weights @ v  # (B, H, Q, d)
    if m.concat == "blocks":
        cat = out.transpose(1, 2).flatten(2)  # (B, Q, H*d): head h in features h*d .. (h+1)*d - 1
    elif m.concat == "interleaved":
        cat = out.permute(0, 2, 3, 1).flatten(2)  # (B, Q, d*H)
    elif m.concat == "no_transpose":
        cat = out.reshape(out.shape[0], out.shape[2], -1)  # reads (B, H, Q, d) in memory order
    else:  # "reversed"
        cat = out.flip(1).transpose(1, 2).flatten(2)
    return (net.W_o(cat) if m.use_wo else cat), weights


_NEVER_SPLIT = "the features were never split into heads: this is single-head attention over all num_hiddens features"
_WEIGHT_MISTAKES = [
    ("forgot the 1/sqrt(d) scale on the scores", dict(scale=None)),
    (
        "scaled by 1/sqrt(num_hiddens); the scale uses the size of one head, d = num_hiddens / num_heads",
        dict(scale="model"),
    ),
    (
        "valid_lens is read along the keys: valid_lens[b, i] is how many keys *query* i may see, so it belongs "
        "on the query axis of the (B, H, Q, K) scores",
        dict(lens_rule="key"),
    ),
    ("valid_lens is ignored: keys beyond each query's length still receive weight", dict(lens_rule="ignore")),
    ("the mask is ignored: keys it hides (False) still receive weight", dict(mask_rule="ignore")),
    (
        "the mask is inverted: here True means *may attend* (as in the package), not nn.MultiheadAttention's "
        "True = ignore",
        dict(mask_rule="inverted"),
    ),
    ("the two masks were joined with 'or': a key is visible only where valid_lens *and* mask allow it", dict(mask_rule="or")),
    (_NEVER_SPLIT, dict(split=False, scale="model")),
    ("softmax over the wrong axis: the weights must sum to 1 over the keys (dim=-1), not the queries", dict(softmax_dim=-2)),
]  # fmt: skip

_OUTPUT_MISTAKES = [
    ("forgot the output projection: the concatenated heads must go through W_o", dict(use_wo=False)),
    (
        "heads concatenated in the wrong order: their features come out interleaved (merged as (d, H)); "
        "head h must fill features h*d .. (h+1)*d - 1 before W_o",
        dict(concat="interleaved"),
    ),
    (
        "heads concatenated in the wrong order (last head first); head h must fill features h*d .. (h+1)*d - 1",
        dict(concat="reversed"),
    ),
    (
        "heads merged without the transpose: reshaping (B, H, Q, d) straight to (B, Q, H*d) mixes positions and "
        "heads; transpose to (B, Q, H, d) first, then flatten the last two axes",
        dict(concat="no_transpose"),
    ),
]


def _applies(flags, valid_lens, mask, Q, K) -> bool:
    """Whether a mistake can show in a case (a length mistake needs lengths, a mask mistake a mask, ...)."""
    if "lens_rule" in flags and (valid_lens is None or (flags["lens_rule"] == "key" and Q != K)):
        return False
    if "mask_rule" in flags and (mask is None or (flags["mask_rule"] == "or" and valid_lens is None)):
        return False
    return True


def _forward_cases():
    """(net, queries, keys, values, valid_lens, mask, description), seeded; every query sees at least one key."""
    g = torch.Generator().manual_seed(4)
    cases = []
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        torch.manual_seed(40)
        net = _NoForward(16, 4, bias=False).eval()
        X = torch.randn(2, 5, 16, generator=g)
        lens = torch.tensor([[3, 2, 2, 5, 4], [1, 4, 3, 2, 5]])  # (B, Q): query i of example b sees lens[b, i] keys
        causal = masks.causal_mask(5)  # (Q, K)
        text = "self-attention, num_hiddens=16, 4 heads, "
        cases.append((net, X, X, X, lens, causal, text + "valid_lens (2, 5) and a causal mask"))
        cases.append((net, X, X, X, None, causal, text + "a causal mask, valid_lens=None"))
        cases.append((net, X, X, X, lens, None, text + "valid_lens (2, 5), mask=None"))
        net = _NoForward(12, 3, bias=True, query_size=6, key_size=10, value_size=7).eval()
        q = torch.randn(2, 3, 6, generator=g)  # (B, Q, query_size)
        k, v = torch.randn(2, 5, 10, generator=g), torch.randn(2, 5, 7, generator=g)  # (B, K, key/value_size)
        lens = torch.tensor([[2, 5, 1], [4, 4, 3]])
        cases.append(
            (net, q, k, v, lens, masks.causal_mask(3, 5), "cross-attention with bias, 3 heads, 3 queries, 5 keys, "
             "valid_lens (2, 3) and causal_mask(3, 5)")
        )  # fmt: skip
    return cases


def _expect_weights_layout(weights, expected, case):
    weights = expect_tensor(weights, case + " (weights)")
    B, H, Q, K = expected.shape
    if tuple(weights.shape) == (B * H, Q, K):
        raise CheckFailed(f"{case}: the weights are in the folded layout (B*H, Q, K); return them as (B, H, Q, K)")
    if tuple(weights.shape) == (B, 1, Q, K) and H > 1:
        raise CheckFailed(f"{case}: weights of shape (B, 1, Q, K): {_NEVER_SPLIT}")
    if tuple(weights.shape) == (B, Q, K):
        raise CheckFailed(f"{case}: the weights have shape (B, Q, K); return one map per head, (B, H, Q, K)")
    if tuple(weights.shape) != (B, H, Q, K):
        raise CheckFailed(f"{case}: weights of shape {tuple(weights.shape)}, expected (B, H, Q, K) = {(B, H, Q, K)}")
    return weights.detach().cpu()


def _diagnose_one(net, q, k, v, valid_lens, mask, actual, case):
    """Compare one case's (output, weights) with the reference; raise naming the mistake when they differ."""
    expected = MultiHeadAttention.forward(net, q, k, v, valid_lens, mask)  # the package's reference
    expected_w = net.attention_weights  # (B, H, Q, K)
    if not isinstance(actual, tuple | list) or len(actual) != 2:
        raise CheckFailed(f"{case}: return a pair (output, weights), got {type(actual).__name__}")
    output, weights = actual
    weights = _expect_weights_layout(weights, expected_w, case)
    Q, K = expected_w.shape[-2:]
    candidates = (
        (message, _variant(net, q, k, v, valid_lens, mask, **flags, empty=empty)[1])
        for message, flags in _WEIGHT_MISTAKES
        if _applies(flags, valid_lens, mask, Q, K)
        for empty in ("zero", "uniform")
    )
    if torch.isnan(weights).any():  # -inf filled into a row with no visible key: name the mask that emptied it
        candidates = ((message, w) for message, w in candidates if not w.isnan().any())
        diagnose(weights.nan_to_num(0.0), expected_w, candidates, case + " (weights)", otherwise=None)
    diagnose(weights, expected_w, candidates, case + " (weights)", atol=1e-5, rtol=1e-5)
    output = expect_tensor(output, case + " (output)").detach().cpu()
    candidates = (
        (message, _variant(net, q, k, v, valid_lens, mask, **flags)[0]) for message, flags in _OUTPUT_MISTAKES
    )
    diagnose(output, expected, candidates, case + " (output)", atol=1e-5, rtol=1e-5)


def _none_hint(valid_lens, mask) -> str:
    """What to say when the learner's code crashes on a case where one argument is None."""
    missing = [name for name, value in (("valid_lens", valid_lens), ("mask", mask)) if value is None]
    if not missing:
        return ""
    return f" -- here {' and '.join(missing)} is None, which the exercise allows: None hides no key"


@friendly
def check_mha_forward(fn) -> None:
    """``fn(net, queries, keys, values, valid_lens=None, mask=None)`` -> (output (B, Q, num_hiddens), weights
    (B, H, Q, K)), as ``net`` gives them, with valid_lens (B, Q) and a bool mask (Q, K), True = may attend."""
    cases = _forward_cases()
    for net, q, k, v, valid_lens, mask, case in cases:
        before = {name: p.detach().clone() for name, p in net.state_dict().items()}
        with torch.no_grad():
            lens = None if valid_lens is None else valid_lens.clone()
            keep = None if mask is None else mask.clone()
            with _no_package_attention():
                actual = call(
                    fn, net, q.clone(), k.clone(), v.clone(), lens, keep, case=case, hint=_none_hint(lens, keep)
                )
            for name, p in net.state_dict().items():
                if not torch.equal(p, before[name]):
                    raise CheckFailed(f"{case}: your function changed net.{name}; it must only read the weights")
            _diagnose_one(net, q, k, v, valid_lens, mask, actual, case)
    passed("check_mha_forward", len(cases))
