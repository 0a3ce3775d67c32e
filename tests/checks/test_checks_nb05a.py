"""The exercise check of notebook 05a's Exercise 2 accepts the right predictions and names each miss."""

from __future__ import annotations

import pytest

from mha_tutorial.checks import CheckFailed, check_load_predictions
from mha_tutorial.checks.nb05a import LOAD_CHANGES, _loads
from mha_tutorial.models.train import load_pretrained

RIGHT = {
    "num_heads=8": True,
    "ffn_num_hiddens=256": False,
    "max_len=12": False,
    "num_enc_layers=2": False,
    "bias=False": False,
    "dropout=0.1": True,
}


def test_the_table_of_changes_matches_what_loading_does():
    trained = load_pretrained("reversal")
    assert set(LOAD_CHANGES) == set(RIGHT)
    assert {name: _loads(trained, change) for name, (change, _) in LOAD_CHANGES.items()} == RIGHT


def test_right_predictions_pass(capsys):
    check_load_predictions(lambda: dict(RIGHT))
    assert "✓ check_load_predictions: passed on 6 cases" in capsys.readouterr().out


def test_a_stub_is_not_attempted(capsys):
    def stub():
        raise NotImplementedError("Exercise 2: not written yet")

    check_load_predictions(stub)
    assert "not attempted yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    "flip, words",
    [
        ("num_heads=8", "changes no parameter's shape"),
        ("max_len=12", "(12, 64) instead of (10, 64)"),
        ("bias=False", "unexpected keys"),
        ("dropout=0.1", "dropout has no parameters"),
        ("num_enc_layers=2", "missing keys"),
    ],
)
def test_each_miss_is_named_with_its_reason(flip, words):
    wrong = dict(RIGHT, **{flip: not RIGHT[flip]})
    with pytest.raises(CheckFailed, match="1 of 6 predictions missed") as err:
        check_load_predictions(lambda: wrong)
    assert flip in str(err.value) and words in str(err.value)


def test_all_true_names_every_refusal():
    with pytest.raises(CheckFailed, match="4 of 6 predictions missed"):
        check_load_predictions(lambda: dict.fromkeys(RIGHT, True))


@pytest.mark.parametrize(
    "answer, words",
    [
        ([True] * 6, "must return a dict"),
        ({"num_heads=8": True}, "missing"),
        (dict(RIGHT, num_heads=True), "not one of them"),
        (dict(RIGHT, **{"num_heads=8": "yes"}), "True (loads) or False (raises)"),
    ],
)
def test_malformed_answers_are_explained(answer, words):
    with pytest.raises(CheckFailed, match=words.replace("(", r"\(").replace(")", r"\)")):
        check_load_predictions(lambda: answer)
