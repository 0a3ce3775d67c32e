"""mha_tutorial.analysis.viz: the head grid draws what it is given, the collected maps are the model's, the statistics match
plain-loop references, and the role labels follow their stated rules."""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import numpy as np
import pytest
import torch
from matplotlib.patches import Rectangle

from mha_tutorial import figures
from mha_tutorial.analysis import head_stats, viz
from mha_tutorial.analysis import maps as attention_maps
from mha_tutorial.core.masks import causal_mask
from mha_tutorial.models.model import build_model
from mha_tutorial.models.tasks import get_task, load_split


def _images(fig):
    """The heatmap image of every panel, in grid order."""
    return [ax.images[0] for ax in fig.axes if ax.images]


def _softmax_weights(H, Q, K, keep=None, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(H, Q, K, generator=g)
    if keep is not None:
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1).nan_to_num(0.0)


# ============================================================================ plot_head_grid
def test_grid_has_one_panel_per_layer_and_head_and_one_shared_colour_bar():
    weights = torch.stack([_softmax_weights(3, 4, 5, seed=s) for s in range(2)])  # (L, H, Q, K)
    fig = viz.plot_head_grid(weights, list("abcd"), list("vwxyz"), layer_names=["first", "second"])
    images = _images(fig)
    assert len(images) == 6
    for img, (l, h) in zip(images, [(l, h) for l in range(2) for h in range(3)], strict=True):
        np.testing.assert_allclose(np.asarray(img.get_array()), weights[l, h].numpy(), rtol=1e-6)
        assert img.get_clim() == (0.0, 1.0)
    colour_bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert len(colour_bars) == 1
    titles = [ax.get_title() for ax in fig.axes if ax.images]
    assert titles[0] == "first · head 0" and titles[-1] == "second · head 2"
    assert "shared colour scale" in fig._suptitle.get_text()


def test_grid_labels_axes_with_the_tokens():
    w = _softmax_weights(2, 3, 4)
    fig = viz.plot_head_grid([w], ["<bos>", "a", " "], ["x", "<pad>", "y", "z"], axis_labels=("q", "k"))
    first = fig.axes[0]
    assert [t.get_text() for t in first.get_yticklabels()] == ["<s>", "a", "␣"]
    assert [t.get_text() for t in first.get_xticklabels()] == ["x", "∅", "y", "z"]
    assert first.get_ylabel() == "q" and first.get_xlabel() == "k"
    assert all(t.get_text() == "" for t in fig.axes[1].get_yticklabels())  # row labels only in the first column


def test_per_head_scales_give_every_head_its_own_colour_bar():
    w = _softmax_weights(3, 4, 4) * torch.tensor([1.0, 0.5, 0.25])[:, None, None]
    fig = viz.plot_head_grid([w], list("abcd"), list("abcd"), shared_scale=False)
    images = _images(fig)
    for h, img in enumerate(images):
        assert img.get_clim() == pytest.approx((0.0, float(w[h].max())))
    assert sum(ax.get_label() == "<colorbar>" for ax in fig.axes) == 3
    assert "own colour scale" in fig._suptitle.get_text()


def test_masked_cells_are_transparent_over_a_hatched_background_and_get_a_legend():
    keep = causal_mask(4)  # (Q, K)
    w = _softmax_weights(2, 4, 4, keep=keep)
    fig = viz.plot_head_grid([w], list("abcd"), list("abcd"), keep=keep)
    for ax in (a for a in fig.axes if a.images):
        data = ax.images[0].get_array()
        np.testing.assert_array_equal(np.ma.getmaskarray(data), (~keep).numpy())
        assert ax.images[0].get_cmap().get_bad()[3] == 0  # masked cells are see-through ...
        hatched = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch()]
        assert len(hatched) == 1 and hatched[0].get_zorder() < ax.images[0].get_zorder()  # ... onto the hatching
    assert fig.legends and "masked" in fig.legends[0].texts[0].get_text()
    unmasked = viz.plot_head_grid([w], list("abcd"), list("abcd"))
    assert not unmasked.legends


def test_layers_of_different_shapes_and_wrapped_heads():
    enc = _softmax_weights(4, 6, 6)
    cross = _softmax_weights(4, 3, 6, seed=1)
    fig = viz.plot_head_grid(
        [enc, cross], [list("abcdef"), list("xyz")], list("abcdef"), layer_names=["enc", "cross"], heads_per_row=2
    )
    images = _images(fig)
    assert len(images) == 8
    assert [img.get_array().shape for img in images] == [(6, 6)] * 4 + [(3, 6)] * 4
    grid = fig.axes[0].get_subplotspec().get_gridspec()
    assert (grid.nrows, grid.ncols) == (4, 2)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(query_labels=list("abc")), ValueError, "3 query labels"),
        (dict(key_labels=list("abcdef")), ValueError, "6 key labels"),
        (dict(keep=torch.ones(3, 5, dtype=torch.bool)), ValueError, "does not fit"),
        (dict(keep=torch.ones(4, 5)), TypeError, "bool"),
        (dict(layer_names=["a", "b"]), ValueError, "layer_names"),
        (dict(weights=torch.rand(4, 5)), ValueError, "(layers, heads, queries, keys)"),
        (dict(weights=[]), TypeError, "non-empty"),
        (dict(head_titles=[["x"]]), ValueError, "head_titles"),
        (dict(query_labels=[list("abcd"), list("abcd")]), ValueError, "one entry per layer"),
        (dict(heads_per_row=0), ValueError, "heads_per_row"),
    ],
)
def test_grid_rejects_what_does_not_fit(kwargs, error, words):
    args = dict(weights=[_softmax_weights(2, 4, 5)], query_labels=list("abcd"), key_labels=list("vwxyz"))
    args.update(kwargs)
    with pytest.raises(error) as info:
        viz.plot_head_grid(**args)
    assert words in str(info.value)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        # weights: a floating tensor per layer, something to draw, values on the 0.. colour scale
        (dict(weights=[torch.ones(2, 4, 5, dtype=torch.long)]), TypeError, "floating"),
        (dict(weights=[torch.ones(2, 4, 5, dtype=torch.bool)]), TypeError, "floating"),
        (dict(weights=[[[0.5] * 5] * 4] * 2), TypeError, "must be a tensor"),
        (dict(weights=[torch.rand(0, 4, 5)]), ValueError, "nothing to draw"),
        (dict(weights=[torch.rand(2, 0, 5)], query_labels=[]), ValueError, "no queries"),
        (dict(weights=[-torch.rand(2, 4, 5)]), ValueError, ">= 0"),
        (dict(weights=[torch.full((2, 4, 5), float("inf"))]), ValueError, "finite"),
        # labels and titles
        (dict(layer_names="abc"), TypeError, "layer_names"),
        (dict(layer_names=5), TypeError, "layer_names"),
        (dict(head_titles=["ab"]), ValueError, "head_titles"),
        (dict(head_titles=3), ValueError, "head_titles"),
        (dict(title=3), TypeError, "title"),
        # drawing options
        (dict(shared_scale="no"), TypeError, "shared_scale"),
        (dict(vmax=0), ValueError, "vmax"),
        (dict(vmax=float("nan")), ValueError, "vmax"),
        (dict(vmax="1"), TypeError, "vmax"),
        (dict(cmap="no-such-map"), ValueError, "cmap"),
        (dict(cmap=3), TypeError, "cmap"),
        (dict(panel_size=0), ValueError, "panel_size"),
        (dict(panel_size="2"), TypeError, "panel_size"),
        (dict(heads_per_row=1.5), TypeError, "heads_per_row"),
        (dict(heads_per_row=-2), ValueError, "heads_per_row"),
        (dict(figsize=3), ValueError, "figsize"),
        (dict(figsize=(4, -1)), ValueError, "figsize"),
    ],
)
def test_grid_names_the_bad_argument_before_drawing(kwargs, error, words):
    args = dict(weights=[_softmax_weights(2, 4, 5)], query_labels=list("abcd"), key_labels=list("vwxyz"))
    args.update(kwargs)
    figures = plt.get_fignums()
    with pytest.raises(error) as info:
        viz.plot_head_grid(**args)
    assert words in str(info.value)
    assert plt.get_fignums() == figures  # refused before a figure was made


def test_display_token_takes_a_string():
    with pytest.raises(TypeError, match="token is a string"):
        viz.display_token(3)


def test_grid_draws_layers_with_different_numbers_of_heads():
    """A pruned model's layers have fewer heads: the grid is as wide as the widest layer, a layer with
    no heads left is a note, and key labels appear above every empty place."""
    full, fewer, none = _softmax_weights(4, 3, 5), _softmax_weights(2, 3, 5, seed=1), torch.zeros(0, 3, 5)
    fig = viz.plot_head_grid([full, fewer, none], list("abc"), list("vwxyz"), layer_names=["a", "b", "c"])
    images = _images(fig)
    assert len(images) == 6
    for img, expected in zip(images, [*full, *fewer], strict=True):
        np.testing.assert_allclose(np.asarray(img.get_array()), expected.numpy(), rtol=1e-6)
    assert [ax.get_title() for ax in fig.axes if ax.images][4:] == ["b · head 0", "b · head 1"]
    grid = fig.axes[0].get_subplotspec().get_gridspec()
    assert (grid.nrows, grid.ncols) == (3, 4)
    assert any("c: no heads left" in t.get_text() for ax in fig.axes for t in ax.texts)
    key_labels = {ax.get_title(): [t.get_text() for t in ax.get_xticklabels()] for ax in fig.axes if ax.images}
    assert key_labels["a · head 0"] == [""] * 5  # layer b's head 0 is below it
    assert key_labels["a · head 3"] == list("vwxyz")  # nothing below it
    with pytest.raises(ValueError, match="head_titles must be a list of 3 lists of \\[4, 2, 0\\] strings"):
        viz.plot_head_grid([full, fewer, none], list("abc"), list("vwxyz"), head_titles=[["x"] * 4] * 3)


def test_grid_refuses_nan_where_the_mask_allows_attention():
    w = _softmax_weights(1, 2, 2)
    w[0, 0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        viz.plot_head_grid([w], list("ab"), list("ab"))
    keep = torch.tensor([[False, True], [True, True]])
    viz.plot_head_grid([w], list("ab"), list("ab"), keep=keep)  # a NaN under the mask is fine


# ============================================================================ collecting weights
def test_collect_reversal_matches_a_direct_forward_pass(models):
    model, task = models["reversal"], get_task("reversal")
    example = load_split("reversal")[3]
    maps = attention_maps.collect_attention(model, "reversal", example)
    with torch.no_grad():
        task.forward(model, task.collate([example]))
    direct = model.attention_weights()[0][1][0]  # (H, Q, K)
    assert maps.layer_names == ["enc.0.self"]
    torch.testing.assert_close(maps.weights[0], direct)
    assert maps.weights[0].device.type == "cpu"
    assert maps.query_labels[0] == list(example[1]) and maps.key_labels[0] == list(example[0])
    assert bool(maps.keep[0].all())


def test_collect_induction_cuts_the_padding_and_marks_the_future(models):
    seq = load_split("induction")[0][0]
    maps = attention_maps.collect_attention(models["induction"], "induction", (seq,))
    T = len(seq)
    assert [tuple(w.shape) for w in maps.weights] == [(4, T, T)] * 2
    assert maps.query_labels[0] == list(seq) == maps.key_labels[1]
    for w, keep in zip(maps.weights, maps.keep, strict=True):
        assert torch.equal(keep, causal_mask(T))
        assert float(w[:, ~keep].abs().max()) == 0.0
        torch.testing.assert_close(w.sum(-1), torch.ones(4, T))


def test_collect_dates_labels_and_padding(models):
    src, iso, fmt = next(e for e in load_split("dates") if e[2] == "{d} {Mon} {Y}")
    maps = attention_maps.collect_attention(models["dates"], "dates", (src, iso, fmt), pad_to=len(src) + 3)
    S = len(src) + 3
    by_name = dict(zip(maps.layer_names, range(4), strict=True))
    enc, dec, cross = by_name["enc.0.self"], by_name["dec.0.self"], by_name["dec.0.cross"]
    assert tuple(maps.weights[cross].shape) == (4, 10, S)
    assert maps.key_labels[cross] == list(src) + ["<pad>"] * 3
    assert maps.query_labels[cross] == list(iso)  # what each decoder position writes
    assert maps.key_labels[dec] == ["<bos>"] + list(iso[:-1])  # what it reads
    for i in (enc, cross):
        assert not bool(maps.keep[i][:, len(src) :].any())
        assert float(maps.weights[i][..., len(src) :].abs().max()) == 0.0  # padding gets exactly 0
    assert torch.equal(maps.keep[dec], causal_mask(10))
    with pytest.raises(ValueError, match="shorter"):
        attention_maps.collect_attention(models["dates"], "dates", (src, iso, fmt), pad_to=3)
    with pytest.raises(ValueError, match="no padding"):
        attention_maps.collect_attention(models["reversal"], "reversal", load_split("reversal")[0], pad_to=12)


def test_select_and_relabel(models):
    maps = attention_maps.collect_attention(models["dates"], "dates", load_split("dates")[0])
    cross = maps.select("dec.0.cross")
    assert cross.layer_names == ["dec.0.cross"] and len(cross.weights) == 1
    assert cross.relabel(list("0123456789")).query_labels == [list("0123456789")]
    with pytest.raises(ValueError, match="unknown layers"):
        maps.select("enc.7.self")


def test_average_of_equal_length_examples_is_the_plain_mean(models):
    rows = load_split("reversal")[:30]
    avg = attention_maps.average_attention(models["reversal"], "reversal", rows, batch_size=7)  # several batches
    single = torch.stack([attention_maps.collect_attention(models["reversal"], "reversal", r).weights[0] for r in rows])
    torch.testing.assert_close(avg.weights[0], single.mean(0))
    assert avg.count == 30 and avg.query_labels[0] == [str(i) for i in range(10)]


def test_average_over_variable_lengths_counts_each_cell_where_it_exists(models):
    rows = load_split("dates")[:12]  # sources of different lengths
    avg = attention_maps.average_attention(models["dates"], "dates", rows, batch_size=5)
    i = avg.layer_names.index("dec.0.cross")
    S = max(len(r[0]) for r in rows)
    total, count = torch.zeros(4, 10, S), torch.zeros(10, S)
    for r in rows:  # reference: one example at a time, a cell counts where the source has a character
        w = attention_maps.collect_attention(models["dates"], "dates", r).weights[3]  # (H, 10, len)
        total[:, :, : w.shape[2]] += w
        count[:, : w.shape[2]] += 1
    torch.testing.assert_close(avg.weights[i], total / count)
    assert bool(avg.keep[i].all())
    j = avg.layer_names.index("enc.0.self")
    longest = max(len(r[0]) for r in rows)
    assert tuple(avg.weights[j].shape) == (4, longest, longest)


def test_average_of_induction_keeps_only_positions_some_example_reaches(models):
    rows = [e for e in load_split("induction") if len(e[0]) == 12][:20]  # run length 6
    avg = attention_maps.average_attention(models["induction"], "induction", rows)
    assert [tuple(w.shape) for w in avg.weights] == [(4, 12, 12)] * 2
    assert torch.equal(avg.keep[0], causal_mask(12))
    assert bool(avg.weights[0][:, ~avg.keep[0]].isnan().all())  # undefined cells are NaN, and masked
    avg.plot()  # NaN under the mask is drawn as masked


# ============================================================================ statistics
def _loop_entropy(w, keep):
    """Normalised entropy per head by plain loops over examples, heads and rows."""
    B, H, Q, K = w.shape
    out = []
    for h in range(H):
        values = []
        for b in range(B):
            for q in range(Q):
                visible = [k for k in range(K) if keep[b, q, k]]
                if len(visible) < 2:
                    continue
                ent = -sum(float(w[b, h, q, k]) * math.log(float(w[b, h, q, k])) for k in visible if w[b, h, q, k] > 0)
                values.append(ent / math.log(len(visible)))
        out.append(sum(values) / len(values))
    return torch.tensor(out, dtype=torch.float64)


def test_normalized_entropy_matches_loops_and_its_extremes():
    B, H, T = 3, 2, 6
    keep = causal_mask(T)[None] & (torch.arange(T)[None, None] < torch.tensor([6, 4, 2])[:, None, None])
    g = torch.Generator().manual_seed(1)
    w = torch.softmax(
        torch.randn(B, H, T, T, generator=g, dtype=torch.float64).masked_fill(~keep[:, None], -torch.inf), -1
    )
    w = w.nan_to_num(0.0)
    torch.testing.assert_close(head_stats.normalized_entropy(w, keep), _loop_entropy(w, keep))
    uniform = keep[:, None].double().expand(B, H, T, T) / keep.sum(-1)[:, None, :, None].clamp_min(1)
    torch.testing.assert_close(head_stats.normalized_entropy(uniform, keep), torch.ones(H, dtype=torch.float64))
    one_hot = torch.zeros(B, H, T, T, dtype=torch.float64)
    one_hot[..., 0] = 1.0
    torch.testing.assert_close(head_stats.normalized_entropy(one_hot, keep), torch.zeros(H, dtype=torch.float64))
    single = causal_mask(1)[None]  # one query, one key: nothing counts
    assert bool(head_stats.normalized_entropy(torch.ones(1, 2, 1, 1), single).isnan().all())
    with pytest.raises(ValueError, match="keep"):
        head_stats.normalized_entropy(w, keep[0])


def test_head_stats_shapes_keys_and_ranges(models):
    for name, model in models.items():
        stats = head_stats.head_stats(model, name, load_split(name)[:40])
        L, H = model.num_attention_layers, model.num_heads
        for key in ("entropy", "distance", "confidence", "first", "self", "prev", "next", "tv_to_nearest"):
            assert tuple(stats[key].shape) == (L, H), key
        for key in ("entropy", "confidence", "first", "tv_to_nearest"):
            v = stats[key]
            assert bool(((v >= -1e-6) & (v <= 1 + 1e-6)).all()), key
        for key in head_stats.PATTERN_KEYS[name]:
            assert tuple(stats[key].shape) == (L, H)


def test_head_stats_match_plain_loops_on_induction(models):
    model, task = models["induction"], get_task("induction")
    rows = load_split("induction")[:25]
    stats = head_stats.head_stats(model, "induction", rows)
    batch = task.collate(rows)
    with torch.no_grad():
        task.forward(model, batch)
    for l, (_, w) in enumerate(model.attention_weights()):
        B, H, T, _ = w.shape
        sums = {k: torch.zeros(H, dtype=torch.float64) for k in ("entropy", "distance", "confidence", "prev")}
        rows_counted, prev_counted = 0, 0
        for b, (seq,) in enumerate(rows):
            for i in range(1, len(seq)):  # real queries with at least 2 visible keys (causal: i >= 1)
                row = w[b, :, i, : i + 1].double()  # (H, i + 1)
                sums["entropy"] += -(row * row.clamp_min(1e-300).log()).sum(-1) / math.log(i + 1)
                sums["distance"] += (row * torch.arange(i, -1, -1, dtype=torch.float64)).sum(-1)
                sums["confidence"] += row.max(-1).values
                sums["prev"] += row[:, i - 1]
                rows_counted += 1
                prev_counted += 1
        for key in ("entropy", "distance", "confidence", "prev"):
            torch.testing.assert_close(stats[key][l].double(), sums[key] / rows_counted, rtol=1e-5, atol=1e-5)
    pattern = head_stats.pattern_scores(model, task.name, rows)
    for key in ("previous_token", "induction"):
        for l, name in enumerate(["dec.0.self", "dec.1.self"]):
            torch.testing.assert_close(stats[key][l], torch.tensor(pattern[key][name]))


def test_distance_is_undefined_for_cross_attention(models):
    stats = head_stats.head_stats(models["dates"], "dates", load_split("dates")[:20])
    assert bool(stats["distance"][3].isnan().all()) and not bool(stats["distance"][:3].isnan().any())
    assert bool(stats["field_alignment"][:3].isnan().all()) and not bool(stats["field_alignment"][3].isnan().any())


def test_tv_to_nearest_is_zero_for_identical_heads():
    cfg = get_task("reversal").default_config()
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    layer = model.enc_blocks[0].self_attn
    d = layer.head_size
    with torch.no_grad():  # copy head 0's query and key projections into head 1
        for W in (layer.W_q, layer.W_k):
            W.weight[d : 2 * d] = W.weight[:d]
            W.bias[d : 2 * d] = W.bias[:d]
    stats = head_stats.head_stats(model, "reversal", load_split("reversal")[:20])
    assert float(stats["tv_to_nearest"][0, 0]) < 1e-6 and float(stats["tv_to_nearest"][0, 1]) < 1e-6
    assert float(stats["tv_to_nearest"][0, 2]) > 0.01


def test_head_stats_restores_training_mode(models):
    model = models["reversal"]
    model.train()
    try:
        head_stats.head_stats(model, "reversal", load_split("reversal")[:5])
        assert model.training
    finally:
        model.eval()


def test_untrained_heads_are_nearly_uniform():
    torch.manual_seed(0)
    model = build_model(get_task("reversal").default_config()).eval()
    stats = head_stats.head_stats(model, "reversal", load_split("reversal")[:50])
    assert bool((stats["entropy"] > 0.85).all())
    assert bool((stats["anti_diagonal"] < 0.2).all())


# ============================================================================ roles
def _stats(**values):
    base = {k: torch.full((1, 1), float("nan")) for k in head_stats.STAT_KEYS}
    base.update(entropy=torch.tensor([[0.5]]), tv_to_nearest=torch.tensor([[1.0]]))
    base.update({k: torch.tensor([[v]]) for k, v in values.items()})
    return base


@pytest.mark.parametrize(
    "values, role",
    [
        (dict(anti_diagonal=0.9, first=0.95), "anti-diagonal"),  # task patterns come first
        (dict(previous_token=0.6, induction=0.7), "induction"),  # the stronger pattern wins
        (dict(field_alignment=0.49, first=0.6), "first-token/BOS"),
        (dict(self=0.7, prev=0.2), "self/diagonal"),
        (dict(prev=0.55), "previous-token"),
        (dict(entropy=0.85), "diffuse"),
        (dict(entropy=0.5, first=0.3), "mixed"),
        (dict(induction=0.9, tv_to_nearest=0.1), "induction (redundant)"),
    ],
)
def test_role_rules(values, role):
    assert head_stats.role_labels(_stats(**values)) == [[role]]


def test_role_thresholds_are_parameters():
    stats = _stats(induction=0.45)
    assert head_stats.role_labels(stats) == [["mixed"]]
    assert head_stats.role_labels(stats, pattern_threshold=0.4) == [["induction"]]
    with pytest.raises(ValueError, match="head_stats"):
        head_stats.role_labels({"confidence": torch.zeros(1, 1)})


def test_roles_of_the_committed_models(models):
    roles = {
        name: head_stats.role_labels(head_stats.head_stats(m, name, load_split(name)[:200]))
        for name, m in models.items()
    }
    assert roles["reversal"] == [["anti-diagonal (redundant)"] * 4]
    assert roles["induction"][0][:3] == ["previous-token"] * 3
    assert roles["induction"][1] == ["induction"] * 4
    assert roles["dates"][3] == ["aligned"] * 4


def test_stats_table_and_chart(models):
    model = models["induction"]
    stats = head_stats.head_stats(model, "induction", load_split("induction")[:20])
    roles = head_stats.role_labels(stats)
    names = [n for n, _ in model.attention_layers()]
    table = head_stats.stats_table(stats, names, roles, columns=["entropy", "induction"])
    assert list(table.columns) == ["entropy", "induction", "role"]
    assert table.index.names == ["layer", "head"] and len(table) == 8
    assert table.loc[("dec.1.self", 3), "role"] == roles[1][3]
    fig = head_stats.plot_head_stats(stats, names, roles, ["entropy", "induction", "distance"], "t")
    assert len(fig.axes) == 3
    assert fig.axes[0].get_yticklabels()[7].get_text() == f"dec.1.self h3: {roles[1][3]}"
    with pytest.raises(ValueError, match="unknown statistics"):
        head_stats.plot_head_stats(stats, names, roles, ["nope"], "t")
    with pytest.raises(ValueError, match="layer names"):
        head_stats.stats_table(stats, names[:1])


def test_display_and_date_labels():
    assert viz.display_token(" ") == "␣" and viz.display_token("a") == "a"
    assert attention_maps.date_field_labels("{dd}.{mm}.{Y}") == list("dd.mm.YYYY")
    assert attention_maps.date_field_labels("{Y}.{mm}.{dd}") == list("YYYY.mm.dd")


def test_long_sequences_show_every_other_label_at_a_readable_size_rather_than_shrinking():
    tokens = [f"t{i}" for i in range(24)]
    weights = torch.stack([_softmax_weights(2, 24, 24, seed=s) for s in range(2)])  # (L, H, Q, K)
    fig = viz.plot_head_grid(weights, tokens, tokens, shared_scale=False)
    for ax in (a for a in fig.axes if a.images):
        shown = [t for t in ax.get_xticklabels() if t.get_text()]
        sizes = [t.get_fontsize() for t in ax.get_xticklabels() + ax.get_yticklabels()]
        assert min(sizes) >= figures.MIN_TICK_PT
        if shown:
            assert 1 < len(shown) < 24 and shown[0].get_text() == "t0"
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert bars and all(bar.get_ylabel() == "attention weight" for bar in bars)


def test_use_style_sets_the_series_figure_settings():
    figures.use_style()
    assert plt.rcParams["figure.dpi"] == 100 and plt.rcParams["xtick.labelsize"] >= figures.MIN_TICK_PT


def test_draw_flow_draws_a_box_per_step_and_a_labelled_arrow_per_edge():
    boxes = {"q": (0.1, 0.5, "queries"), "s": (0.5, 0.5, "scores"), "w": (0.9, 0.5, "weights")}
    fig = figures.draw_flow(
        boxes, [("q", "s", "(B, Q, d)"), ("s", "w", "(B, Q, K)")], title="flow", notes=[(0.5, 0.9, "n")]
    )
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert {"queries", "scores", "weights", "(B, Q, d)", "(B, Q, K)", "n"} <= set(texts)
    assert len(ax.patches) == 3 and ax.get_title() == "flow"
    assert min(t.get_fontsize() for t in ax.texts) >= figures.MIN_TICK_PT


def test_pruning_diagram_shows_the_gate_shapes_in_readable_type():
    fig = figures.pruning_diagram()
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert {"head_mask ξ", "(L, H)", "pruning.pruned_copy", "W_o weight: (D, D) → (D, D − n·d)"} <= set(texts)
    assert min(t.get_fontsize() for t in ax.texts) >= figures.MIN_TICK_PT
    plt.close(fig)


def test_transformer_diagram_shows_both_stacks_with_shapes_in_readable_type():
    fig = figures.transformer_diagram()
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert {"src: source ids", "tgt_in: target ids", "cross-attention", "memory M: (B, S, D)", "(B, T, V)"} <= set(
        texts
    )
    assert texts.count("add & norm") == 5  # two sublayers in an encoder block, three in a decoder block
    assert min(t.get_fontsize() for t in ax.texts) >= figures.MIN_TICK_PT
    plt.close(fig)


def test_mask_viz_hatches_masked_cells_and_names_rows():
    from mha_tutorial.analysis import mask_viz

    keep = causal_mask(3)
    weights = torch.softmax(torch.zeros(3, 3).masked_fill(~keep, float("-inf")), dim=-1)  # (Q, K)
    fig = mask_viz.plot_masked_grid([weights], [keep], [["a", "b", "<pad>"]], ["t"], "s", ncols=2)
    ax = fig.axes[0]
    assert ax.patch.get_hatch() == "///"
    assert len(ax.texts) == int(keep.sum())  # annotations only on the visible (unmasked) cells
    assert not fig.axes[1].get_visible()
    assert [t.get_color() for t in ax.get_xticklabels()][-1] == "grey"
    plt.close(fig)
    assert mask_viz.describe_row(torch.tensor([float("nan"), 0.0])) == "NaN"
    assert mask_viz.describe_row(torch.zeros(4)) == "zeros ✓"
    assert mask_viz.describe_row(torch.full((4,), 0.25, dtype=torch.bfloat16)) == "uniform 1/4"
    assert mask_viz.describe_row(torch.tensor([0.9, 0.1])) == "other"
    with pytest.raises(ValueError, match="1-D"):
        mask_viz.describe_row(torch.zeros(2, 2))
    table, errors = mask_viz.fully_masked_table(
        {
            "fill -inf": lambda s, k: torch.softmax(s.masked_fill(~k, float("-inf")), -1),
            "fill -1e9": lambda s, k: torch.softmax(s.masked_fill(~k, -1e9), -1),
        },
        torch.zeros(1, 2, 4),
        torch.tensor([[[True, False, False, False], [False] * 4]]),
        (torch.float32, torch.float16),
    )
    assert table.loc["fill -inf", "float32"] == "NaN"
    assert table.loc["fill -1e9", "float32"] == "uniform 1/4"
    assert table.loc["fill -1e9", "float16"] == "RuntimeError" and "fill -1e9" in errors


def test_memory_rows_draws_one_box_per_slot_with_its_text_and_labels_in_readable_type():
    rows = [("memory", ["00", "01", "10", "11"], [0, 0, 1, 1]), ("view", [0, 2, 1, 3], [0, 1, 0, 1])]
    fig = figures.memory_rows(rows, ["#66c2a5", "#fc8d62"], xlabel="slot")
    (ax,) = fig.axes
    texts = [t.get_text() for t in ax.texts]
    assert {"memory", "view", "00", "11", "2", "3"} <= set(texts)
    assert len(ax.patches) == 8 and ax.get_xlabel() == "slot"
    assert [p.get_facecolor() for p in ax.patches[4:6]] == [
        ax.patches[0].get_facecolor(),
        ax.patches[2].get_facecolor(),
    ]
    assert min(t.get_fontsize() for t in ax.texts) >= figures.MIN_TICK_PT
    plt.close(fig)
