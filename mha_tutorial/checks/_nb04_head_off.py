"""The check of notebook 04's exercise "switch one head off" (re-exported by ``nb04``).

The learner edits the weights of a copy of the net so that one head no longer contributes; the check compares
with ``head_mask`` and, when the output differs, names the typical mistake it reproduces (rows of W_o instead of
columns, W_o's bias zeroed too, the wrong head, ...).
"""

from __future__ import annotations

import contextlib
import copy

import torch

from ..core.mha import MultiHeadAttention
from ._common import CheckFailed, call, expect_close, expect_shape, expect_tensor, friendly, passed


class _NoHeadMask(MultiHeadAttention):
    """A MultiHeadAttention that refuses ``head_mask``: the exercise is to get the same effect from the weights."""

    def forward(self, queries, keys, values, valid_lens=None, mask=None, head_mask=None, **kwargs):
        if head_mask is not None:
            raise CheckFailed("solve it without head_mask: change the weights of a copy of the net instead")
        return super().forward(queries, keys, values, valid_lens, mask, **kwargs)


@contextlib.contextmanager
def _no_head_mask_anywhere():
    """While the learner's code runs, ``MultiHeadAttention.forward`` refuses a ``head_mask`` however it is called
    (``MultiHeadAttention.forward(net, ..., head_mask=...)`` skips ``_NoHeadMask.forward``)."""
    original = MultiHeadAttention.__dict__["forward"]

    def forward(self, queries, keys, values, valid_lens=None, mask=None, head_mask=None, *rest, **kwargs):
        if head_mask is not None:
            raise CheckFailed("solve it without head_mask: change the weights of a copy of the net instead")
        return original(self, queries, keys, values, valid_lens, mask, None, *rest, **kwargs)

    MultiHeadAttention.forward = forward
    try:
        yield
    finally:
        MultiHeadAttention.forward = original


def _off_by_weights(net, X, h, zero):
    """Run a copy of ``net`` on X after ``zero(copy, cols)`` edits its weights (cols = head h's block)."""
    other = copy.deepcopy(net)
    cols = slice(h * net.head_size, (h + 1) * net.head_size)
    with torch.no_grad():
        zero(other, cols)
    return MultiHeadAttention.forward(other, X, X, X)


def _zero_rows_of_wo(m, cols):
    m.W_o.weight[cols] = 0


def _zero_cols_and_bias_of_wo(m, cols):
    m.W_o.weight[:, cols] = 0
    m.W_o.bias.zero_()


def _zero_wq_rows(m, cols):
    m.W_q.weight[cols] = 0
    if m.W_q.bias is not None:
        m.W_q.bias[cols] = 0


def _zero_wq_rows_not_bias(m, cols):
    m.W_q.weight[cols] = 0


def _zero_wv_rows_not_bias(m, cols):
    m.W_v.weight[cols] = 0


def _head_off_mistakes(net, X, h):
    """(message, what that mistake computes) for the ways of switching head ``h`` of ``net`` off wrongly."""
    candidates = [
        ("nothing was switched off: this is the output with all heads on", MultiHeadAttention.forward(net, X, X, X)),
        (
            "zeroed rows of W_o.weight: nn.Linear stores its weight as (out_features, in_features), so "
            "head h's part of the concatenation is the columns W_o.weight[:, h*d:(h+1)*d]",
            _off_by_weights(net, X, h, _zero_rows_of_wo),
        ),
        (
            "zeroing W_q's rows of head h only makes that head attend uniformly: it still adds the "
            "average of its values; zero its contribution (W_o's columns, or W_v's rows and bias) instead",
            _off_by_weights(net, X, h, _zero_wq_rows),
        ),
    ]
    if net.W_o.bias is not None:
        candidates.append(
            (
                "zeroed W_q's weight rows of head h but not its bias: every query of head h becomes that bias, so "
                "the head still attends (the same way from every position) and adds a mix of its values; zero its "
                "contribution (W_o's columns, or W_v's rows and bias) instead",
                _off_by_weights(net, X, h, _zero_wq_rows_not_bias),
            )
        )
        candidates.append(
            (
                "zeroed W_o's bias as well: the bias belongs to no head, switching one head off leaves it",
                _off_by_weights(net, X, h, _zero_cols_and_bias_of_wo),
            )
        )
        candidates.append(
            (
                "zeroed W_v's weight rows for head h but not its bias: the head still passes on the bias",
                _off_by_weights(net, X, h, _zero_wv_rows_not_bias),
            )
        )
    for j in range(net.num_heads):
        if j != h:
            gates = torch.ones(net.num_heads)
            gates[j] = 0
            candidates.append(
                (
                    f"switched off head {j} instead of head {h}: head h owns features h*d .. (h+1)*d - 1 "
                    f"with d = num_hiddens / num_heads = {net.head_size}",
                    MultiHeadAttention.forward(net, X, X, X, head_mask=gates),
                )
            )
    return candidates


@friendly
def check_head_off(fn) -> None:
    """``fn(net, X, h)`` -> self-attention output of ``net`` on X with head h switched off, without head_mask."""
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        torch.manual_seed(41)
        nets = [_NoHeadMask(16, 4, bias=True).eval(), _NoHeadMask(12, 3, bias=False).eval()]
        g = torch.Generator().manual_seed(5)
        inputs = [torch.randn(2, 5, 16, generator=g), torch.randn(2, 4, 12, generator=g)]
    cases = [(nets[0], inputs[0], 1), (nets[0], inputs[0], 3), (nets[1], inputs[1], 0)]
    for net, X, h in cases:
        H = net.num_heads
        case = f"num_hiddens={net.num_hiddens}, {H} heads, bias={net.W_o.bias is not None}, head h={h}"
        before = {name: p.detach().clone() for name, p in net.state_dict().items()}
        with torch.no_grad():
            gates = torch.ones(H)
            gates[h] = 0
            expected = MultiHeadAttention.forward(net, X, X, X, head_mask=gates)
            with _no_head_mask_anywhere():
                actual = call(fn, net, X.clone(), h, case=case)
        for name, p in net.state_dict().items():
            if not torch.equal(p, before[name]):
                raise CheckFailed(
                    f"{case}: your function changed net.{name} in place; edit a copy (copy.deepcopy(net)) "
                    f"so that the original net keeps all its heads"
                )
        actual = expect_tensor(actual, case).detach().cpu()
        expect_shape(actual, expected.shape, case)
        if torch.allclose(actual, expected, atol=1e-5, rtol=1e-5):
            continue
        with torch.no_grad():
            for message, wrong in _head_off_mistakes(net, X, h):
                if torch.allclose(actual, wrong, atol=1e-5, rtol=1e-5):
                    raise CheckFailed(f"{case}: {message}")
        expect_close(actual, expected, case)
    passed("check_head_off", len(cases))
