"""The exercise checks of notebook 02 pass right answers and name typical wrong ones."""

from __future__ import annotations

import pytest
import torch

import mha_tutorial
from mha_tutorial import checks

from testkit import fails_with

# --------------------------------------------------------------------------- notebook 02, exercise 3: packed mask


def packed_loop(segment_ids):
    """Right answer by loops, written apart from the check's own reference."""
    B, T = segment_ids.shape
    return torch.tensor(
        [
            [[bool(segment_ids[b, i] == segment_ids[b, j]) and j <= i for j in range(T)] for i in range(T)]
            for b in range(B)
        ],
        dtype=torch.bool,
    ).reshape(B, T, T)


def packed_right(segment_ids):
    T = segment_ids.shape[-1]
    same = segment_ids[:, :, None] == segment_ids[:, None, :]  # (B, T, T)
    return same & torch.ones(T, T, dtype=torch.bool, device=segment_ids.device).tril()


def packed_with_causal_mask(segment_ids):
    # the package's causal_mask is allowed as a building block: the exercise is the document part
    return (segment_ids[:, :, None] == segment_ids[:, None, :]) & mha_tutorial.causal_mask(segment_ids.shape[-1])


@pytest.mark.parametrize("fn", [packed_loop, packed_right, packed_with_causal_mask])
def test_packed_right_answers_pass(fn, capsys):
    checks.check_packed_mask(fn)
    assert "✓ check_packed_mask: passed on 5 cases" in capsys.readouterr().out


def _same(ids):
    return ids[:, :, None] == ids[:, None, :]


def _lower(ids):
    T = ids.shape[-1]
    return torch.ones(T, T, dtype=torch.bool).tril()


def _in_place(ids):
    ids.add_(1)  # writes into the caller's tensor; the mask itself comes out right
    return packed_right(ids)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda ids: ~packed_right(ids), "convention inverted"),
        (_same, "the causal part is missing"),
        (lambda ids: _lower(ids).expand(ids.shape[0], -1, -1), "the document part is missing"),
        (lambda ids: _lower(ids) & True, "the batch axis is missing"),
        (lambda ids: _same(ids) & _lower(ids).T, "the comparison is transposed"),
        (lambda ids: _same(ids) & _lower(ids).tril(-1), "each token must also see itself"),
        (lambda ids: torch.eye(ids.shape[-1], dtype=torch.bool).expand(ids.shape[0], -1, -1), "not their positions"),
        (lambda ids: packed_right(ids[:1]).expand(ids.shape[0], -1, -1), "the mask of example 0"),
        (lambda ids: (ids[:, :, None] == ids[:, None, :]).any(-1), "one value per token"),
        (lambda ids: (ids[:, None] == ids[None, :]) & _lower(ids)[-1], "examples met examples"),
        (lambda ids: packed_right(ids)[:, None], "an extra axis"),
        (lambda ids: packed_right(ids).float(), "dtype torch.float32"),
        (lambda ids: packed_right(ids).int(), "dtype torch.int32"),
        (_in_place, "in place"),
    ],
)
def test_packed_mistakes_are_named(fn, fragment):
    fails_with(checks.check_packed_mask, fn, fragment)


def test_packed_unknown_mistake_shows_the_first_difference():
    def one_wrong_entry(ids):
        keep = packed_right(ids).clone()
        keep[-1, -1, 0] = ~keep[-1, -1, 0]
        return keep

    fails_with(checks.check_packed_mask, one_wrong_entry, "wrong mask, first at index (1, 5, 0)", "expected:")


def test_packed_stub_is_not_attempted_and_fails_in_strict_mode(capsys, monkeypatch):
    def stub(segment_ids):
        raise NotImplementedError("Exercise 3: not written yet")

    assert checks.check_packed_mask(stub) is None
    assert "check_packed_mask: not attempted yet" in capsys.readouterr().out
    monkeypatch.setenv("MHA_TUTORIAL_STRICT_CHECKS", "1")
    fails_with(checks.check_packed_mask, stub, "not attempted")


# --------------------------------------------------------------------------- notebook 02, exercise 1: padding mask


def padding_right(valid_lens, num_keys):
    lens = valid_lens[:, None] if valid_lens.dim() == 1 else valid_lens
    return torch.arange(num_keys) < lens[..., None]


def test_padding_right_answer_passes():
    checks.check_padding_mask(padding_right)


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (lambda v, k: ~padding_right(v, k), "convention inverted"),
        (lambda v, k: torch.arange(k) <= (v[:, None] if v.dim() == 1 else v)[..., None], "not <="),
        (lambda v, k: torch.arange(k) < (v[:, None] if v.dim() == 1 else v)[..., None] - 1, "valid_len - 1"),
        (lambda v, k: torch.arange(k) < v[:, None], "Add the axis"),
        (lambda v, k: torch.arange(k) < v.reshape(v.shape[0], -1)[:, :1, None], "2-D valid_lens"),
        (lambda v, k: padding_right(v, k).float(), "dtype"),
    ],
)
def test_padding_mistakes_are_named(fn, fragment):
    fails_with(checks.check_padding_mask, fn, fragment)


# --------------------------------------------------------------------------- notebook 02, exercise 2: masked softmax


def _keep(scores, valid_lens):
    lens = valid_lens[:, None] if valid_lens.dim() == 1 else valid_lens
    return torch.arange(scores.shape[-1]) < lens[..., None]


def masked_softmax_right(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    weights = torch.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), dim=-1)
    return weights * keep.any(dim=-1, keepdim=True)


def test_masked_softmax_right_answer_passes(capsys):
    checks.check_masked_softmax(masked_softmax_right)
    assert "✓ check_masked_softmax" in capsys.readouterr().out


def neg_inf_fill(scores, valid_lens):
    return torch.softmax(scores.masked_fill(~_keep(scores, valid_lens), float("-inf")), dim=-1)


def big_negative_fill(scores, valid_lens):
    return torch.softmax(scores.masked_fill(~_keep(scores, valid_lens), torch.finfo(scores.dtype).min), dim=-1)


def minus_1e9_then_zero(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    return torch.softmax(scores.masked_fill(~keep, -1e9), dim=-1) * keep.any(-1, keepdim=True)


def _zeroed_softmax(scores, keep):
    weights = torch.softmax(scores.masked_fill(~keep, torch.finfo(scores.dtype).min), dim=-1)
    return weights * keep.any(dim=-1, keepdim=True)


def inverted(scores, valid_lens):
    return _zeroed_softmax(scores, ~_keep(scores, valid_lens))


def off_by_one(scores, valid_lens):
    lens = valid_lens[:, None] if valid_lens.dim() == 1 else valid_lens
    return _zeroed_softmax(scores, torch.arange(scores.shape[-1]) <= lens[..., None])


def one_key_too_few(scores, valid_lens):
    lens = valid_lens[:, None] if valid_lens.dim() == 1 else valid_lens
    return _zeroed_softmax(scores, torch.arange(1, scores.shape[-1] + 1) < lens[..., None])


def colleague(scores, valid_lens):
    # notebook 02, Exercise 2: the colleague's masked softmax, verbatim
    positions = torch.arange(1, scores.shape[-1] + 1, device=scores.device)  # (K,)
    keep = positions < valid_lens[:, None, None]  # (B, 1, K)
    return torch.softmax(scores.masked_fill(~keep, -1e9), dim=-1)  # (B, Q, K)


def test_each_bug_of_the_colleague_shows_on_its_code_as_given():
    # Exercise 2 says each of the four bugs shows on the code exactly as written: none hides behind another
    zeros = torch.zeros(1, 1, 4)
    assert colleague(zeros, torch.tensor([2]))[0, 0].tolist() == [1.0, 0.0, 0.0, 0.0]  # one key too few
    assert torch.allclose(colleague(zeros, torch.tensor([0])), torch.full((1, 1, 4), 0.25))  # uniform, not zeros
    with pytest.raises(RuntimeError):  # (B, Q) lengths with Q != K
        colleague(torch.zeros(2, 3, 4), torch.tensor([[1, 2, 3], [0, 4, 2]]))
    with pytest.raises(RuntimeError, match="Half"):  # -1e9 does not fit float16
        colleague(zeros.half(), torch.tensor([2]))


def test_the_colleagues_code_fails_the_check_on_its_first_bug():
    fails_with(checks.check_masked_softmax, colleague, "one key too few")


def additive_inf_where(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    additive = torch.zeros(keep.shape, dtype=scores.dtype).masked_fill(~keep, float("-inf"))
    return torch.where(keep.any(-1, keepdim=True), torch.softmax(scores + additive, dim=-1), 0.0).to(scores.dtype)


def fill_inf_where(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    weights = torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1)
    return torch.where(keep.any(-1, keepdim=True), weights, 0.0).to(scores.dtype)


def test_fill_inf_then_where_passes_with_a_finite_gradient(capsys):
    # masked_fill's backward gives the filled entries gradient 0, so the NaN of the empty row's softmax
    # backward never reaches the scores (notebook 02, section 7); only an *added* -inf mask leaks it
    checks.check_masked_softmax(fill_inf_where)
    assert "✓ check_masked_softmax" in capsys.readouterr().out


def small_negative_fill(scores, valid_lens):
    keep = _keep(scores, valid_lens)
    return torch.softmax(scores.masked_fill(~keep, -5.0), dim=-1) * keep.any(-1, keepdim=True)


def upcasts(scores, valid_lens):
    return masked_softmax_right(scores.float(), valid_lens)


def two_none_axes_always(scores, valid_lens):
    # valid_lens[:, None, None] is right for 1-D lengths but gives 2-D lengths one axis too many
    return _zeroed_softmax(scores, torch.arange(scores.shape[-1]) < valid_lens[:, None, None])


@pytest.mark.parametrize(
    "fn, fragment",
    [
        (neg_inf_fill, "NaN on a fully-masked row"),
        (big_negative_fill, "uniform instead of zero rows"),
        (minus_1e9_then_zero, "float16"),
        (inverted, "convention inverted"),
        (off_by_one, "off-by-one"),
        (one_key_too_few, "one key too few"),
        (additive_inf_where, "*added* to the scores"),
        (small_negative_fill, "non-zero weight"),
        (upcasts, "keep the dtype"),
        (two_none_axes_always, "valid_lens[..., None]"),
    ],
)
def test_masked_softmax_mistakes_are_named(fn, fragment):
    fails_with(checks.check_masked_softmax, fn, fragment)


def test_checks_are_exported():
    from mha_tutorial.checks import nb02

    assert set(nb02.__all__) == {"check_packed_mask", "check_padding_mask", "check_masked_softmax"}
    for name in nb02.__all__:
        assert callable(getattr(checks, name))


@pytest.mark.parametrize(
    "check, fn, fragment",
    [
        (checks.check_padding_mask, mha_tutorial.padding_mask, "mha_tutorial.padding_mask"),
        (checks.check_masked_softmax, mha_tutorial.masked_softmax, "mha_tutorial.masked_softmax"),
        (
            checks.check_masked_softmax,
            lambda s, lens: mha_tutorial.masked_softmax(s, valid_lens=lens) + 0,
            "mha_tutorial.masked_softmax",
        ),
        (  # Exercise 2 reuses Exercise 1's mask: the refusal points back to it by its number
            checks.check_masked_softmax,
            lambda s, lens: s.masked_fill(~mha_tutorial.padding_mask(lens, s.shape[-1]), 0.0),
            "mha_tutorial.padding_mask (build the mask yourself, as in Exercise 1)",
        ),
    ],
)
def test_the_package_functions_are_refused(check, fn, fragment):
    fails_with(check, fn, fragment, "write that step yourself")


def test_packed_messages_do_not_give_the_answer():
    for fn in (_same, lambda ids: _lower(ids).expand(ids.shape[0], -1, -1)):
        message = fails_with(checks.check_packed_mask, fn, "missing")
        assert "tril(" not in message and "expected:" not in message


def test_packed_cases_cover_the_edge_cases():
    from mha_tutorial.checks.nb02 import _packed_cases

    cases = _packed_cases()
    assert {c.shape[0] == 1 for c in cases} == {True, False}  # B = 1 and B > 1
    rows = [row.tolist() for c in cases for row in c]
    assert any(len(set(r)) == 1 and len(r) > 1 for r in rows)  # one document
    assert any(len(set(r)) == len(r) > 1 for r in rows)  # every token its own document
    assert any(r.count(r[-1]) == 1 and len(r) > 1 for r in rows)  # a document of length 1 after others
    assert any(min(r) > 0 or sorted(set(r)) != list(range(min(r), max(r) + 1)) for r in rows)  # free ids
