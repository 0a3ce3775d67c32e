"""Training, evaluation and the committed checkpoints (data/checkpoints/*.pt)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mha_tutorial.analysis import pruning
from mha_tutorial.analysis.head_stats import pattern_scores
from mha_tutorial.models.model import build_model
from mha_tutorial.models.tasks import TASKS, get_task
from mha_tutorial.models.train import (
    CHECKPOINT_DIR,
    CheckpointNotFoundError,
    evaluate,
    load_pretrained,
    read_checkpoint,
    save_checkpoint,
    train,
)
from mha_tutorial.models.train import main as train_main

REPO = Path(__file__).resolve().parents[2]
NAMES = list(TASKS)


@pytest.fixture(scope="module")
def pretrained():
    return {name: load_pretrained(name, device="cpu") for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_committed_checkpoint_is_small_plain_data(name):
    path = CHECKPOINT_DIR / f"{name}.pt"
    assert path.stat().st_size < 1_000_000
    checkpoint = torch.load(path, map_location="cpu", weights_only=True)  # no pickled code
    assert checkpoint["task"] == name
    assert checkpoint["config"] == get_task(name).default_config().to_dict()
    assert checkpoint["train"]["seed"] == 0


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("split", ["eval", "importance"])
def test_committed_checkpoint_reaches_99_percent(pretrained, name, split):
    model = pretrained[name]
    result = evaluate(model, name, split)
    assert result["n"] == 1000
    assert result["accuracy"] >= 0.99, f"{name} on {split}: {result}"
    if split == "eval":  # the stored metric is what the model really scores
        assert result["accuracy"] == pytest.approx(model.metrics["eval_accuracy"], abs=1e-6)


def untrained(name):
    torch.manual_seed(0)
    return build_model(get_task(name).default_config()).eval()


def test_reversal_head_is_anti_diagonal(pretrained):
    task, rows = get_task("reversal"), get_task("reversal").load_split("eval")[:300]
    trained = pattern_scores(pretrained["reversal"], task.name, rows)["anti_diagonal"]["enc.0.self"]
    baseline = pattern_scores(untrained("reversal"), task.name, rows)["anti_diagonal"]["enc.0.self"]
    assert max(trained) > 0.95 and max(baseline) < 0.3


def test_induction_has_previous_token_and_induction_heads(pretrained):
    task, rows = get_task("induction"), get_task("induction").load_split("eval")[:300]
    scores = pattern_scores(pretrained["induction"], task.name, rows)
    assert max(scores["previous_token"]["dec.0.self"]) > 0.8  # layer 0 looks one step back
    assert max(scores["induction"]["dec.1.self"]) > 0.85  # layer 1 looks after the earlier copy
    # ... and not the other way round: the roles belong to the layers.
    assert max(scores["induction"]["dec.0.self"]) < 0.5 and max(scores["previous_token"]["dec.1.self"]) < 0.5
    baseline = pattern_scores(untrained("induction"), task.name, rows)
    assert max(baseline["previous_token"]["dec.0.self"]) < 0.5 and max(baseline["induction"]["dec.1.self"]) < 0.3


def test_dates_cross_attention_reads_the_right_field(pretrained):
    task, rows = get_task("dates"), get_task("dates").load_split("eval")[:300]
    scores = pattern_scores(pretrained["dates"], task.name, rows)
    baseline = pattern_scores(untrained("dates"), task.name, rows)
    for field in ("year", "month", "day"):
        assert max(scores[field]["dec.0.cross"]) > 0.7, field
        assert max(baseline[field]["dec.0.cross"]) < 0.45, field


def test_evaluate_with_a_head_mask(pretrained):
    model = pretrained["reversal"]
    ones = torch.ones(model.num_attention_layers, model.num_heads)
    assert evaluate(model, "reversal", head_mask=ones) == evaluate(model, "reversal")
    assert evaluate(model, "reversal", head_mask=torch.zeros_like(ones))["accuracy"] < 0.2  # no attention, no reversal


def test_dates_loss_and_accuracy_gives_head_mask_gradients(pretrained):
    model, task = pretrained["dates"], get_task("dates")
    batch = task.collate(task.load_split("importance")[:64])
    head_mask = torch.ones(model.num_attention_layers, model.num_heads, requires_grad=True)
    loss, acc = task.loss_and_accuracy(model, batch, head_mask)
    loss.backward()
    assert acc >= 0.99 and head_mask.grad.shape == (4, 4) and head_mask.grad.abs().sum() > 0


def test_missing_checkpoint_names_path_and_command(tmp_path):
    missing = tmp_path / "nothing_here.pt"
    with pytest.raises(
        FileNotFoundError, match="nothing_here.pt.*python -m mha_tutorial.models.train --task dates --out"
    ):
        load_pretrained("dates", path=missing)


def test_corrupt_checkpoint_is_a_value_error(tmp_path):
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"this is not a checkpoint" * 10)
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_pretrained("reversal", path=garbage)
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes((CHECKPOINT_DIR / "reversal.pt").read_bytes()[:5000])
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        load_pretrained("reversal", path=truncated)
    not_ours = tmp_path / "tensor.pt"
    torch.save({"weights": torch.zeros(3)}, not_ours)
    with pytest.raises(ValueError, match="not a checkpoint of this package"):
        read_checkpoint(not_ours)


def test_checkpoint_of_another_task_or_config_is_refused(tmp_path):
    other = tmp_path / "reversal_as_dates.pt"
    shutil.copy(CHECKPOINT_DIR / "reversal.pt", other)
    with pytest.raises(ValueError, match="trained for task 'reversal', not 'dates'"):
        load_pretrained("dates", path=other)
    checkpoint = torch.load(CHECKPOINT_DIR / "induction.pt", weights_only=True)
    checkpoint["config"]["num_heads"] = 2
    changed = tmp_path / "induction_2_heads.pt"
    torch.save(checkpoint, changed)
    with pytest.raises(ValueError, match="different configuration.*num_heads: checkpoint 2 vs current 4"):
        load_pretrained("induction", path=changed)
    checkpoint = torch.load(CHECKPOINT_DIR / "induction.pt", weights_only=True)
    del checkpoint["state_dict"]["head.weight"]
    broken = tmp_path / "induction_no_head.pt"
    torch.save(checkpoint, broken)
    with pytest.raises(ValueError, match="weights do not fit"):
        load_pretrained("induction", path=broken)


def test_train_is_seeded_and_reports_history():
    _, h1 = train("induction", steps=6, seed=3, device="cpu", progress=False, eval_every=3)
    _, h2 = train("induction", steps=6, seed=3, device="cpu", progress=False, eval_every=3)
    _, h3 = train("induction", steps=6, seed=4, device="cpu", progress=False, eval_every=3)
    assert len(h1["loss"]) == len(h1["lr"]) == 6
    assert h1["loss"] == h2["loss"] != h3["loss"]
    assert h1["eval_step"] == [3, 6] and h1["eval_accuracy"][-1] == h1["accuracy"]
    assert h1["lr"][0] < h1["lr"][-1]  # still warming up after 6 of 50 warmup steps
    assert torch.get_num_threads() >= 1


def test_cli_retrains_reversal_to_the_committed_accuracy(tmp_path):
    """The committed checkpoint is honest: the documented command reproduces its accuracy from scratch."""
    out = tmp_path / "reversal.pt"
    result = subprocess.run(
        [sys.executable, "-m", "mha_tutorial.models.train", "--task", "reversal", "--out", str(out), "--no-progress"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    committed = load_pretrained("reversal", device="cpu")
    fresh = load_pretrained("reversal", path=out, device="cpu")
    accuracy = evaluate(fresh, "reversal")["accuracy"]
    assert accuracy >= evaluate(committed, "reversal")["accuracy"] - 0.002
    assert fresh.metrics["eval_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert "reversal: eval accuracy" in result.stdout


def test_cli_rejects_an_unknown_task(tmp_path):
    """The CLI's own entry point, called in this process: ``python -m`` runs this same ``main`` (the retraining
    test above runs it that way), and an exception out of it is a non-zero exit with its message on stderr; a
    second interpreter would only add its start-up (about 4 s on one thread)."""
    out = tmp_path / "x.pt"
    with pytest.raises(ValueError, match="unknown task 'sorting'"):
        train_main(["--task", "sorting", "--out", str(out)])
    assert not out.exists()  # refused before any work


def test_load_pretrained_leaves_the_callers_random_stream_alone():
    torch.manual_seed(0)
    expected = torch.rand(3)
    torch.manual_seed(0)
    load_pretrained("reversal", device="cpu")
    assert torch.equal(torch.rand(3), expected)


def test_checkpoint_of_another_format_is_refused(tmp_path):
    checkpoint = torch.load(CHECKPOINT_DIR / "reversal.pt", weights_only=True)
    checkpoint["format"] = 99
    torch.save(checkpoint, tmp_path / "future.pt")
    with pytest.raises(ValueError, match="checkpoint format 99; this version of the package reads format 1"):
        load_pretrained("reversal", path=tmp_path / "future.pt")


def test_measuring_on_no_examples_is_an_error_not_nan():
    model = load_pretrained("reversal", device="cpu")
    with pytest.raises(ValueError, match="at least one example"):
        evaluate(model, "reversal", examples=[])
    for measure in (pruning.ablation, pruning.gradient_importance):
        with pytest.raises(ValueError, match="no examples of task 'reversal'"):
            measure(model, "reversal", examples=[])
    with pytest.raises(ValueError, match="limit must be a positive int"):
        pruning.ablation(model, "reversal", limit=0)


def _edited(tmp_path, edit, name="edited.pt"):
    """A copy of the committed reversal checkpoint with one field changed by ``edit(checkpoint)``."""
    checkpoint = torch.load(CHECKPOINT_DIR / "reversal.pt", weights_only=True)
    edit(checkpoint)
    torch.save(checkpoint, tmp_path / name)
    return tmp_path / name


@pytest.mark.parametrize(
    "edit, words",
    [
        (lambda c: c.update(task=3), "field 'task' must name a task of this package"),
        (lambda c: c.update(task="sorting"), "got 'sorting'"),
        (lambda c: c.update(config=[1, 2]), "field 'config' must be a dict"),
        (lambda c: c["config"].pop("kind"), "lacks the ModelConfig fields ['kind']"),
        (lambda c: c["config"].update(colour="red"), "fields ['colour'] that ModelConfig does not know"),
        (lambda c: c["config"].update(num_heads="4"), "config['num_heads'] must be of type int, got '4'"),
        (lambda c: c["config"].update(bias=1), "config['bias'] must be of type bool"),
        (lambda c: c.update(state_dict=[1]), "field 'state_dict' must be a non-empty dict"),
        (lambda c: c.update(state_dict={}), "(empty)"),
        (lambda c: c["state_dict"].update({5: torch.zeros(3)}), "has a key 5 (int)"),
        (lambda c: c["state_dict"].update({"head.weight": "x"}), "state_dict['head.weight'] must be a tensor"),
        (lambda c: c["state_dict"]["head.bias"].fill_(float("nan")), "state_dict['head.bias'] contains NaN"),
        (lambda c: c.update(metrics=[1]), "field 'metrics' must be a dict"),
        (lambda c: c["metrics"].update(eval_accuracy="high"), "'eval_accuracy': 'high'"),
        (lambda c: c.update(train="seed 0"), "field 'train' must be a dict"),
    ],
)
def test_malformed_checkpoint_fields_are_named(tmp_path, edit, words):
    path = _edited(tmp_path, edit)
    for read in (read_checkpoint, lambda p: load_pretrained("reversal", path=p)):
        with pytest.raises(ValueError) as info:
            read(path)
        assert str(path) in str(info.value) and words in str(info.value)


def test_state_dict_that_does_not_fit_the_config_is_named(tmp_path):
    path = _edited(tmp_path, lambda c: c["state_dict"].update({"head.weight": torch.zeros(3, 3)}))
    assert read_checkpoint(path)["state_dict"]["head.weight"].shape == (3, 3)  # well-formed on its own
    with pytest.raises(ValueError, match="weights do not fit the configured model .field 'state_dict' vs 'config'"):
        load_pretrained("reversal", path=path)


def test_checkpoint_paths_that_are_missing_or_not_paths(tmp_path):
    missing = tmp_path / "nothing_here.pt"
    for read in (read_checkpoint, lambda p: load_pretrained("reversal", path=p)):
        with pytest.raises(ValueError, match="nothing_here.pt") as info:  # a ValueError ...
            read(missing)
        assert isinstance(info.value, FileNotFoundError) and isinstance(info.value, CheckpointNotFoundError)  # ... too
        for not_a_path in (5, None, ["a.pt"]):
            if not_a_path is None and read is not read_checkpoint:
                continue  # load_pretrained's path=None means the committed checkpoint
            with pytest.raises(TypeError, match="path must be a str or pathlib.Path"):
                read(not_a_path)
    with pytest.raises(ValueError, match="unknown task 'sorting'"):
        load_pretrained("sorting")
    with pytest.raises(ValueError, match="not a readable checkpoint"):
        read_checkpoint(tmp_path)  # a directory


def test_evaluate_and_save_checkpoint_check_their_arguments(tmp_path):
    model = load_pretrained("reversal", device="cpu")
    with pytest.raises(ValueError, match="batch_size must be a positive int, got 0"):
        evaluate(model, "reversal", batch_size=0)
    with pytest.raises(TypeError, match="model must be a model of this package"):
        evaluate(None, "reversal")
    with pytest.raises(ValueError, match="task 'dates' runs a model of kind 'encoder_decoder'"):
        evaluate(model, "dates")
    with pytest.raises(TypeError, match="list of reversal examples"):
        evaluate(model, "reversal", examples="abcdefghij")
    with pytest.raises(ValueError, match="history must be the dict returned by train"):
        save_checkpoint(tmp_path / "x.pt", model, "reversal", {})
    assert not (tmp_path / "x.pt").exists()
