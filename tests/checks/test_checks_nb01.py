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


# --------------------------------------------------------------------------- notebook 01, exercise 2: the colleague


def attention_right(queries, keys, values, temperature=1.0):
    d = queries.shape[-1]
    scores = queries @ keys.transpose(-2, -1) / (math.sqrt(d) * temperature)
    weights = torch.softmax(scores, dim=-1)
    return weights @ values, weights


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
        "check_attention_entropy",
        "check_entropy_limits",
    }
    for name in nb01.__all__:
        assert callable(getattr(checks, name))


def test_reference_softmax_is_F_softmax():
    # sanity for the test helpers themselves
    s = torch.randn(2, 3, 4)
    assert torch.allclose(softmax_right(s), F.softmax(s, dim=-1))


def test_entropy_nan_message_does_not_give_the_answer():
    message = fails_with(checks.check_attention_entropy, lambda w: -(w * w.log()).sum(dim=-1), "NaN")
    assert "xlogy" not in message


def colleague(fix_d=False, fix_temperature=False, fix_output=False):
    """Exercise 2's buggy attention, with some of its three bugs fixed."""

    def fn(queries, keys, values, temperature=1.0):
        d = queries.shape[-1] if fix_d else queries.shape[1]
        scores = queries @ keys.transpose(-2, -1)
        scores = scores / (math.sqrt(d) * temperature) if fix_temperature else scores / math.sqrt(d) * temperature
        weights = torch.softmax(scores, dim=-1)
        return (weights @ values if fix_output else weights.mT @ values), weights

    return fn


# --------------------------------------------------------------------------- notebook 01, exercise 2: the bugs named


def test_the_colleagues_bugs_named_pass(capsys):
    checks.check_colleague_bugs(lambda: {"A", "C", "E"})
    checks.check_colleague_bugs(lambda: ["e", "a", "c"])
    assert capsys.readouterr().out.count("✓ check_colleague_bugs") == 2


@pytest.mark.parametrize(
    "answer, fragments",
    [
        ({"A", "B", "C"}, ["at least one of these lines is right", "3 queries against 5 keys"]),
        ({"A", "C", "D"}, ["at least one of these lines is right", "section 3's weights"]),
        ({"C", "E"}, ["you named 2 lines", "only a full answer gets a verdict"]),
        ({"A"}, ["you named 1 line;", "only a full answer gets a verdict", "tau = 0.5"]),
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


@pytest.mark.parametrize("first, second", [({"A"}, {"B"}), ({"C", "E"}, {"B", "D"})])
def test_a_partial_answer_gets_the_same_message_whether_its_lines_are_bugs_or_not(first, second):
    """One- or two-letter guesses learn nothing about their lines: a bug and a right line get the same answer."""
    assert fails_with(checks.check_colleague_bugs, lambda: first) == fails_with(
        checks.check_colleague_bugs, lambda: second
    )


def test_an_unwritten_bug_list_is_not_attempted(capsys):
    def stub():
        raise NotImplementedError("Exercise 2: not written yet")

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


# --------------------------------------------------------------------------- notebook 01, exercise 4: entropy limits


def limits_right(scores):
    ties = (scores == scores.amax(dim=-1, keepdim=True)).sum(dim=-1)  # (..., Q): tied best keys
    return ties.double().log().mean().item(), math.log(scores.shape[-1])


def limits_by_brute_force(scores, tau):
    """What the prediction must match: the mean entropy of softmax(scores / tau) at an extreme tau."""
    w = torch.softmax(scores.double() / tau, dim=-1)
    return -torch.xlogy(w, w).sum(dim=-1).mean().item()


def test_entropy_limits_right_answers_pass(capsys):
    checks.check_entropy_limits(limits_right)
    checks.check_entropy_limits(lambda s: [torch.tensor(x) for x in limits_right(s)])
    assert capsys.readouterr().out.count("✓ check_entropy_limits") == 2


def test_entropy_limits_are_the_brute_force_limits():
    from mha_tutorial.checks import nb01

    for _, scores in nb01._LIMIT_CASES:
        low, high = limits_right(scores)
        assert abs(limits_by_brute_force(scores, 1e-3) - low) < 1e-6
        assert abs(limits_by_brute_force(scores, 1e6) - high) < 1e-6


def _ties(s):
    return (s == s.amax(dim=-1, keepdim=True)).sum(dim=-1).double()


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda s: limits_right(s)[::-1], "swapped"),
        (lambda s: tuple(x / math.log(2) for x in limits_right(s)), "base 2"),
        (lambda s: (0.0, math.log(s.shape[-1])), "tied best keys"),
        (lambda s: (_ties(s).mean().item(), math.log(s.shape[-1])), "log n, not n"),
        (lambda s: (_ties(s).mean().log().item(), math.log(s.shape[-1])), "log of the mean"),
        (lambda s: (_ties(s).log().sum().item(), math.log(s.shape[-1])), "summed the queries"),
        (lambda s: (_ties(s).log(), math.log(s.shape[-1])), "one entropy per query"),
        (lambda s: (limits_right(s)[0], math.log(s.shape[-2])), "not over the 3 queries"),
        (lambda s: (limits_right(s)[0], 1 / s.shape[-1]), "every weight is 1/K"),
        (lambda s: (limits_right(s)[0], float(s.shape[-1])), "log K, not K"),
        (lambda s: (limits_by_brute_force(s, 1e-3), math.log(s.shape[-1])), "without running a softmax"),
        (lambda s: (0.5, 1.0), "expected"),
        (lambda s: limits_right(s)[0], "return a pair"),
    ],
)
def test_entropy_limit_mistakes_are_named(fn, fragment):
    fails_with(checks.check_entropy_limits, fn, fragment)


def test_entropy_limits_refuse_exp():
    def by_exp(s):
        w = (s / 1e-3 - (s / 1e-3).amax(dim=-1, keepdim=True)).exp()
        w = w / w.sum(dim=-1, keepdim=True)
        return -torch.xlogy(w, w).sum(dim=-1).mean().item(), math.log(s.shape[-1])

    fails_with(checks.check_entropy_limits, by_exp, "exp", "from the scores alone")
