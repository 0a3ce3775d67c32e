"""The exercise checks of notebook 05 accept right answers and reject typical wrong ones by name."""

from __future__ import annotations

import re

import pytest
import torch
from torch.nn import functional as F

from mha_tutorial import causal_mask
from mha_tutorial.checks import (
    CheckFailed,
    check_decoder_mask,
    check_greedy_decode,
    check_masked_loss_and_accuracy,
    check_to_torch_attention,
)
from mha_tutorial.checks.nb05 import _loss_cases, reference_decoder_mask
from mha_tutorial.models.tasks import get_task, load_split
from mha_tutorial.models.train import load_pretrained

# ---------------------------------------------------------------- Exercise 1: the left-padded decoder mask


def mask_right(valid_lens, num_steps):
    T = num_steps
    keys = torch.arange(T)[None, :] >= (T - valid_lens)[:, None]  # (B, K)
    return torch.ones(T, T, dtype=torch.bool).tril()[None] & keys[:, None, :]


def mask_by_loops(valid_lens, num_steps):
    T = num_steps
    out = torch.zeros(len(valid_lens), T, T, dtype=torch.bool)
    for b, n in enumerate(valid_lens.tolist()):
        for i in range(T):
            for j in range(T):
                out[b, i, j] = j <= i and j >= T - n
    return out


def mask_causal_only(valid_lens, num_steps):
    return causal_mask(num_steps)[None].expand(len(valid_lens), num_steps, num_steps)


def mask_right_padded(valid_lens, num_steps):
    keys = torch.arange(num_steps)[None, :] < valid_lens[:, None]
    return causal_mask(num_steps)[None] & keys[:, None, :]


def mask_pads_counted(valid_lens, num_steps):
    keys = torch.arange(num_steps)[None, :] >= valid_lens[:, None]
    return causal_mask(num_steps)[None] & keys[:, None, :]


def mask_no_causal(valid_lens, num_steps):
    keys = torch.arange(num_steps)[None, :] >= (num_steps - valid_lens)[:, None]  # (B, K)
    return keys[:, None, :].expand(-1, num_steps, -1)


def mask_upper(valid_lens, num_steps):
    keys = torch.arange(num_steps)[None, :] >= (num_steps - valid_lens)[:, None]
    return torch.ones(num_steps, num_steps, dtype=torch.bool).triu()[None] & keys[:, None, :]


def mask_swapped(valid_lens, num_steps):
    return mask_right(valid_lens, num_steps).transpose(1, 2)


def mask_strict(valid_lens, num_steps):
    keys = torch.arange(num_steps)[None, :] >= (num_steps - valid_lens)[:, None]
    return torch.ones(num_steps, num_steps, dtype=torch.bool).tril(-1)[None] & keys[:, None, :]


def mask_inverted(valid_lens, num_steps):
    return ~mask_right(valid_lens, num_steps)


def mask_float(valid_lens, num_steps):
    return mask_right(valid_lens, num_steps).float()


def mask_head_axis(valid_lens, num_steps):
    return mask_right(valid_lens, num_steps)[:, None]


def mask_flipped_bit(valid_lens, num_steps):
    out = mask_right(valid_lens, num_steps).clone()
    out[0, -1, -1] = ~out[0, -1, -1]
    return out


def test_decoder_mask_accepts_right_answers(capsys):
    check_decoder_mask(mask_right)
    check_decoder_mask(mask_by_loops)
    check_decoder_mask(reference_decoder_mask)
    assert "✓ check_decoder_mask: passed on 4 cases" in capsys.readouterr().out


def test_reference_decoder_mask_by_loops():
    lens = torch.tensor([4, 2, 5, 1, 0])
    assert torch.equal(reference_decoder_mask(lens, 5), mask_by_loops(lens, 5))


@pytest.mark.parametrize(
    "wrong, words",
    [
        (mask_causal_only, "forgot the padding"),
        (mask_right_padded, "treated the batch as right-padded"),
        (mask_pads_counted, "valid_lens counts the real tokens"),
        (mask_no_causal, "forgot the causal part"),
        (mask_upper, "upper triangle"),
        (mask_swapped, "query and key axes swapped"),
        (mask_strict, "off-by-one on the diagonal"),
        (mask_inverted, "mask convention inverted"),
        (mask_float, "return a bool tensor"),
        (mask_head_axis, "has a head axis"),
        (mask_flipped_bit, "wrong mask, first at index (0, 4, 4)"),
    ],
)
def test_decoder_mask_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_decoder_mask(wrong)
    assert words in str(info.value)


# ---------------------------------------------------------------- Exercise 2: masked loss and accuracy


def loss_right(logits, targets, loss_mask):
    loss = F.cross_entropy(logits[loss_mask], targets[loss_mask])
    whole = ((logits.argmax(-1) == targets) | ~loss_mask).all(dim=1)  # (B,)
    return loss, whole.float().mean().item()


def loss_by_nll(logits, targets, loss_mask):
    logp = logits.log_softmax(-1).gather(-1, targets[..., None])[..., 0]  # (B, T)
    loss = -(logp * loss_mask).sum() / loss_mask.sum()
    wrong = ((logits.argmax(-1) != targets) & loss_mask).sum(1)  # (B,): wrong counted positions per sequence
    return loss, (wrong == 0).float().mean()  # a 0-d tensor is fine too


def loss_everywhere(logits, targets, loss_mask):
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten()), loss_right(logits, targets, loss_mask)[1]


def loss_mean_over_all(logits, targets, loss_mask):
    ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return (ce * loss_mask).mean(), loss_right(logits, targets, loss_mask)[1]


def loss_sum(logits, targets, loss_mask):
    return F.cross_entropy(logits[loss_mask], targets[loss_mask], reduction="sum"), 0.0


def loss_inverted(logits, targets, loss_mask):
    return F.cross_entropy(logits[~loss_mask], targets[~loss_mask]), 0.0


def loss_double_softmax(logits, targets, loss_mask):
    return F.cross_entropy(logits.softmax(-1)[loss_mask], targets[loss_mask]), 0.0


def loss_per_sequence(logits, targets, loss_mask):
    ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    return ((ce * loss_mask).sum(1) / loss_mask.sum(1)).mean(), 0.0


def loss_item(logits, targets, loss_mask):
    loss, acc = loss_right(logits, targets, loss_mask)
    return loss.item(), acc


def loss_detached(logits, targets, loss_mask):
    loss, acc = loss_right(logits, targets, loss_mask)
    return loss.detach(), acc


def loss_unreduced(logits, targets, loss_mask):
    return F.cross_entropy(logits[loss_mask], targets[loss_mask], reduction="none"), 0.0


def acc_with(accuracy):
    def fn(logits, targets, loss_mask):
        return loss_right(logits, targets, loss_mask)[0], accuracy(logits, targets, loss_mask)

    return fn


def acc_tokens(logits, targets, mask):  # the per-position accuracy of train and evaluate
    return (logits.argmax(-1) == targets)[mask].float().mean().item()


def acc_everywhere(logits, targets, mask):
    return (logits.argmax(-1) == targets).all(1).float().mean().item()


def acc_any(logits, targets, mask):
    return ((logits.argmax(-1) == targets) & mask).any(1).float().mean().item()


def acc_count(logits, targets, mask):
    return int(((logits.argmax(-1) == targets) | ~mask).all(1).sum())


def acc_percent(logits, targets, mask):
    return 100 * loss_right(logits, targets, mask)[1]


def acc_inverted(logits, targets, mask):
    return ((logits.argmax(-1) == targets) | mask).all(1).float().mean().item()


def acc_per_sequence(logits, targets, mask):
    right = (logits.argmax(-1) == targets) & mask
    return (right.sum(1) / mask.sum(1)).mean().item()


def acc_wrong_axis(logits, targets, mask):
    return ((logits.argmax(1) == targets) | ~mask).all(1).float().mean().item()


def acc_bool(logits, targets, mask):
    return True


def test_masked_loss_and_accuracy_accepts_right_answers(capsys):
    check_masked_loss_and_accuracy(loss_right)
    check_masked_loss_and_accuracy(loss_by_nll)
    assert "✓ check_masked_loss_and_accuracy: passed on 3 cases" in capsys.readouterr().out


def test_loss_cases_tell_the_mistakes_apart():
    """The cases are built so that the mistakes differ from the right answer (else they could not be named)."""
    for logits, targets, mask, _ in _loss_cases():
        loss, acc = loss_right(logits, targets, mask)
        assert 0 < acc < 1
        assert acc != acc_tokens(logits, targets, mask)
        assert acc != acc_everywhere(logits, targets, mask)
        assert mask.sum(1).unique().numel() > 1  # sequences count different numbers of positions
        assert bool(mask.any(1).all())  # every sequence counts at least one position


@pytest.mark.parametrize(
    "wrong, words",
    [
        (loss_everywhere, r"loss [\d.]+: averaged over every position"),
        (loss_mean_over_all, r"divides by all B\*T positions"),
        (loss_sum, "returned the sum"),
        (loss_inverted, "loss_mask inverted"),
        (loss_double_softmax, "applied softmax before F.cross_entropy"),
        (loss_per_sequence, "averaged per sequence first"),
        (loss_item, "return it as a tensor"),
        (loss_detached, "cut off from the logits"),
        (loss_unreduced, "it must be one number"),
        (acc_with(acc_tokens), r"accuracy [\d.]+: counted positions, not sequences"),
        (acc_with(acc_everywhere), r"accuracy [\d.]+: required every position to be right"),
        (acc_with(acc_any), r"used any\(\) where all\(\) is needed"),
        (acc_with(acc_count), "returned the number of sequences right"),
        (acc_with(acc_percent), "returned a percentage"),
        (acc_with(acc_inverted), r"accuracy [\d.]+: loss_mask inverted"),
        (acc_with(acc_per_sequence), r"accuracy [\d.]+: averaged each sequence's fraction"),
        (acc_with(acc_wrong_axis), "argmax over the wrong axis"),
        (acc_with(acc_bool), "return the accuracy as a float"),
        (lambda *a: 1.0, r"return a pair \(loss, accuracy\)"),
    ],
)
def test_masked_loss_and_accuracy_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_masked_loss_and_accuracy(wrong)
    assert re.search(words, str(info.value)), str(info.value)


# ---------------------------------------------------------------- Exercise 3: greedy decoding


def greedy_right(model, src, src_valid_lens, num_steps, bos_id):
    memory = model.encode(src, src_valid_lens)
    out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    for _ in range(num_steps):
        logits = model.decode(out, memory, src_valid_lens)
        out = torch.cat([out, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return out[:, 1:]


def greedy_forward(model, src, src_valid_lens, num_steps, bos_id):
    """Calling the whole model at every step (re-encoding the source) is slower but right."""
    out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
    with torch.no_grad():
        for _ in range(num_steps):
            out = torch.cat([out, model(src, out, src_valid_lens)[:, -1:].argmax(-1)], dim=1)
    return out[:, 1:]


def greedy_variant(*, keep_bos=False, short=False, last_only=False, first=False, no_lens=False, floats=False):
    def fn(model, src, src_valid_lens, num_steps, bos_id):
        lens = None if no_lens else src_valid_lens
        memory = model.encode(src, lens)
        out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)
        for _ in range(num_steps - 1 if short else num_steps):
            logits = model.decode(out[:, -1:] if last_only else out, memory, lens)
            out = torch.cat([out, logits[:, 0 if first else -1].argmax(-1, keepdim=True)], dim=1)
        out = out if keep_bos else out[:, 1:]
        return out.float() if floats else out

    return fn


def greedy_cheat(model, src, src_valid_lens, num_steps, bos_id):
    return model.greedy_decode(src, num_steps, bos_id, src_valid_lens)


def greedy_wrong_token(model, src, src_valid_lens, num_steps, bos_id):
    out = greedy_right(model, src, src_valid_lens, num_steps, bos_id).clone()
    out[3, 1] = (out[3, 1] + 1) % 11 + 1
    return out


def test_greedy_decode_accepts_right_answers(capsys):
    check_greedy_decode(greedy_right)
    check_greedy_decode(greedy_forward)
    assert "✓ check_greedy_decode: passed on 4 cases" in capsys.readouterr().out


def test_greedy_decode_reads_real_dates():
    """The check's trained model really decodes the eval dates, so wrong loops are told apart from right ones."""
    task = get_task("dates")
    examples = load_split("dates")[:12]
    batch = task.collate(examples)
    model = load_pretrained("dates", device="cpu")
    got = greedy_right(model, batch.src, batch.valid_lens, 10, task.tgt_stoi["<bos>"])
    assert [task.decode(row) for row in got] == [target for _, target, _ in examples]
    assert batch.valid_lens.unique().numel() > 1  # some sources are padded


@pytest.mark.parametrize(
    "wrong, words",
    [
        (greedy_variant(keep_bos=True), "still starts with <bos>"),
        (greedy_variant(short=True), "one token short"),
        (greedy_variant(last_only=True), "fed back only the last token"),
        (greedy_variant(first=True), "read the prediction at the first position"),
        (greedy_variant(no_lens=True), "src_valid_lens was not passed on"),
        (greedy_variant(floats=True), "return token ids"),
        (greedy_cheat, "called model.greedy_decode"),
        (greedy_wrong_token, "wrong tokens for"),
    ],
)
def test_greedy_decode_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_greedy_decode(wrong)
    assert words in str(info.value)


# ---------------------------------------------------------------- all three


# ---------------------------------------------------------------- notebook 05a: our attention in PyTorch's layer


def to_torch_right(ours):
    from mha_tutorial.checks.nb05 import _to_torch

    return _to_torch(ours)


def to_torch_written_out(ours):
    bias = ours.W_q.bias is not None
    layer = torch.nn.MultiheadAttention(
        ours.num_hiddens,
        ours.num_heads,
        bias=bias,
        kdim=ours.W_k.in_features,
        vdim=ours.W_v.in_features,
        batch_first=True,
    )
    with torch.no_grad():
        if layer.in_proj_weight is not None:
            layer.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        else:
            layer.q_proj_weight.copy_(ours.W_q.weight)
            layer.k_proj_weight.copy_(ours.W_k.weight)
            layer.v_proj_weight.copy_(ours.W_v.weight)
        layer.out_proj.weight.copy_(ours.W_o.weight)
        if bias:
            layer.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
            layer.out_proj.bias.copy_(ours.W_o.bias)
    return layer


def test_to_torch_attention_accepts_right_answers(capsys):
    check_to_torch_attention(to_torch_right)
    check_to_torch_attention(to_torch_written_out)
    assert "✓ check_to_torch_attention: passed on 3 cases" in capsys.readouterr().out


def to_torch_stacked_only(ours):
    layer = torch.nn.MultiheadAttention(ours.num_hiddens, ours.num_heads, batch_first=True)
    with torch.no_grad():
        layer.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
    return layer


class Wrapper(torch.nn.MultiheadAttention):
    pass


def to_torch_calls_ours(ours):
    layer = to_torch_right(ours)
    layer.forward = lambda q, k, v, key_padding_mask=None, need_weights=True: (ours(q, k, v), None)
    return layer


def to_torch_subclass(ours):
    return Wrapper(ours.num_hiddens, ours.num_heads, batch_first=True)


def _switched(**switches):
    from mha_tutorial.checks.nb05 import _to_torch

    return lambda ours: _to_torch(ours, **switches)


@pytest.mark.parametrize(
    "wrong, words",
    [
        (
            lambda ours: _switched(swap_kv=ours.W_k.in_features == ours.W_v.in_features)(ours),
            "keys and values swapped",
        ),
        (_switched(in_bias=False), "forgot the input biases"),
        (_switched(out_bias=False), "forgot out_proj.bias"),
        (_switched(batch_first=False), "batch_first=True"),
        (to_torch_stacked_only, "no in_proj_weight"),
        (to_torch_calls_ours, "forward was replaced"),
        (to_torch_subclass, "return an nn.MultiheadAttention"),
        (
            lambda ours: torch.nn.MultiheadAttention(
                ours.num_hiddens, ours.num_heads, batch_first=True, kdim=ours.W_k.in_features, vdim=ours.W_v.in_features
            ),
            "differ from our layer's",
        ),  # fmt: skip
    ],
)
def test_to_torch_attention_names_mistakes(wrong, words):
    with pytest.raises(CheckFailed) as info:
        check_to_torch_attention(wrong)
    assert words in str(info.value)


def greedy_via_class(model, src, src_valid_lens, num_steps, bos_id):
    from mha_tutorial.models.model import TransformerEncoderDecoder

    return TransformerEncoderDecoder.greedy_decode(model, src, num_steps, bos_id, src_valid_lens)


def greedy_via_predict(model, src, src_valid_lens, num_steps, bos_id):
    from mha_tutorial.models.task_base import Batch

    return get_task("dates").predict(model, Batch(src=src, valid_lens=src_valid_lens))[:, :num_steps]


@pytest.mark.parametrize("gamed", [greedy_via_class, greedy_via_predict])
def test_greedy_decode_refuses_the_package_loop(gamed):
    with pytest.raises(CheckFailed) as info:
        check_greedy_decode(gamed)
    assert "greedy_decode" in str(info.value)
