"""The grouped-query conversion study: ``model_to_gqa`` on whole models, the cache it saves, and the shipped table
agreeing with the code that made it."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mha_tutorial.core.kv_cache import KVCache, cache_bytes
from mha_tutorial.models.model import ModelConfig, build_model
from mha_tutorial.models.tasks import get_task
from mha_tutorial.models.train import evaluate
from mha_tutorial.modern import gqa_study as gs
from mha_tutorial.modern.gqa import mha_to_gqa

from testkit import no_arithmetic

KINDS = {  # small models of the two kinds the study converts
    "decoder": dict(src_vocab_size=0, num_enc_layers=0, num_dec_layers=2),
    "encoder_decoder": dict(src_vocab_size=9, num_enc_layers=1, num_dec_layers=2),
}


@pytest.fixture(scope="module")
def study():
    return gs.read_study()


@pytest.fixture(autouse=True, scope="module")
def _one_thread():
    """One thread, as the study ran: a second one on a shared 2-core CPU makes the evaluations ~10x slower."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def _outputs(model, task_name):
    """The model's logits on 16 eval examples of its task (teacher-forced)."""
    task = get_task(task_name)
    batch = task.collate(task.load_split("eval")[:16])
    with torch.no_grad():
        return task.forward(model, batch)


def _same_state(a, b) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.mark.parametrize("task_name", gs.TASKS)
@pytest.mark.parametrize("init", ["mean", "first"])
def test_as_many_kv_heads_as_heads_is_an_exact_copy_and_the_original_is_untouched(models, task_name, init):
    original = models[task_name]
    before = {k: v.clone() for k, v in original.state_dict().items()}
    copy = gs.model_to_gqa(original, original.config.num_heads, init)
    assert copy is not original and copy.config == original.config and not copy.training
    assert _same_state(copy, original)
    assert torch.equal(_outputs(copy, task_name), _outputs(original, task_name))
    assert all(torch.equal(before[k], v) for k, v in original.state_dict().items())


def _identical_within_groups(model, num_kv_heads):
    """A copy of ``model`` whose K/V heads in each group of H / num_kv_heads consecutive heads all equal the group's
    first, with weights rounded to multiples of 2^-12 so that the mean of equal rows is exact in float32."""
    model = gs.model_to_gqa(model, model.config.num_heads)  # a copy
    with torch.no_grad():
        for param in model.parameters():
            param.copy_(torch.round(param * 4096) / 4096)
        for _, layer in model.attention_layers():
            d, G = layer.head_size, layer.num_heads // num_kv_heads
            for proj in (layer.W_k, layer.W_v):
                for param in (proj.weight, proj.bias):
                    for h in range(layer.num_heads):  # head h copies head (h // G) * G, its group's first
                        first = (h // G) * G
                        param[h * d : (h + 1) * d] = param[first * d : (first + 1) * d].clone()
    return model


@pytest.mark.parametrize("task_name", gs.TASKS)
@pytest.mark.parametrize("num_kv_heads", gs.KV_HEADS)
def test_mean_pooling_of_heads_made_identical_in_each_group_changes_nothing(models, task_name, num_kv_heads):
    """Sharp: pooling the wrong heads (another grouping, or the sum instead of the mean) changes the outputs."""
    prepared = _identical_within_groups(models[task_name], num_kv_heads)
    converted = gs.model_to_gqa(prepared, num_kv_heads, "mean")
    assert converted.config.num_kv_heads == num_kv_heads
    want, got = _outputs(prepared, task_name), _outputs(converted, task_name)
    assert torch.equal(got, want)  # exactly: equal rows of multiples of 2^-12 pool without rounding
    assert not torch.allclose(_outputs(models[task_name], task_name), want, atol=1e-2)  # the preparation mattered


@settings(max_examples=10)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    num_kv_heads=st.sampled_from([1, 2, 4]),
    init=st.sampled_from(["mean", "first", "random"]),
    seed=st.integers(0, 2**16),
)
def test_every_layer_is_converted_as_mha_to_gqa_converts_it_alone(kind, num_kv_heads, init, seed):
    torch.manual_seed(seed)
    config = ModelConfig(kind, tgt_vocab_size=7, num_hiddens=16, num_heads=4, ffn_num_hiddens=8, **KINDS[kind])
    model = build_model(config)
    converted = gs.model_to_gqa(model, num_kv_heads, init, torch.Generator().manual_seed(seed))
    generator = torch.Generator().manual_seed(seed)  # the same draws, layer by layer in attention_layers() order
    for (name, layer), (_, new) in zip(model.attention_layers(), converted.attention_layers(), strict=True):
        assert _same_state(new, mha_to_gqa(layer, num_kv_heads, init, generator)), name
    state, new_state = model.state_dict(), converted.state_dict()
    outside = [k for k in state if ".W_k." not in k and ".W_v." not in k]
    assert outside and all(torch.equal(state[k], new_state[k]) for k in outside)


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_the_converted_decoder_caches_what_the_formula_says(models, num_kv_heads):
    model = gs.model_to_gqa(models["induction"], num_kv_heads)
    cache, tokens = KVCache(model), torch.randint(1, 10, (3, 7))
    with torch.no_grad():
        model(tokens[:, :5], cache=cache)
        model(tokens[:, 5:], cache=cache)
    per_token = gs.kv_bytes_per_token(model.config)
    assert cache.nbytes == cache_bytes(2, 3, num_kv_heads, 7, 16) == 3 * 7 * per_token
    assert per_token == 1024 // (4 // num_kv_heads)  # 1024 B for 4 K/V heads: halved, then quartered


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_the_encoder_decoder_cache_grows_by_its_self_attention_layers_only(models, num_kv_heads):
    model = gs.model_to_gqa(models["dates"], num_kv_heads)
    src, tgt = torch.randint(1, 20, (2, 9)), torch.randint(0, 12, (2, 4))
    cache = KVCache(model)
    sizes = []
    with torch.no_grad():
        memory = model.encode(src)
        for t in range(4):
            model.decode(tgt[:, t : t + 1], memory, cache=cache)
            sizes.append(cache.nbytes)
    per_token = gs.kv_bytes_per_token(model.config)
    assert per_token == 128 * num_kv_heads  # 1 self-attention layer: 512 B for 4 K/V heads, halved, quartered
    assert {sizes[t + 1] - sizes[t] for t in range(3)} == {2 * per_token}  # 2 sequences
    cross = cache_bytes(1, 2, num_kv_heads, 9, 16)  # the memory's keys and values: stored once, shrunk the same
    assert cache.layers["dec.0.cross"].nbytes == cross and sizes[0] == cross + 2 * per_token


def test_the_shipped_table_has_every_row_once(study):
    per_task = (len(gs.KV_HEADS) * len(gs.INITS) + 1) * len(gs.SEEDS) * len(gs.STAGES)
    assert list(study.columns) == [*gs.COLUMNS, "machine"]
    assert len(study) == len(gs.TASKS) * per_task
    assert not study.duplicated(["task", "num_kv_heads", "init", "seed", "stage"]).any()
    assert set(study.seed) == set(gs.SEEDS) and set(study.stage) == set(gs.STAGES)
    assert set(study[study.init == gs.CONTROL].num_kv_heads) == {4}
    assert study.accuracy.between(0, 1).all() and (study.loss > 0).all()
    assert study.machine.nunique() == 1  # one run made the whole table
    layers = {"induction": 2, "dates": 1}
    for row in study.drop_duplicates(["task", "num_kv_heads"]).itertuples():
        assert row.kv_bytes_per_token == cache_bytes(layers[row.task], 1, row.num_kv_heads, 1, 16)


@pytest.mark.parametrize("task_name", gs.TASKS)
def test_the_shipped_converted_rows_are_recomputed_live(study, models, task_name):
    """Mean and first conversions are deterministic: every seed's row is the same, and equals a live evaluation
    (up to one example that another CPU may round the other way)."""
    for num_kv_heads in gs.KV_HEADS:
        for init in ("mean", "first"):
            rows = study[
                (study.task == task_name)
                & (study.num_kv_heads == num_kv_heads)
                & (study.init == init)
                & (study.stage == "converted")
            ]
            assert len(rows) == len(gs.SEEDS) and rows.accuracy.nunique() == 1 and rows.loss.nunique() == 1
            live = evaluate(gs.model_to_gqa(models[task_name], num_kv_heads, init), task_name)
            assert abs(live["accuracy"] - rows.accuracy.iloc[0]) <= 1 / live["n"], (num_kv_heads, init)
            assert live["loss"] == pytest.approx(rows.loss.iloc[0], abs=1e-4), (num_kv_heads, init)


def test_summary_and_table_are_the_seeds_min_mean_and_max(study):
    numbers, cells = gs.summary(study), gs.table(study)
    for key in [("dates", 2, "mean", "uptrained"), ("induction", 1, "random", "converted")]:
        values = [
            r.accuracy
            for r in study.itertuples()
            if (r.task, r.num_kv_heads, r.init, r.stage) == key  # a plain filter, row by row
        ]
        assert len(values) == len(gs.SEEDS)
        mean = sum(values) / len(values)
        assert numbers.loc[key, "min"] == min(values) and numbers.loc[key, "max"] == max(values)
        assert numbers.loc[key, "mean"] == pytest.approx(mean, abs=1e-12)
        assert cells.loc[key[:3], key[3]] == f"{mean:.3f} [{min(values):.3f}, {max(values):.3f}]"
    assert len(cells) == len(gs.TASKS) * (len(gs.KV_HEADS) * len(gs.INITS) + 1)


def test_uptraining_is_five_percent_of_the_original_steps_for_every_row():
    assert gs.uptrain_settings("induction").steps == 25 and gs.uptrain_settings("dates").steps == 50
    assert {gs.uptrain_settings(t).lr for t in gs.TASKS} == {gs.UPTRAIN_LR}
    assert all(gs.uptrain_settings(t).eval_every == 0 for t in gs.TASKS)


def test_the_figure_has_one_panel_per_task_on_one_scale(study):
    fig = gs.plot_study(study)
    axes = fig.axes
    assert len(axes) == len(gs.TASKS) and axes[0].get_ylim() == axes[1].get_ylim()
    assert all(ax.get_xlabel() for ax in axes) and axes[0].get_ylabel()
    assert all(t.get_fontsize() >= 8 for ax in axes for t in ax.get_xticklabels() + ax.get_yticklabels())
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "mean init, converted" in labels and "mean init, uptrained" in labels and any("control" in s for s in labels)
    assert len(fig.legends) == 1 and len(labels) == len(set(labels))  # one legend, every entry once


def test_the_figure_draws_a_bar_only_where_the_seeds_differ_and_extra_points_where_asked(study):
    extra = {"induction": [(512, 0.9), (256, 0.3)]}
    fig = gs.plot_study(study, extra_points=extra, extra_label="my points")
    numbers = gs.summary(study)
    for ax, task in zip(fig.axes, gs.TASKS, strict=True):
        bars = [seg for c in ax.collections if c.get_segments() for seg in c.get_segments()]  # errorbars' lines
        lengths = sorted(round(float(s[1][1] - s[0][1]), 9) for s in bars)
        rows = numbers.loc[task].drop(index=gs.CONTROL, level="init")  # the markers' seeds (the control: a line)
        spreads = sorted(round(float(v), 9) for v in rows["max"] - rows["min"] if v > 0)
        assert lengths == spreads, task  # one bar per marker whose seeds differ, as long as their range
    (diamonds,) = [line for line in fig.axes[0].get_lines() if line.get_label() == "my points"]
    x, y = diamonds.get_data()
    assert list(y) == [0.9, 0.3]
    assert all(b < xi < b * 2**0.25 for xi, b in zip(x, (512, 256), strict=True))  # just right of their size
    assert not [line for line in fig.axes[1].get_lines() if line.get_label() == "my points"]
    assert "my points" in [t.get_text() for t in fig.legends[0].get_texts()]
    plain = gs.plot_study(study)
    assert "extra points" not in [t.get_text() for t in plain.legends[0].get_texts()]
    bands = [p for ax in plain.axes for p in ax.patches if "seeds' range" in p.get_label()]
    assert not bands  # the shipped control's ranges are narrower than BAND_MIN: no invisible band in the legend
    for bad, fragment in [
        ({"reversal": [(512, 0.5)]}, "has no panel"),
        ({"induction": [(300, 0.5)]}, "kv_bytes in"),
        ({"induction": [(512, 1.5)]}, r"must lie in \[0, 1\]"),
    ]:
        with pytest.raises(ValueError, match=fragment):
            gs.plot_study(study, extra_points=bad)
    with pytest.raises(TypeError, match="extra_points must be a dict"):
        gs.plot_study(study, extra_points=[(512, 0.5)])


def test_bad_arguments_are_refused_before_any_work(models):
    model = models["induction"]
    grouped, pruned = gs.model_to_gqa(model, 2), gs.model_to_gqa(model, 4)
    pruned.prune_heads({"dec.1.self": [2]})
    cases = [
        (TypeError, "TinyTransformer", lambda: gs.model_to_gqa(model.dec_blocks[0].self_attn, 2)),
        (ValueError, "must divide num_heads=4", lambda: gs.model_to_gqa(model, 3)),
        (ValueError, "must divide num_heads=4", lambda: gs.model_to_gqa(model, 0)),
        (TypeError, "num_kv_heads must be an int", lambda: gs.model_to_gqa(model, None)),
        (TypeError, "num_kv_heads must be an int", lambda: gs.model_to_gqa(model, True)),
        (ValueError, "init must be one of", lambda: gs.model_to_gqa(model, 2, "median")),
        (TypeError, "generator must be", lambda: gs.model_to_gqa(model, 2, "random", generator=0)),
        (ValueError, "already shares its K/V heads", lambda: gs.model_to_gqa(grouped, 1)),
        (ValueError, "pruned heads", lambda: gs.model_to_gqa(pruned, 2)),
        (ValueError, "tasks must be taken from", lambda: gs.run_study(tasks=("reversal",))),
        (ValueError, "kv_heads must be taken from", lambda: gs.run_study(kv_heads=(3,))),
        (ValueError, "seeds must be non-negative ints", lambda: gs.run_study(seeds=(0, -1))),
        (TypeError, "inits must be a sequence", lambda: gs.run_study(inits="mean")),
        (ValueError, "task must be one of", lambda: gs.uptrain_settings("reversal")),
    ]
    for error, fragment, call in cases:
        with no_arithmetic(), pytest.raises(error, match=fragment):
            call()
    with pytest.raises(FileNotFoundError, match="python -m mha_tutorial.modern.gqa_study"):
        gs.read_study("/nonexistent/gqa_study.csv")
