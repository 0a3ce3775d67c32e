"""The check of notebook 05's exercise 3, the greedy decoding loop (re-exported by ``nb05``).

It runs the learner's loop on the committed ``dates`` checkpoint and on an untrained model of the same size, and
when the tokens differ tries the typical mistakes (only the last token fed back, the prediction read at the wrong
position, ``src_valid_lens`` dropped) to name the one that was made.
"""

from __future__ import annotations

import torch

from ..models.model import TransformerEncoderDecoder
from ..models.tasks import BOS, get_task, load_split
from ._common import CheckFailed, call, expect_shape, expect_tensor, friendly, passed
from ._nb04_guards import _refusing


class _NoGreedy(TransformerEncoderDecoder):
    """The dates model without its own ``greedy_decode``: the exercise is to write that loop."""

    def greedy_decode(self, *args, **kwargs):
        raise CheckFailed(
            "your function called model.greedy_decode; the exercise is to write that loop yourself with "
            "model.encode and model.decode"
        )


def _no_package_greedy():
    """While the learner's code runs, the package's own greedy loop refuses to run, however it is reached."""
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
    from ..models.train import load_pretrained  # imported here: only this check needs the checkpoint

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
