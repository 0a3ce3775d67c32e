"""The shipped SmolLM2 pruning study (``data/smollm_pruning.json``): its shapes, its orders and its provenance.

One entry is re-measured on the real model in test_smollm.py (it needs the weights); notebook 14 re-measures more.
"""

from __future__ import annotations

import torch

from mha_tutorial.pretrained import smollm_study as study

L, H, H_KV = 30, 9, 3


def test_the_study_has_every_head_and_group():
    shipped = study.load_study()
    heads, groups = torch.tensor(shipped["head_importance"]), torch.tensor(shipped["group_importance"])
    assert heads.shape == (L, H) and groups.shape == (L, H_KV)
    assert shipped["window"] == study.WINDOW
    assert 1 < shipped["heldout_ppl"] < 1000 and 1 < shipped["selection_ppl"] < 1000  # uniform guess: 49,152


def test_the_curves_follow_the_importance_order():
    shipped = study.load_study()
    for unit, per_layer in [("head", H), ("group", H_KV)]:
        curves, scores = shipped[f"{unit}_curves"], torch.tensor(shipped[f"{unit}_importance"])
        total = L * per_layer
        assert curves["counts"] == [round(f * total) for f in study.COUNTS]
        assert curves["importance_order"] == torch.argsort(scores.flatten(), stable=True).tolist()
        assert sorted(curves["importance_order"]) == list(range(total))
        assert len(curves["random"]) == study.NUM_RANDOM
        assert all(len(c) == len(curves["counts"]) for c in [curves["importance"], *curves["random"]])
        # nothing off: every curve starts at the intact model's held-out perplexity
        assert {c[0] for c in [curves["importance"], *curves["random"]]} == {shipped["heldout_ppl"]}


def test_the_provenance_names_the_command_and_the_machine():
    provenance = study.load_study()["provenance"]
    assert provenance["command"] == "python -m mha_tutorial.pretrained.smollm_study"
    assert provenance["machine"] and provenance["minutes"] > 0
    assert provenance["text"] == study.eval_text()["source"]


def test_the_eval_text_is_four_topics_with_a_licence():
    text = study.eval_text()
    assert list(text["selection"]) == ["calls", "function"] and list(text["heldout"]) == ["import", "try"]
    assert "Python Software Foundation License" in text["licence"]
