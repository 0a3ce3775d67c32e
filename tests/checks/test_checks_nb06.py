"""The exercise checks of notebook 06 accept right answers and reject typical wrong ones by name."""

from __future__ import annotations

import math

import pytest
import torch

from mha_tutorial.analysis import head_stats
from mha_tutorial.checks import (
    CheckFailed,
    check_cell_average,
    check_duplicate_token_score,
    check_induction_score,
    check_normalized_entropy,
    check_previous_token_score,
    check_torch_head_maps,
    nb06,
)
from mha_tutorial.checks import _nb06_mistakes as mistakes
from mha_tutorial.core.masks import causal_mask

# ---------------------------------------------------------------- right answers, written three ways each


def entropy_right(weights, keep):
    n = keep.sum(-1)  # (B, Q)
    ent = -torch.xlogy(weights, weights).sum(-1) / n.clamp_min(2).log()[:, None]  # (B, H, Q)
    return ent.permute(1, 0, 2)[:, n >= 2].mean(-1)  # (H,)


def entropy_loops(weights, keep):
    B, H, Q, K = weights.shape
    out = []
    for h in range(H):
        vals = []
        for b in range(B):
            for q in range(Q):
                n = int(keep[b, q].sum())
                if n < 2:
                    continue
                row = weights[b, h, q][keep[b, q]]
                vals.append(float(-(row * row.clamp_min(1e-300).log()).sum()) / math.log(n))
        out.append(sum(vals) / len(vals))
    return torch.tensor(out)


def previous_right(weights, lengths):
    B, H, T, _ = weights.shape
    d = torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1)  # (B, H, T - 1)
    rows = torch.arange(1, T)[None] < lengths[:, None]  # (B, T - 1)
    return d.permute(1, 0, 2)[:, rows].mean(-1)


def previous_loops(weights, lengths):
    vals = [weights[b, :, t, t - 1] for b in range(weights.shape[0]) for t in range(1, int(lengths[b]))]
    return torch.stack(vals).mean(0)


def induction_right(weights, run_lengths):
    b, p, k = [], [], []
    for i, n in enumerate(run_lengths.tolist()):
        for q in range(n, 2 * n - 1):
            b.append(i), p.append(q), k.append(q - n + 1)
    return weights.permute(0, 2, 3, 1)[b, p, k].mean(0)


@pytest.mark.parametrize("fn", [entropy_right, entropy_loops])
def test_entropy_check_accepts_right_answers(fn, capsys):
    check_normalized_entropy(fn)
    assert "✓ check_normalized_entropy: passed on 5 cases" in capsys.readouterr().out


def test_the_package_implementations_are_refused():
    with pytest.raises(CheckFailed, match="head_stats.normalized_entropy"):
        check_normalized_entropy(head_stats.normalized_entropy)
    with pytest.raises(CheckFailed, match="head_stats.normalized_entropy"):
        check_normalized_entropy(lambda w, keep: head_stats.normalized_entropy(w, keep))


@pytest.mark.parametrize("fn", [previous_right, previous_loops])
def test_previous_token_check_accepts_right_answers_and_reports_the_head(fn, capsys):
    check_previous_token_score(fn)
    out = capsys.readouterr().out
    assert "✓ check_previous_token_score: passed on 5 cases" in out
    assert "strongest previous-token head is dec.0.self head" in out


def test_induction_check_accepts_a_right_answer_and_reports_the_scores(capsys):
    check_induction_score(induction_right)
    out = capsys.readouterr().out
    assert "✓ check_induction_score: passed on 4 cases" in out
    scores = [float(x) for x in out.split("dec.1.self: induction scores [")[1].split("]")[0].split(",")]
    assert min(scores) > 0.8  # the trained model's layer 1 is made of induction heads


# ---------------------------------------------------------------- wrong answers, named


def entropy_log_k(weights, keep):
    ent = -torch.xlogy(weights, weights).sum(-1) / math.log(keep.shape[-1])
    return ent.permute(1, 0, 2)[:, keep.sum(-1) >= 2].mean(-1)


def entropy_nan_0log0(weights, keep):
    n = keep.sum(-1)
    ent = -(weights * weights.log()).sum(-1) / n.clamp_min(2).log()[:, None]
    return ent.permute(1, 0, 2)[:, n >= 2].mean(-1)


def entropy_nan_single(weights, keep):
    ent = -torch.xlogy(weights, weights).sum(-1) / keep.sum(-1).log()[:, None]
    return ent.mean(dim=(0, 2))


def _single_as(weights, keep, value):
    n = keep.sum(-1)
    ent = -torch.xlogy(weights, weights).sum(-1) / n.clamp_min(2).log()[:, None]
    ent = torch.where((n == 1)[:, None], torch.full_like(ent, value), ent)
    return ent.permute(1, 0, 2)[:, n >= 1].mean(-1)


def entropy_raw(weights, keep):
    ent = -torch.xlogy(weights, weights).sum(-1)
    return ent.permute(1, 0, 2)[:, keep.sum(-1) >= 2].mean(-1)


def entropy_bits(weights, keep):
    return entropy_right(weights, keep) / math.log(2)


def entropy_per_example(weights, keep):
    n = keep.sum(-1)
    ent = -torch.xlogy(weights, weights).sum(-1) / n.clamp_min(2).log()[:, None]
    rows = (n >= 2)[:, None].to(ent.dtype)
    return ((ent * rows).sum(-1) / rows.sum(-1)).mean(0)


def entropy_per_row(weights, keep):
    n = keep.sum(-1)
    return -torch.xlogy(weights, weights).sum(-1) / n.clamp_min(2).log()[:, None]  # (B, H, Q)


def entropy_two_mistakes(weights, keep):  # not normalised, and a mean over the keys instead of a sum
    return -torch.xlogy(weights, weights).mean(-1).mean(dim=(0, 2))


@pytest.mark.parametrize(
    "wrong, words",
    [
        (entropy_log_k, "normalised by log K"),
        (entropy_nan_0log0, "0 * log 0"),
        (entropy_nan_single, "single visible key"),
        (lambda w, k: _single_as(w, k, 0.0), "counted (as entropy 0)"),
        (lambda w, k: _single_as(w, k, 1.0), "counted (as entropy 1)"),
        (entropy_raw, "not normalised"),
        (entropy_bits, "entropy in bits"),
        (entropy_per_example, "averaged each example first"),
        (entropy_per_row, "one value per query"),
        (entropy_two_mistakes, "2 things to fix"),
    ],
)
def test_entropy_check_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_normalized_entropy(wrong)
    assert words in str(info.value)


def previous_next(weights, lengths):
    return previous_right(weights.transpose(-1, -2), lengths)  # queries and keys swapped


def previous_diagonal(weights, lengths):
    return torch.diagonal(weights, dim1=-2, dim2=-1)[..., 1:].mean(dim=(0, 2))


def previous_no_lengths(weights, lengths):
    return torch.diagonal(weights, offset=-1, dim1=-2, dim2=-1).mean(dim=(0, 2))


def previous_with_query_0(weights, lengths):
    vals = [weights[b, :, t, t - 1] for b in range(weights.shape[0]) for t in range(0, int(lengths[b]))]
    return torch.stack(vals).mean(0)


def previous_per_example(weights, lengths):
    per = [
        torch.stack([weights[b, :, t, t - 1] for t in range(1, int(lengths[b]))]).mean(0)
        for b in range(weights.shape[0])
    ]
    return torch.stack(per).mean(0)


def previous_drops_last(weights, lengths):
    vals = [weights[b, :, t, t - 1] for b in range(weights.shape[0]) for t in range(1, int(lengths[b]) - 1)]
    return torch.stack(vals).mean(0)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (previous_next, "queries and keys swapped"),
        (previous_diagonal, "read the diagonal"),
        (previous_no_lengths, "ignored lengths"),
        (previous_with_query_0, "query 0 was included"),
        (previous_per_example, "averaged each example first"),
        (previous_drops_last, "last query of each sequence"),
        (lambda w, lens: previous_right(w, lens)[None], "wrong shape (1,"),
        (lambda w, lens: [0.5] * w.shape[1], "expected a tensor"),
    ],
)
def test_previous_token_check_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_previous_token_score(wrong)
    assert words in str(info.value)


def _induction_with(key_shift=1, first=0, last=-1):
    def fn(weights, run_lengths):
        vals = []
        for b, n in enumerate(run_lengths.tolist()):
            vals += [weights[b, :, p, p - n + key_shift] for p in range(n + first, 2 * n + last)]
        return torch.stack(vals).mean(0)

    return fn


def induction_previous(weights, run_lengths):
    vals = []
    for b, n in enumerate(run_lengths.tolist()):
        vals += [weights[b, :, p, p - 1] for p in range(n, 2 * n - 1)]
    return torch.stack(vals).mean(0)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_induction_with(key_shift=0), "duplicate-token"),
        (_induction_with(key_shift=2), "one step too far"),
        (_induction_with(last=0), "included query 2n - 1"),
        (_induction_with(first=-1), "started at query n - 1"),
        (_induction_with(first=1), "started at query n + 1"),
        (induction_previous, "previous-token pattern"),
        (_induction_with(key_shift=0, last=0), "2 things to fix"),
    ],
)
def test_induction_check_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_induction_score(wrong)
    assert words in str(info.value)


def duplicate_right(weights, run_lengths):  # vectorised: the (B, T) rows p = n .. 2n - 1 and their keys p - n
    B, H, T, _ = weights.shape
    p, n = torch.arange(T)[None], run_lengths[:, None]  # (1, T), (B, 1)
    rows = (p >= n) & (p < 2 * n)  # (B, T)
    on = weights.gather(-1, (p - n).clamp_min(0).expand(B, T)[:, None, :, None].expand(B, H, T, 1))[..., 0]
    return on.permute(1, 0, 2)[:, rows].mean(-1)  # (H, B, T) -> (H, N) -> (H,)


@pytest.mark.parametrize("fn", [duplicate_right, _induction_with(key_shift=0, last=0)])
def test_duplicate_token_check_accepts_right_answers_and_finds_no_such_head(fn, capsys):
    check_duplicate_token_score(fn)
    out = capsys.readouterr().out
    assert "✓ check_duplicate_token_score: passed on 4 cases" in out
    assert "no head puts at least half its weight on the earlier copy" in out


@pytest.mark.parametrize(
    "wrong, words",
    [
        (_induction_with(key_shift=1, last=0), "that is the induction score"),
        (_induction_with(key_shift=0, last=-1), "stopped at query 2n - 2"),
        (_induction_with(key_shift=0, first=1, last=0), "started at query n + 1"),
        (_induction_with(key_shift=0, last=-1, first=1), "2 things to fix"),
    ],
)
def test_duplicate_token_check_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_duplicate_token_score(wrong)
    assert words in str(info.value)


def test_the_package_scores_are_refused_by_the_duplicate_token_check():
    def via_package(w, runs):  # calls the package's offset score, then returns the right answer anyway
        B, _, T, _ = w.shape
        head_stats._offset_score(w, torch.ones(B, T, T, dtype=torch.bool), torch.ones(B, T, dtype=torch.bool), -1)
        return duplicate_right(w, runs)

    with pytest.raises(CheckFailed, match="head_stats._offset_score"):
        check_duplicate_token_score(via_package)


# ---------------------------------------------------------------- plumbing


def test_an_unknown_mistake_still_names_the_first_difference():
    with pytest.raises(CheckFailed, match=r"wrong normalised entropy for head \d: got 0\.1234"):
        check_normalized_entropy(lambda w, keep: torch.full((w.shape[1],), 0.1234, dtype=torch.float64))


def test_checks_leave_the_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_induction_score(induction_right)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_the_checks_references_agree_with_independent_code():
    g = torch.Generator().manual_seed(0)
    T = 12
    keep = causal_mask(T)[None].expand(3, T, T)
    w = nb06._random_weights(g, 3, 2, T, T, keep)
    lengths, runs = torch.tensor([12, 7, 3]), torch.tensor([6, 4, 5])
    torch.testing.assert_close(mistakes.previous_variant(w, lengths), previous_loops(w, lengths))
    torch.testing.assert_close(nb06._previous_reference(w, lengths), previous_loops(w, lengths))
    torch.testing.assert_close(mistakes.induction_variant(w, runs), induction_right(w, runs))
    torch.testing.assert_close(nb06._run_reference(w, runs), induction_right(w, runs))
    torch.testing.assert_close(nb06._run_reference(w, runs, shift=0, stop=0), _induction_with(0, 0, 0)(w, runs))
    torch.testing.assert_close(mistakes.entropy_variant(w, keep), head_stats.normalized_entropy(w, keep))
    torch.testing.assert_close(mistakes.entropy_variant(w, keep), entropy_loops(w, keep).double())


def test_every_check_is_exported():
    assert set(nb06.__all__) == {
        "check_cell_average",
        "check_normalized_entropy",
        "check_previous_token_score",
        "check_induction_score",
        "check_duplicate_token_score",
        "check_torch_head_maps",
    }


# ---------------------------------------------------------------- Exercise 2: the cell-by-cell average


def cell_right(weights, keep):
    return weights.sum(0) / keep.sum(0)  # (H, Q, K); 0 / 0 = NaN where no example has the cell


def cell_loops(weights, keep):
    B, H, Q, K = weights.shape
    out = torch.full((H, Q, K), float("nan"), dtype=torch.float64)
    for q in range(Q):
        for k in range(K):
            rows = [b for b in range(B) if keep[b, q, k]]
            if rows:
                out[:, q, k] = weights[rows, :, q, k].double().mean(0)
    return out


@pytest.mark.parametrize("fn", [cell_right, cell_loops])
def test_cell_average_check_accepts_right_answers_and_shows_the_faded_rows(fn, capsys):
    check_cell_average(fn)
    out = capsys.readouterr().out
    assert "✓ check_cell_average: passed on 3 cases" in out
    assert "0.11, 0.11] (sequences reaching them:" in out  # rows reached by 22 of 200 sequences: 22 / 200


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda w, keep: (w * keep[:, None]).sum(0) / w.shape[0], "divided every cell by B"),
        (lambda w, keep: w.sum(0) / keep.sum(0).clamp_min(1), "must be NaN"),
        (lambda w, keep: w.sum(0) / keep.any(-1).sum(0)[:, None], "not each cell"),
        (lambda w, keep: cell_right(w, keep).nanmean(0), "wrong shape"),
        (lambda w, keep: cell_right(w, keep) * 0.5, "wrong value at (head, query, key)"),
    ],
)
def test_cell_average_check_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_cell_average(wrong)
    assert words in str(info.value)


def test_cell_average_check_refuses_average_attention():
    from mha_tutorial.analysis.maps import average_attention
    from mha_tutorial.models.tasks import load_split
    from mha_tutorial.models.train import load_pretrained

    model, examples = load_pretrained("induction", device="cpu"), load_split("induction", "eval")[:4]

    def sneaky(weights, keep):
        average_attention(model, "induction", examples)
        return cell_right(weights, keep)

    with pytest.raises(CheckFailed, match="average_attention"):
        check_cell_average(sneaky)


# ---------------------------------------------------------------- Exercise 3: maps from nn.MultiheadAttention


def _pad(x, valid_lens):
    return torch.arange(x.shape[1])[None] >= valid_lens[:, None]  # (B, T): True = padding


def torch_maps_right(mha, x, valid_lens):
    mha.eval()
    _, w = mha(x, x, x, key_padding_mask=_pad(x, valid_lens), average_attn_weights=False)
    return w  # (B, H, T, T)


def test_torch_maps_check_accepts_the_right_answer(capsys):
    check_torch_head_maps(torch_maps_right)
    assert "✓ check_torch_head_maps: passed on 3 cases" in capsys.readouterr().out


def _train_mode(mha, x, valid_lens):
    return mha(x, x, x, key_padding_mask=_pad(x, valid_lens), average_attn_weights=False)[1]


@pytest.mark.parametrize(
    "wrong, words",
    [
        (lambda m, x, v: m.eval()(x, x, x, key_padding_mask=_pad(x, v))[1], "average_attn_weights=False"),
        (_train_mode, "mha.eval()"),
        (lambda m, x, v: m.eval()(x, x, x, average_attn_weights=False)[1], "padded keys got weight"),
        (lambda m, x, v: m.eval()(x, x, x, key_padding_mask=~_pad(x, v), average_attn_weights=False)[1], "padding"),
        (lambda m, x, v: m.eval()(x, x, x, key_padding_mask=_pad(x, v), need_weights=False)[1], "need_weights"),
        (lambda m, x, v: torch_maps_right(m, x, v) * 0.5, "rows do not sum to 1"),
        (lambda m, x, v: torch_maps_right(m, x, v).flip(-1), "wrong"),
    ],
)
def test_torch_maps_check_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_torch_head_maps(wrong)
    assert words in str(info.value)


def test_torch_maps_check_refuses_collect_attention():
    from mha_tutorial.analysis.maps import collect_attention
    from mha_tutorial.models.tasks import load_split
    from mha_tutorial.models.train import load_pretrained

    model, example = load_pretrained("reversal", device="cpu"), load_split("reversal", "eval")[0]

    def sneaky(mha, x, valid_lens):
        collect_attention(model, "reversal", example)
        return torch_maps_right(mha, x, valid_lens)

    with pytest.raises(CheckFailed, match="collect_attention"):
        check_torch_head_maps(sneaky)
