"""Checks for the exercises of notebook 05 (training a tiny transformer).

* ``check_decoder_mask``: the self-attention mask of a causal decoder on a
  *left*-padded batch (the layout of batched generation).
* ``check_masked_loss_and_accuracy``: the loss over the positions where ``loss_mask``
  is True, and the whole-sequence accuracy (a sequence is right only if every
  counted position is), the metric that dates uses.
* ``check_greedy_decode``: the greedy decoding loop of the encoder-decoder,
  run on the committed ``dates`` checkpoint and on an untrained model.

Each compares with the package's own code on small seeded cases and, when the
answer is wrong, tries a list of typical mistakes to name the one that was made.
"""

from __future__ import annotations

import numbers

import torch
from torch.nn import functional as F

from ..masks import causal_mask
from ..model import TransformerEncoderDecoder
from ..tasks import BOS, get_task, load_split
from ._common import CheckFailed, call, expect_shape, expect_tensor, friendly, passed

__all__ = ["check_decoder_mask", "check_masked_loss_and_accuracy", "check_greedy_decode", "check_to_torch_attention"]


# --------------------------------------------------------------------------- Exercise 1


def reference_decoder_mask(valid_lens: torch.Tensor, num_steps: int) -> torch.Tensor:
    """(B, T, T) bool: query i of example b may see key j iff j <= i and j is one of its real (last) tokens."""
    first_real = num_steps - valid_lens  # (B,): index of example b's first real token
    real_key = torch.arange(num_steps)[None, :] >= first_real[:, None]  # (B, K)
    return causal_mask(num_steps)[None] & real_key[:, None, :]  # (1, Q, K) & (B, 1, K) -> (B, Q, K)


def _decoder_mask_mistakes(valid_lens: torch.Tensor, T: int) -> list:
    expected = reference_decoder_mask(valid_lens, T)
    B = len(valid_lens)
    pos = torch.arange(T)
    causal = causal_mask(T)[None].expand(B, T, T)  # (B, Q, K)
    left_real = (pos[None, :] >= (T - valid_lens)[:, None])[:, None, :]  # (B, 1, K): keys that are real tokens
    right_real = (pos[None, :] < valid_lens[:, None])[:, None, :]  # (B, 1, K): as if the padding were on the right
    lower_strict = torch.ones(T, T, dtype=torch.bool).tril(-1)[None]
    return [
        (
            "mask convention inverted: True must mean 'may attend' (the convention of "
            "F.scaled_dot_product_attention and of this package)",
            ~expected,
        ),
        (
            "forgot the padding: this is the causal mask alone, so real tokens may still attend to the <pad> "
            "tokens to their left. (With right padding that would be harmless, with left padding it is not)",
            causal,
        ),
        (
            "treated the batch as right-padded (real keys 0 .. valid_lens[b] - 1); here the padding is on the "
            "left: example b's real tokens are its *last* valid_lens[b] positions, num_steps - valid_lens[b] .. "
            "num_steps - 1",
            causal & right_real,
        ),
        (
            "valid_lens counts the real tokens, not the padding: example b has num_steps - valid_lens[b] <pad> "
            "tokens on the left",
            causal & (pos[None, :] >= valid_lens[:, None])[:, None, :],
        ),
        (
            "forgot the causal part: every token may look at the tokens after it (the future)",
            left_real.expand(B, T, T),
        ),
        (
            "upper triangle: query i would see the future keys j > i; keep the lower triangle (j <= i)",
            causal.transpose(1, 2) & left_real,
        ),
        (
            "query and key axes swapped: mask[b, i, j] must say whether query i may attend to key j, so the "
            "padding belongs on the last axis (the keys)",
            expected.transpose(1, 2),
        ),
        (
            "off-by-one on the diagonal: each token must also see itself (key j = i); use tril with diagonal 0",
            lower_strict & left_real,
        ),
    ]


_DECODER_MASK_CASES = [([4, 2, 5], 5), ([3, 1], 4), ([6, 1, 3], 6), ([3], 3)]


@friendly
def check_decoder_mask(fn) -> None:
    """``fn(valid_lens, num_steps)`` -> bool (B, T, T): causal self-attention on a left-padded batch."""
    for lens, T in _DECODER_MASK_CASES:
        valid_lens = torch.tensor(lens)
        case = f"decoder_mask(valid_lens=torch.tensor({lens}), num_steps={T})"
        actual = expect_tensor(call(fn, valid_lens.clone(), T, case=case), case)
        B = len(lens)
        if tuple(actual.shape) == (B, 1, T, T):
            raise CheckFailed(
                f"{case}: shape {tuple(actual.shape)} has a head axis; return (B, T, T) = {(B, T, T)} "
                "(MultiHeadAttention broadcasts a (B, T, T) mask over the heads itself)"
            )
        expect_shape(actual, (B, T, T), case)
        if actual.dtype != torch.bool:
            raise CheckFailed(
                f"{case}: the mask has dtype {actual.dtype}; return a bool tensor (True = may attend). A float "
                "0/1 or 0/-inf mask is *added* to the scores by attention code, which means something else"
            )
        actual = actual.cpu()
        expected = reference_decoder_mask(valid_lens, T)
        if torch.equal(actual, expected):
            continue
        for message, wrong in _decoder_mask_mistakes(valid_lens, T):
            if torch.equal(actual, wrong):
                raise CheckFailed(f"{case}: {message}")
        where = tuple(int(i) for i in (actual != expected).nonzero()[0])
        raise CheckFailed(
            f"{case}: wrong mask, first at index {where} (example, query, key): got {bool(actual[where])}, "
            f"expected {bool(expected[where])}\nexpected:\n{expected.int()}\ngot:\n{actual.int()}"
        )
    passed("check_decoder_mask", len(_DECODER_MASK_CASES))


# --------------------------------------------------------------------------- Exercise 2


def reference_masked_loss_and_accuracy(logits, targets, loss_mask):
    """Mean cross-entropy over the positions where ``loss_mask`` is True, and the fraction of sequences whose
    counted positions are all right (positions outside ``loss_mask`` do not matter)."""
    loss = F.cross_entropy(logits[loss_mask], targets[loss_mask])
    right = (logits.argmax(-1) == targets) | ~loss_mask  # (B, T): an uncounted position never spoils a sequence
    accuracy = float(right.all(dim=1).float().mean())
    return loss, accuracy


def _loss_cases():
    """(logits, targets, loss_mask, description), seeded; the masks count different numbers per row, every row
    counts at least one position; row 0 is right exactly where it counts, row 1
    nowhere, row 2 everywhere."""
    g = torch.Generator().manual_seed(5)
    cases = []
    for B, T, V, counts in [(4, 6, 6, [1, 4, 2, 6]), (5, 5, 7, [3, 1, 2, 5, 4]), (4, 4, 9, [2, 3, 1, 4])]:
        logits = 2 * torch.randn(B, T, V, generator=g)  # (B, T, V)
        targets = torch.randint(0, V, (B, T), generator=g)  # (B, T)
        hit = torch.rand(B, T, generator=g) < 0.5  # make about half of the positions right
        targets = torch.where(hit, logits.argmax(-1), targets)
        loss_mask = torch.zeros(B, T, dtype=torch.bool)
        for b, n in enumerate(counts):
            start = int(torch.randint(0, T - n + 1, (1,), generator=g))
            loss_mask[b, start : start + n] = True
        best = logits[0].argmax(-1)  # (T,)
        targets[0] = torch.where(loss_mask[0], best, (best + 1) % V)  # right where it counts, wrong elsewhere
        targets[1] = (logits[1].argmax(-1) + 1) % V  # wrong everywhere
        targets[2] = logits[2].argmax(-1)  # right everywhere
        case = f"B={B}, T={T}, V={V}, positions counted per sequence {counts}"
        cases.append((logits, targets, loss_mask, case))
    return cases


def _per_sequence_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean over sequences of each sequence's mean over its counted positions (0/0 gives NaN)."""
    per_seq = (values * mask).sum(1) / mask.sum(1)  # (B,)
    return float(per_seq.mean())


def _loss_mistakes(logits, targets, mask):
    ce = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")  # (B, T)
    return [
        ("averaged over every position: positions where loss_mask is False must not count", ce.mean()),
        (
            "(ce * loss_mask).mean() divides by all B*T positions; divide by the number of counted positions "
            "(loss_mask.sum()) instead",
            (ce * mask).sum() / mask.numel(),
        ),
        ("returned the sum over the counted positions; the loss is their mean", ce[mask].sum()),
        ("loss_mask inverted: True marks the positions that count", ce[~mask].mean()),
        (
            "applied softmax before F.cross_entropy: it takes raw logits (it computes log_softmax itself), so "
            "the probabilities were squashed twice",
            F.cross_entropy(logits.softmax(-1)[mask], targets[mask]),
        ),
        (
            "averaged per sequence first, then over the batch: every counted position must weigh the same, "
            "whatever the length of its sequence",
            torch.tensor(_per_sequence_mean(ce, mask)),
        ),
    ]


def _accuracy_mistakes(logits, targets, mask):
    right = logits.argmax(-1) == targets  # (B, T)
    whole = (right | ~mask).all(1)  # (B,): the right answer's sequences
    mistakes = [
        (
            "counted positions, not sequences: a sequence is right only if all its counted positions are",
            float(right[mask].float().mean()),
        ),
        (
            "averaged each sequence's fraction of right positions: a sequence is right (1) only if all its counted "
            "positions are, else wrong (0)",
            _per_sequence_mean(right.float(), mask),
        ),
        (
            "required every position to be right, also those where loss_mask is False; only counted ones matter",
            float(right.all(1).float().mean()),
        ),
        (
            "used any() where all() is needed: one right position does not make a sequence right",
            float((right & mask).any(1).float().mean()),
        ),
        ("loss_mask inverted: True marks the positions that count", float((right | mask).all(1).float().mean())),
        (
            "returned the number of sequences right; accuracy is the fraction of sequences that are right",
            float(whole.sum()),
        ),
        ("returned a percentage; return a fraction in [0, 1]", 100 * float(whole.float().mean())),
    ]
    if logits.shape[1] == logits.shape[2]:  # only then does argmax over the wrong axis run without an error
        wrong_axis = logits.argmax(1) == targets
        mistakes.append(
            (
                "argmax over the wrong axis: the prediction is the most likely class, argmax over the last "
                "axis (the vocabulary, dim=-1)",
                float((wrong_axis | ~mask).all(1).float().mean()),
            )
        )
    return mistakes


def _same(a: float, b: float) -> bool:
    return (a != a and b != b) or abs(a - b) <= 1e-5 * max(1.0, abs(b))  # NaN == NaN here


@friendly
def check_masked_loss_and_accuracy(fn) -> None:
    """``fn(logits (B, T, V), targets (B, T), loss_mask (B, T) bool)`` -> (loss tensor, whole-sequence accuracy
    float)."""
    cases = _loss_cases()
    for logits, targets, mask, case in cases:
        logits_in = logits.clone().requires_grad_(True)
        result = call(fn, logits_in, targets.clone(), mask.clone(), case=case)
        if not isinstance(result, tuple | list) or len(result) != 2:
            raise CheckFailed(f"{case}: return a pair (loss, accuracy), got {type(result).__name__}")
        loss, accuracy = result
        expected_loss, expected_acc = reference_masked_loss_and_accuracy(logits, targets, mask)
        _check_loss(loss, float(expected_loss), (logits, targets, mask), case)
        _check_accuracy(accuracy, expected_acc, (logits, targets, mask), case)
    passed("check_masked_loss_and_accuracy", len(cases))


def _check_loss(loss, expected: float, inputs: tuple, case: str) -> None:
    """The learner's loss: a one-number tensor attached to the logits' graph, equal to ``expected``;
    else the message of the mistake it reproduces. ``inputs``: (logits, targets, loss_mask)."""
    if not isinstance(loss, torch.Tensor):
        raise CheckFailed(
            f"{case}: the loss is a {type(loss).__name__}; return it as a tensor, without .item() or "
            "float(), so that training can call loss.backward()"
        )
    if loss.numel() != 1:
        raise CheckFailed(
            f"{case}: the loss has shape {tuple(loss.shape)}; it must be one number, the mean over the "
            "counted positions"
        )
    if not loss.requires_grad:
        raise CheckFailed(
            f"{case}: the loss is cut off from the logits (no grad_fn): compute it with tensor operations "
            "only (no .item(), .detach() or torch.no_grad), so that loss.backward() reaches the model"
        )
    loss_value = float(loss.detach().reshape(()))
    if not _same(loss_value, expected):
        for message, wrong in _loss_mistakes(*inputs):
            if _same(loss_value, float(wrong)):
                raise CheckFailed(f"{case}: loss {loss_value:.4f}: {message}")
        raise CheckFailed(f"{case}: loss {loss_value:.4f}, expected {expected:.4f}")


def _check_accuracy(accuracy, expected: float, inputs: tuple, case: str) -> None:
    """The learner's accuracy: a number (or one-number tensor) equal to ``expected``; else the message of the
    mistake it reproduces. ``inputs``: (logits, targets, loss_mask)."""
    if isinstance(accuracy, torch.Tensor) and accuracy.numel() == 1:
        accuracy = accuracy.detach().reshape(()).item()
    if isinstance(accuracy, bool) or not isinstance(accuracy, numbers.Real):
        raise CheckFailed(f"{case}: return the accuracy as a float, got {type(accuracy).__name__}")
    accuracy = float(accuracy)
    if not _same(accuracy, expected):
        for message, wrong in _accuracy_mistakes(*inputs):
            if _same(accuracy, wrong):
                raise CheckFailed(f"{case}: accuracy {accuracy:.4f}: {message}")
        raise CheckFailed(f"{case}: accuracy {accuracy:.4f}, expected {expected:.4f}")


# --------------------------------------------------------------------------- Exercise 3


class _NoGreedy(TransformerEncoderDecoder):
    """The dates model without its own ``greedy_decode``: the exercise is to write that loop."""

    def greedy_decode(self, *args, **kwargs):
        raise CheckFailed(
            "your function called model.greedy_decode; the exercise is to write that loop yourself with "
            "model.encode and model.decode"
        )


def _no_package_greedy():
    """While the learner's code runs, the package's own greedy loop refuses to run, however it is reached."""
    from .nb04 import _refusing

    return _refusing(
        (TransformerEncoderDecoder,),
        "greedy_decode",
        "your function ran the package's greedy_decode; the exercise is to write that loop yourself with "
        "model.encode and model.decode",
    )


def _reference_greedy(model, src, src_valid_lens, num_steps, bos_id, *, feed="prefix", read=-1, lens=True):
    """Greedy decoding with switchable mistakes; the defaults give the right answer."""
    with torch.no_grad():
        memory = model.encode(src, src_valid_lens if lens else None)  # (B, S, d)
        out = torch.full((src.shape[0], 1), bos_id, dtype=torch.long)  # (B, 1)
        for _ in range(num_steps):
            tgt_in = out if feed == "prefix" else out[:, -1:]  # (B, t) or (B, 1)
            logits = model.decode(tgt_in, memory, src_valid_lens if lens else None)  # (B, t, V)
            out = torch.cat([out, logits[:, read].argmax(-1, keepdim=True)], dim=1)
    return out[:, 1:]  # (B, num_steps)


def _greedy_models():
    """The committed dates model and an untrained one of the same size, both unable to decode on their own."""
    from ..train import load_pretrained  # imported here: only this check needs the checkpoint

    task = get_task("dates")
    trained = load_pretrained("dates", device="cpu")
    models = []
    with torch.random.fork_rng(devices=[]):  # seeded without moving the learner's random stream
        torch.manual_seed(50)
        for label, source in (("the committed dates model", trained), ("an untrained dates model", None)):
            net = _NoGreedy(task.default_config())
            if source is not None:
                net.load_state_dict(source.state_dict())
            models.append((label, net.eval()))
    return models


@friendly
def check_greedy_decode(fn) -> None:
    """``fn(model, src (B, S), src_valid_lens (B,), num_steps, bos_id)`` -> (B, num_steps) ids, without <bos>."""
    task = get_task("dates")
    bos_id = task.tgt_stoi[BOS]
    examples = load_split("dates")[:12]
    batch = task.collate(examples)  # src right-padded to the longest of the 12 sources
    cases = []
    for label, net in _greedy_models():
        for num_steps in (10, 4):
            cases.append((net, num_steps, f"{label}, 12 eval dates, num_steps={num_steps}"))
    for net, num_steps, case in cases:
        expected = TransformerEncoderDecoder.greedy_decode(net, batch.src, num_steps, bos_id, batch.valid_lens)
        with _no_package_greedy():  # also when reached as TransformerEncoderDecoder.greedy_decode(model, ...)
            actual = call(fn, net, batch.src.clone(), batch.valid_lens.clone(), num_steps, bos_id, case=case)
        actual = expect_tensor(actual, case).detach().cpu()
        B = batch.src.shape[0]
        if tuple(actual.shape) == (B, num_steps + 1) and bool((actual[:, 0] == bos_id).all()):
            raise CheckFailed(f"{case}: the output still starts with <bos>; drop it and return (B, num_steps)")
        if tuple(actual.shape) == (B, num_steps - 1):
            raise CheckFailed(
                f"{case}: one token short, shape {tuple(actual.shape)}: num_steps steps predict num_steps tokens"
            )
        expect_shape(actual, (B, num_steps), case)
        if actual.is_floating_point():
            raise CheckFailed(f"{case}: return token ids (integers from argmax), got dtype {actual.dtype}")
        if torch.equal(actual, expected):
            continue
        mistakes = [
            (
                "fed back only the last token: the decoder must see the whole prefix <bos> y_1 .. y_t at every "
                "step (with one token it cannot tell which character it is writing)",
                dict(feed="last"),
            ),
            (
                "read the prediction at the first position (logits[:, 0]); the next token comes from the last "
                "position, logits[:, -1]",
                dict(read=0),
            ),
            (
                "src_valid_lens was not passed on: the encoder's self-attention and the cross-attention then "
                "attend to the <pad> characters at the end of the shorter sources",
                dict(lens=False),
            ),
        ]
        for message, flags in mistakes:
            wrong = _reference_greedy(net, batch.src, batch.valid_lens, num_steps, bos_id, **flags)
            if torch.equal(actual, wrong):
                raise CheckFailed(f"{case}: {message}")
        b = int((actual != expected).any(dim=1).nonzero()[0])
        raise CheckFailed(
            f"{case}: wrong tokens for {examples[b][0]!r}: got {task.decode(actual[b])!r}, "
            f"expected {task.decode(expected[b])!r}"
        )
    passed("check_greedy_decode", len(cases))


# ------------------------------------------------------- notebook 05a: our attention as nn.MultiheadAttention


def _to_torch(ours, swap_kv=False, in_bias=True, out_bias=True, batch_first=True):
    """``ours`` copied into ``nn.MultiheadAttention``; the switches make the mistakes the check names."""
    from torch import nn

    bias = ours.W_q.bias is not None
    layer = nn.MultiheadAttention(
        ours.num_hiddens,
        ours.num_heads,
        bias=bias,
        kdim=ours.W_k.in_features,
        vdim=ours.W_v.in_features,
        batch_first=batch_first,
    )
    W_k, W_v = (ours.W_v, ours.W_k) if swap_kv else (ours.W_k, ours.W_v)
    with torch.no_grad():
        if layer.in_proj_weight is not None:
            layer.in_proj_weight.copy_(torch.cat([ours.W_q.weight, W_k.weight, W_v.weight]))
        else:
            layer.q_proj_weight.copy_(ours.W_q.weight)
            layer.k_proj_weight.copy_(W_k.weight)
            layer.v_proj_weight.copy_(W_v.weight)
        layer.out_proj.weight.copy_(ours.W_o.weight)
        if bias:
            layer.in_proj_bias.copy_(torch.cat([ours.W_q.bias, W_k.bias, W_v.bias]) if in_bias else 0)
            layer.out_proj.bias.copy_(ours.W_o.bias if out_bias else 0)
    return layer.eval()


def _torch_attention_cases():
    """(ours, queries, keys, values, valid_lens, description), seeded."""
    from ..mha import MultiHeadAttention

    cases = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(50)
        for D, H, bias, k_size, v_size in [(16, 4, True, 10, 6), (16, 2, False, 12, 12), (12, 3, True, None, None)]:
            ours = MultiHeadAttention(D, H, bias=bias, key_size=k_size, value_size=v_size).eval()
            K, kw, vw = 5, k_size or D, v_size or D
            inputs = torch.randn(2, 4, D), torch.randn(2, K, kw), torch.randn(2, K, vw)
            describe = f"MultiHeadAttention({D}, {H}, bias={bias}, key_size={k_size}, value_size={v_size})"
            cases.append((ours, *inputs, torch.tensor([5, 3]), describe))
    return cases


def _torch_attention_output(layer, q, k, v, valid_lens):
    """``layer``'s output on batch-first inputs, with our padding lengths as PyTorch's key_padding_mask."""
    from ..masks import padding_mask

    ignore = ~padding_mask(valid_lens, k.shape[1])[:, 0]  # (B, K), True = ignore
    if not layer.batch_first:
        out, _ = layer(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), key_padding_mask=ignore)
        return out.transpose(0, 1)
    out, _ = layer(q, k, v, key_padding_mask=ignore, need_weights=False)
    return out


def _expect_plain_torch_layer(layer, ours, before: dict, case: str) -> None:
    """``layer`` is a plain batch-first ``nn.MultiheadAttention``, and ``ours`` kept its weights."""
    from torch import nn

    for name, p in ours.state_dict().items():
        if not torch.equal(p, before[name]):
            raise CheckFailed(f"{case}: your function changed our layer's {name}; it must only read it")
    if type(layer) is not nn.MultiheadAttention:
        raise CheckFailed(f"{case}: return an nn.MultiheadAttention, got {type(layer).__name__}")
    if "forward" in vars(layer):
        raise CheckFailed(f"{case}: the layer's forward was replaced; copy the weights instead")
    if not layer.batch_first:
        raise CheckFailed(f"{case}: build it with batch_first=True: our tensors are (B, T, D)")


@friendly
def check_to_torch_attention(fn) -> None:
    """``fn(ours)`` -> an ``nn.MultiheadAttention`` (``batch_first=True``) that computes what ``ours`` computes."""
    from ..mha import MultiHeadAttention
    from .nb04 import _refusing

    def refusal():
        return _refusing(
            (MultiHeadAttention,),
            "forward",
            "the layer you returned runs our MultiHeadAttention; copy our weights into PyTorch's layer instead",
        )

    cases = _torch_attention_cases()
    for ours, q, k, v, valid_lens, case in cases:
        before = {name: p.detach().clone() for name, p in ours.state_dict().items()}
        with torch.no_grad():
            expected = ours(q, k, v, valid_lens)  # (B, Q, D)
        hint = (
            " (when kdim or vdim differs from embed_dim, nn.MultiheadAttention has no in_proj_weight: it keeps "
            "q_proj_weight, k_proj_weight and v_proj_weight)"
        )
        layer = call(fn, ours, case=case, hint=hint)
        _expect_plain_torch_layer(layer, ours, before, case)
        layer.eval()
        with torch.no_grad(), refusal():
            actual = call(_torch_attention_output, layer, q, k, v, valid_lens, case=case)
        expect_shape(actual, expected.shape, case)
        if torch.allclose(actual, expected, atol=1e-5, rtol=1e-5):
            continue
        bias = ours.W_q.bias is not None
        mistakes = [
            (
                "keys and values swapped: k_proj / the middle block of in_proj_weight is W_k, then W_v",
                dict(swap_kv=True),
            ),
            ("forgot the input biases: in_proj_bias is the three biases of W_q, W_k and W_v", dict(in_bias=False)),
            ("forgot out_proj.bias: it is W_o's bias", dict(out_bias=False)),
            ("forgot every bias: in_proj_bias and out_proj.bias", dict(in_bias=False, out_bias=False)),
        ]
        with torch.no_grad():
            for message, switches in mistakes:
                if not bias and "swap_kv" not in switches:
                    continue
                if "swap_kv" in switches and ours.W_k.in_features != ours.W_v.in_features:
                    continue  # keys and values of different widths cannot be swapped
                wrong = _torch_attention_output(_to_torch(ours, **switches), q, k, v, valid_lens)
                if torch.allclose(actual, wrong, atol=1e-5, rtol=1e-5):
                    raise CheckFailed(f"{case}: {message}")
        diff = (actual - expected).abs().max().item()
        raise CheckFailed(f"{case}: the outputs differ from our layer's by up to {diff:.3g}")
    passed("check_to_torch_attention", len(cases))
