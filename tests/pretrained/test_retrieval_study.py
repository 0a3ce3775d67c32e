"""Notebook 09's study helpers (retrieval_study.py), against the shipped study and plain references."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from mha_tutorial.pretrained import minilm, retrieval  # noqa: E402
from mha_tutorial.pretrained import retrieval_study as rs  # noqa: E402

EVAL = retrieval.load_paraphrases("eval")


@pytest.fixture(scope="module")
def model():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield minilm.load_minilm(device="cpu")
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def study():
    return retrieval.load_study()


def test_auc_table_reads_the_summary_and_counts_the_wins(study):
    table = rs.auc_table(study)
    s, randoms = study["summary"], study["curves"]["random"]
    assert table.loc["importance, raw", "loss AUC"] == s["importance_raw_loss_auc"]
    assert table.loc["random orders: best", "loss AUC"] == s["random_loss_auc"]["min"]
    assert table.loc["random orders: worst", "accuracy AUC"] == s["random_auc"]["min"]
    wins = sum(c["loss_auc"] > s["importance_raw_loss_auc"] for c in randoms)
    assert table.loc["importance, raw", f"beats (loss, of {len(randoms)})"] == str(wins)
    assert table.loc["random orders: mean", f"beats (loss, of {len(randoms)})"] == "-"


def test_bad_study_is_refused():
    with pytest.raises(TypeError, match="load_study"):
        rs.auc_table({"curves": {}})


def test_same_order_forgives_only_ties():
    scores = torch.tensor([[1.0, 1.00001, 3.0]])
    live = [(0, 0), (0, 1), (0, 2)]
    assert rs._same_order(live, [[0, 1], [0, 0], [0, 2]], scores)  # a tie swapped: the same place
    assert not rs._same_order(live, [[0, 2], [0, 1], [0, 0]], scores)  # 1.0 and 3.0 swapped: different


def test_spot_checks_agree_with_the_shipped_study_and_catch_a_wrong_model(model, study):
    full = retrieval.retrieval_accuracy(model, EVAL)
    with torch.no_grad():
        full_loss = retrieval.retrieval_loss(model, EVAL).item()
    checks, live = rs.spot_checks(model, EVAL, study, study["importance_raw"], full, full_loss, "0" * 64, counts=(12,))
    assert checks.pop("the model") is False  # a wrong digest is caught
    assert all(checks.values()), checks
    assert len(live["accuracy"]) == len(live["loss"]) == 1
    with pytest.raises(ValueError, match="shape"):
        rs.spot_checks(model, EVAL, study, torch.zeros(2, 3), full, full_loss, "")


def test_baseline_table_matches_a_loop():
    torch.manual_seed(0)
    vectors = {}

    def encode(texts):  # a fixed random unit vector per text, paraphrases near their sentence
        rows = []
        for t in texts:
            if t not in vectors:
                vectors[t] = torch.randn(8)
            rows.append(vectors[t])
        return F.normalize(torch.stack(rows), dim=-1)

    pairs = [(f"s{i}", f"p{i}") for i in range(6)]
    for s, p in pairs:
        vectors[p] = vectors.setdefault(s, torch.randn(8)) + 0.8 * torch.randn(8)
    table, embedded = rs.baseline_table({"toy": encode}, {"a": pairs})
    S, P = embedded["toy"]
    hits = sum(int(max(range(6), key=lambda j: float(S[i] @ P[j])) == i) for i in range(6))
    assert table.loc["toy", "accuracy@1, a"] == pytest.approx(hits / 6)
    unrelated = [float(S[i] @ P[j]) for i in range(6) for j in range(6) if i != j]
    assert table.loc["toy", "mean cosine, unrelated"] == pytest.approx(sum(unrelated) / 30, abs=1e-6)
    assert list(table.columns)[0] == "accuracy@1, a"
    with pytest.raises(ValueError):
        rs.baseline_table({}, {"a": pairs})


def test_value_norms_match_one_head_computed_by_hand(model):
    batch = minilm.tokenize(["Owls hunt at night.", "She thanked the barista, who smiled."])
    table = rs.value_norm_shares(model, batch)
    assert list(table.index) == list(range(6))
    assert ((table["weight x |v W_o| on [CLS]"] >= 0) & (table["weight x |v W_o| on [CLS]"] <= 1)).all()
    # by hand, layer 2: head h's output with only token j's value, everything else zero, through W_o (no bias)
    with torch.no_grad():
        out = model(batch.input_ids, batch.attention_mask, output_hidden_states=True)
        attn, X = model.layers[2].self_attn, out.hidden_states[2]
        V = attn.W_v(X)  # (B, T, 384)
        lengths = []
        for h in range(12):
            only = torch.zeros_like(V)
            only[..., 32 * h : 32 * (h + 1)] = V[..., 32 * h : 32 * (h + 1)]
            lengths.append((only @ attn.W_o.weight.T)[:, 0].norm(dim=-1))  # (B,): what [CLS] sends
    assert table.loc[2, "|v W_o|, [CLS]"] == pytest.approx(torch.cat(lengths).median().item(), rel=1e-5)
    with pytest.raises(TypeError):
        rs.value_norm_shares(model, "not a batch")


def test_figures_draw_points_not_boxes(study):
    lost = (study["ablation_drops"] * 160).round().long()
    fig = rs.plot_importance_vs_ablation(study["importance_raw"], lost, title="t")
    ax = fig.axes[0]
    assert len(ax.collections) == 6  # one scatter per layer
    assert not [p for p in ax.patches]  # no boxes
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert any(label.startswith("gains 1") for label in labels) and any(label.startswith("loses 1") for label in labels)
    plt.close(fig)
    assert not ax.texts  # no head labelled by default
    fig = rs.plot_importance_vs_ablation(study["importance_raw"], lost, annotate=(0, 2))
    assert [t.get_text() for t in fig.axes[0].texts] == ["layer 0 head 2"]
    plt.close(fig)
    with pytest.raises(ValueError):
        rs.plot_importance_vs_ablation(study["importance_raw"], lost[:3])
    fig = rs.plot_pruning_curves(study, {"accuracy": [0.8, 0.8, 0.8], "loss": [0.3, 0.3, 0.3]})
    assert len(fig.axes) == 2 and "3 points re-measured live" in fig._suptitle.get_text()
    plt.close(fig)
    fig = rs.plot_pruning_curves(study)  # no live points: the title claims none
    assert "re-measured" not in fig._suptitle.get_text()
    plt.close(fig)
