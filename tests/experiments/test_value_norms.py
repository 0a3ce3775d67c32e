"""mha_tutorial.analysis.maps.value_weighted_maps against a plain loop over heads, queries and keys, and on bad input."""

from __future__ import annotations

import pytest
import torch

from mha_tutorial.analysis.maps import collect_attention, value_weighted_maps
from mha_tutorial.models.tasks import load_split


@pytest.mark.parametrize(
    ("task", "layer"), [("dates", "enc.1.self"), ("dates", "dec.0.cross"), ("reversal", "enc.0.self")]
)
def test_value_weighted_maps_equal_a_hand_loop(models, task, layer):
    model, example = models[task], load_split(task, "eval")[3]
    mha = dict(model.attention_layers())[layer]
    inputs = []
    hook = mha.register_forward_pre_hook(lambda module, args: inputs.append(args[2][0]))  # values (K, D)
    alpha = collect_attention(model, task, example).select(layer).weights[0]  # (H, Q, K)
    hook.remove()
    H, Q, K = alpha.shape
    d = mha.head_size
    got = value_weighted_maps(model, task, example, layer)
    assert got.shape == (H, Q, K) and got.device.type == "cpu"
    want = torch.zeros(H, Q, K)
    with torch.no_grad():
        values = mha.W_v(inputs[0])  # (K, H*d)
        for h in range(H):
            cols = slice(h * d, (h + 1) * d)
            for j in range(K):
                sent = mha.W_o.weight[:, cols] @ values[j, cols]  # (D,): v_j W^O_h
                for i in range(Q):
                    want[h, i, j] = (alpha[h, i, j] * sent).norm()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
    assert not torch.equal(got / got.sum(-1, keepdim=True), alpha)  # value lengths do change the map


def test_value_weighted_maps_are_zero_on_masked_keys(models):
    model = models["dates"]
    example = next(e for e in load_split("dates", "eval") if len(e[0]) < 12)
    got = value_weighted_maps(model, "dates", example, "dec.0.self")  # causal: key j > query i is hidden
    Q, K = got.shape[1:]
    hidden = torch.ones(Q, K, dtype=torch.bool).triu(1)
    assert bool((got[:, hidden] == 0).all()) and bool((got[:, ~hidden] > 0).all())


def test_value_weighted_maps_reject_bad_input(models):
    example = load_split("dates", "eval")[0]
    with pytest.raises(ValueError, match="unknown layer 'enc.2.self'"):
        value_weighted_maps(models["dates"], "dates", example, "enc.2.self")
    with pytest.raises(TypeError, match="layer must be a layer name"):
        value_weighted_maps(models["dates"], "dates", example, 1)
    with pytest.raises(TypeError, match="model must be a model of this package"):
        value_weighted_maps(torch.nn.Linear(2, 2), "dates", example, "enc.1.self")
