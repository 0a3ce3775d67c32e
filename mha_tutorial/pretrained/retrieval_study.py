"""Notebook 09's helpers around the shipped head-pruning study of all-MiniLM-L6-v2 (``retrieval.py``).

* ``spot_checks``: repeat parts of the shipped study live and say, per part, whether it agrees;
* ``auc_table`` and ``plot_pruning_curves``: the pruning curves against the random orders;
* ``plot_importance_vs_ablation``: gradient importance against single-head ablation, one point per head;
* ``baseline_table``: accuracy@1, loss and mean cosines of several sentence encoders on both splits;
* ``value_norm_shares``: does a head's weight on ``[CLS]`` carry much? Kobayashi et al. (2020) weigh each
  attention weight by the length of what the key sends, ``||v_j W_o||``.
"""

from __future__ import annotations

import torch

from ..analysis import pruning
from . import retrieval

SPOT_COUNTS = (12, 24, 36)  # heads off at which the live curves are compared with the shipped ones
ACCURACY_TOL = 1e-6  # accuracy is a count / 160: equal, or a whole pair (0.006) off
LOSS_TOL = 1e-4  # the loss is float32 arithmetic: equal to rounding
TIE_TOL = 1e-4  # two heads whose importances agree to this (relative) may swap places on another CPU


def _check_study(study) -> None:
    if not isinstance(study, dict) or "curves" not in study or "summary" not in study:
        raise TypeError("study must be the dict that retrieval.load_study() returns")


def _same_order(live, shipped, scores) -> bool:
    """Equal orders, except that heads with tied scores (to TIE_TOL) count as the same place."""
    return all(
        a == tuple(b) or abs(scores[a] - scores[tuple(b)]) <= TIE_TOL * abs(scores[a])
        for a, b in zip(live, shipped, strict=True)
    )


def _one_head_off(model, pairs, head, full, full_loss, study) -> bool:
    L, H = study["ablation_drops"].shape
    gates = torch.ones(L, H, device=next(model.parameters()).device)  # (layers, heads)
    gates[head] = 0.0
    lost = full - retrieval.retrieval_accuracy(model, pairs, head_mask=gates)
    with torch.no_grad():
        added = retrieval.retrieval_loss(model, pairs, gates).item() - full_loss
    return (
        abs(lost - study["ablation_drops"][head].item()) < ACCURACY_TOL
        and abs(added - study["ablation_loss_increase"][head].item()) < LOSS_TOL
    )


def spot_checks(model, eval_pairs, study, importance_raw, full, full_loss, digest, counts=SPOT_COUNTS):
    """Repeat parts of the shipped study live: the full model's scores, the model's sha256 ``digest``, the raw
    importance, the single head whose ablation cost most and layer 0 head 2, both importance orders, and the
    curves at ``counts`` heads off (accuracy for the normalised order, loss for the raw one).

    Returns ``(checks, live)``: {what: live == shipped} and the live curve points {"accuracy": [...], "loss": [...]}.
    """
    _check_study(study)
    if tuple(importance_raw.shape) != tuple(study["importance_raw"].shape):
        raise ValueError(f"importance_raw has shape {tuple(importance_raw.shape)}, the study's is (6, 12)")
    importance_raw = importance_raw.detach().cpu()
    checks = {
        "accuracy, all heads": abs(full - study["full_accuracy"]) < ACCURACY_TOL,
        "loss, all heads": abs(full_loss - study["full_loss"]) < LOSS_TOL,
        "the model": study["provenance"]["model_sha256"] == digest,
        "gradient importance": (importance_raw - study["importance_raw"]).abs().max().item() < 1e-6,
    }
    H = importance_raw.shape[1]
    worst = divmod(int(study["ablation_drops"].argmax()), H)
    for head in [worst, (0, 2)]:
        checks[f"layer {head[0]} head {head[1]} off"] = _one_head_off(model, eval_pairs, head, full, full_loss, study)
    normalised = pruning.normalize_per_layer(importance_raw)
    orders = {}
    for name, scores, key in [("normalised", normalised, "importance"), ("raw", importance_raw, "importance_raw")]:
        orders[name] = pruning.order_from_scores(scores)  # least important first
        checks[f"{name} order"] = _same_order(orders[name], study["curves"][key]["order"], scores)
    live = {
        "accuracy": retrieval.pruning_curve(model, eval_pairs, orders["normalised"], list(counts)),
        "loss": retrieval.pruning_curve(model, eval_pairs, orders["raw"], list(counts), metric="loss"),
    }
    for i, n in enumerate(counts):
        at = study["counts"].index(n)
        checks[f"curves at {n} heads off"] = (
            abs(live["accuracy"][i] - study["curves"]["importance"]["accuracy"][at]) < ACCURACY_TOL
            and abs(live["loss"][i] - study["curves"]["importance_raw"]["loss"][at]) < LOSS_TOL
        )
    return checks, live


def auc_table(study):
    """DataFrame: each order's accuracy AUC and loss AUC (both divided by the width: the curve's mean height),
    and how many of the random orders each importance order beats on each."""
    import pandas as pd

    _check_study(study)
    s, randoms = study["summary"], study["curves"]["random"]
    rows = {}
    for name, key in [("importance, normalised", ""), ("importance, raw", "_raw")]:
        acc, loss = s[f"importance{key}_auc"], s[f"importance{key}_loss_auc"]
        wins = (sum(c["auc"] < acc for c in randoms), sum(c["loss_auc"] > loss for c in randoms))
        rows[name] = [acc, loss, str(wins[0]), str(wins[1])]
    for name, (a, b) in [("mean", ("mean", "mean")), ("best", ("max", "min")), ("worst", ("min", "max"))]:
        rows[f"random orders: {name}"] = [s["random_auc"][a], s["random_loss_auc"][b], "-", "-"]
    columns = ["accuracy AUC", "loss AUC", f"beats (accuracy, of {len(randoms)})", f"beats (loss, of {len(randoms)})"]
    table = pd.DataFrame.from_dict(rows, orient="index", columns=columns)
    return table  # the counts are text: "-" where a row has none


def plot_pruning_curves(study, live=None, counts=SPOT_COUNTS, n_pairs: int = 160):
    """Two stacked panels (accuracy@1, retrieval loss): the random orders' min-max band and mean, both importance
    orders, and the ``live`` points of ``spot_checks`` as crosses. Returns the figure."""
    import matplotlib.pyplot as plt

    _check_study(study)
    curves, x = study["curves"], study["counts"]
    fig, axes = plt.subplots(2, 1, figsize=(8.8, 8.6), layout="constrained")  # stacked: 880 px wide
    panels = [
        ("accuracy", "accuracy@1 (higher is better)", "normalised"),
        ("loss", "retrieval loss (lower is better)", "raw"),
    ]
    for ax, (metric, label, live_order) in zip(axes, panels, strict=True):
        randoms = torch.tensor([c[metric] for c in curves["random"]])  # (orders, points)
        ax.fill_between(
            x,
            randoms.min(0).values,
            randoms.max(0).values,
            color="0.85",
            label=f"{len(randoms)} random orders: min-max",
        )
        ax.plot(x, randoms.mean(0), color="0.45", ls="--", lw=1.2, label="random orders: mean")
        ax.plot(
            x,
            curves["importance"][metric],
            color="C0",
            marker="o",
            ms=3,
            lw=1.8,
            label="importance, normalised per layer",
        )
        ax.plot(x, curves["importance_raw"][metric], color="C1", marker="s", ms=3, lw=1.8, label="importance, raw")
        if live is not None:
            ax.plot(
                counts, live[metric], ls="none", marker="x", ms=10, mew=2, color="C3", label=f"{live_order} order, live"
            )
        ax.set(xlabel="heads switched off (of 72), least important first", ylabel=f"{label}, {n_pairs} eval pairs")
        ax.set_xticks(range(0, 73, 12))
        ax.grid(alpha=0.3)
    axes[0].set(ylim=(0.75, 0.92), title="Accuracy@1 on the eval pairs (y axis from 0.75)")
    axes[1].set(title="Retrieval loss on the eval pairs")
    axes[0].legend(loc="lower left", fontsize=8, ncol=2)
    axes[1].legend(loc="upper left", fontsize=8)
    crosses = (
        "" if live is None else f"\ncrosses: {len(counts)} points re-measured live, normalised order on top, raw below"
    )
    fig.suptitle(f"Pruning the 72 heads of all-MiniLM-L6-v2 (shipped curves){crosses}")
    return fig


def plot_importance_vs_ablation(importance, lost, title: str = "", annotate=None, seed: int = 0):
    """One point per head: its gradient ``importance`` (layers, heads; log x axis) against ``lost`` (layers, heads),
    the whole number of eval retrievals lost with only that head off. Points are jittered up and down (no boxes:
    some groups hold only a few heads) and coloured by layer; ``annotate=(layer, head)`` labels one head (default:
    none). Returns the figure."""
    import matplotlib.pyplot as plt

    if importance.shape != lost.shape or importance.dim() != 2:
        raise ValueError(
            f"importance {tuple(importance.shape)} and lost {tuple(lost.shape)} must be equal (layers, heads)"
        )
    L, H = importance.shape
    x, y = importance.detach().cpu().flatten(), lost.detach().cpu().flatten().long()  # (L*H,)
    jitter = torch.empty(L * H).uniform_(-0.2, 0.2, generator=torch.Generator().manual_seed(seed))  # (L*H,)
    fig, ax = plt.subplots(figsize=(8.8, 4.4), layout="constrained")
    for l in range(L):  # one colour per layer: a discrete legend, not a colour bar
        at = slice(l * H, (l + 1) * H)
        ax.scatter(x[at], y[at] + jitter[at], s=28, color=f"C{l}", edgecolors="0.2", lw=0.4, label=f"layer {l}")
    if annotate is not None:
        i = annotate[0] * H + annotate[1]
        ax.annotate(
            f"layer {annotate[0]} head {annotate[1]}",
            (x[i], y[i] + jitter[i]),
            xytext=(60, 40),
            textcoords="offset points",
            fontsize=9,
            arrowprops={"arrowstyle": "-", "color": "0.4", "lw": 0.6},
        )
    ax.set_xscale("log")
    ticks = [t for t in (0.001, 0.002, 0.003, 0.005, 0.01, 0.02, 0.04, 0.1) if x.min() / 1.5 <= t <= x.max() * 1.5]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    groups = sorted(set(y.tolist()))
    names = {-1: "gains 1", 0: "none", 1: "loses 1"}
    ax.set_yticks(groups, [f"{names.get(g, f'loses {g}')} ({int((y == g).sum())} heads)" for g in groups])
    ax.grid(alpha=0.3, axis="x")
    ax.legend(title="head's layer", loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=9)
    ax.set(
        xlabel="gradient importance I = mean |dL/dξ| (importance pairs; log scale)",
        ylabel="net eval retrievals\nwith only this head off",
        title=title,
    )
    return fig


def baseline_table(encoders: dict, splits: dict):
    """Score each sentence encoder (name -> function: list of texts -> (N, d) unit rows) on each split (name -> list
    of (sentence, paraphrase) pairs). Returns ``(table, embedded)``: a DataFrame with accuracy@1 per split, and the
    loss, mean cosine of the pairs and of unrelated sentences on the first split; and {encoder: (S, P)} there."""
    import pandas as pd

    if not encoders or not splits:
        raise ValueError("give at least one encoder and one split")
    first = next(iter(splits))
    rows, embedded = {}, {}
    for name, encode in encoders.items():
        row = {}
        for split, pairs in splits.items():
            S, P = encode([s for s, _ in pairs]), encode([p for _, p in pairs])  # (N, d) each
            scores = retrieval.embedding_scores(torch.cat([S, P]))
            row[f"accuracy@1, {split}"] = scores["accuracy"]
            if split == first:
                n = len(pairs)
                cosines = S @ P.T  # (N, N): sentence i vs paraphrase j
                paired = cosines.diagonal()  # (N,)
                row[f"loss, {split}"] = scores["loss"]
                row[f"mean cosine, {split} pairs"] = paired.mean().item()
                row["mean cosine, unrelated"] = ((cosines.sum() - paired.sum()) / (n * (n - 1))).item()
                embedded[name] = (S, P)
        rows[name] = row
    table = pd.DataFrame.from_dict(rows, orient="index")
    accuracy = [c for c in table.columns if c.startswith("accuracy@1")]
    return table[accuracy + [c for c in table.columns if c not in accuracy]], embedded


def value_norm_shares(model, tokens):
    """Per layer, over the real queries of ``tokens`` (a ``minilm.tokenize`` batch): the mean attention weight on
    ``[CLS]``, the median length of what ``[CLS]`` and what the other real tokens send through a head,
    ``||v_j W_o^h||`` (head h's value of token j times head h's columns of W_o; Kobayashi et al., 2020), and
    ``[CLS]``'s share of the weight-times-length sum ``sum_j a_ij ||v_j W_o^h||``. Averages over the heads.
    Returns a DataFrame with one row per layer."""
    import pandas as pd

    if not hasattr(tokens, "input_ids") or not hasattr(tokens, "attention_mask"):
        raise TypeError("tokens must be a batch from minilm.tokenize")
    with torch.no_grad():
        out = model(tokens.input_ids, tokens.attention_mask, output_hidden_states=True, output_attentions=True)
    real = tokens.attention_mask.bool()  # (B, T)
    cls, other = torch.zeros_like(real), real.clone()
    cls[:, 0], other[:, 0] = True, False  # [CLS] is token 0 of every sentence
    rows = []
    for l, layer in enumerate(model.layers):
        attn, X, A = layer.self_attn, out.hidden_states[l], out.attentions[l]  # X (B, T, D), A (B, H, T, T)
        H = A.shape[1]
        with torch.no_grad():
            V = attn.W_v(X).unflatten(-1, (H, -1))  # (B, T, H, d)
            W_o = attn.W_o.weight.unflatten(1, (H, -1))  # (D, H, d): head h's columns of W_o
            sent = torch.einsum("bthd,ehd->bhte", V, W_o)  # (B, H, T, D): what token t sends through head h
        norms = sent.norm(dim=-1)  # (B, H, T)
        weighted = A * norms[:, :, None, :]  # (B, H, queries, keys): a_ij ||v_j W_o^h||
        queries = real[:, None, :].expand_as(norms)  # (B, H, T): the real queries
        share = weighted[..., 0] / weighted.sum(-1).clamp_min(1e-12)  # (B, H, T)
        rows.append(
            {
                "weight on [CLS]": A[..., 0][queries].mean().item(),
                "|v W_o|, [CLS]": norms[cls[:, None, :].expand_as(norms)].median().item(),
                "|v W_o|, other tokens": norms[other[:, None, :].expand_as(norms)].median().item(),
                "weight x |v W_o| on [CLS]": share[queries].mean().item(),
            }
        )
    return pd.DataFrame(rows).rename_axis("layer")
