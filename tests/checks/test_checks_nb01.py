"""The exercise checks of notebook 01 pass right answers and name typical wrong ones."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

import mha_tutorial
from mha_tutorial import checks

from testkit import fails_with

# --------------------------------------------------------------------------- notebook 01, exercise 1: softmax


def softmax_right(scores):
    shifted = scores - scores.max(dim=-1, keepdim=True).values
    e = shifted.exp()
    return e / e.sum(dim=-1, keepdim=True)


def softmax_over(scores, dim):
    """A softmax by hand over any axis, for the wrong-axis mistakes (torch.softmax itself is refused)."""
    shifted = scores - scores.amax(dim=dim, keepdim=True)
    return shifted.exp() / shifted.exp().sum(dim=dim, keepdim=True)


def test_softmax_right_answers_pass(capsys):
    checks.check_softmax(softmax_right)
    assert "✓ check_softmax" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda s: torch.softmax(s, dim=-1), "torch.softmax"),
        (lambda s: s.softmax(-1), "torch.softmax"),
        (lambda s: F.softmax(s, dim=-1), "F.softmax"),
        (mha_tutorial.masked_softmax, "mha_tutorial.masked_softmax"),
        (lambda s: mha_tutorial.masked_softmax(s), "mha_tutorial.masked_softmax"),
    ],
)
def test_softmax_refuses_ready_made_softmax(fn, fragment):
    fails_with(checks.check_softmax, fn, fragment, "write that step yourself")


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda s: softmax_over(s, -2), "wrong axis"),
        (lambda s: softmax_over(s, 1), "wrong axis"),
        (lambda s: softmax_over(s, 2), "wrong axis"),  # right for 3-D, wrong once a head axis appears
        (lambda s: s.exp() / s.exp().sum(dim=-1, keepdim=True), "subtract each row's maximum"),
        (lambda s: (s - s.max()).exp() / (s - s.max()).exp().sum(dim=-1, keepdim=True), "not the whole tensor's"),
        (lambda s: (s - s.max(dim=-1, keepdim=True)).exp(), "use .values, or torch.amax"),
        (lambda s: (s - s.max(-1, keepdim=True).values).exp(), None),
        (lambda s: s.exp() / s.exp().sum(), None),
        (
            lambda s: (s - s.max(-1, keepdim=True).values).exp() / (s - s.max(-1, keepdim=True).values).exp().sum(-1),
            None,
        ),
    ],
)
def test_softmax_mistakes_fail(fn, fragment):
    fails_with(checks.check_softmax, fn, *([fragment] if fragment else []))


def test_softmax_wrong_axis_is_named():
    fails_with(checks.check_softmax, lambda s: softmax_over(s, -2), "over the queries (dim=-2)")


def test_softmax_inplace_is_named():
    def inplace(s):
        s -= s.max(-1, keepdim=True).values
        return s.exp() / s.exp().sum(-1, keepdim=True)

    fails_with(checks.check_softmax, inplace, "in place")


# --------------------------------------------------------------------------- notebook 01, exercise 2: attention


def attention_right(queries, keys, values, temperature=1.0):
    d = queries.shape[-1]
    scores = queries @ keys.transpose(-2, -1) / (math.sqrt(d) * temperature)
    weights = torch.softmax(scores, dim=-1)
    return weights @ values, weights


def make_attention(scale=None, dim=-1, temperature_mode="divide", transpose="last2", out="weights@values"):
    def fn(queries, keys, values, temperature=1.0):
        d = queries.shape[-1]
        s = 1 / math.sqrt(d) if scale is None else scale(d)
        kt = keys.transpose(-2, -1) if transpose == "last2" else keys.transpose(1, 2)
        scores = queries @ kt * s
        if transpose == "KQ":
            scores = keys @ queries.transpose(-2, -1) * s
        scores = {"divide": scores / temperature, "multiply": scores * temperature, "ignore": scores}[temperature_mode]
        weights = torch.softmax(scores, dim=dim)
        output = weights @ values if out == "weights@values" else weights.transpose(-2, -1) @ values
        return output, weights

    return fn


def test_attention_right_answer_passes(capsys):
    checks.check_temperature_attention(attention_right)
    assert "✓ check_temperature_attention" in capsys.readouterr().out


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (make_attention(scale=lambda d: 1.0), "forgot the 1/sqrt(d) scale"),
        (make_attention(scale=lambda d: 1.0 / d), "divided by d instead of sqrt(d)"),
        (make_attention(scale=lambda d: math.sqrt(d)), "multiplied by sqrt(d)"),
        (make_attention(dim=-2), "softmax over the wrong axis"),
        (make_attention(temperature_mode="multiply"), "multiplied by the temperature"),
        (make_attention(temperature_mode="ignore"), "temperature is ignored"),
        (make_attention(transpose="KQ"), "K Q^T"),
        (make_attention(transpose="1,2"), "transpose(1, 2)"),
        (make_attention(out="weights^T@values"), "transposed weights"),
        (lambda q, k, v, t=1.0: attention_right(q, k, v, t)[0], "return a pair"),
    ],
)
def test_attention_mistakes_are_named(fn, fragment):
    fails_with(checks.check_temperature_attention, fn, fragment)


def test_attention_keys_dot_T_is_reported():
    def with_T(queries, keys, values, temperature=1.0):
        weights = torch.softmax(queries @ keys.T / (math.sqrt(queries.shape[-1]) * temperature), dim=-1)
        return weights @ values, weights

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fails_with(checks.check_temperature_attention, with_T, "keys.T")


# --------------------------------------------------------------------------- notebook 01, exercise 3: entropy


def test_entropy_right_answers_pass():
    checks.check_attention_entropy(lambda w: -torch.xlogy(w, w).sum(dim=-1))
    checks.check_attention_entropy(lambda w: -(w * torch.log(w.clamp_min(1e-30))).sum(dim=-1))


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda w: -(w * torch.log(w)).sum(dim=-1), "0 * log 0"),
        (lambda w: (w * torch.log(w.clamp_min(1e-30))).sum(dim=-1), "minus sign"),
        (lambda w: -torch.xlogy(w, w).sum(dim=-1) / math.log(2), "log base 2"),
        (lambda w: -torch.xlogy(w, w).mean(dim=-1), "mean instead of sum"),
        (lambda w: -torch.xlogy(w, w).sum(dim=-1, keepdim=True), "keepdim=False"),
        (lambda w: -torch.xlogy(w, w).sum(dim=-2), "sum over the keys"),
    ],
)
def test_entropy_mistakes_are_named(fn, fragment):
    fails_with(checks.check_attention_entropy, fn, fragment)


def test_checks_are_exported():
    from mha_tutorial.checks import nb01

    assert set(nb01.__all__) == {
        "check_softmax",
        "check_colleague_bugs",
        "check_temperature_attention",
        "check_attention_entropy",
    }
    for name in nb01.__all__:
        assert callable(getattr(checks, name))


def test_reference_softmax_is_F_softmax():
    # sanity for the test helpers themselves
    s = torch.randn(2, 3, 4)
    assert torch.allclose(softmax_right(s), F.softmax(s, dim=-1))


@pytest.mark.parametrize(
    "fn",
    [
        lambda q, k, v, t=1.0: mha_tutorial.scaled_dot_product_attention(q / t, k, v),
        lambda q, k, v, t=1.0: (F.scaled_dot_product_attention(q / t, k, v), None),
    ],
)
def test_temperature_attention_refuses_the_package(fn):
    fails_with(checks.check_temperature_attention, fn, "scaled_dot_product_attention", "write that step yourself")


def test_entropy_nan_message_does_not_give_the_answer():
    message = fails_with(checks.check_attention_entropy, lambda w: -(w * w.log()).sum(dim=-1), "NaN")
    assert "xlogy" not in message


def attention_d_from(axis):
    def fn(queries, keys, values, temperature=1.0):
        d = queries.shape[axis]
        weights = torch.softmax(queries @ keys.transpose(-2, -1) / (math.sqrt(d) * temperature), dim=-1)
        return weights @ values, weights

    return fn


@pytest.mark.parametrize("axis", [1, -2])
def test_attention_scale_from_the_wrong_axis_is_named(axis):
    fails_with(checks.check_temperature_attention, attention_d_from(axis), "wrong size", "queries.shape[-1]")


def colleague(fix_d=False, fix_temperature=False, fix_output=False):
    """Exercise 2's buggy attention, with some of its three bugs fixed."""

    def fn(queries, keys, values, temperature=1.0):
        d = queries.shape[-1] if fix_d else queries.shape[1]
        scores = queries @ keys.transpose(-2, -1)
        scores = scores / (math.sqrt(d) * temperature) if fix_temperature else scores / math.sqrt(d) * temperature
        weights = torch.softmax(scores, dim=-1)
        return (weights @ values if fix_output else weights.mT @ values), weights

    return fn


@pytest.mark.parametrize(
    "fixes, fragment",
    [
        ({}, "wrong size"),
        ({"fix_d": True}, "transposed weights"),
        ({"fix_d": True, "fix_output": True}, "multiplied by the temperature"),
        ({"fix_d": True, "fix_temperature": True}, "transposed weights"),
        ({"fix_output": True, "fix_temperature": True}, "wrong size"),
    ],
)
def test_the_colleagues_bugs_are_named_one_at_a_time(fixes, fragment):
    fails_with(checks.check_temperature_attention, colleague(**fixes), fragment)


def test_the_colleagues_function_fixed_passes(capsys):
    checks.check_temperature_attention(colleague(fix_d=True, fix_temperature=True, fix_output=True))
    assert "✓ check_temperature_attention" in capsys.readouterr().out


# --------------------------------------------------------------------------- notebook 01, exercise 2a: the bugs named


def test_the_colleagues_bugs_named_pass(capsys):
    checks.check_colleague_bugs(lambda: {"A", "C", "E"})
    checks.check_colleague_bugs(lambda: ["e", "a", "c"])
    assert capsys.readouterr().out.count("✓ check_colleague_bugs") == 2


@pytest.mark.parametrize(
    "answer, fragments",
    [
        ({"A", "B", "C"}, ["at least one of these lines is right", "3 queries against 5 keys"]),
        ({"A", "C", "D"}, ["at least one of these lines is right", "section 3's weights"]),
        ({"C", "E"}, ["each of these lines holds a bug", "1 more bug is still to find"]),
        ({"A"}, ["each of these lines holds a bug", "2 more bugs are still to find", "tau = 0.5"]),
        ({"A", "B", "C", "D", "E"}, ["you named 5 lines", "3 bugs"]),
        (set(), ["is empty"]),
        ({"A", "F"}, ["'F' is not a line"]),
        ("ACE", ["return a set of letters"]),
    ],
)
def test_wrong_bug_lists_are_named(answer, fragments):
    fails_with(checks.check_colleague_bugs, lambda: answer, *fragments)


@pytest.mark.parametrize("answer", [{"A"}, {"A", "B", "D"}, {"B", "D"}, {"B", "C", "D"}, {"C", "E"}])
def test_the_bugs_not_named_are_not_given_away(answer):
    """No wrong answer is told which line is right or which line is a bug: five lines, three bugs, so either would
    give the rest away by elimination."""
    message = fails_with(checks.check_colleague_bugs, lambda: answer)
    for letter in "ABCDE":
        assert f"line {letter}" not in message and f"{letter} is" not in message and f"{letter} and" not in message


def test_two_wrong_answers_with_the_same_size_get_the_same_message():
    """Past the echo of the letters, the message is the same for any guess that names a right line."""
    first = fails_with(checks.check_colleague_bugs, lambda: {"A", "B", "D"})
    second = fails_with(checks.check_colleague_bugs, lambda: {"B", "C", "D"})
    assert first.split("]", 1)[1] == second.split("]", 1)[1]


def test_an_unwritten_bug_list_is_not_attempted(capsys):
    def stub():
        raise NotImplementedError("Exercise 2a: not written yet")

    checks.check_colleague_bugs(stub)
    assert "not attempted yet" in capsys.readouterr().out


def test_the_named_bugs_are_the_colleagues_real_bugs():
    """Each line the check calls a bug, fixed alone, changes the colleague's answer; the others are right."""
    q, k, v = torch.randn(2, 3, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 6)
    right_out, right_w = attention_right(q, k, v, 2.0)
    assert torch.allclose(colleague(fix_d=True, fix_temperature=True, fix_output=True)(q, k, v, 2.0)[1], right_w)
    for fixes in ({"fix_temperature": True, "fix_output": True}, {"fix_d": True, "fix_output": True}):
        assert not torch.allclose(colleague(**fixes)(q, k, v, 2.0)[1], right_w)
    with pytest.raises(RuntimeError):
        colleague(fix_d=True, fix_temperature=True)(q, k, v, 2.0)
