"""The length-generalisation study of notebook 12: the shipped table and models agree with the code that made them."""

from __future__ import annotations

import pytest
import torch

from mha_tutorial.modern import length_study as ls


@pytest.fixture(scope="module")
def study():
    return ls.read_study()


@pytest.fixture(scope="module")
def models():
    return {position: ls.load_model(position) for position in ls.POSITIONS}


def test_the_shipped_table_has_every_row_once(study):
    per_model = len(ls.TEST_RUNS) + (len(ls.STARTS) - 1) * (ls.TRAIN_RUNS[1] - ls.TRAIN_RUNS[0] + 1)
    assert len(study) == len(ls.POSITIONS) * len(ls.SEEDS) * per_model
    assert not study.duplicated(["position", "seed", "run", "start"]).any()
    assert set(study.position) == set(ls.POSITIONS) and set(study.seed) == set(ls.SEEDS)
    assert study.accuracy.between(0, 1).all()
    assert study.machine.nunique() == 1  # one run made the whole table


@pytest.mark.parametrize("position", ls.POSITIONS)
def test_shipped_models_reproduce_their_rows(study, models, position):
    """Seed 0's rows, recomputed from the shipped weights: equal up to one token that another CPU may round the
    other way."""
    shipped = study[(study.position == position) & (study.seed == 0)].set_index(["run", "start"]).accuracy
    for start, runs in ((0, (4, 10, 20)), (24, (5,))):
        live = ls.accuracy_by_length(models[position], runs, start=start)
        for run, accuracy in live.items():
            one_token = 1 / (ls.EVAL_EXAMPLES * (run - 1))  # a run of n letters has n - 1 predictable letters
            assert abs(accuracy - shipped[run, start]) <= 1.5 * one_token, (position, run, start)


def test_accuracy_equals_a_plain_loop(models):
    model, run, start, n = models["sinusoidal"], 11, 3, 20
    task = ls.LongInductionTask(run, run)
    examples = task.sample(n, ls.EVAL_SEED + run, heldout=True)
    hits = total = 0
    with torch.no_grad():
        for (seq,) in examples:  # one sequence at a time: predict letter p + 1 of the copy from the letters <= p
            ids = torch.tensor([[task.tgt_stoi[c] for c in seq]])  # (1, 2n)
            logits = model(ids, positions=torch.arange(start, start + 2 * run))[0]  # (2n, V)
            for p in range(run, 2 * run - 1):
                hits += int(logits[p].argmax()) == task.tgt_stoi[seq[p + 1]]
                total += 1
    assert ls.accuracy_by_length(model, (run,), n=n, start=start)[run] == pytest.approx(hits / total, abs=1e-12)


def test_rotary_model_is_blind_to_where_the_run_starts_and_learned_one_is_not(models):
    """RoPE scores depend on offsets only, so moving a whole run to later positions changes nothing but rounding."""
    runs = (4, 7)
    rope = [ls.accuracy_by_length(models["rope"], runs, n=50, start=s) for s in (0, 29)]
    learned = [ls.accuracy_by_length(models["learned"], runs, n=50, start=s) for s in (0, 29)]
    assert rope[0] == rope[1]
    assert learned[0] != learned[1]


def test_summary_and_table_are_the_seeds_min_mean_and_max(study):
    numbers = ls.summary(study)
    rows = study[(study.position == "rope") & (study.start == 0) & study.run.between(9, 12)]
    per_seed = [rows[rows.seed == s].accuracy.mean() for s in ls.SEEDS]
    assert numbers.loc[("rope", "9-12"), "min"] == pytest.approx(min(per_seed))
    assert numbers.loc[("rope", "9-12"), "mean"] == pytest.approx(sum(per_seed) / len(per_seed))
    assert numbers.loc[("rope", "9-12"), "max"] == pytest.approx(max(per_seed))
    cell = ls.table(study, ["9-12"]).loc["rope", "9-12"]
    assert cell == f"{sum(per_seed) / len(per_seed):.2f} [{min(per_seed):.2f}, {max(per_seed):.2f}]"


def test_the_figure_has_both_panels_on_one_scale(study):
    import matplotlib.pyplot as plt

    fig = ls.plot_study(study)
    left, right = fig.axes
    assert left.get_ylim() == right.get_ylim()
    assert left.get_xlabel() and right.get_xlabel() and left.get_ylabel()
    plt.close(fig)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="min_run <= max_run"):
        ls.LongInductionTask(9, 3)
    with pytest.raises(ValueError, match="position must be one of"):
        ls.load_model("alibi")
    with pytest.raises(ValueError, match="position must be one of"):
        ls.train_model("rotary")
    with pytest.raises(ValueError, match="seed"):
        ls.train_model("rope", seed=-1)
    with pytest.raises(FileNotFoundError, match="python -m mha_tutorial.modern.length_study"):
        ls.load_model("rope", path="/nonexistent/length-rope.pt")


def test_the_batches_and_positions_follow_the_models_device(models, monkeypatch):
    """A model on a GPU gets its batches there (checked on the CPU by watching where they are sent)."""
    sent = []
    collate = ls.LongInductionTask.collate
    monkeypatch.setattr(
        ls.LongInductionTask,
        "collate",
        lambda self, rows, device=None: sent.append(device) or collate(self, rows, device),
    )
    model = models["rope"]
    with torch.no_grad():
        ls.accuracy_by_length(model, (3, 9), n=4)
    assert sent == [next(model.parameters()).device] * 2


def test_same_at_every_start_tells_the_rotary_scores_from_the_learned_ones(study):
    assert ls.same_at_every_start(study, "rope")
    assert not ls.same_at_every_start(study, "learned")
    moved = study.copy()
    moved.loc[(moved.position == "rope") & (moved.start == 16) & (moved.run == 5) & (moved.seed == 2), "accuracy"] -= (
        0.01
    )
    assert not ls.same_at_every_start(moved, "rope")
