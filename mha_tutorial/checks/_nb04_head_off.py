"""The check of notebook 04's exercise "switch one head off through W_v" (re-exported by ``nb04``).

The learner returns a copy of the net in which head h contributes nothing, with only the value projection edited
(W_o stays as it is). The check runs that copy on inputs of its own, compares with ``head_mask`` and, when the
output differs, names the mistake it reproduces: W_v's bias slice left in place (the trap on a biased net: the
weights sum to 1, so the bias passes through), columns instead of rows, W_q's or W_k's rows zeroed instead, ...
The net without biases comes first, so a learner meets the bias only once the rest is right.
"""

from __future__ import annotations

import copy

import torch

from ..core.mha import MultiHeadAttention
from ._common import CheckFailed, call, diagnose, friendly, passed


def _edited(net, h, zero):
    """A copy of ``net`` after ``zero(copy, rows)`` edits its weights (rows = head h's block of features)."""
    other = copy.deepcopy(net)
    rows = slice(h * net.head_size, (h + 1) * net.head_size)
    with torch.no_grad():
        zero(other, rows)
    return other


def _wv_rows_and_bias(m, rows):  # the right answer
    m.W_v.weight[rows] = 0
    if m.W_v.bias is not None:
        m.W_v.bias[rows] = 0


def _wv_rows_only(m, rows):
    m.W_v.weight[rows] = 0


def _wv_columns(m, rows):
    m.W_v.weight[:, rows] = 0
    if m.W_v.bias is not None:
        m.W_v.bias[rows] = 0


def _wv_rows_and_all_bias(m, rows):
    m.W_v.weight[rows] = 0
    m.W_v.bias.zero_()


def _wq_rows_and_bias(m, rows):
    m.W_q.weight[rows] = 0
    if m.W_q.bias is not None:
        m.W_q.bias[rows] = 0


def _wq_rows_only(m, rows):
    m.W_q.weight[rows] = 0


_MISTAKES = [
    (
        "zeroed W_v's weight rows of head h only, not its bias: the attention weights of every query sum to 1, "
        "so head h still returns its slice of W_v.bias at every position, and W_o carries it into the output",
        _wv_rows_only,
        True,
    ),
    (
        "zeroed columns of W_v.weight: nn.Linear stores its weight as (out_features, in_features), so head h's "
        "values come from the rows W_v.weight[h*d:(h+1)*d]",
        _wv_columns,
        False,
    ),
    ("zeroed all of W_v's bias: only head h's slice W_v.bias[h*d:(h+1)*d] is head h's", _wv_rows_and_all_bias, True),
    (
        "zeroed W_q's rows of head h (or W_k's: the same effect): that only makes the head attend uniformly (all "
        "its scores equal), so it still adds the average of its values; the head's output is made of its values",
        _wq_rows_and_bias,
        False,
    ),
    (
        "zeroed W_q's weight rows only: every query of head h becomes its slice of W_q.bias, so the head still "
        "attends (the same way from every position) and adds a mix of its values",
        _wq_rows_only,
        True,
    ),
]


def _head_off_mistakes(net, h):
    """(message, the net that mistake gives) for the ways of switching head ``h`` of ``net`` off wrongly."""
    yield "nothing was switched off: this is the output with all heads on", net
    has_bias = net.W_v.bias is not None
    for message, zero, needs_bias in _MISTAKES:
        if has_bias or not needs_bias:
            yield message, _edited(net, h, zero)
    for j in range(net.num_heads):
        if j != h:
            yield (
                f"switched off head {j} instead of head {h}: head h owns features h*d .. (h+1)*d - 1 "
                f"with d = num_hiddens / num_heads = {net.head_size}",
                _edited(net, j, _wv_rows_and_bias),
            )


def _run(net, X):
    return MultiHeadAttention.forward(net, X, X, X)  # the class's forward, whatever the object's class


def _expect_copy(silent, net, before, case):
    """``silent`` must be an edited copy of ``net``, with ``net`` and W_o untouched."""
    if isinstance(silent, torch.Tensor):
        raise CheckFailed(f"{case}: you returned a tensor; return the edited copy of the net itself")
    if not isinstance(silent, MultiHeadAttention):
        raise CheckFailed(
            f"{case}: return the edited copy of the net (a MultiHeadAttention), got {type(silent).__name__}"
        )
    for name, p in net.state_dict().items():
        if not torch.equal(p, before[name]):
            raise CheckFailed(
                f"{case}: your function changed net.{name} in place; edit a copy (copy.deepcopy(net)) "
                "so that the original net keeps all its heads"
            )
    for name, p in silent.W_o.state_dict().items():
        if not torch.equal(p, before["W_o." + name]):
            raise CheckFailed(
                f"{case}: W_o.{name} was changed; this exercise goes through the values: leave W_o as it is and "
                "edit W_v only"
            )


@friendly
def check_head_off(fn) -> None:
    """``fn(net, h)`` -> a copy of ``net`` whose output equals ``net``'s with ``head_mask`` 0 for head h, with
    only the value projection W_v edited."""
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        torch.manual_seed(41)
        nets = [MultiHeadAttention(12, 3, bias=False).eval(), MultiHeadAttention(16, 4, bias=True).eval()]
        g = torch.Generator().manual_seed(5)
        inputs = [torch.randn(2, 4, 12, generator=g), torch.randn(2, 5, 16, generator=g)]
    cases = [(nets[0], inputs[0], 0), (nets[1], inputs[1], 1), (nets[1], inputs[1], 3)]  # bias=False first
    for net, X, h in cases:
        H = net.num_heads
        case = f"num_hiddens={net.num_hiddens}, {H} heads, bias={net.W_v.bias is not None}, head h={h}"
        before = {name: p.detach().clone() for name, p in net.state_dict().items()}
        silent = call(fn, net, h, case=case)
        _expect_copy(silent, net, before, case)
        gates = torch.ones(H)
        gates[h] = 0
        with torch.no_grad():
            expected = MultiHeadAttention.forward(net, X, X, X, head_mask=gates)
            mistakes = ((message, _run(wrong, X)) for message, wrong in _head_off_mistakes(net, h))
            diagnose(_run(silent, X), expected, mistakes, case, atol=1e-5, rtol=1e-5)
    passed("check_head_off", len(cases))
